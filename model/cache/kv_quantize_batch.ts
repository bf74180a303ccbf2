// The batch path's KV quantization in mlx-vlm 0.7.10 (generate/ar.py _make_cache, models/cache.py
// BatchQuantizedKVCache, models/base.py quantized_scaled_dot_product_attention), on the plain path.
//
// The conversion rule differs from the single-sequence one (kv_quantize.ts):
// - the batch caches are chosen once, when the prompt batch is built, from model.make_cache():
//   an entry that is a KVCache (full attention) becomes a quantized batch cache when kv_bits is set
//   and should_quantize_kv_layer(i, n) holds (every entry but the last when there are more than
//   two); otherwise a BatchKVCache. A RotatingKVCache (sliding layers) becomes a
//   BatchRotatingKVCache, unquantized, for every scheme: so uniform quantization RUNS on Gemma 4
//   in the batch path, where the single-sequence path stops with "RotatingKVCache Quantization NYI".
// - TurboQuant (fractional bits or scheme "turboquant"): a BatchTurboQuantKVCache from the first
//   token, unless quantized_kv_start > 0 and the longest prompt is shorter than it ("defer_turbo"):
//   then a plain BatchKVCache that is never converted later (the batch path has no
//   maybe_quantize_kv_cache).
// - Uniform: a BatchQuantizedKVCache(left_padding, group_size, int(kv_bits)) from the first token,
//   whatever quantized_kv_start; mx.quantize checks the group size against the head dim at the
//   first update.
// - Mixed key/value schemes: NotImplementedError in mlx-vlm; refused here with its message.
//
// KV sharing: a KV-shared layer attends over its donor's update_and_fetch result; with a quantized
// donor that is mlx-vlm's proxy/tuple state, which fails inside attention (see kv_quantize.ts).
// kvSharedBatchConflict names such a donor so the generator refuses before running.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { fromLegacy, KVQuantError, type LegacyKVQuantArgs, turboquantEnabled } from "../kv_quant.ts";
import type { Mask } from "../mask.ts";
import { type BatchCacheLike, BatchKVCache, BatchRotatingKVCache } from "./batch.ts";
import { CacheError, KVCache, type KVCacheLike, RotatingKVCache } from "./index.ts";
import { QuantizedBatchCacheBase } from "./batch_quantized.ts";
import { sharedDonors } from "./kv_quantize.ts";
import { disposeTriple, type QuantTriple, quantizedScaledDotProductAttention, reserveQuantized, sliceTokens, writeTokens } from "./kv_quantize_uniform.ts";
import type { QuantizedAttentionCache, TurboQuantOptions } from "./turboquant.ts";
import { BatchTurboQuantKVCache } from "./turboquant_batch.ts";

/** models/cache.py should_quantize_kv_layer: all layers of a shallow stack, else all but the last. */
export function shouldQuantizeKvLayer(layerIdx: number, numLayers: number): boolean {
  if (numLayers <= 2) return true;
  return layerIdx < numLayers - 1;
}

type Triple = QuantTriple;

/**
 * BatchQuantizedKVCache: BatchKVCache's bookkeeping over mx.quantize'd keys and values (packed
 * uint32, scales, biases; the scales and biases in the keys' dtype), grown by 256 columns.
 */
export class BatchQuantizedKVCache extends QuantizedBatchCacheBase<Triple> implements QuantizedAttentionCache {
  static readonly step = 256;
  protected readonly prefillRefusal = "right-padded (APC) prefill is not ported";
  protected readonly extendRefusal = "continuous batching with quantized caches is not ported";

  constructor(
    leftPadding: readonly number[],
    readonly groupSize = 64,
    readonly bits = 8,
  ) {
    super("BatchQuantizedKVCache", leftPadding);
  }

  get batchSize(): number {
    return this.keys !== null ? this.keys[0].shape[0]! : this.leftPadding.shape[0]!;
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (keys.shape.length !== 4 || values.shape.length !== 4) throw new CacheError("BatchQuantizedKVCache.updateAndFetch", "keys and values must be 4-D (B, n_kv_heads, S, head_dim)");
    const S = keys.shape[2]!;
    const prev = this.idx;
    reserveQuantized(this, keys, values, prev, BatchQuantizedKVCache.step);
    const off = mx.add(this.offset, S);
    this.offset.dispose();
    this.offset = off;
    this.idx += S;
    const qk = mx.quantize(keys, { groupSize: this.groupSize, bits: this.bits }) as Triple;
    const qv = mx.quantize(values, { groupSize: this.groupSize, bits: this.bits }) as Triple;
    try {
      this.keys = writeTokens(this.keys!, qk, prev, this.idx);
      this.values = writeTokens(this.values!, qv, prev, this.idx);
    } finally {
      disposeTriple(qk);
      disposeTriple(qv);
    }
    // stand-ins for the (packed, scales, biases) tuples: attention goes through quantizedAttention
    return [sliceTokens(this.keys[0], 0, this.idx), sliceTokens(this.values[0], 0, this.idx)];
  }

  /** The (packed, scales, biases) of keys then values, up to idx (caller-owned). */
  get quantizedState(): MlxArray[] {
    if (this.keys === null || this.values === null) return [];
    return [...this.keys, ...this.values].map((a) => sliceTokens(a, 0, this.idx));
  }

  /** meta_state: (_idx, group_size, bits) as str. */
  get metaState(): string[] {
    return [String(this.idx), String(this.groupSize), String(this.bits)];
  }

  /** models/base.py quantized_scaled_dot_product_attention over the state up to idx, with the batch mask. */
  quantizedAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray {
    if (this.keys === null || this.values === null) throw new CacheError("BatchQuantizedKVCache", "attention over an empty cache");
    const st = this.quantizedState;
    try {
      return quantizedScaledDotProductAttention(queries, st.slice(0, 3), st.slice(3, 6), scale, mask, this.groupSize, this.bits);
    } finally {
      for (const a of st) a.dispose();
    }
  }

  protected mapState(t: Triple, fn: (a: MlxArray) => MlxArray): Triple {
    return t.map(fn) as Triple;
  }

  protected disposeState(t: Triple | null): void {
    disposeTriple(t);
  }
}

export interface BatchKVQuantConfig extends LegacyKVQuantArgs {
  quantizedKvStart: number;
  turbo?: Pick<TurboQuantOptions, "rotation" | "seed">;
}

/**
 * The layers mlx-vlm's batch path would quantize whose caches KV-shared layers read (their
 * attention then fails in mlx-vlm: TypeError inside scaled_dot_product_attention); null when none.
 */
export function kvSharedBatchConflict(layerTypes: readonly string[], numKvShared: number): { donor: number; readers: number[] } | null {
  const n = layerTypes.length - numKvShared;
  for (const [d, readers] of sharedDonors(layerTypes, numKvShared)) {
    if (layerTypes[d] === "full_attention" && shouldQuantizeKvLayer(d, n)) return { donor: d, readers };
  }
  return null;
}

/**
 * _make_cache(model, left_padding, kv_bits=..., prefill_length=...): the batch caches for the
 * single-sequence caches `single` (model.make_cache(), which this function disposes).
 */
export function makeBatchCaches(single: KVCacheLike[], leftPadding: readonly number[], cfg: BatchKVQuantConfig | null, prefillLength: number): BatchCacheLike[] {
  const out: BatchCacheLike[] = [];
  try {
    const policy = cfg === null ? null : fromLegacy(cfg);
    if (policy !== null && !policy.isHomogeneous) {
      throw new KVQuantError("mixed key/value KV quantization schemes are not supported on the batch path yet; run with a single --kv-quant-scheme or disable continuous batching");
    }
    const kvBits = cfg?.kvBits ?? null;
    const useTurbo = kvBits !== null && turboquantEnabled(kvBits, cfg!.kvQuantScheme ?? null);
    const deferTurbo = useTurbo && cfg!.quantizedKvStart > 0 && prefillLength < cfg!.quantizedKvStart;
    const quantCache = (): BatchCacheLike => {
      if (useTurbo) {
        if (deferTurbo) return new BatchKVCache(leftPadding);
        return new BatchTurboQuantKVCache(leftPadding, kvBits!, { ...cfg!.turbo, keyBits: cfg!.kvKeyBits ?? null, valueBits: cfg!.kvValueBits ?? null });
      }
      return new BatchQuantizedKVCache(leftPadding, cfg!.kvGroupSize ?? 64, Math.trunc(kvBits!));
    };
    const n = single.length;
    for (let i = 0; i < n; i++) {
      const c = single[i]!;
      const quantize = shouldQuantizeKvLayer(i, n);
      if (c instanceof RotatingKVCache) {
        if (c.keep > 0) throw new KVQuantError("RotatingKVCache with keep tokens is not supported.");
        out.push(new BatchRotatingKVCache(c.maxSize, leftPadding));
      } else if (c instanceof KVCache) {
        out.push(kvBits !== null && quantize ? quantCache() : new BatchKVCache(leftPadding));
      } else {
        throw new KVQuantError(`${c.constructor.name} does not yet support batching`);
      }
    }
    return out;
  } catch (e) {
    for (const c of out) c.dispose();
    throw e;
  } finally {
    for (const c of single) c.dispose();
  }
}
