// KV caches with mlx-lm's exact semantics (mlx_lm/models/cache.py, mlx-lm 0.32.2): KVCache and
// RotatingKVCache, op for op (same zeros/concatenate/slice/slice_update sequence), so that the
// buffers are byte-identical to Python's after every update.
//
// Ownership (TS has no refcounting GC for native arrays):
// - updateAndFetch(keys, values) does NOT take ownership of its inputs; it returns two arrays the
//   caller owns (dispose them after attention). When mlx-lm returns the buffer object itself the
//   TS cache returns a second handle to the same array (mx.alias), never a copy.
// - `state` returns caller-owned handles of the buffers; assigning `state` takes copies of the
//   handles (the caller keeps ownership of what it passed).
// - dispose() frees the cache's buffers.
//
// state / metaState: mlx-lm 0.32.2 stores the integers inside `state`
// (KVCache: (keys, values, offset); RotatingKVCache: (keys, values, offset, keep, max_size, _idx)).
// Here `state` is the array part [keys, values] and `metaState` the integer part as strings, in
// the later mlx-lm layout: KVCache [offset], RotatingKVCache [keep, max_size, offset, _idx].
//
// Bad input throws a CacheError and leaves the cache unchanged: keys/values that are not 4-D or
// differ in batch/heads/length/dtype, a dtype or head shape that does not match the buffers, a
// trim that is negative, non-integer or beyond the offset, a metaState that does not parse.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { cacheAttentionMask, createCausalMask, type MakeMaskOptions, type Mask } from "../mask.ts";

export type { Mask, MakeMaskOptions } from "../mask.ts";

export class CacheError extends Error {
  constructor(cache: string, message: string) {
    super(`${cache}: ${message}`);
    this.name = "CacheError";
  }
}

/** mlx-lm's cache interface as the model consumes it. */
export interface KVCacheLike extends Disposable {
  readonly offset: number;
  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray];
  makeMask(N: number, opts?: MakeMaskOptions): Mask;
  state: MlxArray[];
  metaState: string[];
  isTrimmable(): boolean;
  trim(n: number): number;
  size(): number;
  empty(): boolean;
  readonly nbytes: number;
  dispose(): void;
}

/** Hooks for mutation checks (suites/mutations): each flag re-introduces one known cache bug. */
export const cacheMutations = {
  /** RotatingKVCache.trim removes n + 1 tokens. */
  trimOffByOne: false,
  /** RotatingKVCache in-place path returns the buffer in temporal instead of physical order. */
  temporalOrder: false,
  /** KVCache growth concatenates onto the full buffer without slicing it to prev first. */
  growthNoPreSlice: false,
  /** makeMask answers as if the N new tokens were already in the cache (mask built after the update). */
  maskAfterUpdate: false,
  /** RotatingKVCache.makeMask ignores the window: the full-attention (KVCache) mask on sliding layers. */
  slidingUsesFullMask: false,
};

export type CacheMutation = keyof typeof cacheMutations;

/** Runs fn with exactly one cache mutation switched on (tests only). */
export function withCacheMutation<T>(name: CacheMutation, fn: () => T): T {
  for (const k of Object.keys(cacheMutations) as CacheMutation[]) cacheMutations[k] = false;
  cacheMutations[name] = true;
  try {
    return fn();
  } finally {
    cacheMutations[name] = false;
  }
}

export async function withCacheMutationAsync<T>(name: CacheMutation, fn: () => Promise<T>): Promise<T> {
  for (const k of Object.keys(cacheMutations) as CacheMutation[]) cacheMutations[k] = false;
  cacheMutations[name] = true;
  try {
    return await fn();
  } finally {
    cacheMutations[name] = false;
  }
}

export function checkKV(name: string, keys: MlxArray, values: MlxArray): { B: number; H: number; S: number; Dk: number; Dv: number } {
  if (!(keys instanceof mx.MlxArray) || !(values instanceof mx.MlxArray)) throw new CacheError(name, "keys and values must be MlxArrays");
  const ks = keys.shape;
  const vs = values.shape;
  if (ks.length !== 4 || vs.length !== 4) {
    throw new CacheError(name, `keys and values must be 4-D (B, n_kv_heads, S, head_dim), got [${ks}] and [${vs}]`);
  }
  if (ks[0] !== vs[0] || ks[1] !== vs[1]) throw new CacheError(name, `keys [${ks}] and values [${vs}] differ in batch or head count`);
  if (ks[2] !== vs[2]) throw new CacheError(name, `keys and values have different lengths: ${ks[2]} vs ${vs[2]}`);
  if (keys.dtype !== values.dtype) throw new CacheError(name, `keys and values have different dtypes: ${keys.dtype} vs ${values.dtype}`);
  return { B: ks[0]!, H: ks[1]!, S: ks[2]!, Dk: ks[3]!, Dv: vs[3]! };
}

export function checkAgainstBuffer(name: string, buf: MlxArray | null, x: MlxArray, what: string): void {
  if (buf === null) return;
  const b = buf.shape;
  const s = x.shape;
  if (b[0] !== s[0] || b[1] !== s[1] || b[3] !== s[3]) {
    throw new CacheError(name, `${what} [${s}] do not fit the cached buffer [${b}] (batch, heads and head_dim must match)`);
  }
  if (buf.dtype !== x.dtype) throw new CacheError(name, `${what} dtype ${x.dtype} differs from the cached ${buf.dtype}`);
}

function parseIntStrict(name: string, s: unknown, what: string): number {
  if (typeof s !== "string" || !/^-?\d+$/.test(s.trim())) throw new CacheError(name, `metaState ${what} is not an integer: ${JSON.stringify(s)}`);
  const v = Number.parseInt(s.trim(), 10);
  if (!Number.isSafeInteger(v)) throw new CacheError(name, `metaState ${what} out of range: ${s}`);
  return v;
}

/** x[..., start:stop, :] on a 4-D array (Python slice semantics for non-negative bounds). */
export function sliceSeq(x: MlxArray, start: number, stop: number): MlxArray {
  const s = x.shape;
  const len = s[2]!;
  const a = Math.min(Math.max(start, 0), len);
  const b = Math.max(Math.min(stop, len), a);
  return mx.slice(x, [0, 0, a, 0], [s[0]!, s[1]!, b, s[3]!]);
}

/** x[..., start:stop, :] = u, returning the new array (Python overwrites x's descriptor). */
export function assignSeq(x: MlxArray, u: MlxArray, start: number, stop: number): MlxArray {
  const s = x.shape;
  return mx.sliceUpdate(x, u, [0, 0, start, 0], [s[0]!, s[1]!, stop, s[3]!]);
}

export function replace(old: MlxArray | null, next: MlxArray): MlxArray {
  if (old !== null && old !== next) old.dispose();
  return next;
}

/**
 * keys/values grown by zero columns along the sequence axis, as Python's
 * `new_k = mx.zeros(k_shape); keys = mx.concatenate([keys, new_k], axis=2)` (the zeros
 * themselves when there are no buffers yet). Returns new arrays; the inputs stay the caller's.
 */
export function appendZeros(keys: MlxArray | null, values: MlxArray | null, kShape: number[], vShape: number[], dtype: mx.Dtype): [MlxArray, MlxArray] {
  const newK = mx.zeros(kShape, dtype);
  const newV = mx.zeros(vShape, dtype);
  if (keys === null || values === null) return [newK, newV];
  try {
    const k = mx.concatenate([keys, newK], 2);
    try {
      return [k, mx.concatenate([values, newV], 2)];
    } catch (e) {
      k.dispose();
      throw e;
    }
  } finally {
    newK.dispose();
    newV.dispose();
  }
}

/**
 * The rotating caches' in-place growth (RotatingKVCache and BatchRotatingKVCache
 * _update_in_place): while the buffer is below max_size and full up to `prev`, append
 * min(step, max_size - prev) zero columns and set _idx = prev.
 */
export function growRing(c: { keys: MlxArray | null; values: MlxArray | null; idx: number }, prev: number, maxSize: number, step: number, keys: MlxArray, values: MlxArray): void {
  if (c.keys !== null && c.values !== null && !(prev >= c.keys.shape[2]! && c.keys.shape[2]! < maxSize)) return;
  const [B, H, , Dk] = keys.shape as [number, number, number, number];
  const newSize = Math.min(step, maxSize - prev);
  const [k, v] = appendZeros(c.keys, c.values, [B, H, newSize, Dk], [B, H, newSize, values.shape[3]!], keys.dtype);
  c.keys = replace(c.keys, k);
  c.values = replace(c.values, v);
  c.idx = prev;
}

// ------------------------------------------------------------------------------ shared part

/** What both caches share (Python's _BaseCache): the key/value buffers, state and disposal. */
abstract class BufferedCache {
  keys: MlxArray | null = null;
  values: MlxArray | null = null;
  offset = 0;

  empty(): boolean {
    return this.keys === null;
  }

  get nbytes(): number {
    return this.keys === null || this.values === null ? 0 : this.keys.nbytes + this.values.nbytes;
  }

  /** [keys, values] buffers as they are held (KVCache: full capacity; RotatingKVCache: physical order), as mlx-lm 0.32.2's state tuple; caller-owned handles. */
  get state(): MlxArray[] {
    if (this.keys === null || this.values === null) return [];
    return [mx.alias(this.keys), mx.alias(this.values)];
  }

  /** Sets the buffers only (offsets come from metaState), like the Python setters. */
  set state(v: MlxArray[]) {
    const name = `${this.constructor.name}.state`;
    if (!Array.isArray(v) || (v.length !== 0 && v.length !== 2)) throw new CacheError(name, "expects [keys, values] or []");
    if (v.length === 2) {
      checkKV(name, v[0]!, v[1]!);
      this.keys = replace(this.keys, mx.alias(v[0]!));
      this.values = replace(this.values, mx.alias(v[1]!));
    } else {
      this.dispose();
    }
  }

  dispose(): void {
    this.keys?.dispose();
    this.values?.dispose();
    this.keys = this.values = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

// ------------------------------------------------------------------------------------ KVCache

export class KVCache extends BufferedCache implements KVCacheLike {
  static readonly step = 256;

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    const { B, H, S, Dk, Dv } = checkKV("KVCache.updateAndFetch", keys, values);
    checkAgainstBuffer("KVCache.updateAndFetch", this.keys, keys, "keys");
    checkAgainstBuffer("KVCache.updateAndFetch", this.values, values, "values");
    const prev = this.offset;
    const step = KVCache.step;
    if (this.keys === null || this.values === null || prev + S > this.keys.shape[2]!) {
      const nSteps = Math.floor((step + S - 1) / step);
      if (this.keys !== null && this.values !== null && prev % step !== 0 && !cacheMutations.growthNoPreSlice) {
        this.keys = replace(this.keys, sliceSeq(this.keys, 0, prev));
        this.values = replace(this.values, sliceSeq(this.values, 0, prev));
      }
      const [k, v] = appendZeros(this.keys, this.values, [B, H, nSteps * step, Dk], [B, H, nSteps * step, Dv], keys.dtype);
      this.keys = replace(this.keys, k);
      this.values = replace(this.values, v);
    }
    this.offset += S;
    this.keys = replace(this.keys, assignSeq(this.keys!, keys, prev, this.offset));
    this.values = replace(this.values, assignSeq(this.values!, values, prev, this.offset));
    return this.keysAndValues();
  }

  keysAndValues(): [MlxArray, MlxArray] {
    if (this.keys === null || this.values === null) throw new CacheError("KVCache", "empty cache has no keys/values");
    if (this.offset < this.keys.shape[2]!) return [sliceSeq(this.keys, 0, this.offset), sliceSeq(this.values, 0, this.offset)];
    return [mx.alias(this.keys), mx.alias(this.values)];
  }

  size(): number {
    return this.offset;
  }



  get metaState(): string[] {
    return [String(this.offset)];
  }

  set metaState(v: string[]) {
    if (!Array.isArray(v) || v.length !== 1) throw new CacheError("KVCache.metaState", `expects [offset], got ${JSON.stringify(v)}`);
    const off = parseIntStrict("KVCache.metaState", v[0], "offset");
    if (off < 0) throw new CacheError("KVCache.metaState", `offset must be >= 0, got ${off}`);
    this.offset = off;
  }

  static fromState(state: MlxArray[], metaState: string[]): KVCache {
    const c = new KVCache();
    c.metaState = metaState;
    c.state = state;
    return c;
  }

  isTrimmable(): boolean {
    return true;
  }

  trim(n: number): number {
    if (!Number.isInteger(n) || n < 0) throw new CacheError("KVCache.trim", `n must be a non-negative integer, got ${n}`);
    if (n > this.offset) throw new CacheError("KVCache.trim", `cannot trim ${n} tokens, the cache holds only offset=${this.offset}`);
    n = Math.min(this.offset, n);
    this.offset -= n;
    return n;
  }

  makeMask(N: number, { windowSize = null, returnArray = false }: MakeMaskOptions = {}): Mask {
    const offset = cacheMutations.maskAfterUpdate ? this.offset + N : this.offset;
    return cacheAttentionMask(N, offset, returnArray, windowSize);
  }

}

// ---------------------------------------------------------------------------- RotatingKVCache

export class RotatingKVCache extends BufferedCache implements KVCacheLike {
  static readonly step = 256;
  keep: number;
  maxSize: number;
  idx = 0;

  constructor(maxSize: number, keep = 0) {
    super();
    if (!Number.isInteger(maxSize) || maxSize < 1) throw new CacheError("RotatingKVCache", `maxSize must be a positive integer, got ${maxSize}`);
    if (!Number.isInteger(keep) || keep < 0 || keep >= maxSize) throw new CacheError("RotatingKVCache", `keep must be an integer in [0, maxSize), got ${keep}`);
    this.maxSize = maxSize;
    this.keep = keep;
  }

  /** _trim(trim_size, v, append): [v[..., :keep], v[..., trim_size+keep:]] (+ append), concatenated. */
  private trimArr(trimSize: number, v: MlxArray, append?: MlxArray): MlxArray {
    const parts: MlxArray[] = [];
    try {
      if (trimSize > 0) {
        parts.push(sliceSeq(v, 0, this.keep), sliceSeq(v, trimSize + this.keep, v.shape[2]!));
      } else {
        parts.push(mx.alias(v));
      }
      if (append !== undefined) parts.push(mx.alias(append));
      return mx.concatenate(parts, 2);
    } finally {
      for (const p of parts) p.dispose();
    }
  }

  /** _temporal_order(v): rearrange into temporal order, slicing off the unused end (BatchRotatingKVCache.merge calls it too). */
  temporalOrder(v: MlxArray): MlxArray {
    const len = v.shape[2]!;
    if (this.idx === len) return mx.alias(v);
    if (this.idx < this.offset) {
      const parts = [sliceSeq(v, 0, this.keep), sliceSeq(v, this.idx, len), sliceSeq(v, this.keep, this.idx)];
      try {
        return mx.concatenate(parts, 2);
      } finally {
        for (const p of parts) p.dispose();
      }
    }
    return sliceSeq(v, 0, this.idx);
  }

  private updateConcat(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (this.keys === null || this.values === null) {
      this.keys = mx.alias(keys);
      this.values = mx.alias(values);
    } else {
      this.keys = replace(this.keys, this.temporalOrder(this.keys));
      this.values = replace(this.values, this.temporalOrder(this.values));
      this.idx = this.keys.shape[2]!;
      // The largest size is max_size + S - 1 so every token gets at least max_size context.
      const trimSize = this.idx - this.maxSize + 1;
      this.keys = replace(this.keys, this.trimArr(trimSize, this.keys, keys));
      this.values = replace(this.values, this.trimArr(trimSize, this.values, values));
    }
    this.offset += keys.shape[2]!;
    this.idx = this.keys.shape[2]!;
    return [mx.alias(this.keys), mx.alias(this.values)];
  }

  private updateInPlace(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    const S = keys.shape[2]!;
    // May not have hit the max size yet, so potentially keep growing the cache.
    growRing(this, this.offset, this.maxSize, RotatingKVCache.step, keys, values);
    // Trim if needed.
    const trimSize = this.keys!.shape[2]! - this.maxSize;
    if (trimSize > 0) {
      this.keys = replace(this.keys, this.trimArr(trimSize, this.keys!));
      this.values = replace(this.values, this.trimArr(trimSize, this.values!));
      this.idx = this.maxSize;
    }
    // Rotate.
    if (this.idx === this.maxSize) this.idx = this.keep;
    // Assign.
    this.keys = replace(this.keys, assignSeq(this.keys!, keys, this.idx, this.idx + S));
    this.values = replace(this.values, assignSeq(this.values!, values, this.idx, this.idx + S));
    this.offset += S;
    this.idx += S;
    if (cacheMutations.temporalOrder) {
      const saved = this.idx;
      const k = this.temporalOrder(this.keys);
      const v = this.temporalOrder(this.values);
      this.idx = saved;
      if (this.offset < k.shape[2]!) {
        const out: [MlxArray, MlxArray] = [sliceSeq(k, 0, this.offset), sliceSeq(v, 0, this.offset)];
        k.dispose();
        v.dispose();
        return out;
      }
      return [k, v];
    }
    return this.keysAndValues();
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    checkKV("RotatingKVCache.updateAndFetch", keys, values);
    checkAgainstBuffer("RotatingKVCache.updateAndFetch", this.keys, keys, "keys");
    checkAgainstBuffer("RotatingKVCache.updateAndFetch", this.values, values, "values");
    if (keys.shape[2] === 1) return this.updateInPlace(keys, values);
    return this.updateConcat(keys, values);
  }

  keysAndValues(): [MlxArray, MlxArray] {
    if (this.keys === null || this.values === null) throw new CacheError("RotatingKVCache", "empty cache has no keys/values");
    if (this.offset < this.keys.shape[2]!) return [sliceSeq(this.keys, 0, this.offset), sliceSeq(this.values, 0, this.offset)];
    return [mx.alias(this.keys), mx.alias(this.values)];
  }

  size(): number {
    return Math.min(this.offset, this.maxSize);
  }



  /** [keep, max_size, offset, _idx] as strings. */
  get metaState(): string[] {
    return [String(this.keep), String(this.maxSize), String(this.offset), String(this.idx)];
  }

  set metaState(v: string[]) {
    const n = "RotatingKVCache.metaState";
    if (!Array.isArray(v) || v.length !== 4) throw new CacheError(n, `expects [keep, max_size, offset, _idx], got ${JSON.stringify(v)}`);
    const keep = parseIntStrict(n, v[0], "keep");
    const maxSize = parseIntStrict(n, v[1], "max_size");
    const offset = parseIntStrict(n, v[2], "offset");
    const idx = parseIntStrict(n, v[3], "_idx");
    if (maxSize < 1 || keep < 0 || keep >= maxSize || offset < 0 || idx < 0) {
      throw new CacheError(n, `inconsistent values keep=${keep} max_size=${maxSize} offset=${offset} _idx=${idx}`);
    }
    this.keep = keep;
    this.maxSize = maxSize;
    this.offset = offset;
    this.idx = idx;
  }

  static fromState(state: MlxArray[], metaState: string[]): RotatingKVCache {
    const c = new RotatingKVCache(1);
    c.metaState = metaState;
    c.state = state;
    return c;
  }

  isTrimmable(): boolean {
    return this.offset < this.maxSize;
  }

  trim(n: number): number {
    if (!Number.isInteger(n) || n < 0) throw new CacheError("RotatingKVCache.trim", `n must be a non-negative integer, got ${n}`);
    if (n > this.offset) throw new CacheError("RotatingKVCache.trim", `cannot trim ${n} tokens, the cache holds only offset=${this.offset}`);
    n = Math.min(this.offset, n);
    const m = cacheMutations.trimOffByOne ? Math.min(n + 1, this.offset) : n;
    this.offset -= m;
    this.idx -= m;
    return n;
  }

  makeMask(N: number, { windowSize = null, returnArray = false }: MakeMaskOptions = {}): Mask {
    if (cacheMutations.slidingUsesFullMask) return cacheAttentionMask(N, this.offset, returnArray, null);
    const selfOffset = cacheMutations.maskAfterUpdate ? this.offset + N : this.offset;
    if (N > 1) {
      const window = windowSize || this.maxSize; // Python `window_size or self.max_size`
      const offset = Math.min(this.maxSize - 1, selfOffset);
      if (offset + N > window || returnArray) return createCausalMask(N, offset, window);
      return "causal";
    }
    if (windowSize === null || windowSize === undefined) return null;
    // May need a mask for when window_size < max_size.
    if (selfOffset >= windowSize && this.maxSize > windowSize) {
      let idx = this.idx;
      if (idx >= this.maxSize) idx = 0;
      const maskSize = selfOffset < this.maxSize ? selfOffset + 1 : this.maxSize;
      using ar = mx.arange(maskSize);
      using m = mx.greaterEqual(ar, maskSize - windowSize);
      return mx.roll(m, idx + 1);
    }
    return null;
  }

}

/** The config fields makeCache needs (mlx-lm gemma4_text.ModelArgs names). */
export interface MakeCacheConfig {
  num_hidden_layers: number;
  num_kv_shared_layers: number;
  layer_types: readonly string[];
  sliding_window: number;
}

/**
 * gemma4_text.Model.make_cache: one cache per non-shared layer (i < N - num_kv_shared_layers):
 * full_attention → KVCache, sliding_attention → RotatingKVCache(max_size=sliding_window, keep=0).
 */
export function makeCache(cfg: MakeCacheConfig): KVCacheLike[] {
  const first = cfg.num_hidden_layers - cfg.num_kv_shared_layers;
  const out: KVCacheLike[] = [];
  for (let i = 0; i < first; i++) {
    const t = cfg.layer_types[i];
    if (t === undefined) throw new CacheError("makeCache", `layer_types has no entry for layer ${i}`);
    // Python: full_attention → KVCache, anything else → RotatingKVCache.
    if (t === "full_attention") out.push(new KVCache());
    else out.push(new RotatingKVCache(cfg.sliding_window, 0));
  }
  return out;
}

/** Disposes every cache of a list. */
export function disposeCaches(caches: readonly KVCacheLike[]): void {
  for (const c of caches) c.dispose();
}
