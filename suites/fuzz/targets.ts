// The table of fuzz targets: every input the project accepts from outside. Adding a command's
// flags is one entry in COMMANDS (inputs/cli.ts); a new input format is one entry here.
import { symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import * as mx from "@mlx-bun/mlx";
import { MlxError } from "@mlx-bun/mlx";
import { checkCheckpoint, ConfigError, loadModel, WeightsError } from "../../model/gemma4/index.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { isInputError, UsageError } from "../../parity/args.ts";
import { parityPlan } from "../../parity/cli.ts";
import { arbCliInput, type CliInput, COMMANDS, materialise } from "./inputs/cli.ts";
import { tokenizePrompt } from "../../parity/inputs.ts";
import { arbTokenizer, type TokenizerSpec } from "./inputs/tokenizer.ts";
import { OracleError } from "../../oracle/client.ts";
import { arbOracle, type FakeOracleSpec, runOracle } from "./inputs/oracle.ts";
import { decodeImage } from "../../model/media/image.ts";
import { MediaError } from "../../model/media/errors.ts";
import { decodeWav } from "../../model/media/wav.ts";
import { arbMedia, type MediaSpec, mediaBytes } from "./inputs/media.ts";
import { arbConfig, type ConfigSpec, configText } from "./inputs/config.ts";
import { arbOpCall, callOp, type OpCall } from "./inputs/ops.ts";
import { arbSafetensors, baseOfFile, SMALL_BASE, type StSpec, stBytes } from "./inputs/safetensors.ts";
import { expectError, type FuzzContext, type FuzzTarget, target } from "./target.ts";
import { limit } from "../../tests/time_limit.ts";

export const FIXTURE = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");
export const WRAP_FIXTURE = join(REPO_ROOT, ".cache", "checkpoints", "c6_sink", "wrap_f32");

/** Evaluates (and frees) what a call returned, unless it is too big to materialise safely. */
export function consume(out: unknown): void {
  const arrays = out instanceof mx.MlxArray ? [out] : Array.isArray(out) ? out.filter((a): a is mx.MlxArray => a instanceof mx.MlxArray) : [];
  try {
    const small = arrays.filter((a) => a.nbytes <= 64 << 20);
    if (small.length) mx.evaluate(small);
  } finally {
    for (const a of arrays) a.dispose();
  }
}

/** A checkpoint directory: a config and a safetensors file, each the fixture's or a fuzzed one. */
export interface CheckpointSpec {
  fixture: string;
  config?: ConfigSpec;
  safetensors?: StSpec;
}

export function writeCheckpoint(s: CheckpointSpec, dir: string): void {
  if (s.config) writeFileSync(join(dir, "config.json"), configText(s.config));
  else symlinkSync(join(s.fixture, "config.json"), join(dir, "config.json"));
  if (s.safetensors) writeFileSync(join(dir, "model.safetensors"), stBytes(s.safetensors));
  else symlinkSync(join(s.fixture, "model.safetensors"), join(dir, "model.safetensors"));
}

const LOAD_ERRORS = [ConfigError, WeightsError];

/**
 * A fuzzed checkpoint through the pre-flight check (checkCheckpoint: no weights read) and the
 * loader with weights read, then one forward of 3 tokens. The pre-flight check must refuse every
 * checkpoint the loader refuses, and so must `npm run parity -- --model DIR`'s pre-flight
 * (parityPlan, which runs before the oracle process is started).
 */
async function runCheckpoint(s: CheckpointSpec, ctx: FuzzContext): Promise<void> {
  writeCheckpoint(s, ctx.scratch);
  let preflight: unknown = null;
  try {
    checkCheckpoint(ctx.scratch);
  } catch (e) {
    preflight = e;
  }
  let loaded;
  try {
    loaded = loadModel(ctx.scratch);
  } catch (e) {
    if (preflight === null) throw new Error(`the pre-flight check accepted a checkpoint the loader refuses: ${(e as Error).message}`);
    const cli = await Promise.resolve(parityPlan(["--model", ctx.scratch, "--tokens", "2,7,1"])).then(() => null, (x: unknown) => x);
    if (!isInputError(cli)) throw new Error(`the parity command would start an oracle for a checkpoint the loader refuses (${(e as Error).message}): ${String(cli)}`);
    throw e;
  }
  try {
    if (preflight !== null) throw new Error(`the pre-flight check refused a checkpoint the loader accepts: ${(preflight as Error).message}`);
    using x = mx.array([2, 7, 1], [1, 3], "int32");
    consume(loaded.model.call(x));
  } finally {
    loaded.model.dispose();
  }
}

const command = (name: string) => COMMANDS.find((c) => c.name === name)!;
const inputError = (e: unknown) => (isInputError(e) && (e as Error).message.trim().length > 3 ? null : `not a usage or input error: ${e instanceof Error ? `${e.constructor.name}: ${e.message}` : String(e)}`.slice(0, 400));

/**
 * The command line run as a process, for one the command refuses in-process: exit code 2, one
 * "error:" line without a stack trace, and no oracle process started (ORACLE_PYTHON records it).
 */
function runCliProcess(input: CliInput, ctx: FuzzContext): void {
  const c = command(input.command);
  const argv = materialise(input.argv, ctx.scratch, FIXTURE);
  if (argv.some((a) => a.includes("\0"))) return; // no process can be given a NUL byte in an argument
  const marker = join(ctx.scratch, "oracle-started");
  const recorder = join(ctx.scratch, "python");
  writeFileSync(recorder, `#!/bin/sh\ntouch '${marker}'\nexit 1\n`, { mode: 0o755 });
  const r = spawnSync(process.execPath, [join(ctx.root, c.script), ...argv], { cwd: ctx.root, encoding: "utf8", timeout: limit(120_000), env: { ...process.env, ORACLE_PYTHON: recorder } });
  const out = `${r.stdout}${r.stderr}`;
  if (r.status === null) throw new Error(`${c.name} ${JSON.stringify(argv)}: killed (${r.signal ?? r.error?.message})`);
  if (existsSync(marker)) throw new Error(`${c.name} ${JSON.stringify(argv)}: an oracle process was started for a command line it refuses`);
  // --verbose asks for the error with its stack trace instead of the one-line message
  const clean = argv.includes("--verbose") || (/error: /.test(out) && !/\n\s+at .+:\d+:\d+/.test(out));
  if (r.status !== 2 || !clean) throw new Error(`${c.name} ${JSON.stringify(argv)}: exit ${r.status}, output ${JSON.stringify(out.slice(-400))}`);
}

const jsonText = (j: { json: unknown } | { text: string }) => ("json" in j ? JSON.stringify(j.json) : j.text);

export const TARGETS: FuzzTarget[] = [
  target<MediaSpec>({
    name: "media/decode",
    sample: 60,
    arbitrary: arbMedia,
    run: async (m) => {
      const b = new Uint8Array(mediaBytes(m));
      // a small pixel limit: a header may claim any size, and the limit check is fuzzed too
      if (m.format === "wav") decodeWav(b, "fuzz.wav");
      else await decodeImage(b, `fuzz.${m.format}`, { maxPixels: 1 << 20 });
    },
    judge: expectError([MediaError], (m) => [`fuzz.${m.format}`]),
  }),
  target<FakeOracleSpec>({
    name: "oracle/replies",
    sample: 20,
    arbitrary: arbOracle,
    run: (spec, ctx) => runOracle(spec, ctx.root, ctx.scratch),
    judge: expectError([OracleError]),
    timeoutMs: 30_000,
  }),
  target<TokenizerSpec>({
    name: "tokenizer/prompt",
    sample: 60,
    arbitrary: arbTokenizer,
    run: async (t, ctx) => {
      if (t.tokenizer) writeFileSync(join(ctx.scratch, "tokenizer.json"), jsonText(t.tokenizer));
      if (t.config) writeFileSync(join(ctx.scratch, "tokenizer_config.json"), jsonText(t.config));
      if (t.jinja !== null) writeFileSync(join(ctx.scratch, "chat_template.jinja"), t.jinja);
      await tokenizePrompt(ctx.scratch, t.prompt, t.chat);
    },
    judge: expectError([UsageError], (_i, ctx) => [ctx.scratch]),
  }),
  target<CliInput>({
    name: "cli/flags",
    sample: 150,
    arbitrary: arbCliInput,
    run: async (i, ctx) => void (await command(i.command).validate(materialise(i.argv, ctx.scratch, FIXTURE))),
    judge: inputError,
  }),
  target<CliInput>({
    name: "cli/process",
    sample: 6,
    arbitrary: arbCliInput,
    run: async (i, ctx) => {
      try {
        await command(i.command).validate(materialise(i.argv, ctx.scratch, FIXTURE));
      } catch (e) {
        if (inputError(e) !== null) throw e;
        runCliProcess(i, ctx);
        throw e;
      }
    },
    judge: inputError,
    timeoutMs: 150_000,
  }),
  target<OpCall>({
    name: "ops/binding",
    sample: 250,
    arbitrary: arbOpCall,
    run: (c, ctx) => callOp(c, ctx.scratch),
    judge: expectError([MlxError]),
  }),
  target<StSpec>({
    name: "safetensors/binding",
    sample: 120,
    arbitrary: () => arbSafetensors(SMALL_BASE),
    run: (s, ctx) => {
      const file = join(ctx.scratch, "x.safetensors");
      writeFileSync(file, stBytes(s));
      const { arrays } = mx.loadSafetensors(file);
      consume([...arrays.values()]);
    },
    judge: expectError([MlxError]),
  }),
  target<CheckpointSpec>({
    name: "checkpoint/safetensors",
    sample: 80,
    arbitrary: () => arbSafetensors(baseOfFile(join(FIXTURE, "model.safetensors"))).map((safetensors) => ({ fixture: FIXTURE, safetensors })),
    run: runCheckpoint,
    judge: expectError(LOAD_ERRORS, (_i, ctx) => [ctx.scratch]),
  }),
  target<CheckpointSpec>({
    name: "checkpoint/config",
    sample: 100,
    arbitrary: () => fc.oneof(arbConfig(join(FIXTURE, "config.json")).map((config) => ({ fixture: FIXTURE, config })), arbConfig(join(WRAP_FIXTURE, "config.json")).map((config) => ({ fixture: WRAP_FIXTURE, config }))),
    run: runCheckpoint,
    judge: expectError(LOAD_ERRORS, (_i, ctx) => [ctx.scratch]),
  }),
];
