// The bookkeeping mlx-vlm 0.7.10's two quantized batch caches share (models/cache.py
// BatchQuantizedKVCache, turboquant.py BatchTurboQuantKVCache, both written after BatchKVCache):
// left-padded rows, one write index `idx` (Python's _idx) for the whole batch, per-row offsets
// (idx - left_padding), filter (keep rows, then drop the left padding they all share), trim, the
// padded causal mask, and the same refusals for what neither port carries (right-padded prefill,
// extend, extract, copy). What is stored per token (S: mx.quantize's triple, or TurboQuant's MSE
// state) and how attention reads it stay with each class.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { Mask, MakeMaskOptions } from "../mask.ts";
import { type BatchCacheLike, createCausalMaskPadded } from "./batch.ts";
import { CacheError, type KVCacheLike } from "./index.ts";
import { sliceTokens } from "./kv_quantize_uniform.ts";

export function int32(v: readonly number[]): MlxArray {
  return mx.array(Int32Array.from(v), [v.length], "int32");
}

export abstract class QuantizedBatchCacheBase<S> implements BatchCacheLike {
  keys: S | null = null;
  values: S | null = null;
  leftPadding: MlxArray;
  offset: MlxArray;
  /** Python's _idx: the columns written, shared by the batch. */
  idx = 0;

  constructor(
    /** The mlx-vlm class name, for errors. */
    protected readonly className: string,
    leftPadding: readonly number[],
  ) {
    if (!leftPadding.every((p) => Number.isSafeInteger(p))) throw new CacheError(className, `left_padding must be integers, got ${JSON.stringify(leftPadding)}`);
    this.leftPadding = int32(leftPadding);
    this.offset = int32(leftPadding.map((p) => -p));
  }

  abstract get batchSize(): number;
  abstract updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray];
  /** The stored arrays up to idx (caller-owned). */
  abstract get quantizedState(): MlxArray[];
  /** Why prepare/finalize (right-padded prefill) are refused. */
  protected abstract readonly prefillRefusal: string;
  /** Why extend (continuous batching) is refused. */
  protected abstract readonly extendRefusal: string;
  /** fn applied to each array of one side's state (the arrays passed in are fn's to dispose). */
  protected abstract mapState(s: S, fn: (a: MlxArray) => MlxArray): S;
  protected abstract disposeState(s: S | null): void;

  /** make_mask: create_causal_mask(N, offset=_idx, left_padding, window_size=...). */
  makeMask(N: number, { windowSize = null }: MakeMaskOptions = {}): Mask {
    return createCausalMaskPadded(N, this.idx, windowSize ?? null, null, this.leftPadding);
  }

  /** Python's state: (keys state, values state, offset, left_padding), as caller-owned arrays. */
  get state(): MlxArray[] {
    return [...this.quantizedState, mx.alias(this.offset), mx.alias(this.leftPadding)];
  }

  /** filter(batch_indices): keep those rows, then drop the left padding they all share. */
  filter(batchIndices: readonly number[]): void {
    if (batchIndices.length === 0) throw new CacheError(`${this.className}.filter`, "an empty selection (mlx-vlm clears the cache list instead)");
    for (const i of batchIndices) {
      if (!Number.isInteger(i) || i < 0 || i >= this.batchSize) throw new CacheError(`${this.className}.filter`, `index ${i} outside a batch of ${this.batchSize}`);
    }
    using idx = int32(batchIndices);
    const take = (a: MlxArray) => {
      const r = mx.take(a, idx, 0);
      a.dispose();
      return r;
    };
    if (this.keys !== null && this.values !== null) {
      this.keys = this.mapState(this.keys, take);
      this.values = this.mapState(this.values, take);
    }
    this.offset = take(this.offset);
    this.leftPadding = take(this.leftPadding);
    const minLp = Math.min(Math.min(...this.leftPadding.toNumbers()), this.idx);
    if (minLp > 0) {
      const drop = (a: MlxArray) => {
        const r = sliceTokens(a, minLp, a.shape[2]!);
        a.dispose();
        return r;
      };
      if (this.keys !== null && this.values !== null) {
        this.keys = this.mapState(this.keys, drop);
        this.values = this.mapState(this.values, drop);
      }
      this.idx -= minLp;
      const next = mx.subtract(this.leftPadding, minLp);
      this.leftPadding.dispose();
      this.leftPadding = next;
    }
  }

  isTrimmable(): boolean {
    return true;
  }

  trim(n: number): number {
    if (!Number.isInteger(n) || n < 0) throw new CacheError(`${this.className}.trim`, `n must be a non-negative integer, got ${n}`);
    n = Math.min(this.idx, n);
    this.idx -= n;
    const off = mx.subtract(this.offset, n);
    this.offset.dispose();
    this.offset = off;
    return n;
  }

  size(): number {
    return this.idx;
  }

  empty(): boolean {
    return this.keys === null;
  }

  get nbytes(): number {
    const st = this.quantizedState;
    try {
      return st.reduce((a, x) => a + x.nbytes, 0);
    } finally {
      for (const a of st) a.dispose();
    }
  }

  prepare(): void {
    throw new CacheError(`${this.className}.prepare`, this.prefillRefusal);
  }

  finalize(): void {
    throw new CacheError(`${this.className}.finalize`, this.prefillRefusal);
  }

  extend(): void {
    throw new CacheError(`${this.className}.extend`, this.extendRefusal);
  }

  extract(): KVCacheLike {
    throw new CacheError(`${this.className}.extract`, "not ported");
  }

  copy(): BatchCacheLike {
    throw new CacheError(`${this.className}.copy`, "not ported");
  }

  dispose(): void {
    this.disposeState(this.keys);
    this.disposeState(this.values);
    this.keys = this.values = null;
    this.offset.dispose();
    this.leftPadding.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
