// mlx_vlm/turboquant.py's Split codec (_SplitCodec, mode "mse"; mlx-vlm 0.7.10) on the plain-MLX
// path, and a TurboQuantKVCache that runs it.
//
// When mlx-vlm runs it: TurboQuantKVCache builds each codec with _build_codec(tensor, bits,
// mode="mse"); an integer width gives the MSE codec (turboquant.ts), a .5 width the Split codec.
// A fractional --kv-bits alone never reaches it (resolve_kv_bits gives keys floor(B), values
// ceil(B)); it runs when key or value bits are given separately with a .5 width
// (generate_step(kv_key_bits=…, kv_value_bits=…), mlx_vlm.chat --kv-key-bits, the server's
// KV_KEY_BITS), and inside HybridQuantKVCache's TurboQuant half (turboquant_hybrid.ts).
//
// - Outlier selection (_select_outlier_indices, from the first tensor the codec sees):
//   high_count = round((B - floor B) * D / (ceil B - floor B)) clamped to [1, D-1]; per-dim scores
//   mx.mean(|x| as float32, axes (0, 1, 2)); numpy argsort, the top high_count dims sorted are the
//   high ("outlier") set, the rest the low set. numpy's float32 argsort (SIMD quicksort) is not
//   stable, so a tie across the boundary has no portable answer: refused (KVQuantError).
// - Low dims: the MSE codec at floor(B) bits, seed `seed`; high dims: ceil(B) bits, seed + 97.
//   Their head dims (D/2 for a .5 width on an even D) pick the rotation as the MSE codec does:
//   the randomized Hadamard transform for a power of two, else mlx-vlm's numpy-QR matrix, taken
//   as an input (options.rotation).
// - quantize: take the low / high dims, quantize each (state: low (norms, indices), high (…));
//   dequantize / weighted sums: the two halves concatenated, then take(restore_order), where
//   restore_order = argsort(concat(low_idx, high_idx)); scores: low + high.
// - Attention on the CPU (models/base.py with this cache): one query token → decode_attention's
//   generic fallback (every fused/Metal route declines for a Split codec off macOS): prepare,
//   score, weighted_sum_from_scores; more tokens → prefill_attention declines (only Prod keys),
//   so dequantize both (float32) and mx.fast.scaled_dot_product_attention.
//
// The cache is TurboQuantKVCache's bookkeeping (256-token capacity steps, state sliced to the
// offset, meta_state (offset, bits, seed, key_bits, value_bits), trim by offset) with a codec per
// side that is either an MSE or a Split codec; its state arrays are the leaves of mlx-vlm's state
// in order (Split: low norms, low indices, high norms, high indices). mlx-vlm's class name is
// `pythonClass`. mlx-vlm cannot restore a Split state from state + meta_state (the index sets are
// in neither), so neither can this cache: `state` can be set only on a cache whose codecs exist.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVQuantError, pyRound, resolveKvBits } from "../kv_quant.ts";
import type { Mask } from "../mask.ts";
import { CacheError, type KVCacheLike } from "./index.ts";
import {
  allocLike,
  CACHE_STEP,
  type CodecOptions,
  type MSEState,
  quantizeCacheInto,
  sliceT,
  TurboQuantCacheBase,
  TurboQuantMSECodec,
  type TurboQuantOptions,
  writeT,
} from "./turboquant.ts";

// ------------------------------------------------------------------ outlier selection

/** _select_outlier_indices(tensor, bits) → [low_idx, high_idx] (each increasing). */
export function selectOutlierIndices(tensor: MlxArray, avgBits: number): [number[], number[]] {
  const lower = Math.floor(avgBits);
  const upper = Math.ceil(avgBits);
  if (lower === upper) throw new KVQuantError("Mixed-precision selection requires a fractional bit-width.");
  const dim = tensor.shape[tensor.shape.length - 1]!;
  if (tensor.shape.length !== 4) throw new KVQuantError(`the Split codec selects its outlier dims from a 4-D (B, H, T, D) tensor, got shape [${tensor.shape}]`);
  let highCount = Math.trunc(pyRound(((avgBits - lower) * dim) / (upper - lower)));
  highCount = Math.max(1, Math.min(dim - 1, highCount));
  using f = mx.astype(tensor, "float32");
  using a = mx.abs(f);
  using m = mx.mean(a, [0, 1, 2]);
  mx.evaluate(m);
  const scores = Array.from(m.toTypedArray() as Float32Array);
  if (scores.some((s) => Number.isNaN(s))) throw new KVQuantError("the Split codec's outlier scores hold NaN (numpy's argsort order for NaN is not reproduced)");
  const order = scores.map((_, i) => i).sort((x, y) => scores[x]! - scores[y]! || x - y);
  const boundary = dim - highCount;
  if (scores[order[boundary]!] === scores[order[boundary - 1]!]) {
    throw new KVQuantError(`the Split codec's outlier selection is a tie across its boundary (dims ${order[boundary - 1]} and ${order[boundary]} score ${scores[order[boundary]!]}): numpy's unstable argsort has no portable answer`);
  }
  const high = order.slice(boundary).sort((x, y) => x - y);
  const isHigh = new Set(high);
  const low = scores.map((_, i) => i).filter((i) => !isHigh.has(i));
  return [low, high];
}

function int32(v: readonly number[]): MlxArray {
  return mx.array(Int32Array.from(v), [v.length], "int32");
}

// ------------------------------------------------------------------ the Split codec

/** TurboQuantSplitState: the low dims' MSE state and the high dims'. */
export interface SplitState {
  low: MSEState;
  high: MSEState;
}

export class TurboQuantSplitCodec implements Disposable {
  readonly lowerBits: number;
  readonly upperBits: number;
  readonly lowCodec: TurboQuantMSECodec;
  readonly highCodec: TurboQuantMSECodec;
  private readonly lowIdx: MlxArray;
  private readonly highIdx: MlxArray;
  private readonly restoreOrder: MlxArray;

  /** _SplitCodec.from_indices(dim, bits, "mse", seed, low_idx, high_idx). */
  constructor(
    readonly dim: number,
    readonly bits: number,
    readonly seed: number,
    readonly lowIndices: readonly number[],
    readonly highIndices: readonly number[],
    opts: CodecOptions = {},
  ) {
    this.lowerBits = Math.floor(bits);
    this.upperBits = Math.ceil(bits);
    const all = [...lowIndices, ...highIndices];
    if (all.length !== dim || new Set(all).size !== dim || all.some((i) => !Number.isInteger(i) || i < 0 || i >= dim)) {
      throw new KVQuantError(`the Split codec's low and high dims must partition 0..${dim - 1}`);
    }
    // restore_order = argsort(concat(low_idx, high_idx)): where each original dim sits in the concat
    const restore = new Array<number>(dim);
    all.forEach((d, pos) => (restore[d] = pos));
    this.lowCodec = new TurboQuantMSECodec(lowIndices.length, this.lowerBits, seed, opts);
    try {
      this.highCodec = new TurboQuantMSECodec(highIndices.length, this.upperBits, seed + 97, opts);
    } catch (e) {
      this.lowCodec.dispose();
      throw e;
    }
    this.lowIdx = int32(lowIndices);
    this.highIdx = int32(highIndices);
    this.restoreOrder = int32(restore);
  }

  /** _SplitCodec(tensor, bits, "mse", seed): the index sets from this tensor. */
  static fromTensor(tensor: MlxArray, bits: number, seed: number, opts: CodecOptions = {}): TurboQuantSplitCodec {
    const [low, high] = selectOutlierIndices(tensor, bits);
    return new TurboQuantSplitCodec(tensor.shape[3]!, bits, seed, low, high, opts);
  }

  private halves(x: MlxArray): [MlxArray, MlxArray] {
    const axis = x.shape.length - 1;
    const lo = mx.take(x, this.lowIdx, axis);
    try {
      return [lo, mx.take(x, this.highIdx, axis)];
    } catch (e) {
      lo.dispose();
      throw e;
    }
  }

  private merge(lo: MlxArray, hi: MlxArray): MlxArray {
    using merged = mx.concatenate([lo, hi], lo.shape.length - 1);
    return mx.take(merged, this.restoreOrder, merged.shape.length - 1);
  }

  quantize(tensor: MlxArray): SplitState {
    const [lo, hi] = this.halves(tensor);
    try {
      const low = this.lowCodec.quantize(lo);
      try {
        return { low, high: this.highCodec.quantize(hi) };
      } catch (e) {
        low.norms.dispose();
        low.indices.dispose();
        throw e;
      }
    } finally {
      lo.dispose();
      hi.dispose();
    }
  }

  dequantize(state: SplitState): MlxArray {
    using lo = this.lowCodec.dequantize(state.low);
    using hi = this.highCodec.dequantize(state.high);
    return this.merge(lo, hi);
  }

  prepareQueries(queries: MlxArray): [MlxArray, MlxArray] {
    const [lo, hi] = this.halves(queries);
    try {
      const pl = this.lowCodec.prepareQueries(lo);
      try {
        return [pl, this.highCodec.prepareQueries(hi)];
      } catch (e) {
        pl.dispose();
        throw e;
      }
    } finally {
      lo.dispose();
      hi.dispose();
    }
  }

  scorePrepared(prepared: [MlxArray, MlxArray], state: SplitState): MlxArray {
    using lo = this.lowCodec.scorePrepared(prepared[0], state.low);
    using hi = this.highCodec.scorePrepared(prepared[1], state.high);
    return mx.add(lo, hi);
  }

  weightedSumFromScores(scores: MlxArray, state: SplitState): MlxArray {
    using lo = this.lowCodec.weightedSumFromScores(scores, state.low);
    using hi = this.highCodec.weightedSumFromScores(scores, state.high);
    return this.merge(lo, hi);
  }

  dispose(): void {
    this.lowCodec.dispose();
    this.highCodec.dispose();
    this.lowIdx.dispose();
    this.highIdx.dispose();
    this.restoreOrder.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

// ------------------------------------------------------------------ one side's codec, either kind

/** The codec of one side (keys or values), with its state as the flat leaves of mlx-vlm's state. */
interface SideCodec extends Disposable {
  readonly dim: number;
  quantize(x: MlxArray): MlxArray[];
  dequantize(leaves: MlxArray[]): MlxArray;
  /** Query preparation and scores (keys). Prepared queries are caller-owned. */
  prepareQueries(q: MlxArray): MlxArray[];
  scorePrepared(prepared: MlxArray[], leaves: MlxArray[]): MlxArray;
  /** Values. */
  weightedSumFromScores(scores: MlxArray, leaves: MlxArray[]): MlxArray;
  readonly codec: TurboQuantMSECodec | TurboQuantSplitCodec;
}

const mse = (l: MlxArray[]): MSEState => ({ norms: l[0]!, indices: l[1]! });
const split = (l: MlxArray[]): SplitState => ({ low: mse(l.slice(0, 2)), high: mse(l.slice(2, 4)) });

function sideCodec(codec: TurboQuantMSECodec | TurboQuantSplitCodec): SideCodec {
  if (codec instanceof TurboQuantSplitCodec) {
    return {
      codec,
      dim: codec.dim,
      quantize: (x) => {
        const s = codec.quantize(x);
        return [s.low.norms, s.low.indices, s.high.norms, s.high.indices];
      },
      dequantize: (l) => codec.dequantize(split(l)),
      prepareQueries: (q) => codec.prepareQueries(q),
      scorePrepared: (p, l) => codec.scorePrepared([p[0]!, p[1]!], split(l)),
      weightedSumFromScores: (s, l) => codec.weightedSumFromScores(s, split(l)),
      [Symbol.dispose]: () => codec.dispose(),
    };
  }
  return {
    codec,
    dim: codec.dim,
    quantize: (x) => {
      const s = codec.quantize(x);
      return [s.norms, s.indices];
    },
    dequantize: (l) => codec.dequantize(mse(l)),
    prepareQueries: (q) => [codec.prepareQueries(q)],
    scorePrepared: (p, l) => codec.scorePrepared(p[0]!, mse(l)),
    weightedSumFromScores: (s, l) => codec.weightedSumFromScores(s, mse(l)),
    [Symbol.dispose]: () => codec.dispose(),
  };
}

/** _build_codec(tensor, bits, "mse", seed): MSE for an integer width, Split for a .5 width. */
export function buildCodec(tensor: MlxArray, bits: number, seed: number, opts: CodecOptions = {}): TurboQuantMSECodec | TurboQuantSplitCodec {
  if (Number.isInteger(bits)) return new TurboQuantMSECodec(tensor.shape[3]!, bits, seed, opts);
  return TurboQuantSplitCodec.fromTensor(tensor, bits, seed, opts);
}

/** Whether mlx-vlm's TurboQuantKVCache would run a Split codec for these widths (after resolve_kv_bits). */
export function needsSplitCodec(bits: number, keyBits: number | null = null, valueBits: number | null = null): boolean {
  const [, k, v] = resolveKvBits(bits, keyBits, valueBits);
  return !Number.isInteger(k) || !Number.isInteger(v);
}

// ------------------------------------------------------------------ the cache

const disposeAll = (l: MlxArray[] | null) => l?.forEach((a) => a.dispose());

/** mlx-vlm's TurboQuantKVCache with a Split codec on one side or both (see the header). */
export class TurboQuantSplitKVCache extends TurboQuantCacheBase {
  /** mlx-vlm's class this cache stands for. */
  readonly pythonClass = "TurboQuantKVCache";
  /** The leaves of mlx-vlm's keys / values state, with capacity (axis 2) in CACHE_STEP steps. */
  keys: MlxArray[] | null = null;
  values: MlxArray[] | null = null;
  private keySide: SideCodec | null = null;
  private valueSide: SideCodec | null = null;

  /** TurboQuantKVCache.from_cache: quantize an unquantized cache's keys and values. */
  static fromCache(cache: KVCacheLike, bits: number, opts: TurboQuantOptions = {}): TurboQuantSplitKVCache {
    const t = new TurboQuantSplitKVCache(bits, opts);
    try {
      quantizeCacheInto(t, cache);
    } catch (e) {
      t.dispose();
      throw e;
    }
    return t;
  }

  get keyCodec(): TurboQuantMSECodec | TurboQuantSplitCodec | null {
    return this.keySide?.codec ?? null;
  }

  get valueCodec(): TurboQuantMSECodec | TurboQuantSplitCodec | null {
    return this.valueSide?.codec ?? null;
  }

  /** _ensure_codecs: keys with `seed`, values with `seed + 1`; a Split codec picks its dims from these tensors. */
  private ensureCodecs(keys: MlxArray, values: MlxArray): void {
    this.keySide ??= sideCodec(buildCodec(keys, this.keyBits, this.seed, this.opts));
    this.valueSide ??= sideCodec(buildCodec(values, this.valueBits, this.seed + 1, this.opts));
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (keys.shape.length !== 4 || values.shape.length !== 4) throw new CacheError("TurboQuantKVCache.updateAndFetch", "keys and values must be 4-D (B, n_kv_heads, S, head_dim)");
    this.ensureCodecs(keys, values);
    const nk = this.keySide!.quantize(keys);
    let nv: MlxArray[] | null = null;
    try {
      nv = this.valueSide!.quantize(values);
      const newEnd = this.offset + keys.shape[2]!;
      this.keys = this.place(this.keys, nk, newEnd);
      this.values = this.place(this.values, nv, newEnd);
      this.offset = newEnd;
    } finally {
      disposeAll(nk);
      disposeAll(nv);
    }
    mx.evaluate([...this.keys, ...this.values]);
    // stand-ins for mlx-vlm's _QuantizedStateProxy pair: attention goes through quantizedAttention
    return [sliceT(this.keys[this.keys.length - 1]!, this.offset), sliceT(this.values[this.values.length - 1]!, this.offset)];
  }

  /** _allocate_state_like / _reserve_state_capacity, then _write_state at the offset. */
  private place(dst: MlxArray[] | null, src: MlxArray[], newEnd: number): MlxArray[] {
    let cur: MlxArray[];
    if (dst === null) cur = src.map((a) => allocLike(a, newEnd));
    else if (dst[0]!.shape[2]! >= newEnd) cur = dst;
    else {
      const cap = Math.ceil(newEnd / CACHE_STEP) * CACHE_STEP;
      cur = dst.map((a) => {
        const grown = allocLike(a, cap);
        if (this.offset === 0) return grown;
        using used = sliceT(a, this.offset);
        using g = grown;
        return writeT(g, used, 0);
      });
      disposeAll(dst);
    }
    const out = cur.map((a, i) => writeT(a, src[i]!, this.offset));
    disposeAll(cur);
    return out;
  }

  /** The state leaves sliced to the offset: keys' then values' (caller-owned). */
  get quantizedState(): MlxArray[] {
    if (this.keys === null || this.values === null) return [];
    return [...this.keys, ...this.values].map((a) => sliceT(a, this.offset));
  }

  /** How many of quantizedState's leaves are the keys' (2 for MSE, 4 for Split). */
  get keyLeafCount(): number {
    return this.keys?.length ?? 0;
  }

  get state(): MlxArray[] {
    return this.quantizedState;
  }

  set state(v: MlxArray[]) {
    if (!Array.isArray(v)) throw new CacheError("TurboQuantKVCache.state", "expects a list of arrays");
    if (v.length === 0) {
      disposeAll(this.keys);
      disposeAll(this.values);
      this.keys = this.values = null;
      this.offset = 0;
      return;
    }
    if (this.keySide === null || this.valueSide === null) {
      throw new CacheError("TurboQuantKVCache.state", "a Split-codec state cannot be restored from state + meta_state (its outlier dims are in neither; mlx-vlm cannot either)");
    }
    const nk = this.keys?.length ?? (this.keySide.codec instanceof TurboQuantSplitCodec ? 4 : 2);
    const nv = this.values?.length ?? (this.valueSide.codec instanceof TurboQuantSplitCodec ? 4 : 2);
    if (v.length !== nk + nv) throw new CacheError("TurboQuantKVCache.state", `expects ${nk + nv} arrays, got ${v.length}`);
    disposeAll(this.keys);
    disposeAll(this.values);
    this.keys = v.slice(0, nk).map((a) => mx.alias(a));
    this.values = v.slice(nk).map((a) => mx.alias(a));
    this.offset = v[0]!.shape[2]!;
  }

  get nbytes(): number {
    if (this.keys === null || this.values === null) return 0;
    return [...this.keys, ...this.values].reduce((s, a) => s + (a.nbytes / a.shape[2]!) * this.offset, 0);
  }

  dequantize(): [MlxArray, MlxArray] {
    const st = this.quantizedState;
    try {
      using k = this.keySide!.dequantize(st.slice(0, this.keyLeafCount));
      using v = this.valueSide!.dequantize(st.slice(this.keyLeafCount));
      return [mx.astype(k, "float32"), mx.astype(v, "float32")];
    } finally {
      disposeAll(st);
    }
  }

  protected codecsBuilt(): boolean {
    return this.keySide !== null && this.valueSide !== null;
  }

  /** decode_attention's generic CPU route (total tokens <= decode_key_chunk_size, no array mask). */
  protected decodeAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray {
    if (mask !== null && mask !== "causal") throw new CacheError("TurboQuantKVCache", "decode attention with an array mask (mlx-vlm's chunked route) is not ported");
    const [B, Hq, L, D] = queries.shape as [number, number, number, number];
    const Hkv = this.keys![0]!.shape[1]!;
    const R = Hq / Hkv;
    const st = this.quantizedState;
    const prepared: MlxArray[] = [];
    try {
      using qs = mx.multiply(queries, scale);
      using grouped = mx.reshape(qs, [B, Hkv, R, L, D]);
      prepared.push(...this.keySide!.prepareQueries(grouped));
      using scores = this.keySide!.scorePrepared(prepared, st.slice(0, this.keyLeafCount));
      using out = this.valueSide!.weightedSumFromScores(scores, st.slice(this.keyLeafCount));
      using o = mx.reshape(out, [B, Hq, L, this.valueSide!.dim]);
      return mx.astype(o, queries.dtype);
    } finally {
      disposeAll(prepared);
      disposeAll(st);
    }
  }

  dispose(): void {
    disposeAll(this.keys);
    disposeAll(this.values);
    this.keys = this.values = null;
    this.keySide?.[Symbol.dispose]();
    this.valueSide?.[Symbol.dispose]();
    this.keySide = this.valueSide = null;
  }
}
