// Command lines of every command: the command table (one entry per command: its script, its
// flag specs and the check it runs before doing any work) and argv generators built from the
// flag specs, with values that are wrong for their kind, bad checkpoint directories, unknown and
// repeated flags, positionals and missing values.
//
// A new command is one COMMANDS entry: export its FlagSpec list and a function that runs every
// check the command makes before it starts work (throwing UsageError / ConfigError / WeightsError).
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { benchPlan, FLAGS as BENCH_FLAGS } from "../../../bench/run.ts";
import { benchBatchPlan, FLAGS as BENCH_BATCH_FLAGS } from "../../../bench/batch.ts";
import { regenArgs, FLAGS as REGEN_FLAGS } from "../../../parity/golden_regen_cli.ts";
import { referencePlan, FLAGS as REFERENCE_FLAGS } from "../../../parity/reference_export_cli.ts";
import type { FlagSpec } from "../../../parity/args.ts";
import { cachePromptPlan, FLAGS as CACHE_PROMPT_FLAGS } from "../../../parity/cache_prompt_cli.ts";
import { FLAGS as PARITY_FLAGS, parityPlan } from "../../../parity/cli.ts";
import { FLAGS as GENERATE_FLAGS, generatePlan } from "../../../parity/generate_cli.ts";
import { FLAGS as FUSE_FLAGS, fusePlan } from "../../../parity/fuse_cli.ts";
import { FLAGS as OPS_FLAGS, opsReportArgs } from "../../../parity/ops_report.ts";
import { FLAGS as TRAIN_FLAGS, trainPlan } from "../../../parity/train_cli.ts";

export interface CliCommand {
  /** The npm script name. */
  name: string;
  /** Its entry file, relative to the repository root. */
  script: string;
  flags: readonly FlagSpec[];
  /** Every check made before work starts; resolves when the command line would run. */
  validate: (argv: readonly string[]) => unknown;
  /** Positional arguments it takes (most take none). */
  positionals?: readonly string[];
}

export const COMMANDS: CliCommand[] = [
  { name: "parity", script: "parity/cli.ts", flags: PARITY_FLAGS, validate: parityPlan },
  { name: "generate", script: "parity/generate_cli.ts", flags: GENERATE_FLAGS, validate: generatePlan },
  { name: "bench", script: "bench/run.ts", flags: BENCH_FLAGS, validate: benchPlan },
  { name: "golden:regen", script: "parity/golden_regen_cli.ts", flags: REGEN_FLAGS, validate: regenArgs },
  { name: "parity:ops", script: "parity/ops_report.ts", flags: OPS_FLAGS, validate: opsReportArgs, positionals: ["add", "fast.rope", "no_such_op", "add add"] },
  { name: "reference:export", script: "parity/reference_export_cli.ts", flags: REFERENCE_FLAGS, validate: referencePlan },
  { name: "cache-prompt", script: "parity/cache_prompt_cli.ts", flags: CACHE_PROMPT_FLAGS, validate: cachePromptPlan },
  { name: "train", script: "parity/train_cli.ts", flags: TRAIN_FLAGS, validate: trainPlan },
  { name: "fuse", script: "parity/fuse_cli.ts", flags: FUSE_FLAGS, validate: fusePlan },
  { name: "bench:batch", script: "bench/batch.ts", flags: BENCH_BATCH_FLAGS, validate: benchBatchPlan },
];

// Directory placeholders, made in the input's scratch directory by `materialise`.
const DIRS = ["$FIXTURE", "$MISSING", "$FILE", "$EMPTY_DIR", "$BAD_HEADS", "$TRUNCATED", "$BAD_JSON", "$LLAMA"];

const BY_NAME: Record<string, string[]> = {
  model: DIRS,
  "oracle-model": DIRS,
  tokens: ["1,2,3", "2,7", "", ",", "1,,2", "-1", "1.5", "255", "256", "99999999999", "a", "1 2", "1,2,3,".repeat(40)],
  prompt: ["hello", "", " ", "<bos>", "日本語", "\u0000"],
  only: ["c1_dense/*", "*", "", "no_such/*", "tiny-dense", "e2b,moe", "[", "c1_dense/f32/gen_P9_S5", "c1_dense", "c5_moe"],
  "big-prompts": ["128,1024", "1", "2", "x", "", "5,-3", "1e9"],
  "big-dtype": ["float32", "bfloat16", "float16", ""],
  out: ["$SCRATCH/out", ""],
  "prompt-cache-file": ["$SCRATCH/cache.safetensors", "$SCRATCH/cache.txt", "$MISSING/x.safetensors", "$FILE", ""],
  "draft-model": DIRS,
  data: DIRS,
  "adapter-path": DIRS,
  "save-path": ["$SCRATCH/fused", "$FILE", ""],
  "fine-tune-type": ["lora", "dora", "full", "qlora", ""],
  optimizer: ["adam", "adamw", "sgd", "muon", "lion", ""],
  device: ["cpu", "gpu", "tpu", ""],
};
const INTS = ["0", "1", "2", "-1", "8", "1.5", "1e3", "NaN", "Infinity", "-Infinity", "0x10", "", " ", "99999999999999999999", "2147483648", "abc"];
const NUMBERS = ["0", "-0.5", "0.5", "1", "1e-3", "NaN", "Infinity", "abc", "", "1e400"];
const STRINGS = ["", " ", "x", "--", "-", "../nope", "*", "a=b", "\u0000"];

function valueOf(spec: FlagSpec): fc.Arbitrary<string> {
  if (spec.kind === "int") return fc.constantFrom(...INTS);
  if (spec.kind === "number") return fc.constantFrom(...NUMBERS);
  return fc.constantFrom(...(BY_NAME[spec.name] ?? []), ...STRINGS);
}

/** One piece of a command line: a known flag with a (possibly bad or missing) value, or noise. */
function piece(cmd: CliCommand): fc.Arbitrary<string[]> {
  const noise = fc.constantFrom<string[]>(["--frobnicate"], ["--"], ["-x"], ["positional"], ["--MODEL", "x"], ["--help=1"], ["---model"], ...(cmd.positionals ?? []).map((p) => p.split(" ")));
  const flags = cmd.flags.filter((f) => f.name !== "help");
  if (flags.length === 0) return noise;
  const known = fc.constantFrom(...flags);
  return fc.oneof(
    { weight: 8, arbitrary: known.chain((f): fc.Arbitrary<string[]> => (f.kind === "bool" ? fc.constant([`--${f.name}`]) : valueOf(f).map((v) => [`--${f.name}`, v]))) },
    { weight: 2, arbitrary: known.chain((f) => valueOf(f).map((v) => [`--${f.name}=${v}`])) },
    { weight: 1, arbitrary: known.map((f) => [`--${f.name}`]) },
    { weight: 1, arbitrary: noise },
  );
}

export interface CliInput {
  command: string;
  argv: string[];
}

export function arbCliInput(): fc.Arbitrary<CliInput> {
  return fc.oneof(
    ...COMMANDS.map((c) => fc.array(piece(c), { maxLength: 5 }).map((ps): CliInput => ({ command: c.name, argv: ps.flat() }))),
  );
}

/** Makes the placeholder directories in `scratch` and substitutes them into the command line. */
export function materialise(argv: readonly string[], scratch: string, fixture: string): string[] {
  const made = new Map<string, string>();
  const dir = (name: string): string => {
    if (made.has(name)) return made.get(name)!;
    const d = name === "$FIXTURE" ? fixture : join(scratch, name.slice(1).toLowerCase());
    made.set(name, d);
    if (name === "$FIXTURE") return d;
    if (name === "$MISSING" || existsSync(d)) return d;
    if (name === "$FILE") {
      writeFileSync(d, "not a directory");
      return d;
    }
    mkdirSync(d, { recursive: true });
    if (name === "$EMPTY_DIR") return d;
    const weights = join(fixture, "model.safetensors");
    if (name === "$TRUNCATED") {
      const bytes = readFileSync(weights);
      writeFileSync(join(d, "model.safetensors"), bytes.subarray(0, bytes.length >> 1));
    } else symlinkSync(weights, join(d, "model.safetensors"));
    const cfg = JSON.parse(readFileSync(join(fixture, "config.json"), "utf8")) as Record<string, unknown>;
    if (name === "$BAD_HEADS") cfg.num_attention_heads = -4;
    if (name === "$LLAMA") cfg.model_type = "llama";
    writeFileSync(join(d, "config.json"), name === "$BAD_JSON" ? "{ not json" : JSON.stringify(cfg));
    return d;
  };
  return argv.map((a) => {
    let out = a.replaceAll("$SCRATCH", scratch);
    for (const p of DIRS) if (out.includes(p)) out = out.replaceAll(p, dir(p));
    return out;
  });
}
