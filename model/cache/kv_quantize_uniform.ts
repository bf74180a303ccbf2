// The uniform scheme of mlx-vlm 0.7.10 on the single-sequence path: models/cache.py
// QuantizedKVCache and KVCache.to_quantized, and models/base.py
// quantized_scaled_dot_product_attention (also used by the batch path's BatchQuantizedKVCache).
//
// When it runs on Gemma 4: generate/common.py maybe_quantize_kv_cache converts, in layer order,
// every cache with to_quantized whose offset reached quantized_kv_start (the last cache
// included). A sliding layer's RotatingKVCache raises NotImplementedError("RotatingKVCache
// Quantization NYI"), so only a shape whose caches are all full attention (KVCache) gets there:
// every released Gemma 4 has sliding layers; the test builds an all-full-attention fixture.
//
// - to_quantized quantizes the KVCache's whole buffer (its capacity, a multiple of 256 columns,
//   zeros past the offset included), not the keys up to the offset;
// - QuantizedKVCache grows by 256 columns (zeros: packed uint32, scales and biases in the keys'
//   dtype) and writes mx.quantize(new keys) at [offset, offset + S);
// - it has no make_mask: base.py create_attention_mask falls back to None for one token, a
//   causal array when asked for an array (or past a window), else "causal";
// - attention: queries * scale, grouped (B, n_kv_heads, repeats, L, D) with the state expanded on
//   axis -3, quantized_matmul against the keys (transposed), the mask aligned to the grouped scores
//   and applied with finfo.min (a "causal" string becomes arange(kL - qL, kL) >= arange(kL)), a
//   precise softmax, quantized_matmul with the values.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { createCausalMask, type Mask, type MakeMaskOptions } from "../mask.ts";
import { CacheError, KVCache, type KVCacheLike } from "./index.ts";
import type { QuantizedAttentionCache } from "./turboquant.ts";

export type QuantTriple = [MlxArray, MlxArray, MlxArray];

export function disposeTriple(t: QuantTriple | null): void {
  if (t) for (const a of t) a.dispose();
}

/** a[:, :, start:end] on the token axis. */
export function sliceTokens(a: MlxArray, start: number, end: number): MlxArray {
  const s = a.shape;
  const st = s.map(() => 0);
  st[2] = start;
  const stop = [...s];
  stop[2] = end;
  return mx.slice(a, st, stop);
}

/** quantized_scaled_dot_product_attention(queries, q_keys, q_values, scale, mask, group_size, bits). */
export function quantizedScaledDotProductAttention(queries: MlxArray, qKeys: readonly MlxArray[], qValues: readonly MlxArray[], scale: number, mask: Mask, groupSize: number, bits: number): MlxArray {
  const [B, Hq, L, D] = queries.shape as [number, number, number, number];
  using stack = new DisposableStack();
  let qk = [...qKeys];
  let qv = [...qValues];
  const Hkv = qk[0]!.shape[qk[0]!.ndim - 3]!;
  const R = Hq / Hkv;
  let q = stack.use(mx.multiply(queries, scale));
  if (R > 1) {
    q = stack.use(mx.reshape(q, [B, Hkv, R, L, D]));
    qk = qk.map((x) => stack.use(mx.expandDims(x, -3)));
    qv = qv.map((x) => stack.use(mx.expandDims(x, -3)));
  }
  let scores = stack.use(mx.quantizedMatmul(q, qk[0]!, qk[1]!, qk[2]!, { transpose: true, groupSize, bits }));
  if (mask !== null) {
    let m: MlxArray;
    if (mask === "causal") {
      const qL = scores.shape[scores.ndim - 2]!;
      const kL = scores.shape[scores.ndim - 1]!;
      const qi0 = stack.use(mx.arange(kL - qL, kL));
      const ki0 = stack.use(mx.arange(kL));
      const qi = stack.use(mx.expandDims(qi0, 1));
      const ki = stack.use(mx.expandDims(ki0, 0));
      m = stack.use(mx.greaterEqual(qi, ki));
    } else {
      m = mask;
    }
    // align_attention_mask_to_scores: size-1 axes before (L, K) until the ranks match
    while (m.ndim < scores.ndim) m = stack.use(mx.expandDims(m, Math.max(m.ndim - 2, 0)));
    if (m.dtype === "bool") scores = stack.use(mx.where(m, scores, mx.finfo(scores.dtype).min));
    else scores = stack.use(mx.add(scores, m));
  }
  const sm = stack.use(mx.softmax(scores, -1, true));
  const out = mx.quantizedMatmul(sm, qv[0]!, qv[1]!, qv[2]!, { transpose: false, groupSize, bits });
  if (R > 1) {
    using o = out;
    return mx.reshape(o, [B, Hq, L, D]);
  }
  return out;
}

export class QuantizedKVCache implements KVCacheLike, QuantizedAttentionCache {
  static readonly step = 256;
  keys: QuantTriple | null = null;
  values: QuantTriple | null = null;
  offset = 0;

  constructor(
    readonly groupSize = 64,
    readonly bits = 8,
  ) {}

  /** KVCache.to_quantized(group_size, bits): the whole buffer quantized, the offset kept. */
  static fromKVCache(c: KVCache, groupSize: number, bits: number): QuantizedKVCache {
    const q = new QuantizedKVCache(groupSize, bits);
    q.offset = c.offset;
    if (c.keys !== null && c.values !== null) {
      q.keys = mx.quantize(c.keys, { groupSize, bits }) as QuantTriple;
      q.values = mx.quantize(c.values, { groupSize, bits }) as QuantTriple;
    }
    return q;
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (keys.shape.length !== 4 || values.shape.length !== 4) throw new CacheError("QuantizedKVCache.updateAndFetch", "keys and values must be 4-D (B, n_kv_heads, S, head_dim)");
    const S = keys.shape[2]!;
    const prev = this.offset;
    reserveQuantized(this, keys, values, prev, QuantizedKVCache.step);
    this.offset += S;
    const qk = mx.quantize(keys, { groupSize: this.groupSize, bits: this.bits }) as QuantTriple;
    const qv = mx.quantize(values, { groupSize: this.groupSize, bits: this.bits }) as QuantTriple;
    try {
      this.keys = writeTokens(this.keys!, qk, prev, this.offset);
      this.values = writeTokens(this.values!, qv, prev, this.offset);
    } finally {
      disposeTriple(qk);
      disposeTriple(qv);
    }
    // stand-ins for the (packed, scales, biases) tuples: attention goes through quantizedAttention
    return [sliceTokens(this.keys[0], 0, this.offset), sliceTokens(this.values[0], 0, this.offset)];
  }

  /** No make_mask in mlx-vlm's class: create_attention_mask's fallback. */
  makeMask(N: number, { windowSize = null, returnArray = false }: MakeMaskOptions = {}): Mask {
    if (N === 1) return null;
    if (returnArray || (windowSize && N > windowSize)) return createCausalMask(N, 0, windowSize ?? null);
    return "causal";
  }

  /** state: the (packed, scales, biases) of keys then values, cut to the offset unless it fills the buffer (caller-owned). */
  get state(): MlxArray[] {
    if (this.keys === null || this.values === null) return [];
    const full = this.offset === this.keys[0].shape[2]!;
    return [...this.keys, ...this.values].map((a) => (full ? mx.alias(a) : sliceTokens(a, 0, this.offset)));
  }

  set state(v: MlxArray[]) {
    if (!Array.isArray(v) || (v.length !== 0 && v.length !== 6)) throw new CacheError("QuantizedKVCache.state", "expects [k packed, k scales, k biases, v packed, v scales, v biases] or []");
    disposeTriple(this.keys);
    disposeTriple(this.values);
    if (v.length === 0) {
      this.keys = this.values = null;
      return;
    }
    this.keys = v.slice(0, 3).map((a) => mx.alias(a)) as QuantTriple;
    this.values = v.slice(3, 6).map((a) => mx.alias(a)) as QuantTriple;
  }

  /** meta_state: (offset, group_size, bits) as str. */
  get metaState(): string[] {
    return [String(this.offset), String(this.groupSize), String(this.bits)];
  }

  set metaState(_v: string[]) {
    throw new CacheError("QuantizedKVCache.metaState", "group size and bits are fixed at construction (restoring a prompt cache of quantized caches is not ported)");
  }

  quantizedAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray {
    if (this.keys === null || this.values === null) throw new CacheError("QuantizedKVCache", "attention over an empty cache");
    const k = this.keys.map((a) => sliceTokens(a, 0, this.offset));
    const v = this.values.map((a) => sliceTokens(a, 0, this.offset));
    try {
      return quantizedScaledDotProductAttention(queries, k, v, scale, mask, this.groupSize, this.bits);
    } finally {
      for (const a of [...k, ...v]) a.dispose();
    }
  }

  isTrimmable(): boolean {
    return true;
  }

  trim(n: number): number {
    if (!Number.isInteger(n) || n < 0) throw new CacheError("QuantizedKVCache.trim", `n must be a non-negative integer, got ${n}`);
    n = Math.min(this.offset, n);
    this.offset -= n;
    return n;
  }

  size(): number {
    return this.offset;
  }

  empty(): boolean {
    return this.keys === null;
  }

  get nbytes(): number {
    if (this.keys === null || this.values === null) return 0;
    return [...this.keys, ...this.values].reduce((a, x) => a + x.nbytes, 0);
  }

  dispose(): void {
    disposeTriple(this.keys);
    disposeTriple(this.values);
    this.keys = this.values = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** The (packed, scales, biases) buffers of a uniform-quantized cache, single or batch. */
export interface QuantizedBuffers {
  keys: QuantTriple | null;
  values: QuantTriple | null;
  readonly groupSize: number;
  readonly bits: number;
}

/**
 * update_and_fetch's growth (QuantizedKVCache / BatchQuantizedKVCache): when the buffers lack room
 * for these S tokens after `prev`, each is cut to prev (unless prev is a whole number of steps) and
 * extended by ceil(S / step) * step zero columns; an empty cache gets that many zero columns,
 * packed uint32 and the scales and biases in the keys' dtype (old buffers disposed).
 */
export function reserveQuantized(cache: QuantizedBuffers, keys: MlxArray, values: MlxArray, prev: number, step: number): void {
  const [B, H, S, Dk] = keys.shape as [number, number, number, number];
  const Dv = values.shape[3]!;
  if (cache.keys !== null && cache.values !== null && prev + S <= cache.keys[0].shape[2]!) return;
  const newSteps = Math.floor((step + S - 1) / step) * step;
  if (cache.keys !== null && cache.values !== null) {
    const grow = (t: QuantTriple): QuantTriple =>
      t.map((x) => {
        using cut = prev % step !== 0 ? sliceTokens(x, 0, prev) : mx.alias(x);
        const s = [...cut.shape];
        s[2] = newSteps;
        using z = mx.zeros(s, cut.dtype);
        return mx.concatenate([cut, z], 2);
      }) as QuantTriple;
    const nk = grow(cache.keys);
    const nv = grow(cache.values);
    disposeTriple(cache.keys);
    disposeTriple(cache.values);
    cache.keys = nk;
    cache.values = nv;
  } else {
    const init = (dim: number): QuantTriple => [
      mx.zeros([B, H, newSteps, Math.floor((dim * cache.bits) / 32)], "uint32"),
      mx.zeros([B, H, newSteps, Math.floor(dim / cache.groupSize)], keys.dtype),
      mx.zeros([B, H, newSteps, Math.floor(dim / cache.groupSize)], keys.dtype),
    ];
    cache.keys = init(Dk);
    cache.values = init(Dv);
  }
}

/** dst[i][:, :, start:end] = src[i] for the three arrays (new arrays; dst disposed). */
export function writeTokens(dst: QuantTriple, src: QuantTriple, start: number, end: number): QuantTriple {
  return dst.map((d, i) => {
    const s = d.shape;
    const st = s.map(() => 0);
    st[2] = start;
    const stop = [...s];
    stop[2] = end;
    const r = mx.sliceUpdate(d, src[i]!, st, stop);
    d.dispose();
    return r;
  }) as QuantTriple;
}
