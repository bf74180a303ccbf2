// One tensor of a dump against the oracle's tap of the same name: the bit-exact count where both
// have the same dtype (oracle/tensor_diff.ts), and the distribution metrics always
// (metrics.ts). An engine's `logprobs` is compared with the oracle's `logprobs` where the oracle
// has that tap (step calls) and with its `logits` otherwise: the log-softmax of either is the
// same distribution, so KL / top-k / |Δp| are defined, while the element-wise distances are not
// (they are left out then).
import { compareRaw, type RawTensor } from "../tensor_diff.ts";
import { isFloatDtype, logitMetrics, type LogitMetrics, tensorMetrics, type TensorMetrics, toFloat64 as tensorValues } from "./metrics.ts";

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
  /** The engine's top-k axis was put into mlx-lm's expert order first (TOPK_KINDS), on the rows whose expert sets equal mlx-lm's. */
  reordered?: boolean;
  /** TOPK_KINDS: rows (tokens) whose router picked another expert set than mlx-lm's, left in the engine's order. */
  topkRowsDiffering?: number;
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

/**
 * Tap kinds whose axis 2 is the router's top-k experts, in the order the router left them:
 * mlx-lm takes them with argpartition, whose order is unspecified, and another engine may sort
 * them (transformers' topk does). The sum over that axis (`experts`) is order-free; these taps
 * are compared after putting the engine's top-k axis into mlx-lm's order by expert id.
 */
export const TOPK_KINDS = new Set(["router/indices", "router/weights", "experts/switch_glu/up_proj", "experts/switch_glu/gate_proj", "experts/switch_glu/activation", "experts/switch_glu/down_proj", "experts/switch_glu"]);

/** How an engine's top-k axis maps onto mlx-lm's, token by token (topkPermutation). */
export interface TopkOrder {
  /** Per row (token), the engine's position of each of mlx-lm's experts in turn; the identity on rows left as they are. */
  perm: Int32Array;
  /** Rows (flat B·L index) whose expert sets differ from mlx-lm's: left in the engine's order (their distances count as they are). */
  differingRows: number[];
}

/**
 * For router indices (..., K) of the engine and of mlx-lm, token by token: a row whose experts
 * equal mlx-lm's as a set gets mlx-lm's order; a row whose set differs is left as it is and
 * listed, so one token routed differently does not leave every other token of the layer
 * misaligned. Null only when the shapes do not line up (nothing is reordered then).
 */
export function topkPermutation(engine: RawTensor, oracle: RawTensor): TopkOrder | null {
  const K = oracle.shape[oracle.shape.length - 1] ?? 1;
  if (count(engine.shape) !== count(oracle.shape) || (engine.shape[engine.shape.length - 1] ?? 1) !== K) return null;
  const e = tensorValues(engine);
  const o = tensorValues(oracle);
  const perm = new Int32Array(o.length);
  const differingRows: number[] = [];
  const used = new Array<boolean>(K);
  for (let r = 0; r < o.length / K; r++) {
    used.fill(false);
    let sameSet = true;
    for (let k = 0; k < K && sameSet; k++) {
      let at = -1;
      for (let j = 0; j < K; j++) if (!used[j] && e[r * K + j] === o[r * K + k]) { at = j; break; }
      if (at < 0) sameSet = false;
      else {
        used[at] = true;
        perm[r * K + k] = at;
      }
    }
    if (!sameSet) {
      differingRows.push(r);
      for (let k = 0; k < K; k++) perm[r * K + k] = k;
    }
  }
  return { perm, differingRows };
}

/** Whether `perm` moves anything (K experts per row). */
export function isIdentityOrder(perm: Int32Array, K: number): boolean {
  for (let i = 0; i < perm.length; i++) if (perm[i] !== i % K) return false;
  return true;
}

/** `t` with axis 2 (the top-k axis after B and L) reordered: out[row, k] = t[row, perm[row, k]]. */
export function reorderTopK(t: RawTensor, perm: Int32Array): RawTensor {
  const K = t.shape[2] ?? 1;
  const rows = perm.length / K;
  const n = count(t.shape);
  if (t.shape.length < 3 || rows * K === 0 || n % (rows * K) !== 0) throw new Error(`reorderTopK: shape [${t.shape}] does not hold ${rows} rows of ${K} experts`);
  const inner = (n / (rows * K)) * (t.data.byteLength / Math.max(1, n));
  const out = new Uint8Array(t.data.byteLength);
  for (let r = 0; r < rows; r++) {
    for (let k = 0; k < K; k++) {
      const from = (r * K + perm[r * K + k]!) * inner;
      out.set(t.data.subarray(from, from + inner), (r * K + k) * inner);
    }
  }
  return { ...t, data: out };
}
