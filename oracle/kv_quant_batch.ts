// Batch generation with quantized KV caches: the port's mlx-vlm batch path
// (model/generate_batch_vlm.ts) against mlx-vlm 0.7.10's own BatchGenerator
// (oracle/python/kv_quant_ref.py batch_generate), call by call.
//
// Compared after every next() call: the sha256 of each logprobs matrix the greedy sampler saw
// (as float32 bytes), the responses (uid, token, the float32 bits of the token's logprob, finish
// reason), and every batch cache of the prompt batch (while prefilling) or of the generation batch:
// its type, per-row offsets and left padding, meta_state (BatchRotatingKVCache: max_size, _offset,
// _idx, rotated; BatchTurboQuantKVCache: _idx, bits, seed, key/value bits; BatchQuantizedKVCache:
// _idx, group size, bits) and the shape, dtype and sha256 of each array of its state's keys and
// values (BatchKVCache: keys/values up to _idx; BatchRotatingKVCache: the buffers, cut to _offset
// while shorter; TurboQuant: key norms, key indices, value norms, value indices up to _idx;
// uniform: packed, scales, biases of keys then values up to _idx). An error mlx-vlm raises must be
// the port's (type mapped, same message) after the same calls.
import { createHash } from "node:crypto";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type BatchCacheLike, BatchKVCache, BatchRotatingKVCache } from "../model/cache/batch.ts";
import { BatchQuantizedKVCache } from "../model/cache/kv_quantize_batch.ts";
import { BatchTurboQuantKVCache } from "../model/cache/turboquant_batch.ts";
import type { LoadedModel } from "../model/gemma4/index.ts";
import { VlmBatchGenerator, vlmLanguageModel } from "../model/generate_batch_vlm.ts";
import { kvQuantOracle, sameMlxError } from "./kv_quant.ts";

export interface KvQuantBatchCase {
  checkpoint: string;
  prompts: number[][];
  maxTokens: number[];
  kvBits: number | null;
  kvQuantScheme: "uniform" | "turboquant";
  kvGroupSize?: number;
  quantizedKvStart: number;
  prefillStepSize: number | null;
}

interface ArrayRecord {
  shape: number[];
  dtype: string;
  sha256: string;
}

export interface BatchCacheRecord {
  type: string;
  offset: number[];
  left_padding: number[];
  state: ArrayRecord[];
  meta_state?: string[];
}

export interface BatchCallRecord {
  logprobs_sha256: string[];
  responses: { uid: number; token: number; logprob: string; finish: string | null }[];
  cache: BatchCacheRecord[];
}

export interface BatchGenerationRecord {
  calls: BatchCallRecord[];
  error: { type: string; message: string } | null;
}

function sha256(a: MlxArray): string {
  if (a.dtype === "bfloat16") {
    using f = mx.astype(a, "float32");
    return createHash("sha256").update(f.toBytes()).digest("hex");
  }
  return createHash("sha256").update(a.toBytes()).digest("hex");
}

function rec(a: MlxArray): ArrayRecord {
  return { shape: a.shape, dtype: a.dtype, sha256: sha256(a) };
}

function cut(a: MlxArray, end: number): MlxArray {
  const s = a.shape;
  const stop = [...s];
  stop[2] = end;
  return mx.slice(a, s.map(() => 0), stop);
}

/** mlx-vlm's state[:2] leaves and meta_state of one batch cache. */
export function batchCacheRecord(c: BatchCacheLike): BatchCacheRecord {
  const out: BatchCacheRecord = { type: c.constructor.name, offset: c.offset.toNumbers(), left_padding: c.leftPadding.toNumbers(), state: [] };
  let arrays: MlxArray[] = [];
  if (c instanceof BatchTurboQuantKVCache || c instanceof BatchQuantizedKVCache) {
    arrays = c.quantizedState;
    out.meta_state = c.metaState;
  } else if (c instanceof BatchRotatingKVCache) {
    if (c.keys !== null && c.values !== null) {
      const end = c.processed < c.keys.shape[2]! ? c.processed : c.keys.shape[2]!;
      arrays = [cut(c.keys, end), cut(c.values, end)];
    }
    out.meta_state = [String(c.maxSize), String(c.processed), String(c.idx), c.rotated ? "True" : "False"];
  } else if (c instanceof BatchKVCache) {
    if (c.keys !== null && c.values !== null) arrays = [cut(c.keys, c.idx), cut(c.values, c.idx)];
    out.meta_state = [];
  } else {
    throw new Error(`batchCacheRecord: ${c.constructor.name}`);
  }
  try {
    out.state = arrays.map(rec);
  } finally {
    for (const a of arrays) a.dispose();
  }
  return out;
}

function f32hex(x: number): string {
  const b = new DataView(new ArrayBuffer(4));
  b.setFloat32(0, x, true);
  return b.getUint32(0, true).toString(16).padStart(8, "0");
}

/** The port's run of one case, recorded as the oracle records mlx-vlm's. */
export function portBatchGeneration(loaded: LoadedModel, k: KvQuantBatchCase): BatchGenerationRecord {
  const calls: BatchCallRecord[] = [];
  let g: VlmBatchGenerator | null = null;
  try {
    g = new VlmBatchGenerator(vlmLanguageModel(loaded), k.prompts, {
      maxTokens: k.maxTokens,
      prefillStepSize: k.prefillStepSize,
      kv: k.kvBits === null ? null : { kvBits: k.kvBits, kvQuantScheme: k.kvQuantScheme, kvGroupSize: k.kvGroupSize ?? 64, quantizedKvStart: k.quantizedKvStart },
    });
    while (g.hasWork && calls.length < 10_000) {
      const c = g.next();
      calls.push({
        logprobs_sha256: c.logprobs.map((a) => {
          using f = mx.astype(a, "float32");
          return sha256(f);
        }),
        responses: c.responses.map((r) => ({ uid: r.uid, token: r.token, logprob: f32hex(r.logprob), finish: r.finish })),
        cache: c.caches.map(batchCacheRecord),
      });
    }
    return { calls, error: null };
  } catch (e) {
    // MLX's own error text (the binding prefixes it with the op name)
    if (e instanceof mx.MlxError) return { calls, error: { type: e.name, message: e.detail } };
    if (e instanceof Error && (e.name === "KVQuantError" || e.name === "CacheError")) return { calls, error: { type: e.name, message: e.message } };
    throw e;
  } finally {
    g?.close();
  }
}

function caseJob(k: KvQuantBatchCase): Record<string, unknown> {
  return {
    command: "batch_generate",
    checkpoint: k.checkpoint,
    prompts: k.prompts,
    max_tokens: k.maxTokens,
    kv_bits: k.kvBits,
    kv_quant_scheme: k.kvQuantScheme,
    kv_group_size: k.kvGroupSize ?? 64,
    quantized_kv_start: k.quantizedKvStart,
    prefill_step_size: k.prefillStepSize,
  };
}

/** Several cases in one Python process, after the `prelude` jobs (e.g. building test fixtures; their replies are dropped). */
export function oracleBatchGenerations(cases: readonly KvQuantBatchCase[], prelude: Record<string, unknown>[] = []): BatchGenerationRecord[] {
  return kvQuantOracle({ command: "many", jobs: [...prelude, ...cases.map(caseJob)] }).results.slice(prelude.length);
}

export interface BatchComparison {
  calls: number;
  tokens: number;
  quantizedArrays: number;
  quantizedCaches: number;
  firstMismatch: string | null;
  /** MLX's message where both sides stopped at the same MLX error (kv_quant.ts sameMlxError), else null. */
  unsupported: string | null;
}

/** mlx-vlm exception types the port's errors stand for. */
const ERROR_TYPES: Record<string, string[]> = { ValueError: ["MlxError", "KVQuantError"], NotImplementedError: ["KVQuantError", "CacheError"], TypeError: ["KVQuantError"] };

/** Field by field, the first difference named. */
export function compareBatchGenerations(port: BatchGenerationRecord, ref: BatchGenerationRecord): BatchComparison {
  let quantizedArrays = 0;
  let tokens = 0;
  const quantized = new Set<number>();
  const fail = (m: string): BatchComparison => ({ calls: port.calls.length, tokens, quantizedArrays, quantizedCaches: quantized.size, firstMismatch: m, unsupported: null });
  if (port.calls.length !== ref.calls.length) return fail(`next() calls: port ${port.calls.length}, mlx-vlm ${ref.calls.length}`);
  for (let i = 0; i < ref.calls.length; i++) {
    const p = port.calls[i]!;
    const r = ref.calls[i]!;
    if (JSON.stringify(p.logprobs_sha256) !== JSON.stringify(r.logprobs_sha256)) return fail(`call ${i}: logprobs differ (${p.logprobs_sha256.length} vs ${r.logprobs_sha256.length} matrices)`);
    if (JSON.stringify(p.responses) !== JSON.stringify(r.responses)) return fail(`call ${i}: responses ${JSON.stringify(p.responses)} vs ${JSON.stringify(r.responses)}`);
    tokens += r.responses.length;
    if (p.cache.length !== r.cache.length) return fail(`call ${i}: ${p.cache.length} caches vs ${r.cache.length}`);
    for (let j = 0; j < r.cache.length; j++) {
      const pc = p.cache[j]!;
      const rc = r.cache[j]!;
      for (const f of ["type", "offset", "left_padding", "meta_state"] as const) {
        if (JSON.stringify(pc[f] ?? null) !== JSON.stringify(rc[f] ?? null)) return fail(`call ${i} cache ${j} (${rc.type}) ${f}: ${JSON.stringify(pc[f])} vs ${JSON.stringify(rc[f])}`);
      }
      if (pc.state.length !== rc.state.length) return fail(`call ${i} cache ${j} (${rc.type}): ${pc.state.length} state arrays vs ${rc.state.length}`);
      const isQ = rc.type === "BatchTurboQuantKVCache" || rc.type === "BatchQuantizedKVCache";
      if (isQ) quantized.add(j);
      for (let a = 0; a < rc.state.length; a++) {
        if (isQ) quantizedArrays++;
        if (JSON.stringify(pc.state[a]) !== JSON.stringify(rc.state[a])) return fail(`call ${i} cache ${j} (${rc.type}) state[${a}]: ${JSON.stringify(pc.state[a])} vs ${JSON.stringify(rc.state[a])}`);
      }
    }
  }
  if ((port.error === null) !== (ref.error === null)) return fail(`error: port ${JSON.stringify(port.error)}, mlx-vlm ${JSON.stringify(ref.error)}`);
  const unsupported = sameMlxError(port.error, ref.error);
  if (port.error && ref.error && unsupported === null) {
    if (!(ERROR_TYPES[ref.error.type] ?? []).includes(port.error.type) || port.error.message !== ref.error.message) return fail(`error: port ${JSON.stringify(port.error)}, mlx-vlm ${JSON.stringify(ref.error)}`);
  }
  return { calls: port.calls.length, tokens, quantizedArrays, quantizedCaches: quantized.size, firstMismatch: null, unsupported };
}
