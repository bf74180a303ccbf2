// Array operations, in mlx.core's vocabulary (camelCase). Each is one native call.
import { handles, MlxArray, own, ownVec, shapeArg } from "./array.ts";
import { type Dtype, dtypeCode, isFloating } from "./dtype.ts";
import { MlxError } from "./errors.ts";
import { cstr, cstring, lib } from "./native.ts";
import { isScalar, type Scalar, scalarParts } from "./scalar.ts";

export type Operand = MlxArray | Scalar;

function table(count: () => number, name: (i: number) => number | null): Map<string, number> {
  const m = new Map<string, number>();
  for (let i = 0, n = count(); i < n; i++) m.set(cstring(name(i)), i);
  return m;
}

const UNARY = table(lib.mlxb_unary_count, lib.mlxb_unary_name);
const BINARY = table(lib.mlxb_binary_count, lib.mlxb_binary_name);
const REDUCE = table(lib.mlxb_reduce_count, lib.mlxb_reduce_name);

function id(m: Map<string, number>, name: string): number {
  const i = m.get(name);
  if (i === undefined) throw new Error(`@mlx-bun/mlx: native shim lacks op ${name}; rebuild it`);
  return i;
}

function arr(x: unknown, op: string, what = "argument"): MlxArray {
  if (x instanceof MlxArray) return x;
  throw new MlxError(op, `${what} must be an MlxArray, got ${describe(x)}`);
}

function describe(x: unknown): string {
  if (x === null) return "null";
  if (Array.isArray(x)) return "a JS array";
  return typeof x === "object" ? (x as object).constructor?.name ?? "object" : typeof x;
}

function axesArg(axes: number | readonly number[], op: string): Int32Array {
  return shapeArg(typeof axes === "number" ? [axes] : axes, op);
}

// ---------------------------------------------------------------- elementwise

function unary(name: string) {
  const code = id(UNARY, name);
  return (a: MlxArray): MlxArray => own(lib.mlxb_unary(code, arr(a, name).handle), name);
}

function binary(name: string) {
  const code = id(BINARY, name);
  return (a: Operand, b: Operand): MlxArray => {
    if (a instanceof MlxArray) {
      if (b instanceof MlxArray) return own(lib.mlxb_binary(code, a.handle, b.handle), name);
      if (isScalar(b)) {
        const [v, k] = scalarParts(b);
        return own(lib.mlxb_binary_scalar(code, a.handle, v, k, 0), name);
      }
    } else if (b instanceof MlxArray && isScalar(a)) {
      const [v, k] = scalarParts(a);
      return own(lib.mlxb_binary_scalar(code, b.handle, v, k, 1), name);
    }
    throw new MlxError(name, `needs at least one MlxArray operand, got ${describe(a)} and ${describe(b)}`);
  };
}

export const abs = unary("abs");
export const negative = unary("negative");
export const sign = unary("sign");
export const exp = unary("exp");
export const expm1 = unary("expm1");
export const log = unary("log");
export const log1p = unary("log1p");
export const log2 = unary("log2");
export const log10 = unary("log10");
export const sqrt = unary("sqrt");
export const rsqrt = unary("rsqrt");
export const square = unary("square");
export const reciprocal = unary("reciprocal");
export const sin = unary("sin");
export const cos = unary("cos");
export const tan = unary("tan");
export const tanh = unary("tanh");
export const sinh = unary("sinh");
export const cosh = unary("cosh");
export const arcsin = unary("arcsin");
export const arccos = unary("arccos");
export const arctan = unary("arctan");
export const erf = unary("erf");
export const erfinv = unary("erfinv");
export const sigmoid = unary("sigmoid");
export const floor = unary("floor");
export const ceil = unary("ceil");
export const logicalNot = unary("logical_not");
export const isnan = unary("isnan");
export const isinf = unary("isinf");
export const isfinite = unary("isfinite");
export const stopGradient = unary("stop_gradient");
export const bitwiseInvert = unary("bitwise_invert");
export const copy = unary("copy");
export const zerosLike = unary("zeros_like");
export const onesLike = unary("ones_like");
export const arcsinh = unary("arcsinh");
export const arccosh = unary("arccosh");
export const arctanh = unary("arctanh");
export const degrees = unary("degrees");
export const radians = unary("radians");
export const isposinf = unary("isposinf");
export const isneginf = unary("isneginf");

export const add = binary("add");
export const subtract = binary("subtract");
export const multiply = binary("multiply");
export const divide = binary("divide");
export const power = binary("power");
export const floorDivide = binary("floor_divide");
export const remainder = binary("remainder");
export const maximum = binary("maximum");
export const minimum = binary("minimum");
export const equal = binary("equal");
export const notEqual = binary("not_equal");
export const greater = binary("greater");
export const greaterEqual = binary("greater_equal");
export const less = binary("less");
export const lessEqual = binary("less_equal");
export const logicalAnd = binary("logical_and");
export const logicalOr = binary("logical_or");
export const bitwiseAnd = binary("bitwise_and");
export const bitwiseOr = binary("bitwise_or");
export const bitwiseXor = binary("bitwise_xor");
export const leftShift = binary("left_shift");
export const rightShift = binary("right_shift");
export const logaddexp = binary("logaddexp");
export const arctan2 = binary("arctan2");
export const matmul = binary("matmul");
export const logicalXor = binary("logical_xor");
export const outer = binary("outer");
export const inner = binary("inner");
export const kron = binary("kron");

/** mx.where(cond, x, y); one of x/y may be a weak scalar taking the other's dtype. */
export function where(cond: MlxArray, x: Operand, y: Operand): MlxArray {
  const c = arr(cond, "where", "condition");
  if (x instanceof MlxArray && y instanceof MlxArray) return own(lib.mlxb_where(c.handle, x.handle, y.handle, 0, 0), "where");
  if (x instanceof MlxArray && isScalar(y)) {
    const [v, k] = scalarParts(y);
    return own(lib.mlxb_where(c.handle, x.handle, 0, v, k), "where");
  }
  if (y instanceof MlxArray && isScalar(x)) {
    const [v, k] = scalarParts(x);
    return own(lib.mlxb_where(c.handle, 0, y.handle, v, k), "where");
  }
  throw new MlxError("where", "needs at least one MlxArray among x and y");
}

/** mx.clip(a, a_min, a_max): each bound an array, a weak scalar (Python rule), or null. */
export function clip(a: MlxArray, lo: Operand | null, hi: Operand | null): MlxArray {
  const h = arr(a, "clip").handle;
  if ((lo === null || lo instanceof MlxArray) && (hi === null || hi instanceof MlxArray)) {
    return own(lib.mlxb_clip(h, lo ? lo.handle : 0, hi ? hi.handle : 0), "clip");
  }
  const [lv, lk] = lo === null || lo instanceof MlxArray ? [0, -1] : scalarParts(lo);
  const [hv, hk] = hi === null || hi instanceof MlxArray ? [0, -1] : scalarParts(hi);
  return own(
    lib.mlxb_clip_scalar(h, lo instanceof MlxArray ? lo.handle : 0, lv, lk, hi instanceof MlxArray ? hi.handle : 0, hv, hk),
    "clip",
  );
}

export function round(a: MlxArray, decimals = 0): MlxArray {
  return own(lib.mlxb_round(arr(a, "round").handle, decimals), "round");
}

// ---------------------------------------------------------------- creation

export function arange(start: number, stop?: number, step = 1, dtype?: Dtype): MlxArray {
  let lo = start;
  let hi = stop;
  if (hi === undefined) {
    hi = start;
    lo = 0;
  }
  // mx.arange: int32 when every argument is an int, else float32.
  const dt = dtype ?? ([lo, hi, step].every(Number.isInteger) ? "int32" : "float32");
  return own(lib.mlxb_arange(lo, hi, step, dtypeCode(dt)), "arange");
}

/** mx.linspace(start, stop, num=50, dtype=float32). */
export function linspace(start: number, stop: number, num = 50, dtype: Dtype = "float32"): MlxArray {
  return own(lib.mlxb_linspace(start, stop, num, dtypeCode(dtype)), "linspace");
}

/** mx.eye(n, m=n, k=0, dtype=float32). */
export function eye(n: number, m = n, k = 0, dtype: Dtype = "float32"): MlxArray {
  return own(lib.mlxb_eye(n, m, k, dtypeCode(dtype)), "eye");
}

export function zeros(shape: readonly number[], dtype: Dtype = "float32"): MlxArray {
  const s = shapeArg(shape, "zeros");
  return own(lib.mlxb_zeros(s, s.length, dtypeCode(dtype)), "zeros");
}

export function ones(shape: readonly number[], dtype: Dtype = "float32"): MlxArray {
  const s = shapeArg(shape, "ones");
  return own(lib.mlxb_ones(s, s.length, dtypeCode(dtype)), "ones");
}

/**
 * mx.full(shape, vals, dtype?), exactly as Python builds it: `full(shape, to_array(vals, dtype))`.
 * - a number is converted like a Python scalar with that dtype: a float becomes `dtype` if it is
 *   floating, else float32; an int becomes `dtype` (int32 when none or bool); a boolean, bool;
 * - an MlxArray is used as is: Python ignores `dtype` for array values (astype it first).
 */
export function full(shape: readonly number[], vals: MlxArray | Scalar, dtype?: Dtype): MlxArray {
  const s = shapeArg(shape, "full");
  if (vals instanceof MlxArray) return own(lib.mlxb_full(s, s.length, vals.handle, -1), "full");
  const [v, k] = scalarParts(vals);
  const dt: Dtype = k === 2 ? "bool" : k === 1 ? (dtype === undefined || dtype === "bool" ? "int32" : dtype) : dtype !== undefined && isFloating(dtype) ? dtype : "float32";
  const tmp = own(lib.mlxb_scalar(v, k, dtypeCode(dt)), "full");
  try {
    return own(lib.mlxb_full(s, s.length, tmp.handle, -1), "full");
  } finally {
    tmp.dispose();
  }
}

export function astype(a: MlxArray, dtype: Dtype): MlxArray {
  return own(lib.mlxb_astype(arr(a, "astype").handle, dtypeCode(dtype)), "astype");
}

export function view(a: MlxArray, dtype: Dtype): MlxArray {
  return own(lib.mlxb_view(arr(a, "view").handle, dtypeCode(dtype)), "view");
}

export function tri(n: number, m = n, k = 0, dtype: Dtype = "float32"): MlxArray {
  return own(lib.mlxb_tri(n, m, k, dtypeCode(dtype)), "tri");
}

export function tril(a: MlxArray, k = 0): MlxArray {
  return own(lib.mlxb_trilu(arr(a, "tril").handle, k, 0), "tril");
}

export function triu(a: MlxArray, k = 0): MlxArray {
  return own(lib.mlxb_trilu(arr(a, "triu").handle, k, 1), "triu");
}

// ---------------------------------------------------------------- reductions

function reduction(name: string) {
  const code = id(REDUCE, name);
  return (a: MlxArray, axis?: number | readonly number[] | null, keepdims = false, ddof = 0): MlxArray => {
    const h = arr(a, name).handle;
    if (axis === undefined || axis === null) return own(lib.mlxb_reduce(code, h, null, 0, 1, keepdims ? 1 : 0, ddof), name);
    const ax = axesArg(axis, name);
    return own(lib.mlxb_reduce(code, h, ax, ax.length, 0, keepdims ? 1 : 0, ddof), name);
  };
}

export const sum = reduction("sum");
export const mean = reduction("mean");
export const max = reduction("max");
export const min = reduction("min");
export const prod = reduction("prod");
export const all = reduction("all");
export const any = reduction("any");
export const logsumexp = reduction("logsumexp");
export const variance = reduction("var");
export const std = reduction("std");

export function argmax(a: MlxArray, axis?: number, keepdims = false): MlxArray {
  const h = arr(a, "argmax").handle;
  return own(lib.mlxb_argreduce(0, h, axis ?? 0, axis === undefined ? 0 : 1, keepdims ? 1 : 0), "argmax");
}

export function argmin(a: MlxArray, axis?: number, keepdims = false): MlxArray {
  const h = arr(a, "argmin").handle;
  return own(lib.mlxb_argreduce(1, h, axis ?? 0, axis === undefined ? 0 : 1, keepdims ? 1 : 0), "argmin");
}

/** mx.softmax(a, axis, precise=False). */
export function softmax(a: MlxArray, axis?: number | readonly number[], precise = false): MlxArray {
  const h = arr(a, "softmax").handle;
  if (axis === undefined) return own(lib.mlxb_softmax(h, null, 0, 1, precise ? 1 : 0), "softmax");
  const ax = axesArg(axis, "softmax");
  return own(lib.mlxb_softmax(h, ax, ax.length, 0, precise ? 1 : 0), "softmax");
}

function cumulative(which: number, name: string) {
  return (a: MlxArray, axis: number, { reverse = false, inclusive = true } = {}): MlxArray =>
    own(lib.mlxb_cumulative(which, arr(a, name).handle, axis, reverse ? 1 : 0, inclusive ? 1 : 0), name);
}

export const cumsum = cumulative(0, "cumsum");
export const cumprod = cumulative(1, "cumprod");
export const cummax = cumulative(2, "cummax");
export const cummin = cumulative(3, "cummin");
export const logcumsumexp = cumulative(4, "logcumsumexp");

function sortlike(which: number, name: string) {
  return (a: MlxArray, axis: number | null = -1): MlxArray =>
    own(lib.mlxb_sortlike(which, arr(a, name).handle, 0, axis ?? 0, axis === null ? 0 : 1), name);
}

export const sort = sortlike(0, "sort");
export const argsort = sortlike(1, "argsort");

export function partition(a: MlxArray, kth: number, axis: number | null = -1): MlxArray {
  return own(lib.mlxb_sortlike(2, arr(a, "partition").handle, kth, axis ?? 0, axis === null ? 0 : 1), "partition");
}

export function argpartition(a: MlxArray, kth: number, axis: number | null = -1): MlxArray {
  return own(lib.mlxb_sortlike(3, arr(a, "argpartition").handle, kth, axis ?? 0, axis === null ? 0 : 1), "argpartition");
}

export function topk(a: MlxArray, k: number, axis: number | null = -1): MlxArray {
  return own(lib.mlxb_sortlike(4, arr(a, "topk").handle, k, axis ?? 0, axis === null ? 0 : 1), "topk");
}

// ---------------------------------------------------------------- shapes and indexing

export function reshape(a: MlxArray, shape: readonly number[]): MlxArray {
  const s = shapeArg(shape, "reshape");
  return own(lib.mlxb_reshape(arr(a, "reshape").handle, s, s.length), "reshape");
}

export function flatten(a: MlxArray, startAxis = 0, endAxis = -1): MlxArray {
  return own(lib.mlxb_flatten(arr(a, "flatten").handle, startAxis, endAxis), "flatten");
}

export function unflatten(a: MlxArray, axis: number, shape: readonly number[]): MlxArray {
  const s = shapeArg(shape, "unflatten");
  return own(lib.mlxb_unflatten(arr(a, "unflatten").handle, axis, s, s.length), "unflatten");
}

export function transpose(a: MlxArray, axes?: readonly number[]): MlxArray {
  const h = arr(a, "transpose").handle;
  if (axes === undefined) return own(lib.mlxb_transpose(h, null, -1), "transpose");
  const ax = shapeArg(axes, "transpose");
  return own(lib.mlxb_transpose(h, ax, ax.length), "transpose");
}

export function swapaxes(a: MlxArray, axis1: number, axis2: number): MlxArray {
  return own(lib.mlxb_swapaxes(arr(a, "swapaxes").handle, axis1, axis2), "swapaxes");
}

export function moveaxis(a: MlxArray, source: number, destination: number): MlxArray {
  return own(lib.mlxb_moveaxis(arr(a, "moveaxis").handle, source, destination), "moveaxis");
}

export function expandDims(a: MlxArray, axis: number | readonly number[]): MlxArray {
  const ax = axesArg(axis, "expand_dims");
  return own(lib.mlxb_expand_dims(arr(a, "expand_dims").handle, ax, ax.length), "expand_dims");
}

export function squeeze(a: MlxArray, axis?: number | readonly number[]): MlxArray {
  const h = arr(a, "squeeze").handle;
  if (axis === undefined) return own(lib.mlxb_squeeze(h, null, -1), "squeeze");
  const ax = axesArg(axis, "squeeze");
  return own(lib.mlxb_squeeze(h, ax, ax.length), "squeeze");
}

export function broadcastTo(a: MlxArray, shape: readonly number[]): MlxArray {
  const s = shapeArg(shape, "broadcast_to");
  return own(lib.mlxb_broadcast_to(arr(a, "broadcast_to").handle, s, s.length), "broadcast_to");
}

export function concatenate(arrays: readonly MlxArray[], axis = 0): MlxArray {
  const hs = handles(arrays);
  return own(lib.mlxb_concatenate(hs, hs.length, axis), "concatenate");
}

export function stack(arrays: readonly MlxArray[], axis = 0): MlxArray {
  const hs = handles(arrays);
  return own(lib.mlxb_stack(hs, hs.length, axis), "stack");
}

/** mx.split(a, num_or_indices, axis). */
export function split(a: MlxArray, indicesOrSections: number | readonly number[], axis = 0): MlxArray[] {
  const h = arr(a, "split").handle;
  if (typeof indicesOrSections === "number") return ownVec(lib.mlxb_split(h, indicesOrSections, null, -1, axis), "split");
  const idx = shapeArg(indicesOrSections, "split");
  return ownVec(lib.mlxb_split(h, 0, idx, idx.length, axis), "split");
}

/** mx.slice semantics of a[start:stop:step] on every axis (full start/stop/strides lists). */
export function slice(a: MlxArray, start: readonly number[], stop: readonly number[], strides?: readonly number[]): MlxArray {
  const n = start.length;
  if (stop.length !== n || (strides && strides.length !== n)) {
    throw new MlxError("slice", "start, stop and strides must have the same length");
  }
  const st = shapeArg(strides ?? new Array<number>(n).fill(1), "slice");
  return own(lib.mlxb_slice(arr(a, "slice").handle, shapeArg(start, "slice"), shapeArg(stop, "slice"), st, n), "slice");
}

/** Dynamic slice: start offsets given as an array, on `axes`, with static sizes. */
export function sliceDynamic(a: MlxArray, start: MlxArray, axes: readonly number[], sizes: readonly number[]): MlxArray {
  const ax = shapeArg(axes, "slice");
  const sz = shapeArg(sizes, "slice");
  return own(lib.mlxb_slice_dynamic(arr(a, "slice").handle, arr(start, "slice").handle, ax, ax.length, sz, sz.length), "slice");
}

export function sliceUpdate(
  src: MlxArray,
  update: MlxArray,
  start: readonly number[],
  stop: readonly number[],
  strides?: readonly number[],
): MlxArray {
  const n = start.length;
  if (stop.length !== n || (strides && strides.length !== n)) {
    throw new MlxError("slice_update", "start, stop and strides must have the same length");
  }
  const st = shapeArg(strides ?? new Array<number>(n).fill(1), "slice_update");
  return own(
    lib.mlxb_slice_update(
      arr(src, "slice_update").handle,
      arr(update, "slice_update").handle,
      shapeArg(start, "slice_update"),
      shapeArg(stop, "slice_update"),
      st,
      n,
    ),
    "slice_update",
  );
}

export function sliceUpdateDynamic(src: MlxArray, update: MlxArray, start: MlxArray, axes: readonly number[]): MlxArray {
  const ax = shapeArg(axes, "slice_update");
  return own(
    lib.mlxb_slice_update_dynamic(arr(src, "slice_update").handle, arr(update, "slice_update").handle, arr(start, "slice_update").handle, ax, ax.length),
    "slice_update",
  );
}

/** mx.take(a, indices, axis); without axis the flattened array is indexed. */
export function take(a: MlxArray, indices: MlxArray, axis?: number): MlxArray {
  return own(lib.mlxb_take(arr(a, "take").handle, arr(indices, "take", "indices").handle, axis ?? 0, axis === undefined ? 0 : 1), "take");
}

export function takeAlongAxis(a: MlxArray, indices: MlxArray, axis: number): MlxArray {
  return own(lib.mlxb_take_along_axis(arr(a, "take_along_axis").handle, arr(indices, "take_along_axis", "indices").handle, axis), "take_along_axis");
}

export function putAlongAxis(a: MlxArray, indices: MlxArray, values: MlxArray, axis: number): MlxArray {
  return own(
    lib.mlxb_put_along_axis(arr(a, "put_along_axis").handle, arr(indices, "put_along_axis").handle, arr(values, "put_along_axis").handle, axis),
    "put_along_axis",
  );
}

/** mx.roll(a, shift, axis?); without axis the flattened array is rolled. */
export function roll(a: MlxArray, shift: number, axis?: number): MlxArray {
  return own(lib.mlxb_roll(arr(a, "roll").handle, shift, axis ?? 0, axis === undefined ? 0 : 1), "roll");
}

export function contiguous(a: MlxArray, allowColMajor = false): MlxArray {
  return own(lib.mlxb_contiguous(arr(a, "contiguous").handle, allowColMajor ? 1 : 0), "contiguous");
}

/**
 * A second owned handle to the same array: no new graph node, no copy (Python's `b = a`).
 * Disposing either handle leaves the other valid.
 */
export function alias(a: MlxArray): MlxArray {
  const hs = handles([arr(a, "alias")]);
  const [out] = ownVec(lib.mlxb_vec_new(hs, 1), "alias");
  return out!;
}

export function repeat(a: MlxArray, repeats: number, axis?: number): MlxArray {
  return own(lib.mlxb_repeat(arr(a, "repeat").handle, repeats, axis ?? 0, axis === undefined ? 0 : 1), "repeat");
}

export function tile(a: MlxArray, reps: readonly number[]): MlxArray {
  const r = shapeArg(reps, "tile");
  return own(lib.mlxb_tile(arr(a, "tile").handle, r, r.length), "tile");
}

/** mx.pad with per-axis (low, high) widths and a constant value array. */
export function pad(a: MlxArray, widths: readonly (readonly [number, number])[], value: MlxArray): MlxArray {
  const axes = shapeArg(widths.map((_, i) => i), "pad");
  const lo = shapeArg(widths.map((w) => w[0]), "pad");
  const hi = shapeArg(widths.map((w) => w[1]), "pad");
  return own(lib.mlxb_pad(arr(a, "pad").handle, axes, axes.length, lo, hi, arr(value, "pad", "value").handle), "pad");
}

/**
 * mx.depends(inputs, dependencies): the inputs (new handles), made to depend on the dependencies
 * so evaluating them evaluates the dependencies too. A single array in gives a single array out.
 */
export function depends(inputs: MlxArray | readonly MlxArray[], dependencies: MlxArray | readonly MlxArray[]): MlxArray | MlxArray[] {
  const ins = handles(inputs instanceof MlxArray ? [inputs] : inputs);
  const deps = handles(dependencies instanceof MlxArray ? [dependencies] : dependencies);
  const out = ownVec(lib.mlxb_depends(ins.length ? ins : new Float64Array(1), ins.length, deps.length ? deps : new Float64Array(1), deps.length), "depends");
  return inputs instanceof MlxArray ? out[0]! : out;
}

// ---------------------------------------------------------------- matmul and quantization

export function addmm(c: MlxArray, a: MlxArray, b: MlxArray, alpha = 1, beta = 1): MlxArray {
  return own(lib.mlxb_addmm(arr(c, "addmm").handle, arr(a, "addmm").handle, arr(b, "addmm").handle, alpha, beta), "addmm");
}

export type QuantMode = "affine" | "mxfp4" | "nvfp4" | "mxfp8";

export interface QuantArgs {
  groupSize?: number;
  bits?: number;
  mode?: QuantMode;
  /** nvfp4 only: a float32 global scale (Python `global_scale=`). Not taken by quantizedMatmul. */
  globalScale?: MlxArray | null;
}

/** group_size / bits: -1 (the mode's default) when absent, else a positive int32 (FFI would truncate 1.5 to 1). */
function quantParam(v: number | undefined, name: string, op: string): number {
  if (v === undefined) return -1;
  if (!Number.isInteger(v) || v <= 0 || v > 2147483647) throw new MlxError(op, `${name} must be a positive integer, got ${v}`);
  return v;
}

/** mx.quantize → [wq, scales, biases] (affine) or [wq, scales] (fp modes). */
export function quantize(w: MlxArray, { groupSize, bits, mode = "affine", globalScale }: QuantArgs = {}): MlxArray[] {
  return ownVec(lib.mlxb_quantize(arr(w, "quantize").handle, quantParam(groupSize, "group_size", "quantize"), quantParam(bits, "bits", "quantize"), cstr(mode), globalScale ? globalScale.handle : 0), "quantize");
}

export function dequantize(
  w: MlxArray,
  scales: MlxArray,
  biases: MlxArray | null,
  { groupSize, bits, mode = "affine", globalScale, dtype }: QuantArgs & { dtype?: Dtype } = {},
): MlxArray {
  return own(
    lib.mlxb_dequantize(
      arr(w, "dequantize").handle,
      arr(scales, "dequantize", "scales").handle,
      biases ? biases.handle : 0,
      quantParam(groupSize, "group_size", "dequantize"),
      quantParam(bits, "bits", "dequantize"),
      cstr(mode),
      globalScale ? globalScale.handle : 0,
      dtype === undefined ? -1 : dtypeCode(dtype),
    ),
    "dequantize",
  );
}

export function quantizedMatmul(
  x: MlxArray,
  w: MlxArray,
  scales: MlxArray,
  biases: MlxArray | null,
  { transpose = true, groupSize, bits, mode = "affine", globalScale }: QuantArgs & { transpose?: boolean } = {},
): MlxArray {
  if (globalScale) throw new MlxError("quantized_matmul", "quantized_matmul takes no global_scale (as in Python)");
  return own(
    lib.mlxb_quantized_matmul(
      arr(x, "quantized_matmul").handle,
      arr(w, "quantized_matmul").handle,
      arr(scales, "quantized_matmul", "scales").handle,
      biases ? biases.handle : 0,
      transpose ? 1 : 0,
      quantParam(groupSize, "group_size", "quantized_matmul"),
      quantParam(bits, "bits", "quantized_matmul"),
      cstr(mode),
    ),
    "quantized_matmul",
  );
}

export interface GatherArgs {
  lhsIndices?: MlxArray | null;
  rhsIndices?: MlxArray | null;
  sortedIndices?: boolean;
}

export function gatherMm(a: MlxArray, b: MlxArray, { lhsIndices, rhsIndices, sortedIndices = false }: GatherArgs = {}): MlxArray {
  return own(
    lib.mlxb_gather_mm(arr(a, "gather_mm").handle, arr(b, "gather_mm").handle, lhsIndices ? lhsIndices.handle : 0, rhsIndices ? rhsIndices.handle : 0, sortedIndices ? 1 : 0),
    "gather_mm",
  );
}

export function gatherQmm(
  x: MlxArray,
  w: MlxArray,
  scales: MlxArray,
  biases: MlxArray | null,
  { lhsIndices, rhsIndices, sortedIndices = false, transpose = true, groupSize, bits, mode = "affine", globalScale }: GatherArgs & QuantArgs & { transpose?: boolean } = {},
): MlxArray {
  return own(
    lib.mlxb_gather_qmm(
      arr(x, "gather_qmm").handle,
      arr(w, "gather_qmm").handle,
      arr(scales, "gather_qmm", "scales").handle,
      biases ? biases.handle : 0,
      lhsIndices ? lhsIndices.handle : 0,
      rhsIndices ? rhsIndices.handle : 0,
      transpose ? 1 : 0,
      quantParam(groupSize, "group_size", "gather_qmm"),
      quantParam(bits, "bits", "gather_qmm"),
      cstr(mode),
      globalScale ? globalScale.handle : 0,
      sortedIndices ? 1 : 0,
    ),
    "gather_qmm",
  );
}
