// The op parity case table: every op the binding exposes × dtypes × shapes (broadcasting,
// transposed/sliced views, weak-scalar operands). Shared by ops.test.ts and report.ts.
//
// A case names the TS op (`op`, as exported: "add", "fast.rmsNorm", "random.uniform"), the
// oracle op (`oracle`, the mlx.core name run by oracle/python/ops_table.py), its inputs and its
// Python keyword params. `run` calls the binding with the same inputs and params.
import * as mx from "@mlx-bun/mlx";
import * as fastMod from "@mlx-bun/mlx/fast";
import * as opsMod from "@mlx-bun/mlx/ops";
import * as randomMod from "@mlx-bun/mlx/random";
import type { Dtype, MlxArray } from "@mlx-bun/mlx";
import type { Operand } from "@mlx-bun/mlx/ops";

export type Gen =
  | "normal" // N(0, 1)
  | "wide" // N(0, 3), some large values
  | "small" // U(-2, 2)
  | "positive" // U(0.1, 3)
  | "unit" // U(-0.95, 0.95)
  | "ge1" // U(1, 4)
  | "int" // integers in [-20, 20] (unsigned: [0, 40])
  | "nonzero" // integers in [-20, 20] without 0 (unsigned: [1, 40])
  | "shift" // integers in [0, 7]
  | "bool"
  | "bits" // raw random bytes (quantized weights)
  | { index: number } // integers in [0, n)
  | { range: [number, number] } // integers in [lo, hi]
  | { values: number[] }; // fixed values (cycled)

export type View = { transpose: number[] | null } | { slice: { start: number[]; stop: number[]; strides: number[] } };

export interface ArraySpec {
  /** Stored shape; the view (if any) is applied on both sides before the op. */
  shape: number[];
  dtype: Dtype;
  gen?: Gen;
  view?: View;
}
export interface ScalarSpec {
  scalar: number;
  kind: "int" | "float" | "bool";
}
export type InputSpec = ArraySpec | ScalarSpec;
export type Params = Record<string, unknown>;

export interface OpCase {
  id: string;
  op: string;
  oracle: string;
  inputs: InputSpec[];
  params: Params;
  run: (xs: Operand[], p: Params) => MlxArray | MlxArray[];
}

export const FLOATS: Dtype[] = ["float32", "float16", "bfloat16"];

// ---------------------------------------------------------------- exposure

/** Every op the binding exposes: function exports of the ops, fast and random modules. */
export function exposedOps(): string[] {
  const fns = (mod: object, prefix: string) =>
    Object.entries(mod)
      .filter(([, v]) => typeof v === "function")
      .map(([k]) => prefix + k);
  return [...fns(opsMod, ""), ...fns(fastMod, "fast."), ...fns(randomMod, "random.")].sort();
}

// ---------------------------------------------------------------- helpers

const A = (xs: Operand[], i = 0): MlxArray => xs[i] as MlxArray;
const arr = (shape: number[], dtype: Dtype, gen?: Gen, view?: View): ArraySpec => ({ shape, dtype, gen, view });
const sc = (v: number, kind: ScalarSpec["kind"]): ScalarSpec => ({ scalar: v, kind });
const T = (axes: number[] | null = null): View => ({ transpose: axes });
const S = (start: number[], stop: number[], strides: number[]): View => ({ slice: { start, stop, strides } });

function describeInput(s: InputSpec): string {
  if ("scalar" in s) return `${s.kind}:${s.scalar}`;
  let d = `${s.dtype}[${s.shape}]`;
  if (s.view && "transpose" in s.view) d += ".T";
  if (s.view && "slice" in s.view) d += ".sliced";
  return d;
}

const cases: OpCase[] = [];
const ids = new Set<string>();

function add(op: string, oracle: string, inputs: InputSpec[], params: Params, run: OpCase["run"]): void {
  let id = `${op} ${inputs.map(describeInput).join(" ")}${Object.keys(params).length ? ` ${JSON.stringify(params)}` : ""}`;
  let k = 2;
  while (ids.has(id)) id = `${id} #${k++}`;
  ids.add(id);
  cases.push({ id, op, oracle, inputs, params, run });
}

/** Standard elementwise input layouts for a dtype: three shapes, a 0-d, a transposed and a sliced view. */
function layouts1(dt: Dtype, gen: Gen): ArraySpec[][] {
  return [
    [arr([7], dt, gen)],
    [arr([3, 5], dt, gen)],
    [arr([2, 3, 4], dt, gen)],
    [arr([], dt, gen)],
    [arr([4, 3], dt, gen, T())],
    [arr([6, 8], dt, gen, S([0, 1], [6, 7], [2, 1]))],
  ];
}

function layouts2(dt: Dtype, ga: Gen, gb: Gen, dtB: Dtype = dt): InputSpec[][] {
  return [
    [arr([3, 4], dt, ga), arr([3, 4], dtB, gb)],
    [arr([2, 3, 4], dt, ga), arr([4], dtB, gb)],
    [arr([3, 1], dt, ga), arr([1, 5], dtB, gb)],
    [arr([4, 3], dt, ga, T()), arr([3, 4], dtB, gb)],
    [arr([3, 4], dt, ga), arr([6, 8], dtB, gb, S([0, 0], [6, 8], [2, 2]))],
  ];
}

// ---------------------------------------------------------------- elementwise

const UNARY_GEN: Record<string, Gen> = {
  log: "positive", log2: "positive", log10: "positive", log1p: "positive", sqrt: "positive", rsqrt: "positive",
  arcsin: "unit", arccos: "unit", arctanh: "unit", erfinv: "unit", arccosh: "ge1",
  exp: "small", expm1: "small", sinh: "small", cosh: "small", tan: "small",
};
/** Unary ops that also take integer (and bool) arrays. */
const UNARY_INT: Record<string, Dtype[]> = {
  abs: ["int32", "int8"], negative: ["int32"], sign: ["int32"], square: ["int32"], floor: ["int32"], ceil: ["int32"],
  copy: ["int32", "bool"], zerosLike: ["int32", "bool"], onesLike: ["int32", "bool"], stopGradient: ["int32"],
  isnan: ["int32"], isinf: ["int32"], isfinite: ["int32"], logicalNot: ["bool", "int32"],
  bitwiseInvert: ["int32", "uint8", "int16", "bool"], isposinf: ["int32"], isneginf: ["int32"],
};
const INT_ONLY = new Set(["bitwiseInvert"]);

const snake = (s: string) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

const UNARY = [
  "abs", "negative", "sign", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "square", "reciprocal",
  "sin", "cos", "tan", "tanh", "sinh", "cosh", "arcsin", "arccos", "arctan", "erf", "erfinv", "sigmoid", "floor", "ceil",
  "logicalNot", "isnan", "isinf", "isfinite", "stopGradient", "bitwiseInvert", "copy", "zerosLike", "onesLike",
  "arcsinh", "arccosh", "arctanh", "degrees", "radians", "isposinf", "isneginf",
] as const;

for (const name of UNARY) {
  const fn = (opsMod as unknown as Record<string, (a: MlxArray) => MlxArray>)[name]!;
  const gen = UNARY_GEN[name] ?? "normal";
  const dts = [...(INT_ONLY.has(name) ? [] : FLOATS), ...(UNARY_INT[name] ?? [])];
  for (const dt of dts) {
    const g: Gen = dt === "bool" ? "bool" : dt.startsWith("float") || dt === "bfloat16" ? gen : "int";
    for (const ins of layouts1(dt, g)) add(name, snake(name), ins, {}, (xs) => fn(A(xs)));
  }
  if (!INT_ONLY.has(name) && (gen === "normal" || gen === "small")) {
    // special values: ±0, ±inf, nan, tiny and huge
    add(name, snake(name), [arr([8], "float32", { values: [0, -0, Infinity, -Infinity, NaN, 1e-30, -3e38, 0.5] })], {}, (xs) => fn(A(xs)));
  }
}

type BinFn = (a: Operand, b: Operand) => MlxArray;
const BIN_GEN: Record<string, [Gen, Gen]> = {
  divide: ["normal", "nonzero"], power: ["positive", "small"], floorDivide: ["wide", "nonzero"], remainder: ["wide", "nonzero"],
  logicalAnd: ["bool", "bool"], logicalOr: ["bool", "bool"], logicalXor: ["bool", "bool"],
  bitwiseAnd: ["int", "int"], bitwiseOr: ["int", "int"], bitwiseXor: ["int", "int"], leftShift: ["int", "shift"], rightShift: ["int", "shift"],
};
const BIN_INT: Record<string, Dtype[]> = {
  add: ["int32", "uint8"], subtract: ["int32"], multiply: ["int32", "int16"], divide: ["int32"], power: ["int32"],
  floorDivide: ["int32", "uint32"], remainder: ["int32", "uint8"], maximum: ["int32"], minimum: ["int32"],
  equal: ["int32", "bool"], notEqual: ["int32", "bool"], greater: ["int32"], greaterEqual: ["int32"], less: ["int32"], lessEqual: ["int32"],
  logicalAnd: ["bool", "int32"], logicalOr: ["bool"], logicalXor: ["bool"],
  bitwiseAnd: ["int32", "uint8", "bool"], bitwiseOr: ["int32", "uint16", "bool"], bitwiseXor: ["int32", "int64", "bool"],
  leftShift: ["int32", "uint8"], rightShift: ["int32", "uint8", "int8"],
};
const BIN_INT_ONLY = new Set(["bitwiseAnd", "bitwiseOr", "bitwiseXor", "leftShift", "rightShift"]);

const ELEMENTWISE_BINARY = [
  "add", "subtract", "multiply", "divide", "power", "floorDivide", "remainder", "maximum", "minimum", "equal", "notEqual",
  "greater", "greaterEqual", "less", "lessEqual", "logicalAnd", "logicalOr", "logicalXor", "bitwiseAnd", "bitwiseOr",
  "bitwiseXor", "leftShift", "rightShift", "logaddexp", "arctan2",
] as const;

for (const name of ELEMENTWISE_BINARY) {
  const fn = (opsMod as unknown as Record<string, BinFn>)[name]!;
  const [ga, gb] = BIN_GEN[name] ?? ["normal", "normal"];
  const floatGen = (g: Gen): Gen => (g === "nonzero" ? "positive" : g === "int" || g === "shift" ? "normal" : g);
  const dts = [...(BIN_INT_ONLY.has(name) ? [] : FLOATS), ...(BIN_INT[name] ?? [])];
  const run = (xs: Operand[]) => fn(xs[0]!, xs[1]!);
  for (const dt of dts) {
    const isF = dt.includes("float");
    const isB = dt === "bool";
    const a: Gen = isB ? "bool" : isF ? (ga === "bool" ? "normal" : floatGen(ga)) : ga === "bool" || ga === "normal" || ga === "wide" || ga === "positive" ? "int" : ga;
    let b: Gen = isB ? "bool" : isF ? (gb === "bool" ? "normal" : floatGen(gb)) : gb === "bool" || gb === "normal" || gb === "small" ? "int" : gb;
    if (!isF && !isB && name === "power") b = { range: [0, 4] };
    if (name === "divide" && isF) b = "nonzero";
    for (const ins of layouts2(dt, a, b)) add(name, snake(name), ins, {}, run);
    // weak scalars on either side
    if (!isB) {
      const sv = name === "leftShift" || name === "rightShift" ? 3 : name === "power" && !isF ? 2 : 3;
      add(name, snake(name), [arr([3, 4], dt, a), sc(sv, "int")], {}, run);
      add(name, snake(name), [sc(sv, "int"), arr([3, 4], dt, b)], {}, run);
      if (isF || !BIN_INT_ONLY.has(name)) {
        add(name, snake(name), [arr([3, 4], dt, a), sc(2.5, "float")], {}, run);
        add(name, snake(name), [sc(0.1, "float"), arr([3, 4], dt, b)], {}, run);
        add(name, snake(name), [arr([2, 3], dt, a), sc(2, "float")], {}, run);
      }
    } else {
      add(name, snake(name), [arr([3, 4], dt, a), sc(1, "bool")], {}, run);
    }
  }
  // mixed dtypes (promotion)
  if (!BIN_INT_ONLY.has(name) && !["logicalAnd", "logicalOr", "logicalXor"].includes(name)) {
    const pos = name === "power" ? "positive" : "normal";
    add(name, snake(name), [arr([3, 4], "float16", pos), arr([3, 4], "float32", "positive")], {}, run);
    add(name, snake(name), [arr([3, 4], "int32", { range: [1, 5] }), arr([4], "bfloat16", "positive")], {}, run);
    add(name, snake(name), [arr([3, 4], "bfloat16", pos), arr([3, 4], "float16", "positive")], {}, run);
  }
}

// integer division and remainder by zero (MLX defines the result; both sides must agree)
for (const name of ["floorDivide", "remainder", "divide"] as const) {
  const fn = (opsMod as unknown as Record<string, BinFn>)[name]!;
  add(name, snake(name), [arr([8], "int32", { values: [7, -7, 0, 5, 1, -1, 9, 3] }), arr([8], "int32", { values: [0, 0, 0, 2, 0, -3, 0, 1] })], {}, (xs) => fn(xs[0]!, xs[1]!));
}

// matmul-like binaries
for (const dt of FLOATS) {
  const mm = (xs: Operand[]) => mx.matmul(A(xs, 0), A(xs, 1));
  add("matmul", "matmul", [arr([3, 4], dt), arr([4, 5], dt)], {}, mm);
  add("matmul", "matmul", [arr([2, 3, 8], dt), arr([8, 5], dt)], {}, mm);
  add("matmul", "matmul", [arr([2, 1, 3, 8], dt), arr([4, 8, 5], dt)], {}, mm);
  add("matmul", "matmul", [arr([8], dt), arr([8, 3], dt)], {}, mm);
  add("matmul", "matmul", [arr([3, 33], dt), arr([5, 33], dt, "normal", T())], {}, mm);
  add("matmul", "matmul", [arr([20, 6], dt, "normal", S([0, 0], [20, 5], [2, 1])), arr([5, 7], dt)], {}, mm);
  const o = (xs: Operand[]) => mx.outer(A(xs, 0), A(xs, 1));
  add("outer", "outer", [arr([4], dt), arr([5], dt)], {}, o);
  add("outer", "outer", [arr([2, 3], dt), arr([5], dt)], {}, o);
  add("outer", "outer", [arr([8], dt, "normal", S([1], [8], [2])), arr([3], dt)], {}, o);
  const i = (xs: Operand[]) => mx.inner(A(xs, 0), A(xs, 1));
  add("inner", "inner", [arr([6], dt), arr([6], dt)], {}, i);
  add("inner", "inner", [arr([3, 6], dt), arr([2, 6], dt)], {}, i);
  add("inner", "inner", [arr([6, 3], dt, "normal", T()), arr([6], dt)], {}, i);
  const k = (xs: Operand[]) => mx.kron(A(xs, 0), A(xs, 1));
  add("kron", "kron", [arr([2, 3], dt), arr([3, 2], dt)], {}, k);
  add("kron", "kron", [arr([3], dt), arr([4], dt)], {}, k);
  add("kron", "kron", [arr([3, 2], dt, "normal", T()), arr([2, 2, 2], dt)], {}, k);
}
add("matmul", "matmul", [arr([4, 64], "float32"), arr([64, 48], "float32")], {}, (xs) => mx.matmul(A(xs, 0), A(xs, 1)));
add("kron", "kron", [arr([2, 2], "int32", "int"), arr([2, 3], "int32", "int")], {}, (xs) => mx.kron(A(xs, 0), A(xs, 1)));

// where / clip / round
for (const dt of [...FLOATS, "int32" as Dtype]) {
  const g: Gen = dt === "int32" ? "int" : "normal";
  const w = (xs: Operand[]) => mx.where(A(xs, 0), xs[1]!, xs[2]!);
  add("where", "where", [arr([3, 4], "bool", "bool"), arr([3, 4], dt, g), arr([3, 4], dt, g)], {}, w);
  add("where", "where", [arr([3, 1], "bool", "bool"), arr([4], dt, g), arr([2, 3, 4], dt, g)], {}, w);
  add("where", "where", [arr([4, 3], "bool", "bool", T()), arr([4, 3], dt, g, T()), arr([3, 4], dt, g)], {}, w);
  add("where", "where", [arr([3, 4], "bool", "bool"), sc(-Infinity, "float"), arr([3, 4], dt, g)], {}, w);
  add("where", "where", [arr([3, 4], "bool", "bool"), arr([3, 4], dt, g), sc(7, "int")], {}, w);
  const c = (xs: Operand[], p: Params) => {
    const lo = p.lo === "none" ? null : xs[1]!;
    const hi = p.hi === "none" ? null : p.lo === "none" ? xs[1]! : xs[2]!;
    return mx.clip(A(xs), lo, hi);
  };
  add("clip", "clip", [arr([3, 4], dt, g), arr([3, 4], dt, g), arr([4], dt, g)], {}, c);
  add("clip", "clip", [arr([2, 3, 4], dt, g), sc(-0.5, "float"), sc(1, "int")], {}, c);
  add("clip", "clip", [arr([5, 4], dt, g, T()), sc(0, "int")], { hi: "none" }, c);
  add("clip", "clip", [arr([7], dt, g), sc(0.25, "float")], { lo: "none" }, c);
}
for (const dt of [...FLOATS, "int32" as Dtype]) {
  const g: Gen = dt === "int32" ? "int" : "wide";
  const r = (xs: Operand[], p: Params) => mx.round(A(xs), p.decimals as number);
  for (const ins of layouts1(dt, g).slice(0, 4)) add("round", "round", ins, { decimals: 0 }, r);
  add("round", "round", [arr([3, 5], dt, g)], { decimals: 2 }, r);
  add("round", "round", [arr([4, 3], dt, g, T())], { decimals: 1 }, r);
}

// ---------------------------------------------------------------- creation

const ALL_DT: Dtype[] = [...FLOATS, "int32", "uint8", "bool"];
for (const dt of ALL_DT) {
  add("zeros", "zeros", [], { shape: [2, 3], dtype: dt }, (_, p) => mx.zeros(p.shape as number[], p.dtype as Dtype));
  add("zeros", "zeros", [], { shape: [], dtype: dt }, (_, p) => mx.zeros(p.shape as number[], p.dtype as Dtype));
  add("ones", "ones", [], { shape: [4], dtype: dt }, (_, p) => mx.ones(p.shape as number[], p.dtype as Dtype));
  add("ones", "ones", [], { shape: [2, 1, 3], dtype: dt }, (_, p) => mx.ones(p.shape as number[], p.dtype as Dtype));
  add("ones", "ones", [], { shape: [], dtype: dt }, (_, p) => mx.ones(p.shape as number[], p.dtype as Dtype));
  add("zeros", "zeros", [], { shape: [3, 1, 2, 2], dtype: dt }, (_, p) => mx.zeros(p.shape as number[], p.dtype as Dtype));
  add("eye", "eye", [], { n: 5, m: 2, k: -1, dtype: dt }, (_, p) => mx.eye(p.n as number, p.m as number, p.k as number, p.dtype as Dtype));
  add("tri", "tri", [], { n: 1, m: 6, k: 2, dtype: dt }, (_, p) => mx.tri(p.n as number, p.m as number, p.k as number, p.dtype as Dtype));
  add("eye", "eye", [], { n: 3, m: 3, k: 0, dtype: dt }, (_, p) => mx.eye(p.n as number, p.m as number, p.k as number, p.dtype as Dtype));
  add("eye", "eye", [], { n: 3, m: 5, k: 1, dtype: dt }, (_, p) => mx.eye(p.n as number, p.m as number, p.k as number, p.dtype as Dtype));
  add("tri", "tri", [], { n: 4, m: 4, k: 0, dtype: dt }, (_, p) => mx.tri(p.n as number, p.m as number, p.k as number, p.dtype as Dtype));
  add("tri", "tri", [], { n: 3, m: 5, k: -1, dtype: dt }, (_, p) => mx.tri(p.n as number, p.m as number, p.k as number, p.dtype as Dtype));
}
for (const dt of [...FLOATS, "int32" as Dtype]) {
  const ar = (_: Operand[], p: Params) => mx.arange(p.start as number, p.stop as number, p.step as number, p.dtype as Dtype);
  add("arange", "arange", [], { start: 0, stop: 10, step: 1, dtype: dt }, ar);
  add("arange", "arange", [], { start: -3, stop: 7, step: 2, dtype: dt }, ar);
  add("arange", "arange", [], { start: 5, stop: -5, step: -3, dtype: dt }, ar);
  if (dt !== "int32") add("arange", "arange", [], { start: 0.5, stop: 3.1, step: 0.3, dtype: dt }, ar);
  const ls = (_: Operand[], p: Params) => mx.linspace(p.start as number, p.stop as number, p.num as number, p.dtype as Dtype);
  add("linspace", "linspace", [], { start: 0, stop: 1, num: 7, dtype: dt }, ls);
  add("linspace", "linspace", [], { start: -2.5, stop: 9.1, num: 13, dtype: dt }, ls);
  add("linspace", "linspace", [], { start: 3, stop: 3, num: 1, dtype: dt }, ls);
}
// arange/linspace dtype inference as in Python (int32 for all-int args, float32 otherwise)
add("arange", "arange", [], { start: 0, stop: 6, step: 1 }, (_, p) => mx.arange(p.start as number, p.stop as number, p.step as number));
add("arange", "arange", [], { start: 0, stop: 2.5, step: 0.5 }, (_, p) => mx.arange(p.start as number, p.stop as number, p.step as number));
for (const dt of ALL_DT) {
  const f = (xs: Operand[], p: Params) => mx.full(p.shape as number[], A(xs), p.dtype as Dtype | undefined);
  add("full", "full", [arr([], dt, dt === "bool" ? "bool" : "normal")], { shape: [2, 3] }, f);
  add("full", "full", [arr([3], dt, dt === "bool" ? "bool" : "int")], { shape: [2, 3] }, f);
  add("full", "full", [arr([], "float32")], { shape: [4], dtype: dt }, f);
}
// mx.full(shape, python scalar)
add("full", "full", [sc(-Infinity, "float")], { shape: [2, 2] }, (xs, p) => mx.full(p.shape as number[], xs[0] as number));
add("full", "full", [sc(3, "int")], { shape: [3] }, (xs, p) => mx.full(p.shape as number[], xs[0] as number));
for (const dt of ALL_DT) {
  const f = (xs: Operand[], p: Params) => mx.full(p.shape as number[], xs[0] as mx.Scalar, p.dtype as Dtype);
  add("full", "full", [sc(0.1, "float")], { shape: [3], dtype: dt }, f);
  add("full", "full", [sc(3, "int")], { shape: [2], dtype: dt }, f);
}

// astype / view
const CAST_TO: Dtype[] = ["float32", "float16", "bfloat16", "int32", "uint8", "int64", "bool", "float64"];
for (const src of [...FLOATS, "int32" as Dtype, "bool" as Dtype]) {
  for (const to of CAST_TO) {
    if (to === src) continue;
    const g: Gen = src === "bool" ? "bool" : src === "int32" ? "int" : "wide";
    add("astype", "astype", [arr([3, 5], src, g)], { dtype: to }, (xs, p) => mx.astype(A(xs), p.dtype as Dtype));
  }
  add("astype", "astype", [arr([5, 3], src, src === "bool" ? "bool" : "normal", T())], { dtype: "float32" }, (xs, p) => mx.astype(A(xs), p.dtype as Dtype));
  add("astype", "astype", [arr([], src, src === "bool" ? "bool" : "normal")], { dtype: "bfloat16" }, (xs, p) => mx.astype(A(xs), p.dtype as Dtype));
}
add("astype", "astype", [arr([8], "float32", { values: [NaN, Infinity, -Infinity, 65520, 3.4e38, 1e-8, -0, 1e-40] })], { dtype: "float16" }, (xs, p) => mx.astype(A(xs), p.dtype as Dtype));
add("astype", "astype", [arr([8], "float32", { values: [NaN, Infinity, -Infinity, 65520, 3.4e38, 1e-8, -0, 1e-40] })], { dtype: "bfloat16" }, (xs, p) => mx.astype(A(xs), p.dtype as Dtype));
for (const [src, to] of [["float32", "int32"], ["float32", "uint8"], ["bfloat16", "uint16"], ["float16", "int16"], ["int32", "float32"], ["uint8", "bool"]] as [Dtype, Dtype][]) {
  const v = (xs: Operand[], p: Params) => mx.view(A(xs), p.dtype as Dtype);
  add("view", "view", [arr([3, 4], src, src.includes("int") ? "int" : "normal")], { dtype: to }, v);
  add("view", "view", [arr([4], src, src.includes("int") ? "int" : "normal")], { dtype: to }, v);
  add("view", "view", [arr([4, 3], src, src.includes("int") ? "int" : "normal", T())], { dtype: to }, v);
}
// mx.array(python scalar, dtype): the `scalar` creation path
for (const [v, kind] of [[0.1, "float"], [1 / 3, "float"], [7, "int"], [-2, "int"], [1e-8, "float"], [65519, "float"]] as [number, "int" | "float"][]) {
  for (const dt of [...FLOATS, undefined]) {
    add("scalar", "array", [sc(v, kind)], dt ? { dtype: dt } : {}, (xs, p) => mx.scalar(xs[0] as mx.Scalar, p.dtype as Dtype | undefined));
  }
}

for (const dt of [...FLOATS, "int32" as Dtype]) {
  const g: Gen = dt === "int32" ? "int" : "normal";
  for (const k of [0, 1, -2]) {
    add("tril", "tril", [arr([4, 5], dt, g)], { k }, (xs, p) => mx.tril(A(xs), p.k as number));
    add("triu", "triu", [arr([2, 4, 4], dt, g)], { k }, (xs, p) => mx.triu(A(xs), p.k as number));
  }
  add("tril", "tril", [arr([5, 4], dt, g, T())], { k: 0 }, (xs, p) => mx.tril(A(xs), p.k as number));
  add("tril", "tril", [arr([2, 3, 3], dt, g)], { k: -1 }, (xs, p) => mx.tril(A(xs), p.k as number));
  add("triu", "triu", [arr([3, 6], dt, g)], { k: 2 }, (xs, p) => mx.triu(A(xs), p.k as number));
  add("triu", "triu", [arr([5, 4], dt, g, T())], { k: 0 }, (xs, p) => mx.triu(A(xs), p.k as number));
}

// ---------------------------------------------------------------- reductions

type RedFn = (a: MlxArray, axis?: number | number[] | null, keepdims?: boolean, ddof?: number) => MlxArray;
const REDUCE: [string, string, Dtype[]][] = [
  ["sum", "sum", ["int32", "bool", "uint8"]],
  ["mean", "mean", ["int32"]],
  ["max", "max", ["int32", "bool"]],
  ["min", "min", ["int32", "uint8"]],
  ["prod", "prod", ["int32"]],
  ["all", "all", ["bool", "int32"]],
  ["any", "any", ["bool", "int32"]],
  ["logsumexp", "logsumexp", []],
  ["variance", "var", []],
  ["std", "std", []],
];
for (const [name, oracle, ints] of REDUCE) {
  const fn = (opsMod as unknown as Record<string, RedFn>)[name]!;
  const run = (xs: Operand[], p: Params) => fn(A(xs), (p.axis ?? null) as number | number[] | null, (p.keepdims ?? false) as boolean, (p.ddof ?? 0) as number);
  for (const dt of [...FLOATS, ...ints]) {
    const g: Gen = dt === "bool" ? "bool" : dt.includes("int") ? { range: [-3, 3] } : name === "prod" ? "unit" : "normal";
    const g2: Gen = dt === "uint8" ? { range: [0, 5] } : g;
    add(name, oracle, [arr([2, 3, 4], dt, g2)], {}, run);
    add(name, oracle, [arr([2, 3, 4], dt, g2)], { axis: -1 }, run);
    add(name, oracle, [arr([2, 3, 4], dt, g2)], { axis: [0, 2], keepdims: true }, run);
    add(name, oracle, [arr([5, 6], dt, g2, T())], { axis: 0 }, run);
    add(name, oracle, [arr([8, 6], dt, g2, S([1, 0], [8, 6], [2, 2]))], { axis: 1, keepdims: true }, run);
    add(name, oracle, [arr([37], dt, g2)], { axis: 0 }, run);
  }
  if (oracle === "var" || oracle === "std") {
    add(name, oracle, [arr([3, 7], "float32")], { axis: -1, ddof: 1 }, run);
    add(name, oracle, [arr([3, 7], "bfloat16")], { axis: 0, ddof: 1 }, run);
  }
}
// long reductions (accumulation order matters)
for (const dt of FLOATS) {
  add("sum", "sum", [arr([3, 1000], dt)], { axis: -1 }, (xs, p) => mx.sum(A(xs), p.axis as number));
  add("mean", "mean", [arr([1000, 3], dt)], { axis: 0 }, (xs, p) => mx.mean(A(xs), p.axis as number));
  add("softmax", "softmax", [arr([2, 1000], dt, "wide")], { axis: -1 }, (xs, p) => mx.softmax(A(xs), p.axis as number));
}
for (const name of ["argmax", "argmin"] as const) {
  const fn = name === "argmax" ? mx.argmax : mx.argmin;
  const run = (xs: Operand[], p: Params) => fn(A(xs), p.axis as number | undefined, (p.keepdims ?? false) as boolean);
  for (const dt of [...FLOATS, "int32" as Dtype]) {
    const g: Gen = dt === "int32" ? "int" : "normal";
    add(name, name, [arr([2, 3, 4], dt, g)], {}, run);
    add(name, name, [arr([2, 3, 4], dt, g)], { axis: -1 }, run);
    add(name, name, [arr([2, 3, 4], dt, g)], { axis: 1, keepdims: true }, run);
    add(name, name, [arr([5, 4], dt, g, T())], { axis: 0 }, run);
    add(name, name, [arr([37], dt, g)], { axis: 0 }, run);
    add(name, name, [arr([6, 8], dt, g, S([0, 1], [6, 8], [2, 2]))], { axis: -1, keepdims: true }, run);
  }
}
for (const dt of FLOATS) {
  const run = (xs: Operand[], p: Params) => mx.softmax(A(xs), p.axis as number | number[] | undefined, (p.precise ?? false) as boolean);
  add("softmax", "softmax", [arr([2, 3, 5], dt, "wide")], { axis: -1 }, run);
  add("softmax", "softmax", [arr([2, 3, 5], dt, "wide")], { axis: -1, precise: true }, run);
  add("softmax", "softmax", [arr([2, 3, 5], dt, "wide")], { axis: [0, 2] }, run);
  add("softmax", "softmax", [arr([4, 3], dt, "wide")], {}, run);
  add("softmax", "softmax", [arr([5, 4], dt, "wide", T())], { axis: 0 }, run);
  add("softmax", "softmax", [arr([3, 6], dt, { values: [0, -Infinity, 1, -Infinity, 2, 3] })], { axis: -1 }, run);
}
type CumFn = (a: MlxArray, axis: number, o?: { reverse?: boolean; inclusive?: boolean }) => MlxArray;
for (const [name, oracle, ints] of [
  ["cumsum", "cumsum", ["int32", "bool"]],
  ["cumprod", "cumprod", ["int32"]],
  ["cummax", "cummax", ["int32"]],
  ["cummin", "cummin", ["int32"]],
  ["logcumsumexp", "logcumsumexp", []],
] as [string, string, Dtype[]][]) {
  const fn = (opsMod as unknown as Record<string, CumFn>)[name]!;
  const run = (xs: Operand[], p: Params) => fn(A(xs), p.axis as number, { reverse: (p.reverse ?? false) as boolean, inclusive: (p.inclusive ?? true) as boolean });
  for (const dt of [...FLOATS, ...ints]) {
    const g: Gen = dt === "bool" ? "bool" : dt === "int32" ? { range: [-3, 3] } : name === "cumprod" ? "unit" : "normal";
    add(name, oracle, [arr([3, 7], dt, g)], { axis: -1 }, run);
    add(name, oracle, [arr([3, 7], dt, g)], { axis: 0, reverse: true }, run);
    add(name, oracle, [arr([2, 3, 7], dt, g)], { axis: -1, reverse: true, inclusive: false }, run);
    add(name, oracle, [arr([6, 3], dt, g, T())], { axis: 1, inclusive: false }, run);
  }
}

// sort family
for (const dt of [...FLOATS, "int32" as Dtype]) {
  const g: Gen = dt === "int32" ? "int" : "normal";
  const s = (xs: Operand[], p: Params) => mx.sort(A(xs), p.axis as number | null);
  const as = (xs: Operand[], p: Params) => mx.argsort(A(xs), p.axis as number | null);
  for (const [name, oracle, fn] of [["sort", "sort", s], ["argsort", "argsort", as]] as const) {
    add(name, oracle, [arr([3, 9], dt, g)], { axis: -1 }, fn);
    add(name, oracle, [arr([3, 9], dt, g)], { axis: 0 }, fn);
    add(name, oracle, [arr([2, 3, 4], dt, g)], { axis: null }, fn);
    add(name, oracle, [arr([9, 3], dt, g, T())], { axis: -1 }, fn);
    add(name, oracle, [arr([40], dt, { range: [-3, 3] })], { axis: -1 }, fn); // ties: stability
  }
  const pa = (xs: Operand[], p: Params) => mx.partition(A(xs), p.kth as number, p.axis as number | null);
  const apa = (xs: Operand[], p: Params) => mx.argpartition(A(xs), p.kth as number, p.axis as number | null);
  const tk = (xs: Operand[], p: Params) => mx.topk(A(xs), p.k as number, p.axis as number | null);
  for (const [name, fn] of [["partition", pa], ["argpartition", apa]] as const) {
    add(name, name, [arr([3, 12], dt, g)], { kth: 4, axis: -1 }, fn);
    add(name, name, [arr([3, 12], dt, g)], { kth: -3, axis: -1 }, fn);
    add(name, name, [arr([12, 3], dt, g, T())], { kth: 2, axis: 0 }, fn);
    add(name, name, [arr([2, 3, 4], dt, g)], { kth: 5, axis: null }, fn);
  }
  add("topk", "topk", [arr([3, 12], dt, g)], { k: 3, axis: -1 }, tk);
  add("topk", "topk", [arr([12, 3], dt, g, T())], { k: 2, axis: 0 }, tk);
  add("topk", "topk", [arr([2, 3, 4], dt, g)], { k: 4, axis: null }, tk);
}

// ---------------------------------------------------------------- shapes and indexing

const SHAPE_DT: Dtype[] = [...FLOATS, "int32", "bool"];
for (const dt of SHAPE_DT) {
  const g: Gen = dt === "bool" ? "bool" : dt === "int32" ? "int" : "normal";
  const n = (ps: number[]) => arr(ps, dt, g);
  add("reshape", "reshape", [n([2, 3, 4])], { shape: [6, 4] }, (xs, p) => mx.reshape(A(xs), p.shape as number[]));
  add("reshape", "reshape", [n([2, 3, 4])], { shape: [-1] }, (xs, p) => mx.reshape(A(xs), p.shape as number[]));
  add("reshape", "reshape", [arr([4, 6], dt, g, T())], { shape: [3, 8] }, (xs, p) => mx.reshape(A(xs), p.shape as number[]));
  add("flatten", "flatten", [n([2, 3, 4])], {}, (xs) => mx.flatten(A(xs)));
  add("flatten", "flatten", [n([2, 3, 4, 5])], { start_axis: 1, end_axis: 2 }, (xs, p) => mx.flatten(A(xs), p.start_axis as number, p.end_axis as number));
  add("flatten", "flatten", [arr([4, 3], dt, g, T())], { start_axis: 0, end_axis: -1 }, (xs, p) => mx.flatten(A(xs), p.start_axis as number, p.end_axis as number));
  add("unflatten", "unflatten", [n([6, 4])], { axis: 0, shape: [2, 3] }, (xs, p) => mx.unflatten(A(xs), p.axis as number, p.shape as number[]));
  add("unflatten", "unflatten", [n([2, 12])], { axis: -1, shape: [3, -1] }, (xs, p) => mx.unflatten(A(xs), p.axis as number, p.shape as number[]));
  add("unflatten", "unflatten", [arr([12, 2], dt, g, T())], { axis: 1, shape: [4, 3] }, (xs, p) => mx.unflatten(A(xs), p.axis as number, p.shape as number[]));
  add("transpose", "transpose", [n([2, 3, 4])], {}, (xs) => mx.transpose(A(xs)));
  add("transpose", "transpose", [n([2, 3, 4])], { axes: [1, 0, 2] }, (xs, p) => mx.transpose(A(xs), p.axes as number[]));
  add("transpose", "transpose", [n([2, 1, 3, 4])], { axes: [3, 1, 0, 2] }, (xs, p) => mx.transpose(A(xs), p.axes as number[]));
  add("transpose", "transpose", [arr([6, 8], dt, g, S([1, 0], [6, 8], [2, 3]))], { axes: [1, 0] }, (xs, p) => mx.transpose(A(xs), p.axes as number[]));
  add("swapaxes", "swapaxes", [n([2, 3, 4])], { axis1: -1, axis2: -2 }, (xs, p) => mx.swapaxes(A(xs), p.axis1 as number, p.axis2 as number));
  add("swapaxes", "swapaxes", [n([2, 3, 4])], { axis1: 0, axis2: 2 }, (xs, p) => mx.swapaxes(A(xs), p.axis1 as number, p.axis2 as number));
  add("swapaxes", "swapaxes", [n([1, 4, 5, 2])], { axis1: 1, axis2: 2 }, (xs, p) => mx.swapaxes(A(xs), p.axis1 as number, p.axis2 as number));
  add("swapaxes", "swapaxes", [arr([4, 3], dt, g, T())], { axis1: 0, axis2: 1 }, (xs, p) => mx.swapaxes(A(xs), p.axis1 as number, p.axis2 as number));
  add("moveaxis", "moveaxis", [n([2, 3, 4])], { source: 0, destination: -1 }, (xs, p) => mx.moveaxis(A(xs), p.source as number, p.destination as number));
  add("moveaxis", "moveaxis", [n([2, 3, 4, 5])], { source: 3, destination: 1 }, (xs, p) => mx.moveaxis(A(xs), p.source as number, p.destination as number));
  add("moveaxis", "moveaxis", [arr([4, 3], dt, g, T())], { source: 1, destination: 0 }, (xs, p) => mx.moveaxis(A(xs), p.source as number, p.destination as number));
  add("expandDims", "expand_dims", [n([3, 4])], { axis: 0 }, (xs, p) => mx.expandDims(A(xs), p.axis as number));
  add("expandDims", "expand_dims", [n([3, 4])], { axis: [-2, -3] }, (xs, p) => mx.expandDims(A(xs), p.axis as number[]));
  add("expandDims", "expand_dims", [n([])], { axis: 0 }, (xs, p) => mx.expandDims(A(xs), p.axis as number));
  add("expandDims", "expand_dims", [arr([4, 3], dt, g, T())], { axis: 1 }, (xs, p) => mx.expandDims(A(xs), p.axis as number));
  add("squeeze", "squeeze", [n([1, 3, 1, 4])], {}, (xs) => mx.squeeze(A(xs)));
  add("squeeze", "squeeze", [n([1, 3, 1, 4])], { axis: -2 }, (xs, p) => mx.squeeze(A(xs), p.axis as number));
  add("squeeze", "squeeze", [n([1, 3, 1, 4])], { axis: [0, 2] }, (xs, p) => mx.squeeze(A(xs), p.axis as number[]));
  add("squeeze", "squeeze", [n([5, 1])], { axis: 1 }, (xs, p) => mx.squeeze(A(xs), p.axis as number));
  add("squeeze", "squeeze", [arr([1, 4, 1], dt, g, T())], {}, (xs) => mx.squeeze(A(xs)));
  add("broadcastTo", "broadcast_to", [n([3, 1])], { shape: [2, 3, 4] }, (xs, p) => mx.broadcastTo(A(xs), p.shape as number[]));
  add("broadcastTo", "broadcast_to", [n([])], { shape: [5] }, (xs, p) => mx.broadcastTo(A(xs), p.shape as number[]));
  add("broadcastTo", "broadcast_to", [arr([1, 3], dt, g, T())], { shape: [2, 3, 4] }, (xs, p) => mx.broadcastTo(A(xs), p.shape as number[]));
  add("concatenate", "concatenate", [n([2, 3]), n([4, 3])], { axis: 0 }, (xs, p) => mx.concatenate(xs as MlxArray[], p.axis as number));
  add("concatenate", "concatenate", [n([2, 3]), n([2, 1]), arr([3, 2], dt, g, T())], { axis: -1 }, (xs, p) => mx.concatenate(xs as MlxArray[], p.axis as number));
  add("concatenate", "concatenate", [n([2, 3, 4]), n([2, 3, 4])], { axis: 1 }, (xs, p) => mx.concatenate(xs as MlxArray[], p.axis as number));
  add("stack", "stack", [n([2, 3]), n([2, 3])], { axis: 0 }, (xs, p) => mx.stack(xs as MlxArray[], p.axis as number));
  add("stack", "stack", [n([4]), n([4]), n([4])], { axis: -1 }, (xs, p) => mx.stack(xs as MlxArray[], p.axis as number));
  add("stack", "stack", [arr([3, 2], dt, g, T()), n([2, 3])], { axis: 1 }, (xs, p) => mx.stack(xs as MlxArray[], p.axis as number));
  const sp = (xs: Operand[], p: Params) => mx.split(A(xs), p.indices_or_sections as number | number[], p.axis as number);
  add("split", "split", [n([6, 4])], { indices_or_sections: 2, axis: 0 }, sp);
  add("split", "split", [n([2, 4, 16])], { indices_or_sections: 2, axis: -2 }, sp);
  add("split", "split", [n([3, 10])], { indices_or_sections: [2, 7], axis: 1 }, sp);
  add("split", "split", [arr([4, 6], dt, g, T())], { indices_or_sections: 3, axis: 0 }, sp);
  const sl = (xs: Operand[], p: Params) => mx.slice(A(xs), p.start as number[], p.stop as number[], p.strides as number[]);
  add("slice", "slice", [n([5, 6])], { start: [1, 0], stop: [4, 6], strides: [1, 2] }, sl);
  add("slice", "slice", [n([2, 3, 8])], { start: [0, 0, 5], stop: [2, 3, 8], strides: [1, 1, 1] }, sl);
  add("slice", "slice", [arr([6, 5], dt, g, T())], { start: [4, 1], stop: [0, 6], strides: [-2, 1] }, sl);
  const sld = (xs: Operand[], p: Params) => mx.sliceDynamic(A(xs), A(xs, 1), p.axes as number[], p.slice_size as number[]);
  add("sliceDynamic", "slice_dynamic", [n([5, 6]), arr([1], "int32", { values: [2] })], { axes: [0], slice_size: [2, 6] }, sld);
  add("sliceDynamic", "slice_dynamic", [n([4, 6, 3]), arr([2], "int32", { values: [1, 3] })], { axes: [0, 1], slice_size: [2, 3, 3] }, sld);
  add("sliceDynamic", "slice_dynamic", [arr([6, 5], dt, g, T()), arr([], "int32", { values: [3] })], { axes: [1], slice_size: [5, 2] }, sld);
  const su = (xs: Operand[], p: Params) => mx.sliceUpdate(A(xs), A(xs, 1), p.start as number[], p.stop as number[], p.strides as number[]);
  add("sliceUpdate", "slice_update", [n([5, 6]), n([2, 6])], { start: [1, 0], stop: [3, 6], strides: [1, 1] }, su);
  add("sliceUpdate", "slice_update", [n([2, 3, 8]), n([2, 3, 2])], { start: [0, 0, 0], stop: [2, 3, 8], strides: [1, 1, 4] }, su);
  add("sliceUpdate", "slice_update", [arr([6, 5], dt, g, T()), n([1, 3])], { start: [1, 0], stop: [2, 6], strides: [1, 2] }, su);
  const sud = (xs: Operand[], p: Params) => mx.sliceUpdateDynamic(A(xs), A(xs, 1), A(xs, 2), p.axes as number[]);
  add("sliceUpdateDynamic", "slice_update_dynamic", [n([5, 6]), n([2, 6]), arr([1], "int32", { values: [2] })], { axes: [0] }, sud);
  add("sliceUpdateDynamic", "slice_update_dynamic", [n([1, 2, 8, 4]), n([1, 2, 3, 4]), arr([1], "int32", { values: [4] })], { axes: [2] }, sud);
  add("sliceUpdateDynamic", "slice_update_dynamic", [arr([6, 5], dt, g, T()), n([5, 2]), arr([1], "int32", { values: [3] })], { axes: [1] }, sud);
  const tk = (xs: Operand[], p: Params) => mx.take(A(xs), A(xs, 1), p.axis as number | undefined);
  add("take", "take", [n([10, 4]), arr([2, 3], "int32", { index: 10 })], { axis: 0 }, tk);
  add("take", "take", [n([3, 5]), arr([4], "uint32", { index: 5 })], { axis: 1 }, tk);
  add("take", "take", [n([3, 5]), arr([6], "int32", { index: 15 })], {}, tk);
  add("take", "take", [arr([5, 3], dt, g, T()), arr([2], "int32", { range: [-3, 2] })], { axis: 0 }, tk);
  add("take", "take", [n([10, 4]), arr([], "int32", { values: [7] })], { axis: 0 }, tk);
  const ta = (xs: Operand[], p: Params) => mx.takeAlongAxis(A(xs), A(xs, 1), p.axis as number);
  add("takeAlongAxis", "take_along_axis", [n([3, 8]), arr([3, 2], "int32", { index: 8 })], { axis: -1 }, ta);
  add("takeAlongAxis", "take_along_axis", [n([2, 3, 8]), arr([1, 3, 8], "uint32", { index: 2 })], { axis: 0 }, ta);
  add("takeAlongAxis", "take_along_axis", [arr([8, 3], dt, g, T()), arr([3, 1], "int32", { index: 8 })], { axis: 1 }, ta);
  const pa = (xs: Operand[], p: Params) => mx.putAlongAxis(A(xs), A(xs, 1), A(xs, 2), p.axis as number);
  add("putAlongAxis", "put_along_axis", [n([3, 8]), arr([3, 2], "int32", { values: [0, 5, 1, 7, 3, 2] }), n([3, 2])], { axis: -1 }, pa);
  add("putAlongAxis", "put_along_axis", [n([3, 8]), arr([3, 3], "int32", { values: [0, 5, 6, 1, 7, 2, 3, 2, 4] }), n([])], { axis: -1 }, pa);
  add("putAlongAxis", "put_along_axis", [arr([8, 3], dt, g, T()), arr([2, 8], "uint32", { values: [0, 1, 2, 0, 1, 2, 0, 1, 2, 1, 0, 2, 1, 0, 1, 0] }), n([2, 8])], { axis: 0 }, pa);
  const rl = (xs: Operand[], p: Params) => mx.roll(A(xs), p.shift as number, p.axis as number | undefined);
  add("roll", "roll", [n([3, 5])], { shift: 2 }, rl);
  add("roll", "roll", [n([3, 5])], { shift: -1, axis: 1 }, rl);
  add("roll", "roll", [arr([5, 3], dt, g, T())], { shift: 7, axis: 0 }, rl);
  add("roll", "roll", [n([2, 3, 4])], { shift: -5, axis: -1 }, rl);
  add("alias", "alias", [n([3, 4])], {}, (xs) => mx.alias(A(xs)));
  add("alias", "alias", [arr([4, 3], dt, g, T())], {}, (xs) => mx.alias(A(xs)));
  add("alias", "alias", [n([])], {}, (xs) => mx.alias(A(xs)));
  add("contiguous", "contiguous", [n([3, 4])], {}, (xs) => mx.contiguous(A(xs)));
  add("contiguous", "contiguous", [arr([4, 3], dt, g, T())], {}, (xs) => mx.contiguous(A(xs)));
  add("contiguous", "contiguous", [arr([4, 3], dt, g, T())], { allow_col_major: true }, (xs, p) => mx.contiguous(A(xs), p.allow_col_major as boolean));
  add("contiguous", "contiguous", [arr([6, 8], dt, g, S([0, 1], [6, 8], [2, 3]))], {}, (xs) => mx.contiguous(A(xs)));
  const rp = (xs: Operand[], p: Params) => mx.repeat(A(xs), p.repeats as number, p.axis as number | undefined);
  add("repeat", "repeat", [n([2, 3])], { repeats: 2, axis: 0 }, rp);
  add("repeat", "repeat", [n([2, 3])], { repeats: 3 }, rp);
  add("repeat", "repeat", [arr([3, 2], dt, g, T())], { repeats: 2, axis: -1 }, rp);
  add("repeat", "repeat", [n([2, 2, 3])], { repeats: 4, axis: 1 }, rp);
  add("tile", "tile", [n([2, 3])], { reps: [2, 1] }, (xs, p) => mx.tile(A(xs), p.reps as number[]));
  add("tile", "tile", [n([3])], { reps: [2, 2] }, (xs, p) => mx.tile(A(xs), p.reps as number[]));
  add("tile", "tile", [arr([3, 2], dt, g, T())], { reps: [1, 3] }, (xs, p) => mx.tile(A(xs), p.reps as number[]));
  const pd = (xs: Operand[], p: Params) => mx.pad(A(xs), p.pad_width as [number, number][], A(xs, 1));
  add("pad", "pad", [n([2, 3]), n([])], { pad_width: [[1, 0], [2, 1]] }, pd);
  add("pad", "pad", [n([2, 3, 2]), n([])], { pad_width: [[0, 0], [0, 2], [1, 1]] }, pd);
  add("pad", "pad", [arr([3, 2], dt, g, T()), arr([], "float32")], { pad_width: [[1, 1], [0, 1]] }, pd);
}

for (const dt of SHAPE_DT) {
  const g: Gen = dt === "bool" ? "bool" : dt === "int32" ? "int" : "normal";
  const dp = (xs: Operand[], p: Params) => mx.depends(xs.slice(0, p.n_inputs as number) as MlxArray[], xs.slice(p.n_inputs as number) as MlxArray[]) as MlxArray[];
  add("depends", "depends", [arr([3, 4], dt, g), arr([2], "float32")], { n_inputs: 1 }, dp);
  add("depends", "depends", [arr([5], dt, g), arr([2, 3], dt, g, T()), arr([], "int32"), arr([4], "float16")], { n_inputs: 2 }, dp);
  add("depends", "depends", [arr([2, 1, 3], dt, g), arr([6, 8], dt, g, S([0, 1], [6, 8], [2, 2]))], { n_inputs: 1 }, dp);
}

// ---------------------------------------------------------------- matmul and quantization

for (const dt of FLOATS) {
  const am = (xs: Operand[], p: Params) => mx.addmm(A(xs, 0), A(xs, 1), A(xs, 2), (p.alpha ?? 1) as number, (p.beta ?? 1) as number);
  add("addmm", "addmm", [arr([5], dt), arr([3, 8], dt), arr([5, 8], dt, "normal", T())], {}, am);
  add("addmm", "addmm", [arr([3, 5], dt), arr([3, 8], dt), arr([8, 5], dt)], { alpha: 0.5, beta: 2.0 }, am);
  add("addmm", "addmm", [arr([2, 3, 5], dt), arr([2, 3, 8], dt), arr([8, 5], dt)], { alpha: 1.0, beta: 0.1 }, am);
}

interface QMode {
  mode: mx.QuantMode;
  groupSize?: number;
  bits?: number;
}
const QMODES: QMode[] = [
  { mode: "affine" },
  { mode: "affine", groupSize: 32, bits: 8 },
  { mode: "affine", groupSize: 128, bits: 2 },
  { mode: "affine", groupSize: 64, bits: 3 },
  { mode: "affine", groupSize: 64, bits: 6 },
  { mode: "affine", groupSize: 32, bits: 5 },
  { mode: "mxfp4" },
  { mode: "nvfp4" },
  { mode: "mxfp8" },
];
const qparams = (q: QMode): Params => ({ mode: q.mode, ...(q.groupSize ? { group_size: q.groupSize } : {}), ...(q.bits ? { bits: q.bits } : {}) });
const qargs = (p: Params): mx.QuantArgs => ({ mode: p.mode as mx.QuantMode, groupSize: p.group_size as number | undefined, bits: p.bits as number | undefined });

/** Packed (quantized) input specs for an [n, k] weight (or [e, n, k] with experts). */
function qinputs(q: QMode, dims: number[]): InputSpec[] {
  const gs = q.groupSize ?? (q.mode === "affine" ? 64 : q.mode === "nvfp4" ? 16 : 32);
  const bits = q.bits ?? (q.mode === "mxfp8" ? 8 : 4);
  const k = dims[dims.length - 1]!;
  const lead = dims.slice(0, -1);
  const w = arr([...lead, (k * bits) / 32], "uint32", "bits");
  if (q.mode === "affine") {
    return [w, arr([...lead, k / gs], "float32", "small"), arr([...lead, k / gs], "float32", "small")];
  }
  // fp modes: uint8 scales (e8m0 for mx*, e4m3 for nvfp4), kept in a sane exponent range
  return [w, arr([...lead, k / gs], "uint8", q.mode === "nvfp4" ? { range: [40, 70] } : { range: [118, 130] })];
}

for (const q of QMODES) {
  const qp = qparams(q);
  for (const dt of FLOATS) {
    const run = (xs: Operand[], p: Params) => mx.quantize(A(xs), qargs(p));
    add("quantize", "quantize", [arr([8, 128], dt)], qp, run);
    add("quantize", "quantize", [arr([2, 4, 256], dt, "wide")], qp, run);
    add("quantize", "quantize", [arr([128, 6], dt, "normal", T())], qp, run);
  }
  const packed = qinputs(q, [6, 128]);
  const hasB = q.mode === "affine";
  for (const dims of [[2, 3, 256], [1, 512]]) {
    add("dequantize", "dequantize", qinputs(q, dims), { ...qp, has_biases: hasB }, (xs, p) =>
      mx.dequantize(A(xs, 0), A(xs, 1), p.has_biases ? A(xs, 2) : null, { ...qargs(p), dtype: p.dtype as Dtype | undefined }));
  }
  // dequantize: affine output dtype follows scales (f32 here) unless dtype given
  for (const dtype of [undefined, "bfloat16", "float16"] as (Dtype | undefined)[]) {
    const ps = { ...qp, has_biases: hasB, ...(dtype ? { dtype } : {}) };
    add("dequantize", "dequantize", packed, ps, (xs, p) =>
      mx.dequantize(A(xs, 0), A(xs, 1), p.has_biases ? A(xs, 2) : null, { ...qargs(p), dtype: p.dtype as Dtype | undefined }));
  }
  // quantized_matmul with x in each float dtype (affine scales/biases cast to x's dtype, as in a model)
  for (const dt of FLOATS) {
    const ins = qinputs(q, [6, 128]).map((s, i) => (i >= 1 && "dtype" in s && s.dtype === "float32" ? { ...s, dtype: dt } : s));
    const run = (xs: Operand[], p: Params) =>
      mx.quantizedMatmul(A(xs, 0), A(xs, 1), A(xs, 2), p.has_biases ? A(xs, 3) : null, { ...qargs(p), transpose: p.transpose as boolean });
    add("quantizedMatmul", "quantized_matmul", [arr([3, 128], dt), ...ins], { ...qp, has_biases: hasB, transpose: true }, run);
    add("quantizedMatmul", "quantized_matmul", [arr([2, 1, 128], dt), ...ins], { ...qp, has_biases: hasB, transpose: true }, run);
    add("quantizedMatmul", "quantized_matmul", [arr([128], dt), ...ins], { ...qp, has_biases: hasB, transpose: true }, run);
    if (q.mode === "affine" && !q.groupSize) {
      // transpose=False: w is [K, N] quantized along N
      const insT = qinputs(q, [128, 64]).map((s, i) => (i >= 1 && "dtype" in s ? { ...s, dtype: dt } : s));
      add("quantizedMatmul", "quantized_matmul", [arr([3, 128], dt), ...insT], { ...qp, has_biases: true, transpose: false }, run);
      add("quantizedMatmul", "quantized_matmul", [arr([128, 3], dt, "normal", T()), ...ins], { ...qp, has_biases: true, transpose: true }, run);
    }
    // gather_qmm: experts [4, 6, 128], rhs indices pick an expert per token
    const insE = qinputs(q, [4, 6, 128]).map((s, i) => (i >= 1 && "dtype" in s && s.dtype === "float32" ? { ...s, dtype: dt } : s));
    const gq = (xs: Operand[], p: Params) => {
      const nq = p.has_biases ? 4 : 3;
      let i = nq;
      const lhs = p.lhs ? A(xs, i++) : null;
      const rhs = p.rhs ? A(xs, i++) : null;
      return mx.gatherQmm(A(xs, 0), A(xs, 1), A(xs, 2), p.has_biases ? A(xs, 3) : null, {
        ...qargs(p),
        lhsIndices: lhs,
        rhsIndices: rhs,
        transpose: p.transpose as boolean,
        sortedIndices: p.sorted_indices as boolean,
      });
    };
    add("gatherQmm", "gather_qmm", [arr([5, 1, 128], dt), ...insE, arr([5], "uint32", { index: 4 })], { ...qp, has_biases: hasB, rhs: true, transpose: true, sorted_indices: false }, gq);
    add("gatherQmm", "gather_qmm", [arr([6, 1, 128], dt), ...insE, arr([6], "uint32", { values: [0, 0, 1, 2, 2, 3] })], { ...qp, has_biases: hasB, rhs: true, transpose: true, sorted_indices: true }, gq);
    if (q.mode === "affine" && !q.groupSize) {
      add("gatherQmm", "gather_qmm", [arr([3, 2, 128], dt), ...insE, arr([4], "uint32", { index: 3 }), arr([4], "uint32", { index: 4 })], { ...qp, has_biases: true, lhs: true, rhs: true, transpose: true, sorted_indices: false }, gq);
    }
  }
}

// quantized_matmul with one quantization group per row (K == group_size) and several rows of x:
// the fixtures' router projections (8-bit g64, K = 64, N = 8) and c4_e4b/mixed's per-layer
// projection (4-bit g64, N = 192). On CUDA with compute capability 9 these are the only shapes
// MLX sends to its qmm_sm90 kernel (group_size >= K, more than one row), where the two processes
// computed different values (bench/PARITY-cuda.md).
for (const dt of FLOATS) {
  const run = (xs: Operand[], p: Params) => mx.quantizedMatmul(A(xs, 0), A(xs, 1), A(xs, 2), A(xs, 3), { ...qargs(p), transpose: true });
  for (const [bits, n] of [[8, 8], [4, 192], [4, 8]] as const) {
    const q: QMode = { mode: "affine", groupSize: 64, bits };
    const ins = qinputs(q, [n, 64]).map((s, i) => (i >= 1 && "dtype" in s ? { ...s, dtype: dt } : s));
    for (const m of [5, 36]) add("quantizedMatmul", "quantized_matmul", [arr([1, m, 64], dt), ...ins], { ...qparams(q), has_biases: true, transpose: true }, run);
  }
}

// nvfp4 with a global scale (Python `global_scale=`)
for (const dt of FLOATS) {
  const gsc: Gen = { values: [0.75] };
  add("quantize", "quantize", [arr([8, 64], dt, "wide"), arr([], "float32", gsc)], { mode: "nvfp4", has_global_scale: true }, (xs, p) =>
    mx.quantize(A(xs), { ...qargs(p), globalScale: A(xs, 1) }));
  add("dequantize", "dequantize", [...qinputs({ mode: "nvfp4" }, [4, 64]), arr([], "float32", { values: [2.5] })], { mode: "nvfp4", has_biases: false, has_global_scale: true, dtype: dt }, (xs, p) =>
    mx.dequantize(A(xs, 0), A(xs, 1), null, { ...qargs(p), globalScale: A(xs, 2), dtype: p.dtype as Dtype }));
  // (gather_qmm with a global scale is GPU-only in MLX 0.32.4: both sides raise on CPU)
}

// gather_mm: the CPU kernel supports float32 only (f16/bf16 raise in both Python and TS)
for (const dt of ["float32"] as Dtype[]) {
  const gm = (xs: Operand[], p: Params) => {
    let i = 2;
    const lhs = p.lhs ? A(xs, i++) : null;
    const rhs = p.rhs ? A(xs, i++) : null;
    return mx.gatherMm(A(xs, 0), A(xs, 1), { lhsIndices: lhs, rhsIndices: rhs, sortedIndices: p.sorted_indices as boolean });
  };
  add("gatherMm", "gather_mm", [arr([5, 1, 8], dt), arr([4, 8, 6], dt), arr([5], "uint32", { index: 4 })], { rhs: true, sorted_indices: false }, gm);
  add("gatherMm", "gather_mm", [arr([6, 1, 8], dt), arr([4, 6, 8], dt, "normal", T([0, 2, 1])), arr([6], "uint32", { values: [0, 1, 1, 2, 3, 3] })], { rhs: true, sorted_indices: true }, gm);
  add("gatherMm", "gather_mm", [arr([3, 2, 8], dt), arr([4, 8, 5], dt), arr([4], "uint32", { index: 3 }), arr([4], "uint32", { index: 4 })], { lhs: true, rhs: true, sorted_indices: false }, gm);
  add("gatherMm", "gather_mm", [arr([2, 3, 8], dt), arr([2, 8, 5], dt)], { sorted_indices: false }, gm);
  add("gatherMm", "gather_mm", [arr([2, 4, 1, 16], dt), arr([8, 16, 32], dt), arr([2, 4], "uint32", { index: 8 })], { rhs: true, sorted_indices: false }, gm);
  add("gatherMm", "gather_mm", [arr([8, 1, 16], dt, "wide"), arr([3, 32, 16], dt, "normal", T([0, 2, 1])), arr([8], "uint32", { values: [0, 0, 0, 1, 1, 2, 2, 2] })], { rhs: true, sorted_indices: true }, gm);
}

// ---------------------------------------------------------------- fast

for (const dt of FLOATS) {
  const rn = (xs: Operand[], p: Params) => mx.fast.rmsNorm(A(xs), p.has_weight ? A(xs, 1) : null, p.eps as number);
  add("fast.rmsNorm", "fast.rms_norm", [arr([2, 3, 16], dt), arr([16], dt)], { eps: 1e-6, has_weight: true }, rn);
  add("fast.rmsNorm", "fast.rms_norm", [arr([2, 3, 16], dt), arr([16], "float32")], { eps: 1e-5, has_weight: true }, rn);
  add("fast.rmsNorm", "fast.rms_norm", [arr([4, 32], dt, "wide")], { eps: 1e-6, has_weight: false }, rn);
  add("fast.rmsNorm", "fast.rms_norm", [arr([16, 3], dt, "normal", T()), arr([16], dt)], { eps: 1e-6, has_weight: true }, rn);
  const ln = (xs: Operand[], p: Params) => {
    const w = p.has_weight ? A(xs, 1) : null;
    const b = p.has_bias ? A(xs, p.has_weight ? 2 : 1) : null;
    return mx.fast.layerNorm(A(xs), w, b, p.eps as number);
  };
  add("fast.layerNorm", "fast.layer_norm", [arr([2, 3, 16], dt), arr([16], dt), arr([16], dt)], { eps: 1e-5, has_weight: true, has_bias: true }, ln);
  add("fast.layerNorm", "fast.layer_norm", [arr([4, 32], dt)], { eps: 1e-6, has_weight: false, has_bias: false }, ln);
  add("fast.layerNorm", "fast.layer_norm", [arr([16, 3], dt, "normal", T()), arr([16], dt)], { eps: 1e-5, has_weight: true, has_bias: false }, ln);
  add("fast.layerNorm", "fast.layer_norm", [arr([3, 16], dt), arr([16], "float32")], { eps: 1e-5, has_weight: false, has_bias: true }, ln);

  const rp = (xs: Operand[], p: Params) => {
    let i = 1;
    const offset = p.offset === undefined ? A(xs, i++) : (p.offset as number);
    const freqs = p.has_freqs ? A(xs, i++) : null;
    return mx.fast.rope(A(xs), p.dims as number, { traditional: p.traditional as boolean, base: p.base as number | null, scale: p.scale as number, offset, freqs });
  };
  add("fast.rope", "fast.rope", [arr([1, 2, 5, 16], dt)], { dims: 16, traditional: false, base: 10000.0, scale: 1.0, offset: 0 }, rp);
  add("fast.rope", "fast.rope", [arr([1, 2, 5, 16], dt)], { dims: 8, traditional: true, base: 1000000.0, scale: 0.5, offset: 7 }, rp);
  add("fast.rope", "fast.rope", [arr([2, 5, 1, 16], dt, "normal", T([0, 2, 1, 3])), arr([], "int32", { values: [3] })], { dims: 16, traditional: false, base: 10000.0, scale: 1.0 }, rp);
  add("fast.rope", "fast.rope", [arr([2, 1, 3, 16], dt), arr([2], "int32", { values: [0, 5] })], { dims: 16, traditional: false, base: 10000.0, scale: 1.0 }, rp);
  add("fast.rope", "fast.rope", [arr([1, 2, 4, 32], dt), arr([16], "float32", { values: [1, 2.5, 7, 19, 55, 150, 400, 1100, Infinity, Infinity, Infinity, Infinity, Infinity, Infinity, Infinity, Infinity] })], { dims: 32, traditional: false, base: null, scale: 1.0, offset: 11, has_freqs: true }, rp);

  const sd = (xs: Operand[], p: Params) => {
    let mask: MlxArray | "causal" | null = null;
    let i = 3;
    if (p.mask === "causal") mask = "causal";
    else if (p.mask === "array") mask = A(xs, i++);
    const sinks = p.has_sinks ? A(xs, i++) : null;
    return mx.fast.scaledDotProductAttention(A(xs, 0), A(xs, 1), A(xs, 2), { scale: p.scale as number, mask, sinks });
  };
  const q = arr([1, 4, 5, 16], dt);
  const kv = () => arr([1, 2, 7, 16], dt);
  add("fast.scaledDotProductAttention", "fast.scaled_dot_product_attention", [q, kv(), kv()], { scale: 0.25 }, sd);
  add("fast.scaledDotProductAttention", "fast.scaled_dot_product_attention", [q, kv(), kv()], { scale: 1.0, mask: "causal" }, sd);
  add("fast.scaledDotProductAttention", "fast.scaled_dot_product_attention", [q, kv(), kv(), arr([5, 7], "bool", "bool")], { scale: 1.0, mask: "array" }, sd);
  add("fast.scaledDotProductAttention", "fast.scaled_dot_product_attention", [q, kv(), kv(), arr([1, 1, 5, 7], dt, "small")], { scale: 0.5, mask: "array" }, sd);
  add("fast.scaledDotProductAttention", "fast.scaled_dot_product_attention", [arr([1, 5, 4, 16], dt, "normal", T([0, 2, 1, 3])), arr([1, 4, 4, 16], dt), arr([1, 4, 4, 16], dt), arr([4], dt)], { scale: 0.25, mask: "causal", has_sinks: true }, sd);
  add("fast.scaledDotProductAttention", "fast.scaled_dot_product_attention", [arr([1, 2, 1, 8], dt), arr([1, 2, 9, 8], dt), arr([1, 2, 9, 8], dt)], { scale: 1.0 }, sd);
}

// ---------------------------------------------------------------- convolution and einsum (multimodal towers)

for (const dt of FLOATS) {
  const c2 = (xs: Operand[], p: Params) =>
    mx.conv2d(A(xs, 0), A(xs, 1), { stride: p.stride as number, padding: p.padding as number, dilation: (p.dilation ?? 1) as number, groups: (p.groups ?? 1) as number });
  // the audio SSCP convs: NHWC, 3x3, stride 2, no padding (after an explicit mx.pad)
  add("conv2d", "conv2d", [arr([1, 13, 16, 1], dt), arr([8, 3, 3, 1], dt)], { stride: 2, padding: 0 }, c2);
  add("conv2d", "conv2d", [arr([2, 7, 8, 8], dt), arr([4, 3, 3, 8], dt)], { stride: 2, padding: 0 }, c2);
  add("conv2d", "conv2d", [arr([1, 6, 5, 3], dt), arr([2, 3, 3, 3], dt)], { stride: 1, padding: 1 }, c2);
  add("conv2d", "conv2d", [arr([1, 9, 9, 4], dt), arr([6, 3, 3, 2], dt)], { stride: 2, padding: 1, dilation: 2, groups: 2 }, c2);
  add("conv2d", "conv2d", [arr([1, 8, 6, 2], dt, "normal", T([0, 2, 1, 3])), arr([3, 2, 2, 2], dt)], { stride: 1, padding: 0 }, c2);
  const cg = (xs: Operand[], p: Params) =>
    mx.convGeneral(A(xs, 0), A(xs, 1), {
      stride: p.stride as number | number[],
      padding: p.padding as number | number[] | [number[], number[]],
      kernelDilation: (p.kernel_dilation ?? 1) as number | number[],
      inputDilation: (p.input_dilation ?? 1) as number | number[],
      groups: (p.groups ?? 1) as number,
      flip: (p.flip ?? false) as boolean,
    });
  // the audio light conv: depthwise causal 1-D (groups = channels), kernel 5
  add("convGeneral", "conv_general", [arr([1, 16, 8], dt), arr([8, 5, 1], dt)], { stride: 1, padding: 0, groups: 8 }, cg);
  add("convGeneral", "conv_general", [arr([2, 10, 6], dt), arr([6, 3, 1], dt)], { stride: 2, padding: [[2], [0]], groups: 6 }, cg);
  add("convGeneral", "conv_general", [arr([1, 7, 6, 2], dt), arr([3, 2, 3, 2], dt)], { stride: [1, 2], padding: [1, 0], kernel_dilation: [2, 1], input_dilation: 1 }, cg);
  add("convGeneral", "conv_general", [arr([1, 5, 5, 2], dt), arr([2, 3, 3, 2], dt)], { stride: 1, padding: 1, input_dilation: 2, flip: true }, cg);
  const es = (xs: Operand[], p: Params) => mx.einsum(p.subscripts as string, ...(xs as MlxArray[]));
  // the vision pooler's and the audio attention's contractions
  add("einsum", "einsum", [arr([1, 18, 2], dt), arr([1, 18, 5], dt)], { subscripts: "bLl,bLd->bld" }, es);
  add("einsum", "einsum", [arr([1, 2, 3, 4, 6], dt), arr([1, 3, 6, 2, 5], dt)], { subscripts: "bnuwc,bucnh->buwnh" }, es);
  add("einsum", "einsum", [arr([3, 4], dt), arr([5, 4], dt, "normal", T())], { subscripts: "ij,jk->ik" }, es);
  add("einsum", "einsum", [arr([4, 4], dt)], { subscripts: "ii->i" }, es);
  add("einsum", "einsum", [arr([2, 3, 4], dt), arr([4], dt), arr([3], dt)], { subscripts: "abc,c,b->a" }, es);
}

// ---------------------------------------------------------------- random

for (const seed of [0, 42, 2 ** 33 + 5]) {
  add("random.key", "random.key", [], { seed }, (_, p) => mx.random.key(p.seed as number));
  add("random.seed", "random.seed", [], { seed, shape: [3, 4] }, (_, p) => {
    mx.random.seed(p.seed as number);
    return [mx.random.uniform({ shape: p.shape as number[] }), mx.random.normal({ shape: p.shape as number[] })];
  });
}
const KEY = (vals: number[]) => arr([2], "uint32", { values: vals });
for (const k of [[0, 0], [0, 42], [7, 123456]]) {
  add("random.split", "random.split", [KEY(k)], { num: 2 }, (xs, p) => mx.random.split(A(xs), p.num as number));
  add("random.split", "random.split", [KEY(k)], { num: 3 }, (xs, p) => mx.random.split(A(xs), p.num as number));
  for (const dt of FLOATS) {
    const u = (xs: Operand[], p: Params) => mx.random.uniform({ low: p.low as number, high: p.high as number, shape: p.shape as number[], dtype: p.dtype as Dtype, key: A(xs) });
    add("random.uniform", "random.uniform", [KEY(k)], { shape: [3, 4], dtype: dt, low: 0.0, high: 1.0 }, u);
    add("random.uniform", "random.uniform", [KEY(k)], { shape: [5], dtype: dt, low: -0.125, high: 0.125 }, u);
    add("random.uniform", "random.uniform", [KEY(k)], { shape: [2, 3, 2], dtype: dt, low: -3.0, high: 2.0 }, u);
    const nm = (xs: Operand[], p: Params) => mx.random.normal({ shape: p.shape as number[], dtype: p.dtype as Dtype, loc: p.loc as number, scale: p.scale as number, key: A(xs) });
    add("random.normal", "random.normal", [KEY(k)], { shape: [3, 4], dtype: dt, loc: 0.0, scale: 1.0 }, nm);
    add("random.normal", "random.normal", [KEY(k)], { shape: [5], dtype: dt, loc: 0.0, scale: 0.02 }, nm);
    add("random.normal", "random.normal", [KEY(k)], { shape: [2, 3], dtype: dt, loc: 1.5, scale: 3.0 }, nm);
    const ct = (xs: Operand[], p: Params) =>
      mx.random.categorical(A(xs), { axis: p.axis as number, shape: (p.shape ?? undefined) as number[] | undefined, numSamples: (p.num_samples ?? undefined) as number | undefined, key: A(xs, 1) });
    add("random.categorical", "random.categorical", [arr([3, 10], dt, "wide"), KEY(k)], { axis: -1 }, ct);
    add("random.categorical", "random.categorical", [arr([10, 3], dt, "wide"), KEY(k)], { axis: 0 }, ct);
    add("random.categorical", "random.categorical", [arr([2, 10], dt, "wide"), KEY(k)], { axis: -1, num_samples: 4 }, ct);
    add("random.categorical", "random.categorical", [arr([2, 10], dt, "wide"), KEY(k)], { axis: -1, shape: [3, 2] }, ct);
  }
}

// ---------------------------------------------------------------- tuner (nn.Dropout's mask, nn.losses' GPU cross-entropy)

for (const k of [[0, 0], [7, 123456]]) {
  const b = (xs: Operand[], p: Params) => mx.random.bernoulli(p.p as number, { shape: p.shape as number[], key: A(xs) });
  add("random.bernoulli", "random.bernoulli", [KEY(k)], { p: 0.9, shape: [4, 8] }, b);
  add("random.bernoulli", "random.bernoulli", [KEY(k)], { p: 0.5, shape: [3, 5] }, b);
  add("random.bernoulli", "random.bernoulli", [arr([3, 5], "float32", "unit"), KEY(k)], {}, (xs) => mx.random.bernoulli(A(xs), { key: A(xs, 1) }));
}
for (const dt of FLOATS) {
  const ce = (xs: Operand[]) => mx.fast.crossEntropy(A(xs), A(xs, 1));
  add("fast.crossEntropy", "fast.cross_entropy", [arr([2, 5, 16], dt, "wide"), arr([2, 5], "int32", { index: 16 })], {}, ce);
  add("fast.crossEntropy", "fast.cross_entropy", [arr([7, 33], dt), arr([7], "uint32", { index: 33 })], {}, ce);
}

// ---------------------------------------------------------------- exports

export const CASES: readonly OpCase[] = cases;

/** Exported names that are not ops (helpers, state), with the reason. */
export const NOT_OPS: Record<string, string> = {
  "random.state": "global key state object (compile capture), exercised by random.seed cases",
  ...Object.fromEntries(
    ["fast.metalKernel", "fast.cudaKernel", "fast.CustomKernel"].map((o) => [
      o,
      "custom-kernel builders (kernel source compiled by the GPU backend, no CPU path): suites/kvquant/custom_kernel.test.ts checks MLX's refusal messages against Python's on the CPU and the outputs bit for bit on CUDA",
    ]),
  ),
};
