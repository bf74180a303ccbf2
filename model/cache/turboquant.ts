// mlx_vlm/turboquant.py (mlx-vlm 0.7.10), the part Gemma 4 runs off macOS (no Metal: every
// `_metal_*` helper and fused kernel returns None there and the plain-MLX fallback runs):
//
// - TurboQuantKVCache with the MSE codec (mode "mse" for keys and values, as the cache builds
//   them), key seed `seed`, value seed `seed + 1`; a fractional width B splits into keys floor(B)
//   and values ceil(B) (resolve_kv_bits), each an integer-width MSE codec. The Split codec (a .5
//   width given per key or value) is TurboQuantSplitKVCache's (turboquant_split.ts); this class refuses it.
// - Rotation: for a power-of-two head dim the randomized Hadamard transform, signs from numpy's
//   np.random.default_rng(seed + dim*7919).choice([-1.0, 1.0], size=dim) (PCG64Generator);
//   mx.hadamard_transform is not in the binding, so it is composed from add/subtract butterflies
//   and one multiply by the float32 scale, the op order of MLX's CPU kernel (hadamard_n), checked
//   bit for bit against mx.hadamard_transform (suites/kvquant). Other dims use
//   _rotation_matrix (numpy LAPACK QR): not portable, so the matrix is an input (options.rotation).
// - Codebooks: computed by mlx-vlm in numpy float32 at run time; carried here as data
//   (turboquant_codebooks.json, with the numpy build and CPU features that produced them); the
//   parity suite checks them against the oracle's run-time values.
// - Packing: _pack_lowbit / _unpack_lowbit's bit layout (value i at bit i*bits, spilling into the
//   next uint32 word). Integer results, so the port packs on the host and unpacks with MLX ops.
// - Attention (models/base.py scaled_dot_product_attention with a TurboQuant cache): one query
//   token → decode_attention's CPU fallback (rotate the queries, einsum scores against the
//   codebook entries, softmax, einsum the weighted values, rotate back); more tokens →
//   prefill_attention declines for MSE keys, so dequantize and mx.fast.scaled_dot_product_attention.
//
// Ownership follows model/cache: updateAndFetch returns two caller-owned arrays. Here they are
// stand-ins (the packed key and value indices), since mlx-vlm returns proxies of its quantized
// state; a layer that attends through this cache must call `attention` (gemma4_text's attend).
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { cacheAttentionMask, type Mask, type MakeMaskOptions } from "../mask.ts";
import { KVQuantError, resolveKvBits } from "../kv_quant.ts";
import { PCG64Generator } from "../tuner/np_random.ts";
import codebookData from "./turboquant_codebooks.json" with { type: "json" };
import { CacheError, type KVCacheLike } from "./index.ts";

export const DEFAULT_TURBOQUANT_SEED = 0;
const EPS = 1e-6;
export const CACHE_STEP = 256;

// ------------------------------------------------------------------ numpy-side constants

const signCache = new Map<string, Float32Array>();

/** _rht_sign_vector(dim, seed) as float32 values. */
export function rhtSignVector(dim: number, seed: number): Float32Array {
  const key = `${dim}:${seed}`;
  let s = signCache.get(key);
  if (!s) {
    const g = new PCG64Generator(seed + dim * 7919);
    s = Float32Array.from(g.choice([-1, 1], dim));
    signCache.set(key, s);
  }
  return s;
}

/** _codebook(dim, bits) from the carried data (this machine's numpy values; see the JSON's provenance). */
export function codebookValues(dim: number, bits: number): Float32Array {
  const hex = (codebookData.codebooks as Record<string, string[]>)[`${dim}:${bits}`];
  if (!hex) {
    throw new KVQuantError(`no TurboQuant codebook for head dim ${dim} at ${bits} bits in model/cache/turboquant_codebooks.json (mlx-vlm computes it with numpy at run time; regenerate the file with oracle/python/kv_quant_ref.py's codebooks command)`);
  }
  const u = Uint32Array.from(hex, (h) => Number.parseInt(h, 16));
  return new Float32Array(u.buffer);
}

export const codebookProvenance = codebookData.provenance;

function isPowerOfTwo(n: number): boolean {
  return n > 0 && (n & (n - 1)) === 0;
}

/** mx.hadamard_transform(x, scale=1/sqrt(D)) on the last axis (D a power of two, float32 input), as MLX's CPU kernel computes it. */
export function hadamardTransform(x: MlxArray): MlxArray {
  const shape = x.shape;
  const D = shape[shape.length - 1]!;
  const lead = shape.slice(0, -1);
  let y = mx.alias(x);
  for (let h = 1; h < D; h *= 2) {
    using r = mx.reshape(y, [...lead, D / (2 * h), 2, h]);
    const n = r.shape.length;
    const stop = [...r.shape];
    stop[n - 2] = 1;
    const start1 = r.shape.map(() => 0);
    start1[n - 2] = 1;
    using a0 = mx.slice(r, r.shape.map(() => 0), stop);
    using b0 = mx.slice(r, start1, r.shape);
    using a = mx.squeeze(a0, n - 2);
    using b = mx.squeeze(b0, n - 2);
    using s = mx.add(a, b);
    using d = mx.subtract(a, b);
    using st = mx.stack([s, d], n - 2);
    y.dispose();
    y = mx.reshape(st, shape);
  }
  using yy = y;
  return mx.multiply(yy, 1 / Math.sqrt(D));
}

// ------------------------------------------------------------------ packing

function packedWidth(length: number, bits: number): number {
  return length === 0 || bits === 0 ? 0 : Math.floor((length * bits + 31) / 32);
}

/** _pack_lowbit on the host: rows of `length` values (< 2^bits) into uint32 words. */
function packRows(values: Uint32Array, rows: number, length: number, bits: number): Uint32Array {
  const pw = packedWidth(length, bits);
  const out = new Uint32Array(rows * pw);
  for (let r = 0; r < rows; r++) {
    for (let i = 0; i < length; i++) {
      const v = values[r * length + i]!;
      const bitOffset = i * bits;
      const w = r * pw + Math.floor(bitOffset / 32);
      const off = bitOffset % 32;
      out[w] = (out[w]! | (v << off)) >>> 0;
      const spill = off + bits - 32;
      if (spill > 0) out[w + 1] = (out[w + 1]! | (v >>> (bits - spill))) >>> 0;
    }
  }
  return out;
}

/** _unpack_lowbit with MLX ops: (..., PW) uint32 → (..., length) uint32. */
function unpackLowbit(packed: MlxArray, bits: number, length: number): MlxArray {
  const word = new Int32Array(length);
  const next = new Int32Array(length);
  const off = new Uint32Array(length);
  const hiShift = new Uint32Array(length);
  const hasSpill = new Uint8Array(length);
  const pw = packed.shape[packed.shape.length - 1]!;
  for (let i = 0; i < length; i++) {
    const b = i * bits;
    word[i] = Math.floor(b / 32);
    off[i] = b % 32;
    const spill = off[i]! + bits - 32;
    hasSpill[i] = spill > 0 ? 1 : 0;
    next[i] = spill > 0 ? word[i]! + 1 : Math.min(word[i]!, pw - 1);
    hiShift[i] = spill > 0 ? bits - spill : 0;
  }
  using wi = mx.array(word, [length], "int32");
  using ni = mx.array(next, [length], "int32");
  using offs = mx.array(off, [length], "uint32");
  using his = mx.array(hiShift, [length], "uint32");
  using spU = mx.array(Uint32Array.from(hasSpill), [length], "uint32");
  using sp = mx.greater(spU, 0);
  const axis = packed.shape.length - 1;
  using lo = mx.take(packed, wi, axis);
  using hi = mx.take(packed, ni, axis);
  using loS = mx.rightShift(lo, offs);
  using hiS = mx.leftShift(hi, his);
  using zero = mx.zeros([1], "uint32");
  using hiM = mx.where(sp, hiS, zero);
  using v = mx.bitwiseOr(loS, hiM);
  using mask = mx.array(new Uint32Array([(2 ** bits - 1) >>> 0]), [1], "uint32");
  return mx.bitwiseAnd(v, mask);
}

// ------------------------------------------------------------------ the MSE codec

/** TurboQuantMSEState: norms (B, H, T) float16, indices (B, H, T, packed width) uint32. */
export interface MSEState {
  norms: MlxArray;
  indices: MlxArray;
}

export function disposeState(s: MSEState | null): void {
  s?.norms.dispose();
  s?.indices.dispose();
}

export interface CodecOptions {
  /** The rotation matrix for a head dim that is not a power of two (mlx-vlm: numpy QR, not portable). */
  rotation?: (dim: number, seed: number) => MlxArray;
}

export class TurboQuantMSECodec implements Disposable {
  readonly useRht: boolean;
  private readonly signs: MlxArray | null;
  private readonly rotation: MlxArray | null;
  private readonly rotationT: MlxArray | null;
  readonly codebook: MlxArray;
  private readonly midpoints: MlxArray;

  constructor(
    readonly dim: number,
    readonly bits: number,
    readonly seed: number,
    opts: CodecOptions = {},
  ) {
    if (!Number.isInteger(bits) || bits < 1) throw new KVQuantError(`the MSE codec takes an integer width >= 1, got ${bits}`);
    this.useRht = isPowerOfTwo(dim);
    if (this.useRht) {
      this.signs = mx.array(rhtSignVector(dim, seed), [dim], "float32");
      this.rotation = this.rotationT = null;
    } else {
      if (!opts.rotation) {
        throw new KVQuantError(`TurboQuant on head dim ${dim} (not a power of two) rotates with mlx-vlm's _rotation_matrix (numpy LAPACK QR, not portable bit for bit): pass the matrix as an input`);
      }
      this.signs = null;
      this.rotation = opts.rotation(dim, seed);
      this.rotationT = mx.transpose(this.rotation, [1, 0]);
    }
    this.codebook = mx.array(codebookValues(dim, bits), [2 ** bits], "float32");
    // (codebook[:-1] + codebook[1:]) / 2
    const L = 2 ** bits;
    using lo = mx.slice(this.codebook, [0], [L - 1]);
    using hi = mx.slice(this.codebook, [1], [L]);
    using s = mx.add(lo, hi);
    this.midpoints = mx.divide(s, 2);
  }

  rotateForward(x: MlxArray): MlxArray {
    if (this.useRht) {
      using y = mx.multiply(x, this.signs!);
      return hadamardTransform(y);
    }
    return mx.matmul(x, this.rotationT!);
  }

  rotateInverse(x: MlxArray): MlxArray {
    if (this.useRht) {
      using y = hadamardTransform(x);
      return mx.multiply(y, this.signs!);
    }
    return mx.matmul(x, this.rotation!);
  }

  /** quantize(vectors (B, H, T, D)) → MSEState (the fallback after the Metal-only branches). */
  quantize(vectors: MlxArray): MSEState {
    using v = mx.astype(vectors, "float32");
    using sq = mx.square(v);
    using ss = mx.sum(sq, -1);
    const norms = mx.sqrt(ss);
    try {
      using n1 = mx.expandDims(norms, -1);
      using den = mx.maximum(n1, EPS);
      using unit = mx.divide(v, den);
      using rotated = this.rotateForward(unit);
      using r1 = mx.expandDims(rotated, -1);
      using gt = mx.greater(r1, this.midpoints);
      using idx = mx.sum(gt, -1); // the number of midpoints below: the Python loop's sum
      using idx32 = mx.astype(idx, "uint32");
      mx.evaluate(idx32);
      const shape = vectors.shape;
      const rows = shape.slice(0, -1).reduce((a, b) => a * b, 1);
      const packed = packRows(idx32.toTypedArray() as Uint32Array, rows, this.dim, this.bits);
      const indices = mx.array(packed, [...shape.slice(0, -1), packedWidth(this.dim, this.bits)], "uint32");
      const n16 = mx.astype(norms, "float16");
      return { norms: n16, indices };
    } finally {
      norms.dispose();
    }
  }

  /** The codebook entries of a state's indices, in the rotated space: (B, H, T, D) float32. */
  private rotatedEntries(state: MSEState): MlxArray {
    using u = unpackLowbit(state.indices, this.bits, this.dim);
    using i = mx.astype(u, "int32");
    return mx.take(this.codebook, i, 0);
  }

  dequantize(state: MSEState): MlxArray {
    using rot = this.rotatedEntries(state);
    using unit = this.rotateInverse(rot);
    using n1 = mx.expandDims(state.norms, -1);
    using n = mx.astype(n1, unit.dtype);
    return mx.multiply(n, unit);
  }

  prepareQueries(queries: MlxArray): MlxArray {
    return this.rotateForward(queries);
  }

  /** score_prepared's fallback: einsum against the codebook entries, times the norms. */
  scorePrepared(prepared: MlxArray, state: MSEState): MlxArray {
    using rot = this.rotatedEntries(state);
    using dots = mx.einsum("bhmld,bhtd->bhmlt", prepared, rot);
    using nf = mx.astype(state.norms, "float32");
    const [B, H, T] = nf.shape as [number, number, number];
    using n5 = mx.reshape(nf, [B, H, 1, 1, T]);
    return mx.multiply(dots, n5);
  }

  weightedSum(weights: MlxArray, state: MSEState): MlxArray {
    using rot = this.rotatedEntries(state);
    using nf = mx.astype(state.norms, "float32");
    using w = mx.einsum("bhmlt,bht,bhtd->bhmld", weights, nf, rot);
    return this.rotateInverse(w);
  }

  weightedSumFromScores(scores: MlxArray, state: MSEState): MlxArray {
    using sm = mx.softmax(scores, -1);
    return this.weightedSum(sm, state);
  }

  dispose(): void {
    this.signs?.dispose();
    this.rotation?.dispose();
    this.rotationT?.dispose();
    this.codebook.dispose();
    this.midpoints.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

// ------------------------------------------------------------------ state helpers

/** a[:, :, :end] (the token axis of a state array). */
export function sliceT(a: MlxArray, end: number): MlxArray {
  const s = a.shape;
  const stop = [...s];
  stop[2] = end;
  return mx.slice(a, s.map(() => 0), stop);
}

/** dst[:, :, start:start + src's tokens] = src (a new array). */
export function writeT(dst: MlxArray, src: MlxArray, start: number): MlxArray {
  const s = dst.shape;
  const st = s.map(() => 0);
  st[2] = start;
  const stop = [...s];
  stop[2] = start + src.shape[2]!;
  return mx.sliceUpdate(dst, src, st, stop);
}

/** zeros like `a` with `length` tokens. */
export function allocLike(a: MlxArray, length: number): MlxArray {
  const s = [...a.shape];
  s[2] = length;
  return mx.zeros(s, a.dtype);
}

// ------------------------------------------------------------------ the cache

export interface TurboQuantOptions extends CodecOptions {
  seed?: number;
  keyBits?: number | null;
  valueBits?: number | null;
}

/** _reserve_state_capacity(state, used, needed, cache_step): grow to the next multiple of the step, copying the used part (s disposed when grown). */
export function reserveMSE(s: MSEState, used: number, needed: number): MSEState {
  const capacity = s.norms.shape[2]!;
  if (capacity >= needed) return s;
  const cap = Math.ceil(needed / CACHE_STEP) * CACHE_STEP;
  let grown: MSEState = { norms: allocLike(s.norms, cap), indices: allocLike(s.indices, cap) };
  if (used > 0) {
    using n = sliceT(s.norms, used);
    using i = sliceT(s.indices, used);
    grown = writeMSE(grown, { norms: n, indices: i }, 0);
  }
  disposeState(s);
  return grown;
}

/** _write_state: src written into dst from token `start` (new arrays; dst disposed). */
export function writeMSE(dst: MSEState, src: MSEState, start: number): MSEState {
  const norms = writeT(dst.norms, src.norms, start);
  const indices = writeT(dst.indices, src.indices, start);
  disposeState(dst);
  return { norms, indices };
}

/** A cache whose attention must be computed by the cache itself (its keys/values are not arrays to attend over). */
export interface QuantizedAttentionCache {
  quantizedAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray;
}

export function isQuantizedAttentionCache(c: unknown): c is QuantizedAttentionCache {
  return c !== null && typeof c === "object" && typeof (c as QuantizedAttentionCache).quantizedAttention === "function";
}

/**
 * What mlx-vlm's TurboQuantKVCache is whatever codec each side has (TurboQuantKVCache here: MSE
 * both sides; TurboQuantSplitKVCache: a Split codec on one side or both): the widths and seed
 * (meta_state), the token offset (trim, size, the causal mask), and attention: a decode step
 * through the codecs, anything longer dequantized to float32 and run through SDPA in the queries'
 * dtype (prefill_attention returns None for these keys).
 */
export abstract class TurboQuantCacheBase implements KVCacheLike, QuantizedAttentionCache {
  bits: number;
  keyBits: number;
  valueBits: number;
  seed: number;
  offset = 0;
  abstract keys: object | null;
  abstract values: object | null;
  protected readonly opts: CodecOptions;

  constructor(bits: number, opts: TurboQuantOptions = {}) {
    [this.bits, this.keyBits, this.valueBits] = resolveKvBits(bits, opts.keyBits ?? null, opts.valueBits ?? null);
    this.seed = opts.seed ?? DEFAULT_TURBOQUANT_SEED;
    this.opts = { rotation: opts.rotation };
  }

  abstract updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray];
  abstract get state(): MlxArray[];
  abstract set state(v: MlxArray[]);
  abstract get nbytes(): number;
  /** dequantize(): float32 (keys, values) over the offset. */
  abstract dequantize(): [MlxArray, MlxArray];
  abstract dispose(): void;
  /** Whether both sides' codecs exist (built on the first update). */
  protected abstract codecsBuilt(): boolean;
  /** decode_attention for one query token. */
  protected abstract decodeAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray;

  /** meta_state: (offset, bits, seed, key_bits, value_bits) as Python's str(). */
  get metaState(): string[] {
    const f = (x: number) => (Number.isInteger(x) ? `${x}.0` : String(x));
    return [String(this.offset), f(this.bits), String(this.seed), f(this.keyBits), f(this.valueBits)];
  }

  set metaState(v: string[]) {
    if (!Array.isArray(v) || v.length < 3) throw new CacheError("TurboQuantKVCache.metaState", `expects [offset, bits, seed, key_bits?, value_bits?], got ${JSON.stringify(v)}`);
    const nums = v.map(Number);
    if (nums.some((x) => !Number.isFinite(x))) throw new CacheError("TurboQuantKVCache.metaState", `not numbers: ${JSON.stringify(v)}`);
    this.offset = Math.trunc(nums[0]!);
    this.seed = Math.trunc(nums[2]!);
    [this.bits, this.keyBits, this.valueBits] = resolveKvBits(nums[1]!, nums.length > 3 ? nums[3]! : null, nums.length > 4 ? nums[4]! : null);
  }

  isTrimmable(): boolean {
    return true;
  }

  trim(n: number): number {
    if (!Number.isInteger(n) || n < 0) throw new CacheError("TurboQuantKVCache.trim", `n must be a non-negative integer, got ${n}`);
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

  makeMask(N: number, { windowSize = null, returnArray = false }: MakeMaskOptions = {}): Mask {
    return cacheAttentionMask(N, this.offset, returnArray, windowSize);
  }

  /** models/base.py scaled_dot_product_attention for this cache (no sinks). */
  quantizedAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray {
    if (this.keys === null || !this.codecsBuilt()) throw new CacheError("TurboQuantKVCache", "attention over an empty cache");
    if (queries.shape[2] === 1) return this.decodeAttention(queries, scale, mask);
    // prefill_attention returns None for these keys: dequantize, then SDPA
    return attendDequantized(queries, this.dequantize(), scale, mask);
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** from_cache's body: an unquantized cache's keys and values (its state) written into t through updateAndFetch. */
export function quantizeCacheInto(t: KVCacheLike, cache: KVCacheLike): void {
  const st = cache.state;
  try {
    if (st.length === 2 && cache.offset > 0) {
      // mlx-vlm's KVCache.state is keys[..., :offset, :]
      using k = sliceT(st[0]!, cache.offset);
      using v = sliceT(st[1]!, cache.offset);
      const [a, b] = t.updateAndFetch(k, v);
      a.dispose();
      b.dispose();
    }
  } finally {
    for (const s of st) s.dispose();
  }
}

/** models/base.py's fallback: dequantized (keys, values) cast to the queries' dtype, through mx.fast.scaled_dot_product_attention (k and v disposed here). */
export function attendDequantized(queries: MlxArray, [k, v]: [MlxArray, MlxArray], scale: number, mask: Mask): MlxArray {
  try {
    using kq = mx.astype(k, queries.dtype);
    using vq = mx.astype(v, queries.dtype);
    return mx.fast.scaledDotProductAttention(queries, kq, vq, { scale, mask });
  } finally {
    k.dispose();
    v.dispose();
  }
}

/** float32 (keys, values) from an MSE state [key norms, key indices, value norms, value indices] (the four disposed here). */
export function dequantizeMSE(keyCodec: TurboQuantMSECodec, valueCodec: TurboQuantMSECodec, quantizedState: MlxArray[]): [MlxArray, MlxArray] {
  const [kn, ki, vn, vi] = quantizedState as [MlxArray, MlxArray, MlxArray, MlxArray];
  try {
    using k = keyCodec.dequantize({ norms: kn, indices: ki });
    using v = valueCodec.dequantize({ norms: vn, indices: vi });
    return [mx.astype(k, "float32"), mx.astype(v, "float32")];
  } finally {
    for (const a of [kn, ki, vn, vi]) a.dispose();
  }
}

export class TurboQuantKVCache extends TurboQuantCacheBase {
  keys: MSEState | null = null;
  values: MSEState | null = null;
  keyCodec: TurboQuantMSECodec | null = null;
  valueCodec: TurboQuantMSECodec | null = null;

  constructor(bits: number, opts: TurboQuantOptions = {}) {
    super(bits, opts);
    for (const b of [this.keyBits, this.valueBits]) {
      if (!Number.isInteger(b)) throw new KVQuantError(`a ${b}-bit key or value width runs mlx-vlm's split codec: use TurboQuantSplitKVCache (turboquant_split.ts; makeKvQuantizer picks it)`);
    }
  }

  /** TurboQuantKVCache.from_cache: quantize an unquantized cache's keys and values (its state). */
  static fromCache(cache: KVCacheLike, bits: number, opts: TurboQuantOptions = {}): TurboQuantKVCache {
    const t = new TurboQuantKVCache(bits, opts);
    quantizeCacheInto(t, cache);
    return t;
  }

  /** _ensure_codecs: the codecs for these keys/values' head dims (a cache restored from state + metaState builds them here or on its first update). */
  ensureCodecs(keys: MlxArray, values: MlxArray): void {
    this.keyCodec ??= new TurboQuantMSECodec(keys.shape[3]!, this.keyBits, this.seed, this.opts);
    this.valueCodec ??= new TurboQuantMSECodec(values.shape[3]!, this.valueBits, this.seed + 1, this.opts);
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (keys.shape.length !== 4 || values.shape.length !== 4) throw new CacheError("TurboQuantKVCache.updateAndFetch", "keys and values must be 4-D (B, n_kv_heads, S, head_dim)");
    this.ensureCodecs(keys, values);
    const nk = this.keyCodec!.quantize(keys);
    const nv = this.valueCodec!.quantize(values);
    try {
      const newEnd = this.offset + keys.shape[2]!;
      if (this.keys === null || this.values === null) {
        this.keys = { norms: allocLike(nk.norms, newEnd), indices: allocLike(nk.indices, newEnd) };
        this.values = { norms: allocLike(nv.norms, newEnd), indices: allocLike(nv.indices, newEnd) };
      } else {
        this.keys = reserveMSE(this.keys, this.offset, newEnd);
        this.values = reserveMSE(this.values, this.offset, newEnd);
      }
      this.keys = writeMSE(this.keys, nk, this.offset);
      this.values = writeMSE(this.values, nv, this.offset);
      this.offset = newEnd;
    } finally {
      disposeState(nk);
      disposeState(nv);
    }
    mx.evaluate([this.keys.norms, this.keys.indices, this.values.norms, this.values.indices]);
    // stand-ins for mlx-vlm's _QuantizedStateProxy pair (see the header)
    return [sliceT(this.keys.indices, this.offset), sliceT(this.values.indices, this.offset)];
  }

  /** The state sliced to the offset: [keys norms, keys indices, values norms, values indices] (caller-owned). */
  get quantizedState(): MlxArray[] {
    if (this.keys === null || this.values === null) return [];
    return [sliceT(this.keys.norms, this.offset), sliceT(this.keys.indices, this.offset), sliceT(this.values.norms, this.offset), sliceT(this.values.indices, this.offset)];
  }

  get state(): MlxArray[] {
    return this.quantizedState;
  }

  set state(v: MlxArray[]) {
    if (!Array.isArray(v) || (v.length !== 0 && v.length !== 4)) throw new CacheError("TurboQuantKVCache.state", "expects [key norms, key indices, value norms, value indices] or []");
    disposeState(this.keys);
    disposeState(this.values);
    if (v.length === 0) {
      this.keys = this.values = null;
      this.offset = 0;
      return;
    }
    this.keys = { norms: mx.alias(v[0]!), indices: mx.alias(v[1]!) };
    this.values = { norms: mx.alias(v[2]!), indices: mx.alias(v[3]!) };
    this.offset = v[0]!.shape[2]!;
  }

  get nbytes(): number {
    if (this.keys === null || this.values === null) return 0;
    const per = (s: MSEState) => (s.norms.nbytes / s.norms.shape[2]! + s.indices.nbytes / s.indices.shape[2]!) * this.offset;
    return per(this.keys) + per(this.values);
  }

  dequantize(): [MlxArray, MlxArray] {
    return dequantizeMSE(this.keyCodec!, this.valueCodec!, this.quantizedState);
  }

  protected codecsBuilt(): boolean {
    return this.keyCodec !== null && this.valueCodec !== null;
  }

  /** decode_attention's CPU route for MSE keys and values (total tokens <= decode_key_chunk_size, no array mask). */
  protected decodeAttention(queries: MlxArray, scale: number, mask: Mask): MlxArray {
    if (mask !== null && mask !== "causal") throw new CacheError("TurboQuantKVCache", "decode attention with an array mask (mlx-vlm's chunked route) is not ported");
    const [B, Hq, L, D] = queries.shape as [number, number, number, number];
    const Hkv = this.keys!.norms.shape[1]!;
    const R = Hq / Hkv;
    const [kn, ki, vn, vi] = this.quantizedState as [MlxArray, MlxArray, MlxArray, MlxArray];
    try {
      using qs = mx.multiply(queries, scale);
      using grouped = mx.reshape(qs, [B, Hkv, R, L, D]);
      using prepared = this.keyCodec!.prepareQueries(grouped);
      using scores = this.keyCodec!.scorePrepared(prepared, { norms: kn, indices: ki });
      using out = this.valueCodec!.weightedSumFromScores(scores, { norms: vn, indices: vi });
      using o = mx.reshape(out, [B, Hq, L, this.valueCodec!.dim]);
      return mx.astype(o, queries.dtype);
    } finally {
      for (const a of [kn, ki, vn, vi]) a.dispose();
    }
  }

  dispose(): void {
    disposeState(this.keys);
    disposeState(this.values);
    this.keys = this.values = null;
    this.keyCodec?.dispose();
    this.valueCodec?.dispose();
    this.keyCodec = this.valueCodec = null;
  }
}
