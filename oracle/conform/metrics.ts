// Distribution metrics between an engine's tensor and the oracle's (issue 24): the distances a
// conformance check needs where bit equality is not expected (another engine, another dtype).
// Every value is computed in float64 from the raw bytes (float32, float16, bfloat16, float64, or
// integers), so a bfloat16 engine and a float32 oracle are compared on their exact values.
// Conventions where numpy would give NaN (stated once, here): the relative L2 error of two
// all-zero tensors is 0 (they are equal) and of a non-zero tensor against a zero one is Infinity;
// the cosine of two zero vectors is 1, of one zero vector against a non-zero one 0.
import { type RawTensor, reader } from "../tensor_diff.ts";

export type { RawTensor } from "../tensor_diff.ts";

/** Element-wise distances of an engine tensor `a` from the oracle's `b` (same element count). */
export interface TensorMetrics {
  /** Elements compared. */
  n: number;
  maxAbs: number;
  /** Largest distance in float32 units in the last place, both sides rounded to float32 first. */
  maxUlp: number;
  /** ‖a − b‖₂ / ‖b‖₂ (b = the oracle). */
  relL2: number;
  /** a·b / (‖a‖₂‖b‖₂). */
  cosine: number;
}

/** Row metrics of logits (or log-probabilities) over the vocabulary, the last axis. */
export interface LogitMetrics {
  rows: number;
  vocab: number;
  /** KL(oracle ‖ engine) of the two softmaxes, in nats: mean and max over rows. */
  klMean: number;
  klMax: number;
  /** Fraction of rows whose argmax agrees (the first index on a tie, as numpy's argmax). */
  top1: number;
  /** k used (min(10, vocab)) and the mean of |topk_engine ∩ topk_oracle| / k over rows. */
  k: number;
  topkOverlap: number;
  /** |p_engine(t) − p_oracle(t)| for t = the oracle's top token of each row: mean and max. */
  dpTopMean: number;
  dpTopMax: number;
}

const FLOATS = new Set(["float16", "bfloat16", "float32", "float64"]);

export function isFloatDtype(dtype: string): boolean {
  return FLOATS.has(dtype);
}

function count(t: RawTensor): number {
  return t.shape.reduce((a, b) => a * b, 1);
}

/** Every element of a raw tensor as a float64 (a bfloat16's or float16's exact value). */
export function toFloat64(t: RawTensor): Float64Array {
  const n = count(t);
  const r = reader(t);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = r.num(i);
  return out;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The float32 bit pattern mapped to an integer line on which adjacent floats differ by 1. */
function orderedF32(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  return bits & 0x80000000 ? -(bits & 0x7fffffff) : bits;
}

function sameCount(a: RawTensor, b: RawTensor, what: string): void {
  if (count(a) !== count(b)) throw new Error(`${what}: ${count(a)} elements [${a.shape}] vs the oracle's ${count(b)} [${b.shape}]`);
}

/** Distances of the engine's `a` from the oracle's `b` (any dtypes, same element count). */
export function tensorMetrics(a: RawTensor, b: RawTensor): TensorMetrics {
  sameCount(a, b, "tensorMetrics");
  return tensorMetricsOf(toFloat64(a), toFloat64(b));
}

export function tensorMetricsOf(a: Float64Array, b: Float64Array): TensorMetrics {
  if (a.length !== b.length) throw new Error(`tensorMetrics: ${a.length} vs ${b.length} elements`);
  let maxAbs = 0, maxUlp = 0, dd = 0, aa = 0, bb = 0, ab = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i]!, y = b[i]!;
    const d = x - y;
    // NaN on either side makes the distances NaN (Math.max propagates it)
    maxAbs = Math.max(maxAbs, Math.abs(d));
    if (Number.isNaN(x) || Number.isNaN(y)) maxUlp = Number.NaN;
    else if (x !== y) maxUlp = Math.max(maxUlp, Math.abs(orderedF32(x) - orderedF32(y)));
    dd += d * d;
    aa += x * x;
    bb += y * y;
    ab += x * y;
  }
  const relL2 = bb > 0 ? Math.sqrt(dd) / Math.sqrt(bb) : dd > 0 ? Infinity : Number.isNaN(dd) ? Number.NaN : 0;
  // sqrt(aa·bb), not sqrt(aa)·sqrt(bb): identical tensors then give exactly 1
  const cosine = aa > 0 && bb > 0 ? ab / Math.sqrt(aa * bb) : aa === 0 && bb === 0 ? 1 : Number.isNaN(aa + bb) ? Number.NaN : 0;
  return { n: a.length, maxAbs, maxUlp, relL2, cosine };
}

/** log-softmax of one row in float64 (idempotent: a row of log-probabilities maps to itself up to rounding). */
export function logSoftmax(row: Float64Array): Float64Array {
  let m = -Infinity;
  for (const x of row) if (x > m) m = x;
  let s = 0;
  for (const x of row) s += Math.exp(x - m);
  const lse = m + Math.log(s);
  return row.map((x) => x - lse);
}

function argmax(row: Float64Array): number {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i;
  return best;
}

/** Indices of the k largest values, larger first, the lower index first on a tie. */
export function topK(row: Float64Array, k: number): number[] {
  // One pass keeping the k best so far, in order (a full sort of a 262,144-entry vocabulary
  // took seconds per row); a row holding a NaN keeps the full sort's order.
  const best: number[] = [];
  if (k <= 0) return best;
  for (let i = 0; i < row.length; i++) {
    const x = row[i]!;
    if (Number.isNaN(x)) return sortedTopK(row, k);
    if (best.length === k) {
      if (!(x > row[best[k - 1]!]!)) continue;
      best.pop();
    }
    // after every kept value >= x: an equal value keeps the lower index first
    let p = best.length;
    while (p > 0 && row[best[p - 1]!]! < x) p--;
    best.splice(p, 0, i);
  }
  return best;
}

function sortedTopK(row: Float64Array, k: number): number[] {
  const idx = Array.from(row.keys());
  idx.sort((i, j) => row[j]! - row[i]! || i - j);
  return idx.slice(0, k);
}

/**
 * Logit metrics of the engine's `a` against the oracle's `b`: both are logits or
 * log-probabilities (either side may be either) over the last axis. Shapes may differ in their
 * leading axes of size 1 ((1, V) against (1, 1, V)); the vocabulary and element count must agree.
 */
export function logitMetrics(a: RawTensor, b: RawTensor, k = 10): LogitMetrics {
  const V = b.shape[b.shape.length - 1] ?? 1;
  if ((a.shape[a.shape.length - 1] ?? 1) !== V) throw new Error(`logitMetrics: vocabulary ${a.shape.at(-1)} vs the oracle's ${V}`);
  sameCount(a, b, "logitMetrics");
  return logitMetricsOf(toFloat64(a), toFloat64(b), V, k);
}

export function logitMetricsOf(a: Float64Array, b: Float64Array, V: number, k = 10): LogitMetrics {
  const rows = a.length / V;
  const kk = Math.min(k, V);
  let klSum = 0, klMax = 0, top1 = 0, overlap = 0, dpSum = 0, dpMax = 0;
  for (let r = 0; r < rows; r++) {
    const la = logSoftmax(a.subarray(r * V, (r + 1) * V));
    const lb = logSoftmax(b.subarray(r * V, (r + 1) * V));
    let kl = 0;
    for (let i = 0; i < V; i++) {
      const p = Math.exp(lb[i]!);
      // a token the oracle gives no mass adds nothing (0·log 0 = 0)
      if (p > 0) kl += p * (lb[i]! - la[i]!);
    }
    klSum += kl;
    klMax = Math.max(klMax, kl);
    const tb = argmax(lb);
    if (argmax(la) === tb) top1++;
    const sb = new Set(topK(lb, kk));
    overlap += topK(la, kk).filter((i) => sb.has(i)).length / kk;
    const dp = Math.abs(Math.exp(la[tb]!) - Math.exp(lb[tb]!));
    dpSum += dp;
    dpMax = Math.max(dpMax, dp);
  }
  const n = Math.max(1, rows);
  return { rows, vocab: V, klMean: klSum / n, klMax, top1: top1 / n, k: kk, topkOverlap: overlap / n, dpTopMean: dpSum / n, dpTopMax: dpMax };
}

/**
 * The first step of a generation whose greedy token differs (index into the token lists), or
 * null when they agree; a shorter list differs at its end.
 */
export function firstDifferingStep(engine: readonly number[], oracle: readonly number[]): number | null {
  const n = Math.min(engine.length, oracle.length);
  for (let i = 0; i < n; i++) if (engine[i] !== oracle[i]) return i;
  return engine.length === oracle.length ? null : n;
}

/** A float tensor of the given dtype from float64 values (round to nearest even), for tests and edited dumps. */
export function rawFromFloat64(values: ArrayLike<number>, shape: number[], dtype: "float32" | "bfloat16" | "float64"): RawTensor {
  const n = values.length;
  if (dtype === "float64") return { dtype, shape, data: new Uint8Array(Float64Array.from(values).buffer) };
  const f = Float32Array.from(values);
  if (dtype === "float32") return { dtype, shape, data: new Uint8Array(f.buffer) };
  const bits = new Uint32Array(f.buffer);
  const out = new Uint16Array(n);
  for (let i = 0; i < n; i++) {
    const x = bits[i]!;
    // NaN stays a quiet NaN; otherwise round the low 16 bits to nearest, ties to even
    out[i] = (x & 0x7fffffff) > 0x7f800000 ? (x >>> 16) | 0x40 : (x + 0x7fff + ((x >>> 16) & 1)) >>> 16;
  }
  return { dtype, shape, data: new Uint8Array(out.buffer) };
}
