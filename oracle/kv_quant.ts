// KV-cache quantization parity: the port's greedy generation with a quantized cache
// (model/cache/kv_quantize.ts hooked into generateStep) against mlx-vlm 0.7.10's own
// generate_step with kv_bits / kv_quant_scheme / quantized_kv_start, on a text fixture held by
// mlx-vlm's gemma4 Model (oracle/python/kv_quant_ref.py, a one-shot Python process per job).
//
// Compared per generated token: the token, the sha256 of its logprobs (as float32 bytes), and every
// cache entry: its type and offset, and for a TurboQuantKVCache the sha256, shape and dtype of
// each state array (key norms, key indices, value norms, value indices, sliced to the offset)
// and its meta_state; for a QuantizedKVCache (uniform) the same of its state (packed, scales,
// biases of keys then values) and meta_state. Unquantized caches are compared by type and offset only (their buffers
// are covered by the generation parity suites; any difference would show in the logprobs).
// Also: an error mlx-vlm raises (type and message) must be the port's, after the same tokens.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../model/cache/index.ts";
import { makeKvQuantizer } from "../model/cache/kv_quantize.ts";
import { QuantizedKVCache } from "../model/cache/kv_quantize_uniform.ts";
import { TurboQuantKVCache } from "../model/cache/turboquant.ts";
import { generateStep } from "../model/generate.ts";
import type { LoadedModel } from "../model/gemma4/index.ts";
import { generationModel } from "../model/runtime.ts";
import { DEFAULT_PYTHON, REPO_ROOT } from "./client.ts";

export const KV_QUANT_SCRIPT = join(REPO_ROOT, "oracle", "python", "kv_quant_ref.py");

/** One JSON job to kv_quant_ref.py, its JSON reply. */
export function kvQuantOracle(job: Record<string, unknown>, python = DEFAULT_PYTHON): any {
  const r = spawnSync(python, [KV_QUANT_SCRIPT], { input: JSON.stringify(job), encoding: "utf8", maxBuffer: 256 << 20 });
  if (r.status !== 0) throw new Error(`kv_quant_ref.py ${String(job.command)} failed (exit ${r.status}): ${r.stderr.slice(-2000)}`);
  return JSON.parse(r.stdout);
}

export interface KvQuantCase {
  checkpoint: string;
  prompt: number[];
  maxTokens: number;
  kvBits: number;
  kvQuantScheme: "uniform" | "turboquant";
  kvGroupSize?: number;
  quantizedKvStart: number;
  prefillStepSize: number;
}

interface ArrayRecord {
  shape: number[];
  dtype: string;
  sha256: string;
}

interface CacheRecord {
  type: string;
  offset: number;
  keys?: ArrayRecord[];
  values?: ArrayRecord[];
  meta_state?: string[];
}

export interface StepRecord {
  token: number;
  logprobs_sha256: string;
  cache: CacheRecord[];
}

export interface GenerationRecord {
  steps: StepRecord[];
  error: { type: string; message: string } | null;
}

function sha256(a: MlxArray): string {
  return createHash("sha256").update(a.toBytes()).digest("hex");
}

function arrayRecord(a: MlxArray): ArrayRecord {
  return { shape: a.shape, dtype: a.dtype, sha256: sha256(a) };
}

export function cacheRecord(c: KVCacheLike): CacheRecord {
  const rec: CacheRecord = { type: c.constructor.name, offset: c.offset };
  if (c instanceof QuantizedKVCache) {
    // mlx-vlm's QuantizedKVCache.state: (packed, scales, biases) of keys, then of values
    const st = c.state;
    try {
      rec.keys = st.slice(0, 3).map(arrayRecord);
      rec.values = st.slice(3, 6).map(arrayRecord);
    } finally {
      for (const a of st) a.dispose();
    }
    rec.meta_state = c.metaState;
  } else if (c instanceof TurboQuantKVCache) {
    const st = c.quantizedState;
    try {
      rec.keys = st.slice(0, 2).map(arrayRecord);
      rec.values = st.slice(2, 4).map(arrayRecord);
    } finally {
      for (const a of st) a.dispose();
    }
    rec.meta_state = c.metaState;
  }
  return rec;
}

/** The port's run of one case: per-token records, and the error (KVQuantError) if one stopped it. */
export async function portGeneration(loaded: LoadedModel, k: KvQuantCase): Promise<GenerationRecord> {
  const steps: StepRecord[] = [];
  let cacheRef: KVCacheLike[] = [];
  const model = generationModel(loaded);
  const cache = model.makeCache();
  cacheRef = cache;
  try {
    const quantizeCache = makeKvQuantizer({ kvBits: k.kvBits, kvQuantScheme: k.kvQuantScheme, kvGroupSize: k.kvGroupSize ?? 64, quantizedKvStart: k.quantizedKvStart }) ?? undefined;
    for await (const t of generateStep(model, k.prompt, { maxTokens: k.maxTokens, prefillStepSize: k.prefillStepSize, promptCache: cache, quantizeCache })) {
      // the oracle hashes lp.astype(float32)
      using lp32 = mx.astype(t.logprobs, "float32");
      steps.push({ token: t.token, logprobs_sha256: sha256(lp32), cache: cacheRef.map(cacheRecord) });
    }
    return { steps, error: null };
  } catch (e) {
    if (e instanceof Error && e.name === "KVQuantError") return { steps, error: { type: e.name, message: e.message } };
    // MLX's own error (e.g. a backend without the kernel): compared with mlx-vlm's, see sameMlxError
    if (e instanceof mx.MlxError) return { steps, error: { type: e.name, message: e.detail } };
    throw e;
  } finally {
    for (const c of cacheRef) c.dispose();
  }
}

function caseJob(k: KvQuantCase): Record<string, unknown> {
  return {
    checkpoint: k.checkpoint,
    prompt: k.prompt,
    max_tokens: k.maxTokens,
    kv_bits: k.kvBits,
    kv_quant_scheme: k.kvQuantScheme,
    kv_group_size: k.kvGroupSize ?? 64,
    quantized_kv_start: k.quantizedKvStart,
    prefill_step_size: k.prefillStepSize,
  };
}

export function oracleGeneration(k: KvQuantCase): GenerationRecord {
  return kvQuantOracle({ command: "generate", ...caseJob(k) });
}

/** Several cases in one Python process (the import and model load dominate a small case). */
export function oracleGenerations(cases: readonly KvQuantCase[]): GenerationRecord[] {
  return kvQuantOracle({ command: "generate_many", cases: cases.map(caseJob) }).results;
}

/** Python exception type names the port's errors stand for. */
const ERROR_TYPES: Record<string, string> = { NotImplementedError: "KVQuantError", ValueError: "KVQuantError" };

export interface KvQuantComparison {
  tokens: number;
  quantizedArrays: number;
  turboCaches: number;
  firstMismatch: string | null;
  /** MLX's message where both sides stopped at the same MLX error (see sameMlxError), else null. */
  unsupported: string | null;
}

/**
 * Both sides stopped at one MLX error with the same message: MLX's RuntimeError in Python, an
 * MlxError through the binding (a backend without a kernel for the shape, e.g. CUDA's
 * quantized_matmul at group size 32). The case is "unsupported on <backend>": counted apart,
 * never a pass.
 */
export function sameMlxError(port: { type: string; message: string } | null, ref: { type: string; message: string } | null): string | null {
  return port && ref && port.type === "MlxError" && ref.type === "RuntimeError" && port.message === ref.message ? ref.message : null;
}

/** Field by field, the first difference named. */
export function compareGenerations(port: GenerationRecord, ref: GenerationRecord): KvQuantComparison {
  let quantizedArrays = 0;
  const turbo = new Set<number>();
  const fail = (m: string): KvQuantComparison => ({ tokens: port.steps.length, quantizedArrays, turboCaches: turbo.size, firstMismatch: m, unsupported: null });
  if (port.steps.length !== ref.steps.length) return fail(`token count: port ${port.steps.length}, mlx-vlm ${ref.steps.length}`);
  for (let i = 0; i < ref.steps.length; i++) {
    const p = port.steps[i]!;
    const r = ref.steps[i]!;
    if (p.token !== r.token) return fail(`step ${i}: token ${p.token} vs ${r.token}`);
    if (p.logprobs_sha256 !== r.logprobs_sha256) return fail(`step ${i}: logprobs differ`);
    if (p.cache.length !== r.cache.length) return fail(`step ${i}: ${p.cache.length} caches vs ${r.cache.length}`);
    for (let j = 0; j < r.cache.length; j++) {
      const pc = p.cache[j]!;
      const rc = r.cache[j]!;
      if (pc.type !== rc.type || pc.offset !== rc.offset) return fail(`step ${i} cache ${j}: ${pc.type}@${pc.offset} vs ${rc.type}@${rc.offset}`);
      if (rc.type !== "TurboQuantKVCache" && rc.type !== "QuantizedKVCache") continue;
      turbo.add(j);
      if (JSON.stringify(pc.meta_state) !== JSON.stringify(rc.meta_state)) return fail(`step ${i} cache ${j}: meta_state ${JSON.stringify(pc.meta_state)} vs ${JSON.stringify(rc.meta_state)}`);
      for (const part of ["keys", "values"] as const) {
        const pa = pc[part] ?? [];
        const ra = rc[part] ?? [];
        if (pa.length !== ra.length) return fail(`step ${i} cache ${j} ${part}: ${pa.length} arrays vs ${ra.length}`);
        for (let a = 0; a < ra.length; a++) {
          quantizedArrays++;
          if (JSON.stringify(pa[a]) !== JSON.stringify(ra[a])) return fail(`step ${i} cache ${j} ${part}[${a}]: ${JSON.stringify(pa[a])} vs ${JSON.stringify(ra[a])}`);
        }
      }
    }
  }
  if ((port.error === null) !== (ref.error === null)) return fail(`error: port ${JSON.stringify(port.error)}, mlx-vlm ${JSON.stringify(ref.error)}`);
  const unsupported = sameMlxError(port.error, ref.error);
  if (port.error && ref.error && unsupported === null) {
    if (ERROR_TYPES[ref.error.type] !== port.error.type || port.error.message !== ref.error.message) return fail(`error: port ${JSON.stringify(port.error)}, mlx-vlm ${JSON.stringify(ref.error)}`);
  }
  return { tokens: port.steps.length, quantizedArrays, turboCaches: turbo.size, firstMismatch: null, unsupported };
}
