// mlx_vlm/turboquant.py BatchTurboQuantKVCache (mlx-vlm 0.7.10) on the plain-MLX path: the
// batch cache mlx-vlm's batch generation (_make_cache in generate/ar.py) puts on full-attention
// layers with TurboQuant. The codecs are TurboQuantKVCache's (turboquant.ts: MSE keys with `seed`,
// MSE values with `seed + 1`, a fractional width split floor/ceil); what differs is the batch
// bookkeeping, as in BatchKVCache: left-padded rows, a shared write index `idx` (Python's _idx) and
// per-row offsets (idx - left_padding).
//
// Attention (models/base.py scaled_dot_product_attention): the quantized route applies only to a
// single row with no left padding (_turboquant_attention_applies); every other batch dequantizes
// the state up to idx (float32), casts to the queries' dtype and runs
// mx.fast.scaled_dot_product_attention with the batch mask. For that single row a decode step is
// decode_attention with the batch's array mask, which takes mlx-vlm's masked chunked route
// (maskedDecodeAttention); a prefill chunk dequantizes (prefill_attention declines MSE keys).
//
// Not ported (refused with a CacheError): extend, extract, prepare/finalize (mlx-vlm's class has
// no prepare/finalize either), copy. filter is ported (rows leaving a batch).
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { resolveKvBits } from "../kv_quant.ts";
import type { Mask } from "../mask.ts";
import { QuantizedBatchCacheBase } from "./batch_quantized.ts";
import { CacheError } from "./index.ts";
import {
  allocLike,
  attendDequantized,
  type CodecOptions,
  DEFAULT_TURBOQUANT_SEED,
  dequantizeMSE,
  disposeState,
  type MSEState,
  type QuantizedAttentionCache,
  reserveMSE,
  sliceT,
  TurboQuantKVCache,
  TurboQuantMSECodec,
  type TurboQuantOptions,
  writeMSE,
} from "./turboquant.ts";

/** Python's str(float) for the bit widths in meta_state. */
function pyFloatStr(x: number): string {
  return Number.isInteger(x) ? `${x}.0` : String(x);
}

export class BatchTurboQuantKVCache extends QuantizedBatchCacheBase<MSEState> implements QuantizedAttentionCache {
  bits: number;
  keyBits: number;
  valueBits: number;
  seed: number;
  keyCodec: TurboQuantMSECodec | null = null;
  valueCodec: TurboQuantMSECodec | null = null;
  /** Python's _fused_attention_eligible: one row, no left padding (refreshed after filter). */
  fusedAttentionEligible: boolean;
  private readonly opts: CodecOptions;
  protected readonly prefillRefusal = "not in mlx-vlm's class (right-padded prefill with TurboQuant is not a path mlx-vlm has)";
  protected readonly extendRefusal = "continuous batching with TurboQuant caches is not ported";

  constructor(leftPadding: readonly number[], bits: number, opts: TurboQuantOptions = {}) {
    // the widths are checked before the left padding (the errors' order kept); the width check and the split-codec refusal are TurboQuantKVCache's
    const widths = resolveKvBits(bits, opts.keyBits ?? null, opts.valueBits ?? null);
    new TurboQuantKVCache(bits, opts).dispose();
    super("BatchTurboQuantKVCache", leftPadding);
    [this.bits, this.keyBits, this.valueBits] = widths;
    this.seed = opts.seed ?? DEFAULT_TURBOQUANT_SEED;
    this.opts = { rotation: opts.rotation };
    this.fusedAttentionEligible = leftPadding.length === 1 && leftPadding[0] === 0;
  }

  get batchSize(): number {
    return this.leftPadding.shape[0]!;
  }

  /** _ensure_codecs (through a temporary TurboQuantKVCache in Python: the same codecs). */
  ensureCodecs(keys: MlxArray, values: MlxArray): void {
    if (this.keyCodec !== null) return;
    this.keyCodec = new TurboQuantMSECodec(keys.shape[3]!, this.keyBits, this.seed, this.opts);
    this.valueCodec = new TurboQuantMSECodec(values.shape[3]!, this.valueBits, this.seed + 1, this.opts);
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (keys.shape.length !== 4 || values.shape.length !== 4) throw new CacheError("BatchTurboQuantKVCache.updateAndFetch", "keys and values must be 4-D (B, n_kv_heads, S, head_dim)");
    if (keys.shape[0] !== this.batchSize) throw new CacheError("BatchTurboQuantKVCache.updateAndFetch", `keys hold ${keys.shape[0]} sequences, the cache ${this.batchSize}`);
    this.ensureCodecs(keys, values);
    const prev = this.idx;
    const nk = this.keyCodec!.quantize(keys);
    const nv = this.valueCodec!.quantize(values);
    try {
      const newEnd = prev + keys.shape[2]!;
      if (this.keys === null || this.values === null) {
        this.keys = { norms: allocLike(nk.norms, newEnd), indices: allocLike(nk.indices, newEnd) };
        this.values = { norms: allocLike(nv.norms, newEnd), indices: allocLike(nv.indices, newEnd) };
      } else {
        this.keys = reserveMSE(this.keys, prev, newEnd);
        this.values = reserveMSE(this.values, prev, newEnd);
      }
      this.keys = writeMSE(this.keys, nk, prev);
      this.values = writeMSE(this.values, nv, prev);
      const off = mx.add(this.offset, keys.shape[2]!);
      this.offset.dispose();
      this.offset = off;
      this.idx = newEnd;
    } finally {
      disposeState(nk);
      disposeState(nv);
    }
    mx.evaluate([this.keys.norms, this.keys.indices, this.values.norms, this.values.indices]);
    // stand-ins for mlx-vlm's _QuantizedStateProxy pair: attention goes through quantizedAttention
    return [sliceT(this.keys.indices, this.idx), sliceT(this.values.indices, this.idx)];
  }

  /** The state arrays up to idx: [key norms, key indices, value norms, value indices] (caller-owned). */
  get quantizedState(): MlxArray[] {
    if (this.keys === null || this.values === null) return [];
    return [sliceT(this.keys.norms, this.idx), sliceT(this.keys.indices, this.idx), sliceT(this.values.norms, this.idx), sliceT(this.values.indices, this.idx)];
  }

  /** meta_state: (_idx, bits, seed, key_bits, value_bits) as Python's str(). */
  get metaState(): string[] {
    return [String(this.idx), pyFloatStr(this.bits), String(this.seed), pyFloatStr(this.keyBits), pyFloatStr(this.valueBits)];
  }

  /** dequantize(): float32 (keys, values) up to idx. */
  dequantize(): [MlxArray, MlxArray] {
    return dequantizeMSE(this.keyCodec!, this.valueCodec!, this.quantizedState);
  }

  quantizedAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray {
    if (this.keys === null || this.keyCodec === null || this.valueCodec === null) throw new CacheError("BatchTurboQuantKVCache", "attention over an empty cache");
    if (this.fusedAttentionEligible && queries.shape[2] === 1) return this.maskedDecodeAttention(queries, scale, mask);
    // several rows (or a single row's prefill: prefill_attention declines MSE keys): dequantize + SDPA
    return attendDequantized(queries, this.dequantize(), scale, mask);
  }

  /**
   * decode_attention for one unpadded row: the batch mask is an array, so mlx-vlm takes its
   * chunked route (one chunk: decode_key_chunk_size is 2^30), op for op: scores against the
   * codebook entries, the mask applied with finfo.min, exp(scores - max) weights summed through
   * the value codec (weighted_sum_stats_from_scores), the running max / normalizer merge from
   * zeros and -inf, and the division by max(normalizer, 1e-6).
   */
  private maskedDecodeAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray {
    const [B, Hq, L, D] = queries.shape as [number, number, number, number];
    const Hkv = this.keys!.norms.shape[1]!;
    const R = Hq / Hkv;
    const Dv = this.valueCodec!.dim;
    const [kn, ki, vn, vi] = this.quantizedState as [MlxArray, MlxArray, MlxArray, MlxArray];
    const total = kn.shape[2]!;
    using stack = new DisposableStack();
    for (const a of [kn, ki, vn, vi]) stack.use(a);
    const qs = stack.use(mx.multiply(queries, scale));
    const grouped = stack.use(mx.reshape(qs, [B, Hkv, R, L, D]));
    const prepared = stack.use(this.keyCodec!.prepareQueries(grouped));
    const output0 = stack.use(mx.zeros([B, Hkv, R, L, Dv], "float32"));
    const normalizer0 = stack.use(mx.zeros([B, Hkv, R, L], "float32"));
    const maxScore0 = stack.use(mx.full([B, Hkv, R, L], -Infinity, "float32"));
    let scores = stack.use(this.keyCodec!.scorePrepared(prepared, { norms: kn, indices: ki }));
    if (mask === "causal") {
      const past = total - L;
      const qi0 = stack.use(mx.arange(past, past + L));
      const kj0 = stack.use(mx.arange(0, total));
      const qi = stack.use(mx.expandDims(qi0, 1));
      const kj = stack.use(mx.expandDims(kj0, 0));
      const c0 = stack.use(mx.greaterEqual(qi, kj));
      const c = stack.use(mx.reshape(c0, [1, 1, 1, L, total]));
      scores = stack.use(mx.where(c, scores, mx.finfo(scores.dtype).min));
    } else if (mask !== null) {
      const s = mask.shape;
      const start = s.map(() => 0);
      const stop = [...s];
      stop[s.length - 2] = Math.min(L, s[s.length - 2]!);
      stop[s.length - 1] = Math.min(total, s[s.length - 1]!);
      let m = stack.use(mx.slice(mask, start, stop));
      if (m.ndim === scores.ndim - 1) m = stack.use(mx.expandDims(m, 2));
      scores = m.dtype === "bool" ? stack.use(mx.where(m, scores, mx.finfo(scores.dtype).min)) : stack.use(mx.add(scores, m));
    }
    // weighted_sum_stats_from_scores (the value codec's plain path)
    const chunkMax = stack.use(mx.max(scores, -1));
    const cm1 = stack.use(mx.expandDims(chunkMax, -1));
    const shifted = stack.use(mx.subtract(scores, cm1));
    const weights = stack.use(mx.exp(shifted));
    const chunkOut = stack.use(this.valueCodec!.weightedSum(weights, { norms: vn, indices: vi }));
    const chunkDenom = stack.use(mx.sum(weights, -1));
    // the online-softmax merge with the initial zeros / -inf
    const newMax = stack.use(mx.maximum(maxScore0, chunkMax));
    const prevScale = stack.use(mx.exp(stack.use(mx.subtract(maxScore0, newMax))));
    const chunkScale = stack.use(mx.exp(stack.use(mx.subtract(chunkMax, newMax))));
    const o1 = stack.use(mx.multiply(output0, stack.use(mx.expandDims(prevScale, -1))));
    const o2 = stack.use(mx.multiply(chunkOut, stack.use(mx.expandDims(chunkScale, -1))));
    const output = stack.use(mx.add(o1, o2));
    const n1 = stack.use(mx.multiply(normalizer0, prevScale));
    const n2 = stack.use(mx.multiply(chunkDenom, chunkScale));
    const normalizer = stack.use(mx.add(n1, n2));
    const den = stack.use(mx.maximum(stack.use(mx.expandDims(normalizer, -1)), 1e-6));
    const out = stack.use(mx.divide(output, den));
    const r = stack.use(mx.reshape(out, [B, Hq, L, Dv]));
    return mx.astype(r, queries.dtype);
  }

  /** filter(batch_indices), then _fused_attention_eligible refreshed. */
  override filter(batchIndices: readonly number[]): void {
    super.filter(batchIndices);
    this.fusedAttentionEligible = this.batchSize === 1 && this.leftPadding.toNumbers()[0] === 0;
  }

  protected mapState(s: MSEState, fn: (a: MlxArray) => MlxArray): MSEState {
    return { norms: fn(s.norms), indices: fn(s.indices) };
  }

  protected disposeState(s: MSEState | null): void {
    disposeState(s);
  }

  override dispose(): void {
    super.dispose();
    this.keyCodec?.dispose();
    this.valueCodec?.dispose();
    this.keyCodec = this.valueCodec = null;
  }
}
