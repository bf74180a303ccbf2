// Conformance engine "transformers": Hugging Face transformers' Gemma 4 (PyTorch, CPU, float32 or
// bfloat16) runs one forward over a prompt on a fixture checkpoint; engines/transformers/hf_dump.py
// reads its intermediate values through module hooks, named by the tap scheme (oracle/TAPS.md),
// and this entry writes them as a conformance dump (oracle/conform/FORMAT.md) with the shared
// writer. The model is the independent reference's (oracle/python/reference_export.py,
// build_model); torch and transformers live in the on-demand .venv-reference (ensureVenv).
//
//   bun engines/transformers/dump.ts --checkpoint c1_dense/f32 --out DIR [--dtype bfloat16]
//                                    [--prompt 2,17,33 | --seed N] [--prefill-step-size 4 --max-tokens 6]
// (the last two: mlx-lm's generate_step schedule on transformers' own cache, instead of a forward)
// Exit 0: dump written; 2: bad usage or input (one line on stderr); 1: the engine failed.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { isAbsolute, join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadConfig } from "../../model/gemma4/index.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { callTaps, checkpointHashes, type DumpLevel, type DumpManifest, type DumpSchedule, levelTaps, scheduleCalls, writeDump } from "../../oracle/conform/dump.ts";
import { ensureVenv, TOKENS, tokensFor } from "../../oracle/reference_export.ts";

export const ENGINE = "transformers";
export type TorchDtype = "float32" | "bfloat16";
const SCRIPT = join(REPO_ROOT, "engines", "transformers", "hf_dump.py");
const CKPT_ROOT = join(REPO_ROOT, ".cache", "checkpoints");

export class EngineUsageError extends Error {
  override readonly name = "EngineUsageError";
}

/** A checkpoint folder, or a fixture id ("c1_dense/f32") of the checkpoint cache. */
export function resolveCheckpoint(ref: string): string {
  const dir = isAbsolute(ref) || existsSync(join(ref, "config.json")) ? resolve(ref) : join(CKPT_ROOT, ref);
  if (!existsSync(join(dir, "config.json"))) throw new EngineUsageError(`--checkpoint ${ref}: no config.json there (a folder, or a fixture id under .cache/checkpoints made by npm run setup)`);
  return dir;
}

export interface TransformersDumpResult {
  manifest: DumpManifest;
  versions: Record<string, string>;
  /** Tap names of the scheme this engine could not read (none expected for a forward). */
  notRead: string[];
  /** Parameters transformers has and the checkpoint leaves out (unused ones only; others are refused). */
  missingUnused: string[];
}

/** The prompt the reference uses for a checkpoint: 16 seeded ids (oracle/reference_export.ts). */
export function seededPrompt(checkpointDir: string, seed = 1): number[] {
  return tokensFor(loadConfig(checkpointDir).args.vocab_size, seed);
}

/** The highest level whose every name is present in every required call of the schedule. */
export function levelOf(config: Record<string, unknown>, length: number, present: ReadonlySet<string>, schedule: DumpSchedule = { kind: "forward" }): DumpLevel | null {
  const calls = scheduleCalls(length, schedule).filter((c) => c.required);
  for (const level of [2, 1, 0] as const) if (calls.every((c) => levelTaps(config, c, level).every((n) => present.has(c.prefix + n)))) return level;
  return null;
}

export interface HfRun {
  /** The folder holding tensors.safetensors (float64 values as uint64 bit patterns); remove it with dispose(). */
  dir: string;
  versions: Record<string, string>;
  written: string[];
  notRead: string[];
  /** generate: the greedy tokens of step0..step{max_tokens-1}. */
  generated: number[];
  missingUnused: string[];
  dispose(): void;
}

/**
 * Runs hf_dump.py: one transformers forward of `prompt` on the checkpoint in `dtype` (float64 only
 * for the noise-floor measurement: it is never a dump), every tap of the scheme it can read.
 */
export function runTransformers(dir: string, prompt: number[], dtype: TorchDtype | "float64", schedule: DumpSchedule = { kind: "forward" }): HfRun {
  const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  const { args } = loadConfig(dir);
  const vocab = args.vocab_size;
  const bad = prompt.find((t) => !Number.isInteger(t) || t < 0 || t >= vocab);
  if (prompt.length === 0 || bad !== undefined) throw new EngineUsageError(`prompt: token ids must be integers in [0, ${vocab}); got ${bad ?? "none"}`);
  if (schedule.kind === "generate" && prompt.length < 1) throw new EngineUsageError("a generate schedule needs a prompt");
  const taps = scheduleCalls(prompt.length, schedule).flatMap((c) => callTaps(config, c).map((n) => c.prefix + n));
  const py = ensureVenv();
  const tmp = join(REPO_ROOT, ".cache", `transformers-run-${process.pid}-${runSeq++}`);
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  const dispose = () => rmSync(tmp, { recursive: true, force: true });
  try {
    writeFileSync(join(tmp, "job.json"), JSON.stringify({ id: dir, dir, args, tokens: prompt, dtype, taps, schedule }));
    const r = spawnSync(py, [SCRIPT, join(tmp, "job.json"), tmp], { cwd: REPO_ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 26 });
    if (r.error || r.status !== 0) throw new Error(`transformers (hf_dump.py) failed: ${r.error?.message ?? `exit ${r.status}`}\n${(r.stderr ?? "").trim().split("\n").slice(-6).join("\n")}`);
    const out = JSON.parse(r.stdout.trim().split("\n").pop()!) as { versions: Record<string, string>; written: string[]; not_read: string[]; generated: number[]; missing_unused: string[] };
    return { dir: tmp, versions: out.versions, written: out.written, notRead: out.not_read, generated: out.generated, missingUnused: out.missing_unused, dispose };
  } catch (e) {
    dispose();
    throw e;
  }
}
let runSeq = 0;

/** Runs transformers on one forward and writes the dump to `out` (replacing a dump there). */
export function transformersDump(opts: { checkpoint: string; out: string; dtype: TorchDtype; prompt: number[]; schedule?: DumpSchedule }): TransformersDumpResult {
  const schedule = opts.schedule ?? { kind: "forward" };
  const dir = opts.checkpoint;
  const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  const run = runTransformers(dir, opts.prompt, opts.dtype, schedule);
  try {
    const st = mx.loadSafetensors(join(run.dir, "tensors.safetensors"));
    try {
      const level = levelOf(config, opts.prompt.length, new Set(run.written), schedule);
      if (level === null) throw new Error(`transformers gave no logits (read ${run.written.length} taps)`);
      const manifest = writeDump(
        opts.out,
        {
          engine: { name: ENGINE, version: run.versions.transformers!, device: "cpu", dtype: opts.dtype },
          checkpoint: { files: checkpointHashes(dir) },
          prompt: opts.prompt,
          schedule,
          level,
          ...(schedule.kind === "generate" ? { generated: run.generated } : {}),
          notes: `torch ${run.versions.torch}, eager attention and experts, one thread${schedule.kind === "generate" ? ", transformers' DynamicCache" : ""}; taps read through module hooks (engines/transformers/README.md)${run.notRead.length ? `; not read: ${run.notRead.length > 40 ? `${run.notRead.slice(0, 40).join(", ")} and ${run.notRead.length - 40} more` : run.notRead.join(", ")}` : ""}`,
        },
        run.written.map((n) => [n, st.arrays.get(n)!] as [string, mx.MlxArray]),
      );
      return { manifest, versions: run.versions, notRead: run.notRead, missingUnused: run.missingUnused };
    } finally {
      for (const a of st.arrays.values()) a.dispose();
    }
  } finally {
    run.dispose();
  }
}

const FLAG_NAMES = ["--checkpoint", "--out", "--dtype", "--prompt", "--seed", "--prefill-step-size", "--max-tokens"];

function parseFlags(argv: readonly string[]): { checkpoint: string; out: string; dtype: TorchDtype; prompt?: number[]; seed: number; schedule: DumpSchedule } {
  const v: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!FLAG_NAMES.includes(a)) throw new EngineUsageError(`unknown flag ${a} (flags: ${FLAG_NAMES.join(" ")})`);
    const val = argv[++i];
    if (val === undefined) throw new EngineUsageError(`${a} needs a value`);
    v[a.slice(2)] = val;
  }
  if (!v.checkpoint || !v.out) throw new EngineUsageError("--checkpoint and --out are required");
  const dtype = (v.dtype ?? "float32") as TorchDtype;
  if (dtype !== "float32" && dtype !== "bfloat16") throw new EngineUsageError(`--dtype must be float32 or bfloat16, got ${v.dtype}`);
  const prompt = v.prompt?.split(",").map((s) => Number(s.trim()));
  if (prompt?.some((t) => !Number.isInteger(t))) throw new EngineUsageError(`--prompt must be comma-separated token ids, got ${v.prompt}`);
  const seed = Number(v.seed ?? 1);
  if (!Number.isInteger(seed) || seed < 0) throw new EngineUsageError(`--seed must be a non-negative integer, got ${v.seed}`);
  const nat = (flag: string, val: string | undefined) => {
    const n = Number(val);
    if (!Number.isInteger(n) || n < 1) throw new EngineUsageError(`--${flag} must be a positive integer, got ${val}`);
    return n;
  };
  if ((v["max-tokens"] === undefined) !== (v["prefill-step-size"] === undefined)) throw new EngineUsageError("--max-tokens and --prefill-step-size go together (a generate schedule)");
  const schedule: DumpSchedule = v["max-tokens"] === undefined ? { kind: "forward" } : { kind: "generate", prefill_step_size: nat("prefill-step-size", v["prefill-step-size"]), max_tokens: nat("max-tokens", v["max-tokens"]) };
  return { checkpoint: v.checkpoint, out: v.out, dtype, prompt, seed, schedule };
}

if (import.meta.main) {
  try {
    const f = parseFlags(process.argv.slice(2));
    const dir = resolveCheckpoint(f.checkpoint);
    const prompt = f.prompt ?? seededPrompt(dir, f.seed);
    const r = transformersDump({ checkpoint: dir, out: resolve(f.out), dtype: f.dtype, prompt, schedule: f.schedule });
    process.stderr.write(`[transformers] ${f.checkpoint} ${f.dtype}: level ${r.manifest.level}, ${r.manifest.tensors.length} tensors (${TOKENS === prompt.length ? "seeded" : "given"} prompt of ${prompt.length})${r.notRead.length ? `; not read: ${r.notRead.join(", ")}` : ""} -> ${f.out}\n`);
    process.exit(0);
  } catch (e) {
    const usage = e instanceof EngineUsageError || (e as Error).name === "DumpError" || (e as Error).name === "ConfigError";
    process.stderr.write(`error: ${(e as Error).message}\n`);
    process.exit(usage ? 2 : 1);
  }
}
