// One tensor of a dump against the oracle's tap of the same name: the bit-exact count where both
// have the same dtype (oracle/tensor_diff.ts), and the distribution metrics always
// (metrics.ts). An engine's `logprobs` is compared with the oracle's `logprobs` where the oracle
// has that tap (step calls) and with its `logits` otherwise: the log-softmax of either is the
// same distribution, so KL / top-k / |Δp| are defined, while the element-wise distances are not
// (they are left out then).
import { compareRaw, type RawTensor } from "../tensor_diff.ts";
import { isFloatDtype, logitMetrics, type LogitMetrics, tensorMetrics, type TensorMetrics } from "./metrics.ts";

export interface TensorComparison {
  /** The dump's tensor name (call prefix + tap name). */
  name: string;
  /** The oracle tap it was compared with (differs from name for logprobs against logits). */
  oracleName: string;
  call: string;
  layer: number | null;
  kind: string;
  engineDtype: string;
  oracleDtype: string;
  shape: number[];
  /** Same dtype: elements that differ in their bytes (0 = bit-exact); null across dtypes. */
  mismatches: number | null;
  total: number;
  bitExact: boolean;
  /**
   * Every value equal (bit-exact, or equal values across dtypes: a float32 copy of a bfloat16
   * tensor). A distance of 0 is within any floor, so such a tensor needs no measured floor.
   */
  exact: boolean;
  /** Element-wise metrics (absent for logprobs against logits, and for integer tensors). */
  metrics?: TensorMetrics;
  /** Row metrics of logits / logprobs. */
  logits?: LogitMetrics;
  /** Integer tensors (token ids): equal or not. */
  integerEqual?: boolean;
  /** A comparison that could not be made (element counts differ). */
  note?: string;
}

export const LOGIT_KINDS = new Set(["logits", "logprobs"]);

function count(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Compares the engine's tensor with the oracle's; `where` is the parsed name of the dump's tensor. */
export function compareTensor(name: string, where: { call: string; layer: number | null; kind: string }, engine: RawTensor, oracleName: string, oracle: RawTensor): TensorComparison {
  const base = { name, oracleName, ...where, engineDtype: engine.dtype, oracleDtype: oracle.dtype, shape: engine.shape, total: count(oracle.shape) };
  if (count(engine.shape) !== count(oracle.shape)) {
    return { ...base, mismatches: null, bitExact: false, exact: false, note: `${count(engine.shape)} elements [${engine.shape}] vs the oracle's ${count(oracle.shape)} [${oracle.shape}]` };
  }
  // Shapes differing only in axes of size 1 ((1, V) against (1, 1, V)) compare as the oracle's.
  const eng = { ...engine, shape: oracle.shape };
  const same = engine.dtype === oracle.dtype ? compareRaw(name, eng, oracle) : null;
  const mismatches = same ? same.mismatches : null;
  const bitExact = same?.equal === true;
  if (!isFloatDtype(engine.dtype) || !isFloatDtype(oracle.dtype)) {
    const equal = bitExact || (same === null && tensorMetrics(eng, oracle).maxAbs === 0);
    return { ...base, mismatches, bitExact, exact: equal, integerEqual: equal };
  }
  const crossLogits = name !== oracleName; // logprobs against logits
  const out: TensorComparison = { ...base, mismatches, bitExact, exact: bitExact };
  if (!crossLogits) {
    out.metrics = tensorMetrics(eng, oracle);
    // NaN on both sides at the same place is not "equal values": maxAbs would be NaN then
    out.exact = bitExact || (out.metrics.maxAbs === 0 && out.metrics.maxUlp === 0);
  }
  if (LOGIT_KINDS.has(where.kind)) out.logits = logitMetrics(eng, oracle);
  return out;
}

export type MaskValue = RawTensor | "causal" | "none";

/**
 * The boolean mask a kind stands for, in the shape of an array mask (..., L, K): "causal" is
 * scaled_dot_product_attention's mask="causal", aligned to the last key (query i sees keys
 * j <= K - L + i); "none" lets every query see every key.
 */
export function materializeMask(kind: "causal" | "none", shape: readonly number[]): RawTensor {
  const L = shape[shape.length - 2] ?? 1;
  const K = shape[shape.length - 1] ?? 1;
  const n = count(shape);
  const data = new Uint8Array(n);
  for (let e = 0; e < n; e++) {
    const j = e % K;
    const i = Math.floor(e / K) % L;
    data[e] = kind === "none" || j <= K - L + i ? 1 : 0;
  }
  return { dtype: "bool", shape: [...shape], data };
}

function maskBits(t: RawTensor): Uint8Array {
  return Uint8Array.from(t.data, (b) => (b ? 1 : 0));
}

/**
 * A mask tap, where either side may give a kind ("causal" / "none", as mlx-lm does where no array
 * is needed) or a boolean array: two kinds must agree; a kind against an array is compared as the
 * array it stands for (an engine that materializes mlx-lm's "causal" mask conforms).
 */
export function compareMask(name: string, where: { call: string; layer: number | null; kind: string }, engine: MaskValue, oracleName: string, oracle: MaskValue): TensorComparison {
  const label = (v: MaskValue) => (typeof v === "string" ? v : v.dtype);
  const base = { name, oracleName, ...where, engineDtype: label(engine), oracleDtype: label(oracle), mismatches: null };
  if (typeof engine === "string" && typeof oracle === "string") {
    const equal = engine === oracle;
    return { ...base, shape: [], total: 1, bitExact: equal, exact: equal, integerEqual: equal, ...(equal ? {} : { note: `mask ${engine} where mlx-lm has ${oracle}` }) };
  }
  if (typeof engine !== "string" && typeof oracle !== "string") return compareTensor(name, where, engine, oracleName, oracle);
  const array = (typeof engine === "string" ? oracle : engine) as RawTensor;
  const kind = (typeof engine === "string" ? engine : oracle) as "causal" | "none";
  const bits = maskBits(array);
  const want = materializeMask(kind, array.shape).data;
  let differ = 0;
  for (let i = 0; i < want.length; i++) if (bits[i] !== want[i]) differ++;
  const equal = differ === 0;
  return {
    ...base, shape: [...array.shape], total: want.length, bitExact: false, exact: equal, integerEqual: equal,
    ...(equal ? {} : { note: `${differ} of ${want.length} mask entries differ from the ${kind} mask ${typeof engine === "string" ? "the engine gives" : "mlx-lm gives"}` }),
  };
}
