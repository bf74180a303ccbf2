// Batch KV caches with mlx-lm's exact semantics (mlx_lm/models/cache.py, mlx-lm 0.32.2):
// BatchKVCache and BatchRotatingKVCache, op for op. The sequences of a batch are LEFT-padded:
// every sequence ends at the same physical column, `leftPadding` (B,) says how many columns in
// front of each are not its own, and `offset` (B,) is each sequence's logical position (the RoPE
// offset, an int32 array). A right-padded prefill (prompts of different lengths in one call)
// is announced with prepare({lengths, rightPadding}) and rolled into left padding by finalize().
//
// Bit parity of batched generation depends on this bookkeeping, not only on the math: a padded
// sequence of a rotated sliding-window buffer sees its keys in another slot order than it would
// alone, so the attention sums run in another order (docs: mlxlm-extras §5.5). Every roll, trim,
// pad and rotation here is Python's, in Python's order.
//
// Ownership as in model/cache/index.ts: updateAndFetch does not take its inputs and returns
// caller-owned arrays; the cache owns its buffers and per-sequence arrays and frees the ones it
// replaces (Python's `x -= 1` rebinds the attribute, which an alias models exactly); dispose()
// frees everything. extract() returns a new, caller-owned single-sequence cache.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { createCausalMask, type MakeMaskOptions, type Mask } from "../mask.ts";
import { appendZeros, assignSeq, growRing, CacheError, checkAgainstBuffer, checkKV, KVCache, type KVCacheLike, replace, RotatingKVCache, sliceSeq } from "./index.ts";

/** prepare()'s keyword arguments (Python: left_padding=, lengths=, right_padding=). */
export interface PrepareOptions {
  leftPadding?: readonly number[];
  lengths?: readonly number[];
  rightPadding?: readonly number[];
}

/** The batch caches as the model and the batch generator consume them. */
export interface BatchCacheLike extends Disposable {
  /** (B,) int32: each sequence's logical position. */
  readonly offset: MlxArray;
  /** (B,) int32: columns in front of each sequence that are not its own (may go negative in a rotating cache). */
  readonly leftPadding: MlxArray;
  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray];
  makeMask(N: number, opts?: MakeMaskOptions): Mask;
  prepare(opts: PrepareOptions): void;
  finalize(): void;
  filter(batchIndices: readonly number[]): void;
  extend(other: BatchCacheLike): void;
  extract(idx: number): KVCacheLike;
  /** Python's deepcopy: a cache with its own handles to the same (immutable) arrays. */
  copy(): BatchCacheLike;
  /** The arrays of Python's state tuple (caller-owned handles), for evaluation. */
  readonly state: MlxArray[];
  readonly batchSize: number;
  isTrimmable(): boolean;
  trim(n: number): number;
  size(): number;
  empty(): boolean;
  readonly nbytes: number;
  dispose(): void;
}

function intList(name: string, v: readonly number[], what: string): number[] {
  if (!Array.isArray(v)) throw new CacheError(name, `${what} must be a list of integers`);
  for (const x of v) if (!Number.isSafeInteger(x)) throw new CacheError(name, `${what} must hold integers, got ${JSON.stringify(v)}`);
  return [...v];
}

/** mx.array(list) of Python ints: int32 (B,). */
function int32(v: readonly number[]): MlxArray {
  return mx.array(Int32Array.from(v), [v.length], "int32");
}

/** x[..., None] for a (B,) array: (B, 1). */
function col(x: MlxArray): MlxArray {
  return mx.expandDims(x, 1);
}

/** x[batch_indices] with a Python list of indices: take(x, array(list), 0). */
function takeRows(x: MlxArray, idx: MlxArray): MlxArray {
  return mx.take(x, idx, 0);
}

function checkIndices(name: string, indices: readonly number[], B: number): void {
  if (!Array.isArray(indices) || indices.length === 0) throw new CacheError(name, "filter needs a non-empty list of batch indices");
  for (const i of indices) if (!Number.isInteger(i) || i < 0 || i >= B) throw new CacheError(name, `batch index ${i} is out of range for a batch of ${B}`);
}

/**
 * dynamic_roll(x, shifts, axis): roll each row of x along `axis` by its own shift,
 * take_along_axis(x, (arange(n)[..., None] - shifts[..., None, None]) % n, axis). `shifts` is (B, 1).
 */
export function dynamicRoll(x: MlxArray, shifts: MlxArray, axis: number): MlxArray {
  const n = x.shape[axis]!;
  const extra = x.ndim - axis; // (...,) + (None,) * (x.ndim - axis)
  using ar = mx.arange(n);
  let ai = mx.alias(ar);
  for (let i = 0; i < extra - 1; i++) {
    const next = mx.expandDims(ai, -1);
    ai.dispose();
    ai = next;
  }
  let sh = mx.alias(shifts);
  for (let i = 0; i < extra; i++) {
    const next = mx.expandDims(sh, -1);
    sh.dispose();
    sh = next;
  }
  try {
    using diff = mx.subtract(ai, sh);
    using idx = mx.remainder(diff, n);
    return mx.takeAlongAxis(x, idx, axis);
  } finally {
    ai.dispose();
    sh.dispose();
  }
}

/**
 * base.py create_causal_mask(N, offset, window_size, right_padding, left_padding): the causal
 * (and window) mask, then `& (rinds < expand_dims((offset + N) - right_padding, (1, 2, 3)))` and
 * `& (expand_dims(left_padding, (1, 2, 3)) <= rinds)`; bool (B, 1, N, offset + N) with padding.
 */
export function createCausalMaskPadded(N: number, offset: number, windowSize: number | null, rightPadding: MlxArray | null, leftPadding: MlxArray | null): MlxArray {
  let mask = createCausalMask(N, offset, windowSize);
  try {
    using r0 = mx.arange(offset + N);
    using rinds = mx.expandDims(r0, 0);
    if (rightPadding !== null) {
      using lim = mx.subtract(offset + N, rightPadding);
      using limE = mx.expandDims(lim, [1, 2, 3]);
      using ok = mx.less(rinds, limE);
      const next = mx.bitwiseAnd(mask, ok);
      mask.dispose();
      mask = next;
    }
    if (leftPadding !== null) {
      using lp = mx.expandDims(leftPadding, [1, 2, 3]);
      using ok = mx.lessEqual(lp, rinds);
      const next = mx.bitwiseAnd(mask, ok);
      mask.dispose();
      mask = next;
    }
    return mask;
  } catch (e) {
    mask.dispose();
    throw e;
  }
}

/** mx.pad(k, [(0,0),(0,0),(left,right),(0,0)]) with zeros. */
function padSeq(x: MlxArray, left: number, right: number): MlxArray {
  using zero = mx.scalar(0, x.dtype);
  return mx.pad(x, [[0, 0], [0, 0], [left, right], [0, 0]], zero);
}

/** What both batch caches share: buffers, per-sequence arrays, state, disposal. */
abstract class BatchBase {
  keys: MlxArray | null = null;
  values: MlxArray | null = null;
  leftPadding: MlxArray;
  offset: MlxArray;
  /** Python's _idx: the physical write index shared by the batch. */
  idx = 0;

  constructor(leftPadding: readonly number[]) {
    const lp = intList(this.constructor.name, leftPadding, "left_padding");
    this.leftPadding = int32(lp);
    this.offset = int32(lp.map((l) => -l));
  }

  get batchSize(): number {
    return this.offset.shape[0]!;
  }

  empty(): boolean {
    return this.keys === null;
  }

  get nbytes(): number {
    return this.keys === null || this.values === null ? 0 : this.keys.nbytes + this.values.nbytes;
  }

  protected checkUpdate(keys: MlxArray, values: MlxArray): { B: number; H: number; S: number; Dk: number; Dv: number } {
    const name = `${this.constructor.name}.updateAndFetch`;
    const d = checkKV(name, keys, values);
    if (d.B !== this.batchSize) throw new CacheError(name, `keys hold ${d.B} sequences, the cache ${this.batchSize}`);
    checkAgainstBuffer(name, this.keys, keys, "keys");
    checkAgainstBuffer(name, this.values, values, "values");
    return d;
  }

  /** prepare(left_padding=...) on an empty cache: left_padding += lp; offset -= lp. */
  protected addLeftPadding(leftPadding: readonly number[]): void {
    const name = `${this.constructor.name}.prepare`;
    if (this.keys !== null) throw new CacheError(name, `Left padding can only be added to an empty ${this.constructor.name}`);
    const lp = intList(name, leftPadding, "left_padding");
    if (lp.length !== this.batchSize) throw new CacheError(name, `left_padding has ${lp.length} entries for a batch of ${this.batchSize}`);
    using a = int32(lp);
    this.leftPadding = replace(this.leftPadding, mx.add(this.leftPadding, a));
    this.offset = replace(this.offset, mx.subtract(this.offset, a));
  }

  /** keys/values/offset/left_padding = x[batch_indices] (Python list indexing: take along axis 0). */
  protected takeBatch(name: string, batchIndices: readonly number[]): void {
    checkIndices(name, batchIndices, this.batchSize);
    using idx = int32(batchIndices);
    if (this.keys !== null && this.values !== null) {
      this.keys = replace(this.keys, takeRows(this.keys, idx));
      this.values = replace(this.values, takeRows(this.values, idx));
    }
    this.offset = replace(this.offset, takeRows(this.offset, idx));
    this.leftPadding = replace(this.leftPadding, takeRows(this.leftPadding, idx));
  }

  /**
   * extend's pad(c) for both caches and the concatenation: each cache right-justified to
   * max_idx and padded to the longer buffer, then keys, values, offset and left_padding
   * concatenated along the batch. Both sides share the `other.keys is None` zero-length fallback.
   */
  protected concatJustified(other: BatchBase, maxIdx: number, idxOf: (c: BatchBase) => number): void {
    const ref = (this.keys ?? other.keys)!;
    const refV = (this.values ?? other.values)!;
    const [, H, , D] = ref.shape as [number, number, number, number];
    const M = refV.shape[3]!;
    const L1 = this.keys?.shape[2] ?? 0;
    const L2 = other.keys?.shape[2] ?? 0;
    const maxSize = Math.max(L1, L2);
    const parts = [this, other].map((c) => {
      let k = c.keys !== null ? mx.alias(c.keys) : mx.zeros([c.batchSize, H, 0, D], ref.dtype);
      let v = c.values !== null ? mx.alias(c.values) : mx.zeros([c.batchSize, H, 0, M], ref.dtype);
      const left = maxIdx - idxOf(c);
      let right = maxSize - k.shape[2]! - left;
      if (right < 0) {
        k = replace(k, sliceSeq(k, 0, k.shape[2]! + right));
        v = replace(v, sliceSeq(v, 0, v.shape[2]! + right));
        right = 0;
      }
      if (left !== 0 || right !== 0) {
        k = replace(k, padSeq(k, left, right));
        v = replace(v, padSeq(v, left, right));
      }
      return { k, v, off: mx.alias(c.offset), lp: mx.add(c.leftPadding, left) };
    });
    try {
      this.keys = replace(this.keys, mx.concatenate(parts.map((p) => p.k), 0));
      this.values = replace(this.values, mx.concatenate(parts.map((p) => p.v), 0));
      this.offset = replace(this.offset, mx.concatenate(parts.map((p) => p.off), 0));
      this.leftPadding = replace(this.leftPadding, mx.concatenate(parts.map((p) => p.lp), 0));
    } finally {
      for (const p of parts) for (const a of [p.k, p.v, p.off, p.lp]) a.dispose();
    }
  }

  /** extend() when neither cache has buffers: only the per-sequence arrays are concatenated. */
  protected concatEmpty(other: BatchBase): void {
    this.leftPadding = replace(this.leftPadding, mx.concatenate([this.leftPadding, other.leftPadding], 0));
    this.offset = replace(this.offset, mx.concatenate([this.offset, other.offset], 0));
  }

  /** Python's state arrays (keys, values, offset, left_padding), caller-owned handles. */
  get state(): MlxArray[] {
    const out = [mx.alias(this.offset), mx.alias(this.leftPadding)];
    if (this.keys !== null && this.values !== null) out.unshift(mx.alias(this.keys), mx.alias(this.values));
    return out;
  }

  /** Copies this cache's handles into `c` (a fresh instance of the same class). */
  protected copyInto<T extends BatchBase>(c: T): T {
    c.offset.dispose();
    c.leftPadding.dispose();
    c.keys = this.keys && mx.alias(this.keys);
    c.values = this.values && mx.alias(this.values);
    c.offset = mx.alias(this.offset);
    c.leftPadding = mx.alias(this.leftPadding);
    c.idx = this.idx;
    return c;
  }

  dispose(): void {
    this.keys?.dispose();
    this.values?.dispose();
    this.keys = this.values = null;
    this.offset.dispose();
    this.leftPadding.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

function checkOther<T>(name: string, other: unknown, cls: abstract new (...a: never[]) => T): T {
  if (!(other instanceof cls)) throw new CacheError(name, `can only extend with another ${cls.name}, got ${(other as object)?.constructor?.name ?? typeof other}`);
  return other;
}

/** Per-sequence values of a (B,) int array (evaluates it, as Python's .tolist()). */
function listOf(a: MlxArray): number[] {
  return a.toNumbers();
}

/**
 * merge's buffers: zeros (B, H, max_length, D), and for each cache with buffers its `l` columns
 * (`columns(x, l)`) written at [i, :, padding : padding + l] (Python's slice assignment).
 */
function mergedBuffers<C extends { keys: MlxArray | null; values: MlxArray | null }>(
  caches: readonly C[],
  lengths: readonly number[],
  columns: (c: C, x: MlxArray, l: number) => MlxArray,
): [MlxArray, MlxArray] {
  const maxLength = Math.max(...lengths);
  const full = caches.filter((c) => c.keys !== null);
  const H = Math.max(...full.map((c) => c.keys!.shape[1]!));
  const Dk = Math.max(...full.map((c) => c.keys!.shape[3]!));
  const Dv = Math.max(...full.map((c) => c.values!.shape[3]!));
  const dt = full[0]!.keys!.dtype;
  let keys = mx.zeros([caches.length, H, maxLength, Dk], dt);
  let values = mx.zeros([caches.length, H, maxLength, Dv], dt);
  try {
    caches.forEach((c, i) => {
      if (c.keys === null || c.values === null) return;
      const l = lengths[i]!;
      const p = maxLength - l;
      using k = columns(c, c.keys, l);
      using v = columns(c, c.values, l);
      keys = replace(keys, mx.sliceUpdate(keys, k, [i, 0, p, 0], [i + 1, H, p + l, Dk]));
      values = replace(values, mx.sliceUpdate(values, v, [i, 0, p, 0], [i + 1, H, p + l, Dv]));
    });
  } catch (e) {
    keys.dispose();
    values.dispose();
    throw e;
  }
  return [keys, values];
}

// ------------------------------------------------------------------------------- BatchKVCache

export class BatchKVCache extends BatchBase implements BatchCacheLike {
  static readonly step = 256;
  rightPadding: MlxArray | null = null;

  /** BatchKVCache(left_padding): `offset` starts at -left_padding. */
  constructor(leftPadding: readonly number[]) {
    super(leftPadding);
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    const { B, H, S, Dk, Dv } = this.checkUpdate(keys, values);
    const prev = this.idx;
    const step = BatchKVCache.step;
    if (this.keys === null || this.values === null || prev + S > this.keys.shape[2]!) {
      const nSteps = Math.floor((step + S - 1) / step);
      if (this.keys !== null && this.values !== null && prev % step !== 0) {
        this.keys = replace(this.keys, sliceSeq(this.keys, 0, prev));
        this.values = replace(this.values, sliceSeq(this.values, 0, prev));
      }
      const [k, v] = appendZeros(this.keys, this.values, [B, H, nSteps * step, Dk], [B, H, nSteps * step, Dv], keys.dtype);
      this.keys = replace(this.keys, k);
      this.values = replace(this.values, v);
    }
    this.offset = replace(this.offset, mx.add(this.offset, S));
    this.idx += S;
    this.keys = replace(this.keys, assignSeq(this.keys!, keys, prev, this.idx));
    this.values = replace(this.values, assignSeq(this.values!, values, prev, this.idx));
    return this.keysAndValues();
  }

  keysAndValues(): [MlxArray, MlxArray] {
    if (this.keys === null || this.values === null) throw new CacheError("BatchKVCache", "empty cache has no keys/values");
    return [sliceSeq(this.keys, 0, this.idx), sliceSeq(this.values, 0, this.idx)];
  }

  prepare({ leftPadding, rightPadding }: PrepareOptions): void {
    if (leftPadding !== undefined) this.addLeftPadding(leftPadding);
    if (rightPadding !== undefined && Math.max(...intList("BatchKVCache.prepare", rightPadding, "right_padding")) > 0) {
      this.rightPadding = replace(this.rightPadding, int32(rightPadding));
    }
  }

  /** Rolls the right padding of a prefill to the left: keys rolled per row, offset -= pad, left_padding += pad. */
  finalize(): void {
    if (this.rightPadding === null) return;
    const padding = this.rightPadding;
    using shifts = col(padding);
    if (this.keys !== null && this.values !== null) {
      this.keys = replace(this.keys, dynamicRoll(this.keys, shifts, 2));
      this.values = replace(this.values, dynamicRoll(this.values, shifts, 2));
    }
    this.offset = replace(this.offset, mx.subtract(this.offset, padding));
    this.leftPadding = replace(this.leftPadding, mx.add(this.leftPadding, padding));
    padding.dispose();
    this.rightPadding = null;
  }

  isTrimmable(): boolean {
    return true;
  }

  trim(n: number): number {
    if (!Number.isInteger(n) || n < 0) throw new CacheError("BatchKVCache.trim", `n must be a non-negative integer, got ${n}`);
    n = Math.min(this.idx, n);
    this.idx -= n;
    this.offset = replace(this.offset, mx.subtract(this.offset, n));
    return n;
  }

  /** create_causal_mask(N, offset=_idx, left_padding=left_padding, window_size=...): always an array. */
  makeMask(N: number, { windowSize = null }: MakeMaskOptions = {}): Mask {
    return createCausalMaskPadded(N, this.idx, windowSize ?? null, null, this.leftPadding);
  }

  /**
   * Keeps the given sequences, then shifts out the left padding they all share. A state where
   * every kept sequence's padding exceeds the columns written (offsets below zero, after a trim
   * past a sequence's tokens) is refused: Python would drive _idx negative.
   */
  filter(batchIndices: readonly number[]): void {
    checkIndices("BatchKVCache.filter", batchIndices, this.batchSize);
    const lp = listOf(this.leftPadding);
    const minLeftPad = Math.min(...batchIndices.map((i) => lp[i]!));
    if (minLeftPad > this.idx) throw new CacheError("BatchKVCache.filter", `the kept sequences' left padding (${minLeftPad}) exceeds the ${this.idx} columns written: their offsets are negative`);
    this.takeBatch("BatchKVCache.filter", batchIndices);
    if (minLeftPad > 0) {
      if (this.keys !== null && this.values !== null) {
        this.keys = replace(this.keys, sliceSeq(this.keys, minLeftPad, this.keys.shape[2]!));
        this.values = replace(this.values, sliceSeq(this.values, minLeftPad, this.values.shape[2]!));
      }
      this.idx -= minLeftPad;
      this.leftPadding = replace(this.leftPadding, mx.subtract(this.leftPadding, minLeftPad));
    }
  }

  /** Appends the other cache's sequences, both right-justified to the larger _idx. */
  extend(other: BatchCacheLike): void {
    const o = checkOther("BatchKVCache.extend", other, BatchKVCache);
    if (this.keys === null && o.keys === null) return this.concatEmpty(o);
    const maxIdx = Math.max(this.idx, o.idx);
    this.concatJustified(o, maxIdx, (c) => c.idx);
    this.idx = maxIdx;
  }

  /** KVCache over keys[idx:idx+1, :, left_padding[idx]:_idx], made contiguous. */
  extract(idx: number): KVCache {
    checkIndices("BatchKVCache.extract", [idx], this.batchSize);
    if (this.keys === null || this.values === null) throw new CacheError("BatchKVCache.extract", "the cache is empty");
    const padding = listOf(this.leftPadding)[idx]!;
    const cache = new KVCache();
    const take = (x: MlxArray) => {
      const s = x.shape;
      using row = mx.slice(x, [idx, 0, 0, 0], [idx + 1, s[1]!, s[2]!, s[3]!]);
      using sl = sliceSeq(row, padding, this.idx);
      return mx.contiguous(sl);
    };
    cache.keys = take(this.keys);
    cache.values = take(this.values);
    cache.offset = cache.keys.shape[2]!;
    return cache;
  }

  /** BatchKVCache.merge (KVCache.merge): each cache left-padded to the longest. */
  static merge(caches: readonly KVCacheLike[]): BatchKVCache {
    const lengths = caches.map((c) => c.size());
    const maxLength = Math.max(...lengths);
    if (maxLength === 0) return new BatchKVCache(caches.map(() => 0));
    const padding = lengths.map((l) => maxLength - l);
    // keys[i : i + 1, :, p : p + c.offset] = c.keys[..., : c.offset, :]
    const [keys, values] = mergedBuffers(caches as KVCache[], lengths, (_c, x, l) => sliceSeq(x, 0, l));
    const cache = new BatchKVCache(padding);
    cache.keys = keys;
    cache.values = values;
    cache.offset = replace(cache.offset, mx.add(cache.offset, keys.shape[2]!));
    cache.idx = keys.shape[2]!;
    return cache;
  }

  copy(): BatchKVCache {
    const c = this.copyInto(new BatchKVCache([]));
    c.rightPadding = this.rightPadding && mx.alias(this.rightPadding);
    return c;
  }

  size(): number {
    return this.idx;
  }

  override dispose(): void {
    super.dispose();
    this.rightPadding?.dispose();
    this.rightPadding = null;
  }
}

// ------------------------------------------------------------------------ BatchRotatingKVCache

export class BatchRotatingKVCache extends BatchBase implements BatchCacheLike {
  static readonly step = 256;
  readonly maxSize: number;
  /** Python's _offset: the count of columns processed (one for the whole batch). */
  processed = 0;
  rotated = false;
  /** Python's _lengths: set by a right-padded prepare so padding never evicts valid tokens. */
  lengths: MlxArray | null = null;

  constructor(maxSize: number, leftPadding: readonly number[]) {
    super(leftPadding);
    if (!Number.isInteger(maxSize) || maxSize < 1) throw new CacheError("BatchRotatingKVCache", `maxSize must be a positive integer, got ${maxSize}`);
    this.maxSize = maxSize;
  }

  /** _trim(trim_size, v, append): v[..., trim_size:, :] (when > 0), then append concatenated. */
  private trimArr(trimSize: number, v: MlxArray, append?: MlxArray): MlxArray {
    using t = trimSize > 0 ? sliceSeq(v, trimSize, v.shape[2]!) : mx.alias(v);
    if (append !== undefined) return mx.concatenate([t, append], 2);
    return mx.alias(t);
  }

  /** _temporal_order(): when rotated, roll the buffers by -_idx so the oldest column comes first. */
  temporalOrder(): void {
    if (!this.rotated || this.keys === null || this.values === null) return;
    this.keys = replace(this.keys, mx.roll(this.keys, -this.idx, 2));
    this.values = replace(this.values, mx.roll(this.values, -this.idx, 2));
    this.idx = this.keys.shape[2]!;
    this.rotated = false;
  }

  /** Right-rolls each sequence by max(0, offset - lengths) and moves that much into left padding. */
  private rollToLengths(): void {
    using d = mx.subtract(this.offset, this.lengths!);
    using roll = mx.maximum(0, d);
    if (this.keys !== null && this.values !== null) {
      using shifts = col(roll);
      this.keys = replace(this.keys, dynamicRoll(this.keys, shifts, 2));
      this.values = replace(this.values, dynamicRoll(this.values, shifts, 2));
    }
    this.leftPadding = replace(this.leftPadding, mx.add(this.leftPadding, roll));
    this.offset = replace(this.offset, mx.subtract(this.offset, roll));
  }

  /** keys = mx.depends(keys, (left_padding, offset)): evaluating keys evaluates both. */
  private dependOnScalars(): void {
    this.keys = replace(this.keys, mx.depends(this.keys!, [this.leftPadding, this.offset]) as MlxArray);
  }

  private updateConcat(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (this.keys === null || this.values === null) {
      this.keys = mx.alias(keys);
      this.values = mx.alias(values);
    } else {
      // Put the keys/values in temporal order to preserve context.
      this.temporalOrder();
      // Slice off the end if needed.
      if (this.keys!.shape[2]! > this.idx) {
        this.keys = replace(this.keys, sliceSeq(this.keys!, 0, this.idx));
        this.values = replace(this.values, sliceSeq(this.values!, 0, this.idx));
      }
      // Roll right the padded sequences so that no valid entry is trimmed.
      if (this.lengths !== null) this.rollToLengths();
      // The largest size is max_size + S - 1 so every token gets at least max_size context.
      const trimSize = this.idx - this.maxSize + 1;
      if (trimSize > 0) this.leftPadding = replace(this.leftPadding, mx.subtract(this.leftPadding, trimSize));
      this.keys = replace(this.keys, this.trimArr(trimSize, this.keys!, keys));
      this.values = replace(this.values, this.trimArr(trimSize, this.values!, values));
    }
    const S = keys.shape[2]!;
    this.offset = replace(this.offset, mx.add(this.offset, S));
    this.processed += S;
    this.idx = this.keys!.shape[2]!;
    this.dependOnScalars();
    return [mx.alias(this.keys!), mx.alias(this.values!)];
  }

  private updateInPlace(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (this.lengths !== null) throw new CacheError("BatchRotatingKVCache.updateAndFetch", "finalize() should be called before decoding with BatchRotatingKVCache");
    const S = keys.shape[2]!;
    // May not have hit the max size yet, so potentially keep growing the cache.
    growRing(this, this.processed, this.maxSize, BatchRotatingKVCache.step, keys, values);
    // Trim if needed.
    const trimSize = this.keys!.shape[2]! - this.maxSize;
    if (trimSize > 0) {
      this.keys = replace(this.keys, this.trimArr(trimSize, this.keys!));
      this.values = replace(this.values, this.trimArr(trimSize, this.values!));
      this.idx = this.maxSize;
      this.leftPadding = replace(this.leftPadding, mx.subtract(this.leftPadding, trimSize));
    }
    // Rotate.
    if (this.idx === this.maxSize) {
      this.rotated = true;
      this.idx = 0;
    }
    if (this.rotated) this.leftPadding = replace(this.leftPadding, mx.subtract(this.leftPadding, S));
    // Assign.
    this.keys = replace(this.keys, assignSeq(this.keys!, keys, this.idx, this.idx + S));
    this.values = replace(this.values, assignSeq(this.values!, values, this.idx, this.idx + S));
    this.processed += S;
    this.offset = replace(this.offset, mx.add(this.offset, S));
    this.idx += S;
    this.dependOnScalars();
    return this.keysAndValues();
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    this.checkUpdate(keys, values);
    if (keys.shape[2] === 1) return this.updateInPlace(keys, values);
    return this.updateConcat(keys, values);
  }

  keysAndValues(): [MlxArray, MlxArray] {
    if (this.keys === null || this.values === null) throw new CacheError("BatchRotatingKVCache", "empty cache has no keys/values");
    if (this.processed < this.keys.shape[2]!) return [sliceSeq(this.keys, 0, this.processed), sliceSeq(this.values, 0, this.processed)];
    return [mx.alias(this.keys), mx.alias(this.values)];
  }

  prepare({ leftPadding, lengths, rightPadding }: PrepareOptions): void {
    if (leftPadding !== undefined) this.addLeftPadding(leftPadding);
    if (rightPadding !== undefined && Math.max(...intList("BatchRotatingKVCache.prepare", rightPadding, "right_padding")) > 0) {
      if (lengths === undefined) throw new CacheError("BatchRotatingKVCache.prepare", "right_padding needs lengths");
      using l = int32(intList("BatchRotatingKVCache.prepare", lengths, "lengths"));
      this.lengths = replace(this.lengths, mx.add(l, this.offset));
    }
  }

  finalize(): void {
    if (this.lengths === null) return;
    this.rollToLengths();
    this.lengths.dispose();
    this.lengths = null;
  }

  isTrimmable(): boolean {
    return this.processed < this.maxSize;
  }

  trim(n: number): number {
    if (!Number.isInteger(n) || n < 0) throw new CacheError("BatchRotatingKVCache.trim", `n must be a non-negative integer, got ${n}`);
    n = Math.min(this.processed, n);
    this.processed -= n;
    this.idx -= n;
    this.offset = replace(this.offset, mx.subtract(this.offset, n));
    return n;
  }

  /**
   * make_mask(N, window_size, return_array): the window mask at offset min(max_size - 1, _offset),
   * `& (rinds >= left_padding)` with the padding moved by the columns the update will trim (and
   * by 1 for a rotated single-token step), rolled by idx + 1 when rotated.
   */
  makeMask(N: number, { windowSize = null }: MakeMaskOptions = {}): Mask {
    const window = windowSize || this.maxSize; // Python `window_size or self.max_size`
    const offset = Math.min(this.maxSize - 1, this.processed);
    let mask = createCausalMask(N, offset, window);
    let lp = mx.alias(this.leftPadding);
    try {
      const trimSize = this.idx - this.maxSize + (N > 1 ? 1 : 0);
      if (trimSize > 0) lp = replace(lp, mx.subtract(lp, trimSize));
      const rotated = N === 1 && (this.rotated || this.idx >= this.maxSize);
      if (rotated) lp = replace(lp, mx.subtract(lp, 1));
      {
        using r0 = mx.arange(offset + N);
        using rinds = mx.expandDims(r0, 0);
        using lpE = mx.expandDims(lp, [1, 2, 3]);
        using ok = mx.greaterEqual(rinds, lpE);
        mask = replace(mask, mx.bitwiseAnd(mask, ok));
      }
      if (rotated) {
        let idx = this.idx;
        if (idx >= this.maxSize) idx = 0;
        mask = replace(mask, mx.roll(mask, idx + 1, -1));
      }
      return mask;
    } catch (e) {
      mask.dispose();
      throw e;
    } finally {
      lp.dispose();
    }
  }

  /** Keeps the given sequences (no left shift, unlike BatchKVCache). */
  filter(batchIndices: readonly number[]): void {
    this.takeBatch("BatchRotatingKVCache.filter", batchIndices);
  }

  extend(other: BatchCacheLike): void {
    const o = checkOther("BatchRotatingKVCache.extend", other, BatchRotatingKVCache);
    if (this.keys === null && o.keys === null) return this.concatEmpty(o);
    if (this.rotated !== o.rotated || this.idx !== o.idx) {
      this.temporalOrder();
      o.temporalOrder();
    }
    const maxIdx = Math.max(this.idx, o.idx);
    this.concatJustified(o, maxIdx, (c) => c.idx);
    this.idx = maxIdx;
    this.processed = Math.max(this.processed, o.processed);
  }

  /** A RotatingKVCache of sequence idx, in temporal order, without its left padding. */
  extract(idx: number): RotatingKVCache {
    checkIndices("BatchRotatingKVCache.extract", [idx], this.batchSize);
    if (this.keys === null || this.values === null) throw new CacheError("BatchRotatingKVCache.extract", "the cache is empty");
    const padding = Math.max(0, listOf(this.leftPadding)[idx]!);
    const offset = listOf(this.offset)[idx]!;
    const cache = new RotatingKVCache(this.maxSize);
    // keys[idx:idx+1], rolled into temporal order when rotated (then _idx = max_size), [padding:_idx]
    const end = this.rotated ? this.maxSize : this.idx;
    const one = (x: MlxArray): MlxArray => {
      const s = x.shape;
      let y = mx.slice(x, [idx, 0, 0, 0], [idx + 1, s[1]!, s[2]!, s[3]!]);
      if (this.rotated) y = replace(y, mx.roll(y, -this.idx, 2));
      using sl = sliceSeq(y, padding, end);
      y.dispose();
      return mx.contiguous(sl);
    };
    cache.keys = one(this.keys);
    cache.values = one(this.values);
    cache.offset = offset;
    cache.idx = cache.keys.shape[2]!;
    return cache;
  }

  /** BatchRotatingKVCache.merge (RotatingKVCache.merge): each cache's last size() columns, temporal order, right-justified. */
  static merge(caches: readonly KVCacheLike[]): BatchRotatingKVCache {
    const rot = caches.map((c) => {
      if (!(c instanceof RotatingKVCache)) throw new CacheError("BatchRotatingKVCache.merge", `expects RotatingKVCaches, got ${c?.constructor?.name}`);
      return c;
    });
    const maxSize = rot[0]!.maxSize;
    if (!rot.every((c) => c.maxSize === maxSize)) throw new CacheError("BatchRotatingKVCache.merge", "BatchRotatingKVCache can only merge caches with the same maximum size");
    const offsets = rot.map((c) => c.offset);
    const lengths = rot.map((c) => c.size());
    const maxLength = Math.max(...lengths);
    if (maxLength === 0) return new BatchRotatingKVCache(maxSize, rot.map(() => 0));
    const padding = lengths.map((l) => maxLength - l);
    // keys[i : i + 1, :, p : p + l] = c._temporal_order(c.keys)[..., -l:, :]
    const [keys, values] = mergedBuffers(rot, lengths, (c, x, l) => {
      using t = c.temporalOrder(x);
      return sliceSeq(t, t.shape[2]! - l, t.shape[2]!);
    });
    const cache = new BatchRotatingKVCache(maxSize, padding);
    cache.keys = keys;
    cache.values = values;
    cache.offset = replace(cache.offset, int32(offsets));
    cache.idx = maxLength;
    cache.processed = maxLength;
    return cache;
  }

  copy(): BatchRotatingKVCache {
    const c = this.copyInto(new BatchRotatingKVCache(this.maxSize, []));
    c.processed = this.processed;
    c.rotated = this.rotated;
    c.lengths = this.lengths && mx.alias(this.lengths);
    return c;
  }

  size(): number {
    return Math.min(this.processed, this.maxSize);
  }

  override dispose(): void {
    super.dispose();
    this.lengths?.dispose();
    this.lengths = null;
  }
}

/**
 * _merge_caches for one layer: type(caches[0]).merge(caches): KVCache → BatchKVCache,
 * RotatingKVCache → BatchRotatingKVCache.
 */
export function mergeLayer(caches: readonly KVCacheLike[]): BatchCacheLike {
  const first = caches[0];
  if (first instanceof KVCache) return BatchKVCache.merge(caches);
  if (first instanceof RotatingKVCache) return BatchRotatingKVCache.merge(caches);
  throw new CacheError("mergeCaches", `${first?.constructor?.name ?? "no cache"} does not yet support batching with history`);
}

/** _merge_caches(caches): one batch cache per layer from one cache list per sequence. */
export function mergeCaches(caches: readonly (readonly KVCacheLike[])[]): BatchCacheLike[] {
  if (caches.length === 0) return [];
  const out: BatchCacheLike[] = [];
  try {
    for (let i = 0; i < caches[0]!.length; i++) out.push(mergeLayer(caches.map((c) => c[i]!)));
  } catch (e) {
    for (const c of out) c.dispose();
    throw e;
  }
  return out;
}
