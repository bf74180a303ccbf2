// BufferedRotatingKVCache, op for op as mlx_vlm/models/cache.py (mlx-vlm 0.7.10): the sliding-
// window cache mlx-vlm's MTP round loop swaps in for every RotatingKVCache (keep=0) after the
// prefill (_buffer_mtp_target_cache). It keeps keys in temporal order with `buffer_size` slots of
// slack beyond the window, so a rejected speculative block can always be trimmed; old tokens are
// dropped (compacted to the front) only when an update would overflow the slack. Attention sees
// keys[start_position : offset] masked to the window.
//
// Only keep = 0 exists here: mlx-vlm converts only keep-0 caches, and Gemma 4 makes no others.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { MakeMaskOptions, Mask } from "../mask.ts";
import { CacheError, type KVCacheLike, RotatingKVCache } from "./index.ts";

function seq(x: MlxArray, start: number, stop: number): MlxArray {
  const s = x.shape;
  return mx.slice(x, [0, 0, start, 0], [s[0]!, s[1]!, stop, s[3]!]);
}

/** zeros (B, H, capacity, D) with `src` written at [..., :n, :]. */
function zerosWith(like: MlxArray, capacity: number, src: MlxArray | null, n: number): MlxArray {
  const s = like.shape;
  const z = mx.zeros([s[0]!, s[1]!, capacity, s[3]!], like.dtype);
  if (src === null || n <= 0) return z;
  try {
    return mx.sliceUpdate(z, src, [0, 0, 0, 0], [s[0]!, s[1]!, n, s[3]!]);
  } finally {
    z.dispose();
  }
}

/** A subclass of RotatingKVCache, as in Python: offset, max_size, _idx, size() and the buffers are its. */
export class BufferedRotatingKVCache extends RotatingKVCache implements KVCacheLike {
  bufferSize: number;
  startPosition = 0;

  constructor(maxSize: number, bufferSize = 64) {
    super(maxSize, 0);
    this.bufferSize = Math.max(0, Math.trunc(bufferSize));
  }

  /** from_cache(other, buffer_size): the other cache's window in temporal order; `other` is left as is. */
  static fromCache(other: RotatingKVCache, bufferSize = 64): BufferedRotatingKVCache {
    if (other.keep !== 0) throw new CacheError("BufferedRotatingKVCache.fromCache", `only keep=0 caches are buffered (got keep=${other.keep})`);
    const c = new BufferedRotatingKVCache(other.maxSize, bufferSize);
    c.offset = other.offset;
    if (other.keys === null || other.values === null) return c;
    let keys = other.temporalOrder(other.keys);
    let values = other.temporalOrder(other.values);
    try {
      const len = keys.shape[2]!;
      const keep = Math.min(len, other.maxSize);
      if (keep < len) {
        const k2 = seq(keys, len - keep, len);
        const v2 = seq(values, len - keep, len);
        keys.dispose();
        values.dispose();
        keys = k2;
        values = v2;
      }
      c.startPosition = c.offset - keep;
      c.idx = keep;
      const capacity = c.capacityFor(keep);
      c.keys = zerosWith(keys, capacity, keys, keep);
      c.values = zerosWith(values, capacity, values, keep);
      return c;
    } finally {
      keys.dispose();
      values.dispose();
    }
  }

  targetSize(incoming = 0): number {
    return this.maxSize + Math.max(this.bufferSize, incoming);
  }

  capacityFor(needed: number): number {
    const target = Math.max(needed, this.targetSize());
    const step = RotatingKVCache.step;
    return Math.floor((target + step - 1) / step) * step;
  }

  plannedDrop(incoming: number): number {
    const needed = this.idx + incoming;
    if (needed <= this.targetSize(incoming)) return 0;
    const targetStart = Math.max(0, this.offset - this.maxSize + 1);
    return Math.min(Math.max(0, targetStart - this.startPosition), this.idx);
  }

  private compact(drop: number): void {
    if (drop <= 0 || this.keys === null || this.values === null) return;
    const keep = this.idx - drop;
    const capacity = this.keys.shape[2]!;
    using k = seq(this.keys, drop, this.idx);
    using v = seq(this.values, drop, this.idx);
    const nk = zerosWith(k, capacity, k, keep);
    const nv = zerosWith(v, capacity, v, keep);
    this.keys.dispose();
    this.values.dispose();
    this.keys = nk;
    this.values = nv;
    this.startPosition += drop;
    this.idx = keep;
  }

  private ensureCapacity(keys: MlxArray, values: MlxArray, needed: number): void {
    if (this.keys !== null && needed <= this.keys.shape[2]!) return;
    const capacity = this.capacityFor(needed);
    const hasOld = this.keys !== null && this.values !== null && this.idx > 0;
    using ok = hasOld ? seq(this.keys!, 0, this.idx) : null;
    using ov = hasOld ? seq(this.values!, 0, this.idx) : null;
    const nk = zerosWith(keys, capacity, ok, this.idx);
    const nv = zerosWith(values, capacity, ov, this.idx);
    this.keys?.dispose();
    this.values?.dispose();
    this.keys = nk;
    this.values = nv;
  }

  override updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    const incoming = keys.shape[2]!;
    this.compact(this.plannedDrop(incoming));
    const needed = this.idx + incoming;
    this.ensureCapacity(keys, values, needed);
    const s = this.keys!.shape;
    const vs = this.values!.shape;
    const nk = mx.sliceUpdate(this.keys!, keys, [0, 0, this.idx, 0], [s[0]!, s[1]!, needed, s[3]!]);
    const nv = mx.sliceUpdate(this.values!, values, [0, 0, this.idx, 0], [vs[0]!, vs[1]!, needed, vs[3]!]);
    this.keys!.dispose();
    this.values!.dispose();
    this.keys = nk;
    this.values = nv;
    this.idx = needed;
    this.offset += incoming;
    return [seq(this.keys, 0, this.idx), seq(this.values, 0, this.idx)];
  }

  override trim(n: number): number {
    const m = Math.min(Math.trunc(n), this.idx, this.offset);
    this.offset -= m;
    this.idx -= m;
    return m;
  }

  override isTrimmable(): boolean {
    return true;
  }

  override makeMask(N: number, { windowSize = null, returnArray = false }: MakeMaskOptions = {}): Mask {
    const window = windowSize || this.maxSize; // Python `window_size or self.max_size`
    const start = this.startPosition + this.plannedDrop(N);
    const end = this.offset + N;
    const keyLen = end - start;
    if (N === 1 && keyLen <= window && !returnArray) return null;
    if (N > 1 && keyLen <= window && !returnArray) return "causal";
    using q0 = mx.arange(this.offset, end);
    using q = mx.expandDims(q0, 1);
    using k0 = mx.arange(start, end);
    using k = mx.expandDims(k0, 0);
    using ge = mx.greaterEqual(q, k);
    using kw = mx.add(k, window);
    using lt = mx.less(q, kw);
    return mx.bitwiseAnd(ge, lt);
  }

  /** keys[..., :_idx, :], values[..., :_idx, :] (caller-owned), or [] when empty. */
  override get state(): MlxArray[] {
    if (this.keys === null || this.values === null) return [];
    return [seq(this.keys, 0, this.idx), seq(this.values, 0, this.idx)];
  }

  override set state(_v: MlxArray[]) {
    throw new CacheError("BufferedRotatingKVCache", "state cannot be assigned (build it with fromCache)");
  }

  /** [keep, max_size, offset, _idx, start_position, buffer_size] as strings. */
  override get metaState(): string[] {
    return [this.keep, this.maxSize, this.offset, this.idx, this.startPosition, this.bufferSize].map(String);
  }

  override set metaState(_v: string[]) {
    throw new CacheError("BufferedRotatingKVCache", "metaState cannot be assigned (build it with fromCache)");
  }
}
