// Conformance engine "llama.cpp" (npm node-llama-cpp, CPU, float32 GGUF, float32 KV cache): writes
// a level-0 conformance dump (oracle/conform/FORMAT.md) of one checkpoint: per model call the
// next-token log-probabilities over the whole vocabulary (`logprobs`, (1, L, V): node-llama-cpp
// gives probabilities, not raw logits) and, on decode steps, the greedy token.
//
//   bun engines/llama_cpp/dump.ts --checkpoint c1_dense/f32 --out DIR [--install]
//       [--prompt 2,17,33 | --seed N] [--prefill-step-size N --max-tokens N]
//
// The checkpoint is first copied into a form llama.cpp's converter accepts (prepare_checkpoint.py:
// the same weights, plus a tokenizer and two config keys) and converted to GGUF; the dump names
// that copy's files (manifest checkpoint.files), so compare it with
//   npm run conform -- --dump DIR --checkpoint <the "checkpoint" path printed on stdout>
// node-llama-cpp (~730 MB) installs into engines/llama_cpp/node_modules only with --install or
// CONFORM_ENGINES=llama_cpp. Exit 0: dump written; 2: bad usage or input, or the converter
// refused the checkpoint (one line on stderr); 1: the engine failed.
import { existsSync, readFileSync } from "node:fs";
import { isAbsolute, join, resolve } from "node:path";
import { checkpointHashes, type DumpManifest, type DumpSchedule, scheduleCalls, writeDump } from "../../oracle/conform/dump.ts";
import { ensureVenv, tokensFor } from "../../oracle/reference_export.ts";
import type { RawTensor } from "../../oracle/tensor_diff.ts";
import {
  ConversionRefused,
  ENGINE,
  EngineAborted,
  EngineUsageError,
  ensureConverter,
  ensureInstalled,
  ensureTool,
  llamaCppRelease,
  optedIn,
  type Prepared,
  prepareAndConvert,
  REPO,
  runCalls,
  runTaps,
} from "./engine.ts";

const CKPT_ROOT = join(REPO, ".cache", "checkpoints");

export interface LlamaDumpOptions {
  /** A checkpoint folder or a fixture id ("c1_dense/f32"). */
  checkpoint: string;
  out: string;
  prompt?: number[];
  seed: number;
  schedule: DumpSchedule;
  install: boolean;
  /** 0: node-llama-cpp's API (probabilities); 1: the C API's raw logits and residual stream (needs a C compiler). */
  level: 0 | 1;
}

export interface LlamaDumpResult {
  manifest: DumpManifest;
  /** The converter-ready copy the engine loaded: the checkpoint to compare the dump against. */
  checkpoint: string;
  prepared: Prepared;
  /** Every greedy token node-llama-cpp's sampler chose equals the argmax of the probabilities it returned. */
  samplerAgreesWithArgmax: boolean;
}

/** A checkpoint folder, or a fixture id of the checkpoint cache. */
export function resolveCheckpoint(ref: string): { dir: string; name: string } {
  const dir = isAbsolute(ref) || existsSync(join(ref, "config.json")) ? resolve(ref) : join(CKPT_ROOT, ref);
  if (!existsSync(join(dir, "config.json"))) throw new EngineUsageError(`--checkpoint ${ref}: no config.json there (a folder, or a fixture id under .cache/checkpoints made by npm run setup)`);
  const rel = dir.startsWith(`${CKPT_ROOT}/`) ? dir.slice(CKPT_ROOT.length + 1) : dir.split("/").slice(-2).join("/");
  return { dir, name: rel };
}

function textConfigOf(dir: string): Record<string, unknown> {
  const c = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  return (c.text_config ?? c) as Record<string, unknown>;
}

function layerCount(dir: string): number {
  const n = textConfigOf(dir).num_hidden_layers;
  if (typeof n !== "number" || !Number.isInteger(n) || n <= 0) throw new EngineUsageError(`${dir}/config.json: num_hidden_layers must be a positive integer`);
  return n;
}

function vocabOf(dir: string): number {
  const c = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  const t = (c.text_config ?? c) as Record<string, unknown>;
  const v = t.vocab_size;
  if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) throw new EngineUsageError(`${dir}/config.json: vocab_size must be a positive integer`);
  return v;
}

const f32 = (a: Float32Array, shape: number[]): RawTensor => ({ dtype: "float32", shape, data: new Uint8Array(a.buffer, a.byteOffset, a.byteLength) });
const i32 = (v: number): RawTensor => ({ dtype: "int32", shape: [1], data: new Uint8Array(Int32Array.of(v).buffer) });

/** Prepare, convert, run the schedule on llama.cpp and write the dump. */
export async function llamaDump(opts: LlamaDumpOptions): Promise<LlamaDumpResult> {
  const { dir: source, name } = resolveCheckpoint(opts.checkpoint);
  const vocab = vocabOf(source);
  const prompt = opts.prompt ?? tokensFor(vocab, opts.seed);
  if (prompt.length === 0 || prompt.some((t) => !Number.isInteger(t) || t < 0 || t >= vocab)) throw new EngineUsageError(`--prompt: token ids must be integers in [0, ${vocab})`);
  const version = ensureInstalled(opts.install);
  const converter = ensureConverter(version);
  const python = ensureVenv();
  const prepared = prepareAndConvert(python, converter, source, name);
  // the dump names the files the engine's GGUF was made from; the writer's own hashing must agree
  const hashes = checkpointHashes(prepared.dir);
  if (JSON.stringify(hashes) !== JSON.stringify(prepared.files)) throw new Error(`the prepared copy's hashes changed under us (${prepared.dir})`);

  const calls = scheduleCalls(prompt.length, opts.schedule);
  const maxTokens = opts.schedule.kind === "generate" ? opts.schedule.max_tokens : 0;
  // what each call feeds: prompt chunks, the last prompt token, then the previous greedy token
  let fed = 0;
  const feeds = calls.map((call) => {
    if (call.kind === "step") return call.index === 0 ? [prompt[prompt.length - 1]!] : null;
    fed += call.length;
    return prompt.slice(fed - call.length, fed);
  });
  const tensors: [string, RawTensor][] = [];
  const generated: number[] = [];
  let agrees = true;
  let buildType = "prebuilt";
  if (opts.level === 0) {
    const r = runCalls(prepared.gguf, vocab, feeds);
    agrees = r.samplerAgreesWithArgmax;
    buildType = r.buildType;
    calls.forEach((call, k) => {
      const L = r.greedy[k]!.length;
      tensors.push([`${call.prefix}logprobs`, f32(r.logprobs[k]!, [1, L, vocab])]);
      if (call.kind === "step") {
        const t = r.greedy[k]![0]!;
        tensors.push([`${call.prefix}token`, i32(t)]);
        if (call.index < maxTokens) generated.push(t);
      }
    });
  } else {
    const tool = ensureTool("llama_taps", converter);
    const r = runTaps(tool, prepared.gguf, vocab, feeds);
    const nLayers = layerCount(source);
    calls.forEach((call, k) => {
      const c = r[k]!;
      const L = feeds[k]?.length ?? 1;
      tensors.push([`${call.prefix}logits`, f32(c.logits, [1, L, vocab])]);
      if (call.kind === "step") {
        tensors.push([`${call.prefix}token`, i32(c.greedy)]);
        if (call.index < maxTokens) generated.push(c.greedy);
      }
      // llama.cpp's callback names -> the tap scheme's residual stream (ggml's ne[0] = hidden is the fastest axis)
      const names: [string, string][] = [["inp_scaled", "embed_scaled"], ...Array.from({ length: nLayers }, (_, i): [string, string] => [`l_out-${i}`, `layers.${i}/output`]), ["result_norm", "norm"]];
      for (const [from, to] of names) {
        const v = c.taps.get(from);
        if (!v) throw new Error(`llama.cpp's eval callback gave no ${from} on call ${k}`);
        tensors.push([`${call.prefix}${to}`, f32(v, [1, L, v.length / L])]);
      }
    });
  }
  const manifest = writeDump(
    opts.out,
    {
      engine: { name: ENGINE, version: `node-llama-cpp ${version} (llama.cpp ${llamaCppRelease()}, ${buildType} CPU)`, device: "cpu", dtype: "float32" },
      checkpoint: { files: prepared.files },
      prompt,
      schedule: opts.schedule,
      level: opts.level,
      ...(opts.schedule.kind === "generate" ? { generated } : {}),
      notes:
        `llama.cpp through node-llama-cpp ${version}: GGUF converted with --outtype f32 by the converter shipped in the package, F32 KV cache (flash attention off), 1 thread. ` +
        (opts.level === 0
          ? `logprobs = log of node-llama-cpp's full-vocabulary probabilities (float32 softmax of the raw logits, greedy sampler at temperature 0). `
          : `Level 1 through llama.cpp's C API (engines/llama_cpp/llama_taps.c on the package's libllama): raw logits, and the eval callback's inp_scaled, l_out-<i>, result_norm as embed_scaled, layers.<i>/output, norm. `) +
        `Checkpoint: a converter-ready copy of ${name} (prepare_checkpoint.py: same weights${prepared.rewrittenMoeLayout.length ? ", experts rewritten in HF's layout" : ""}, a synthetic tokenizer, architectures and attn_logit_softcapping keys).`,
    },
    tensors,
  );
  return { manifest, checkpoint: prepared.dir, prepared, samplerAgreesWithArgmax: agrees };
}

const USAGE =
  "usage: bun engines/llama_cpp/dump.ts --checkpoint DIR|FIXTURE_ID --out DIR [--install] [--level 0|1] [--prompt 2,5,9 | --seed N] [--prefill-step-size N --max-tokens N]";

export function parseFlags(argv: readonly string[], env: Record<string, string | undefined> = process.env): LlamaDumpOptions {
  const v: Record<string, string> = {};
  let install = optedIn(env);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--install") {
      install = true;
      continue;
    }
    if (!["--checkpoint", "--out", "--prompt", "--seed", "--prefill-step-size", "--max-tokens", "--level"].includes(a)) throw new EngineUsageError(`unknown flag ${a}\n${USAGE}`);
    const val = argv[++i];
    if (val === undefined || val.startsWith("--")) throw new EngineUsageError(`${a} needs a value\n${USAGE}`);
    v[a.slice(2)] = val;
  }
  if (!v.checkpoint || !v.out) throw new EngineUsageError(`--checkpoint and --out are required\n${USAGE}`);
  const int = (k: string, min: number): number | undefined => {
    if (v[k] === undefined) return undefined;
    const n = Number(v[k]);
    if (!Number.isSafeInteger(n) || n < min) throw new EngineUsageError(`--${k} must be an integer >= ${min}, got ${v[k]}`);
    return n;
  };
  const prompt = v.prompt?.split(",").map((s) => {
    if (!/^\d+$/.test(s.trim())) throw new EngineUsageError(`--prompt must be comma-separated token ids, got ${JSON.stringify(s)}`);
    return Number(s);
  });
  const step = int("prefill-step-size", 1);
  const max = int("max-tokens", 1);
  if ((step === undefined) !== (max === undefined)) throw new EngineUsageError("--prefill-step-size and --max-tokens go together (a generate schedule); neither gives a forward");
  const schedule: DumpSchedule = step !== undefined && max !== undefined ? { kind: "generate", prefill_step_size: step, max_tokens: max } : { kind: "forward" };
  const level = int("level", 0) ?? 0;
  if (level !== 0 && level !== 1) throw new EngineUsageError(`--level must be 0 (node-llama-cpp's API) or 1 (llama.cpp's C API; needs a C compiler), got ${level}`);
  return { checkpoint: v.checkpoint, out: resolve(v.out), prompt, seed: int("seed", 0) ?? 1, schedule, install, level };
}

async function main(): Promise<number> {
  let opts: LlamaDumpOptions;
  try {
    opts = parseFlags(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`${(e as Error).message}\n`);
    return 2;
  }
  try {
    const r = await llamaDump(opts);
    process.stdout.write(`${JSON.stringify({ dump: opts.out, checkpoint: r.checkpoint, level: r.manifest.level, generated: r.manifest.generated ?? [], sampler_agrees_with_argmax: r.samplerAgreesWithArgmax })}\n`);
    return 0;
  } catch (e) {
    if (e instanceof EngineUsageError || e instanceof ConversionRefused || (e as Error).name === "DumpError") {
      process.stderr.write(`${(e as Error).message}\n`);
      return 2;
    }
    if (e instanceof EngineAborted) {
      process.stderr.write(`${e.message}\n`);
      return 1;
    }
    process.stderr.write(`llama.cpp dump failed: ${(e as Error).stack ?? e}\n`);
    return 1;
  }
}

if (import.meta.main) process.exit(await main());
