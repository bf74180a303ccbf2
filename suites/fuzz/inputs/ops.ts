// Bad op calls through the binding: one call of one op with fuzzed arguments (shapes, axes,
// dtypes, out-of-range indices, sizes that overflow, disposed or foreign handles, mismatched
// quantization parameters). An input is a JSON description; `callOp` materialises the arrays,
// makes the call, evaluates what it returned (when small enough) and frees everything.
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import * as mx from "@mlx-bun/mlx";
import { type Dtype, MlxArray } from "@mlx-bun/mlx";

/** An array argument: data of a shape and dtype, or a handle that is not a live array. */
export type ArrSpec =
  | { shape: number[]; dtype: string; seed: number }
  | { bad: "disposed" | "foreign" | "junk-number" | "not-an-array" };
export type Arg = { arr: ArrSpec } | { arrs: ArrSpec[] } | { num: number } | { nums: number[] } | { str: string } | { bool: boolean } | { none: true } | { obj: Record<string, Arg> };
export interface OpCall {
  op: string;
  args: Arg[];
}

const DTYPES = ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bfloat16", "complex64"];
const INDEX_DTYPES = ["int32", "uint32", "int64", "int8", "uint8", "int16", "float32", "bool"];

// Sizes that overflow int32 or the address space, fractions, non-finite values and the usual small ones.
const num: fc.Arbitrary<number> = fc.oneof(
  { weight: 6, arbitrary: fc.integer({ min: -3, max: 6 }) },
  { weight: 1, arbitrary: fc.constantFrom(2 ** 31 - 1, 2 ** 31, -(2 ** 31) - 1, 2 ** 32 + 2, 2 ** 40, 2 ** 53, 1.5, -0.5, Number.NaN, Number.POSITIVE_INFINITY, 1e-45) },
);
const dim = fc.oneof({ weight: 8, arbitrary: fc.integer({ min: 0, max: 5 }) }, { weight: 1, arbitrary: num });
const shape = fc.array(dim, { maxLength: 4 });
const smallShape = fc.array(fc.oneof({ weight: 6, arbitrary: fc.integer({ min: 1, max: 4 }) }, { weight: 1, arbitrary: fc.constant(0) }), { maxLength: 4 });

const arrSpec = (dtypes = DTYPES, shp: fc.Arbitrary<number[]> = smallShape): fc.Arbitrary<ArrSpec> =>
  fc.oneof(
    { weight: 12, arbitrary: fc.record({ shape: shp, dtype: fc.constantFrom(...dtypes), seed: fc.integer({ min: 0, max: 1000 }) }) },
    { weight: 1, arbitrary: fc.record({ bad: fc.constantFrom("disposed" as const, "foreign" as const, "junk-number" as const, "not-an-array" as const) }) },
  );
const A = (dtypes?: string[], shp?: fc.Arbitrary<number[]>) => arrSpec(dtypes, shp).map((arr): Arg => ({ arr }));
const IDX = A(INDEX_DTYPES);
const FLOAT = A(["float32", "float32", "bfloat16", "float16"]);
const N = num.map((n): Arg => ({ num: n }));
const NS = (max = 4) => fc.array(num, { maxLength: max }).map((nums): Arg => ({ nums }));
const SH = shape.map((nums): Arg => ({ nums }));
const D = fc.oneof(fc.constantFrom(...DTYPES), fc.constantFrom("float8", "int4", "", "Float32")).map((str): Arg => ({ str }));
const B = fc.boolean().map((bool): Arg => ({ bool }));
const NONE: fc.Arbitrary<Arg> = fc.constant({ none: true });
const orNone = (a: fc.Arbitrary<Arg>) => fc.oneof({ weight: 3, arbitrary: a }, { weight: 1, arbitrary: NONE });
const ARRS = fc.array(arrSpec(), { maxLength: 4 }).map((arrs): Arg => ({ arrs }));
const QUANT = fc
  .record({ groupSize: fc.oneof(fc.constantFrom(16, 32, 64, 128), num), bits: fc.oneof(fc.constantFrom(2, 3, 4, 5, 6, 8), num), mode: fc.constantFrom("affine", "mxfp4", "nvfp4", "mxfp8", "int3") }, { requiredKeys: [] })
  .map((q): Arg => ({ obj: Object.fromEntries(Object.entries(q).map(([k, v]) => [k, typeof v === "string" ? { str: v } : { num: v }])) }));
const QW = A(["float32", "bfloat16", "float16", "uint32", "uint8"], fc.constantFrom([4, 64], [8, 128], [2, 4, 32], [16, 32], [3, 96]));

const UNARY = ["abs", "negative", "sign", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "square", "reciprocal", "sin", "tanh", "erf", "erfinv", "sigmoid", "floor", "ceil", "logicalNot", "isnan", "isinf", "bitwiseInvert", "copy", "zerosLike", "arccosh", "degrees", "isposinf"] as const;
const BINARY = ["add", "subtract", "multiply", "divide", "power", "floorDivide", "remainder", "maximum", "equal", "less", "logicalAnd", "bitwiseAnd", "bitwiseXor", "leftShift", "rightShift", "logaddexp", "arctan2", "matmul", "outer", "inner", "kron"] as const;
const REDUCE = ["sum", "mean", "max", "min", "prod", "all", "any", "logsumexp", "variance", "std"] as const;
const SCALAR_OR_A = fc.oneof(A(), N, B);

/** Op name → argument generator. The call itself is in CALLS below. */
const ARGS: Record<string, fc.Arbitrary<Arg[]>> = {
  ...Object.fromEntries(UNARY.map((u) => [u, fc.tuple(A())])),
  ...Object.fromEntries(BINARY.map((b) => [b, fc.tuple(SCALAR_OR_A, SCALAR_OR_A)])),
  ...Object.fromEntries(REDUCE.map((r) => [r, fc.tuple(A(), orNone(fc.oneof(N, NS())), B, N)])),
  where: fc.tuple(A(), SCALAR_OR_A, SCALAR_OR_A),
  clip: fc.tuple(A(), orNone(SCALAR_OR_A), orNone(SCALAR_OR_A)),
  round: fc.tuple(A(), N),
  arange: fc.tuple(N, N, N, orNone(D)),
  linspace: fc.tuple(N, N, N, D),
  eye: fc.tuple(N, N, N, D),
  tri: fc.tuple(N, N, N, D),
  zeros: fc.tuple(SH, D),
  ones: fc.tuple(SH, D),
  full: fc.tuple(SH, SCALAR_OR_A, orNone(D)),
  astype: fc.tuple(A(), D),
  view: fc.tuple(A(), D),
  tril: fc.tuple(A(), N),
  argmax: fc.tuple(A(), orNone(N), B),
  softmax: fc.tuple(A(), orNone(fc.oneof(N, NS())), B),
  cumsum: fc.tuple(A(), N, B, B),
  logcumsumexp: fc.tuple(A(), N, B, B),
  sort: fc.tuple(A(), orNone(N)),
  argpartition: fc.tuple(A(), N, orNone(N)),
  topk: fc.tuple(A(), N, orNone(N)),
  reshape: fc.tuple(A(), SH),
  flatten: fc.tuple(A(), N, N),
  unflatten: fc.tuple(A(), N, SH),
  transpose: fc.tuple(A(), orNone(NS())),
  swapaxes: fc.tuple(A(), N, N),
  moveaxis: fc.tuple(A(), N, N),
  expandDims: fc.tuple(A(), fc.oneof(N, NS())),
  squeeze: fc.tuple(A(), orNone(fc.oneof(N, NS()))),
  broadcastTo: fc.tuple(A(), SH),
  concatenate: fc.tuple(ARRS, N),
  stack: fc.tuple(ARRS, N),
  split: fc.tuple(A(), fc.oneof(N, NS()), N),
  slice: fc.tuple(A(), NS(), NS(), orNone(NS())),
  sliceDynamic: fc.tuple(A(), IDX, NS(), SH),
  sliceUpdate: fc.tuple(A(), A(), NS(), NS(), orNone(NS())),
  sliceUpdateDynamic: fc.tuple(A(), A(), IDX, NS()),
  take: fc.tuple(A(), IDX, orNone(N)),
  takeAlongAxis: fc.tuple(A(), IDX, N),
  putAlongAxis: fc.tuple(A(), IDX, A(), N),
  roll: fc.tuple(A(), N, orNone(N)),
  repeat: fc.tuple(A(), N, orNone(N)),
  tile: fc.tuple(A(), NS()),
  pad: fc.tuple(A(), fc.array(fc.tuple(num, num), { maxLength: 4 }).map((w): Arg => ({ nums: w.flat() })), A()),
  addmm: fc.tuple(A(), A(), A(), N, N),
  quantize: fc.tuple(FLOAT, QUANT),
  dequantize: fc.tuple(QW, A(), orNone(A()), QUANT),
  quantizedMatmul: fc.tuple(FLOAT, QW, A(), orNone(A()), QUANT, B),
  quantizeRoundTrip: fc.tuple(A(["float32", "bfloat16"], fc.constantFrom([8, 64], [4, 128], [2, 3, 64])), QUANT, QUANT, A(["float32"], fc.constantFrom([1, 64], [2, 128], [3, 32]))),
  gatherMm: fc.tuple(FLOAT, FLOAT, orNone(IDX), orNone(IDX), B),
  gatherQmm: fc.tuple(FLOAT, QW, A(), orNone(A()), orNone(IDX), orNone(IDX), QUANT),
  rmsNorm: fc.tuple(A(), orNone(A()), N),
  layerNorm: fc.tuple(A(), orNone(A()), orNone(A()), N),
  rope: fc.tuple(FLOAT, N, B, orNone(N), orNone(A(["float32", "int32"])), N, fc.oneof(N, IDX)),
  sdpa: fc.tuple(FLOAT, FLOAT, FLOAT, N, orNone(fc.oneof(A(["bool", "float32"]), fc.constant<Arg>({ str: "causal" }), fc.constant<Arg>({ str: "sliding" })))),
  randomKey: fc.tuple(N),
  randomSplit: fc.tuple(A(["uint32", "float32"], fc.constantFrom([2], [3], [2, 2])), N),
  randomUniform: fc.tuple(N, N, SH, D),
  randomNormal: fc.tuple(SH, D, N, N),
  randomCategorical: fc.tuple(A(), N, orNone(NS()), orNone(N)),
  // methods: only on MlxArray values (live, disposed or foreign handles), as the type system allows
  item: fc.tuple(A().filter((a) => !("arr" in a && "bad" in a.arr && a.arr.bad === "not-an-array"))),
  toNumbers: fc.tuple(A().filter((a) => !("arr" in a && "bad" in a.arr && a.arr.bad === "not-an-array"))),
  alias: fc.tuple(A()),
  depends: fc.tuple(ARRS, ARRS),
  saveSafetensors: fc.tuple(
    fc.constantFrom("ok.safetensors", "no/such/dir/x.safetensors", ".", "plain", "bad\u0000name.safetensors").map((str): Arg => ({ str })),
    fc.array(fc.tuple(fc.constantFrom("w", "", "a\u0000b", "κ", "x".repeat(300)), arrSpec()), { maxLength: 3 }).map((kv): Arg => ({ obj: Object.fromEntries(kv.map(([k, a]) => [k, { arr: a }])) })),
    fc.dictionary(fc.constantFrom("format", "a\u0000", ""), fc.constantFrom("mlx", "x\u0000y"), { maxKeys: 2 }).map((m): Arg => ({ obj: Object.fromEntries(Object.entries(m).map(([k, v]) => [k, { str: v }])) })),
  ),
};

export function arbOpCall(): fc.Arbitrary<OpCall> {
  return fc.oneof(...Object.entries(ARGS).map(([op, args]) => args.map((a): OpCall => ({ op, args: a }))));
}

// ------------------------------------------------------------------ materialising and calling

type V = unknown;

/** Deterministic contents: small integers (so index arrays hold in- and out-of-range values). */
function makeArray(s: ArrSpec, live: MlxArray[]): V {
  if ("bad" in s) {
    if (s.bad === "not-an-array") return { handle: 1 };
    if (s.bad === "junk-number") return new MlxArray(0x1234_5670);
    if (s.bad === "foreign") return new MlxArray(Number(process.memoryUsage().rss) & ~7);
    const a = mx.zeros([2], "float32");
    a.dispose();
    return a;
  }
  const n = s.shape.reduce((x, y) => x * y, 1);
  if (!s.shape.every((d) => Number.isInteger(d) && d >= 0) || n > 4096) {
    const z = mx.zeros(s.shape, s.dtype as Dtype);
    live.push(z);
    return z;
  }
  const data = Int32Array.from({ length: n }, (_, i) => ((i * 7 + s.seed) % 15) - 4);
  const base = mx.array(data, s.shape, "int32");
  live.push(base);
  const out = s.dtype === "int32" ? base : mx.astype(base, s.dtype as Dtype);
  if (out !== base) live.push(out);
  // Arguments from outside are data (evaluated), as mx.array(...) makes them. The binding range-
  // checks evaluated index arrays; indices computed lazily inside a graph are not checked (that
  // would force evaluation mid-graph), and an out-of-range one is undefined behaviour in MLX.
  mx.evaluate([out]);
  return out;
}

function value(a: Arg, live: MlxArray[]): V {
  if ("arr" in a) return makeArray(a.arr, live);
  if ("arrs" in a) return a.arrs.map((s) => makeArray(s, live));
  if ("num" in a) return a.num;
  if ("nums" in a) return a.nums;
  if ("str" in a) return a.str;
  if ("bool" in a) return a.bool;
  if ("none" in a) return undefined;
  return Object.fromEntries(Object.entries(a.obj).map(([k, v]) => [k, value(v, live)]));
}

const pairs = (ns: number[]): [number, number][] => Array.from({ length: Math.floor(ns.length / 2) }, (_, i) => [ns[2 * i]!, ns[2 * i + 1]!]);
type Fn = (...a: never[]) => unknown;
const f = (name: string): Fn => (mx as unknown as Record<string, Fn>)[name]!;

const CALLS: Record<string, (v: V[], scratch: string) => unknown> = {
  ...Object.fromEntries([...UNARY, ...BINARY, ...REDUCE].map((n) => [n, (v: V[]) => (f(n) as (...a: V[]) => unknown)(...v)])),
  where: ([c, x, y]) => mx.where(c as MlxArray, x as mx.Operand, y as mx.Operand),
  clip: ([a, lo, hi]) => mx.clip(a as MlxArray, (lo ?? null) as mx.Operand | null, (hi ?? null) as mx.Operand | null),
  round: ([a, d]) => mx.round(a as MlxArray, d as number),
  arange: ([a, b, c, d]) => mx.arange(a as number, b as number, c as number, d as Dtype | undefined),
  linspace: ([a, b, n, d]) => mx.linspace(a as number, b as number, n as number, d as Dtype),
  eye: ([n, m, k, d]) => mx.eye(n as number, m as number, k as number, d as Dtype),
  tri: ([n, m, k, d]) => mx.tri(n as number, m as number, k as number, d as Dtype),
  zeros: ([s, d]) => mx.zeros(s as number[], d as Dtype),
  ones: ([s, d]) => mx.ones(s as number[], d as Dtype),
  full: ([s, v, d]) => mx.full(s as number[], v as MlxArray, d as Dtype | undefined),
  astype: ([a, d]) => mx.astype(a as MlxArray, d as Dtype),
  view: ([a, d]) => mx.view(a as MlxArray, d as Dtype),
  tril: ([a, k]) => mx.tril(a as MlxArray, k as number),
  argmax: ([a, ax, k]) => mx.argmax(a as MlxArray, ax as number | undefined, k as boolean),
  softmax: ([a, ax, p]) => mx.softmax(a as MlxArray, ax as number | undefined, p as boolean),
  cumsum: ([a, ax, r, i]) => (mx.cumsum as Fn as (...x: V[]) => unknown)(a, ax, r, i),
  logcumsumexp: ([a, ax, r, i]) => (mx.logcumsumexp as Fn as (...x: V[]) => unknown)(a, ax, r, i),
  sort: ([a, ax]) => mx.sort(a as MlxArray, (ax ?? null) as number | null),
  argpartition: ([a, k, ax]) => mx.argpartition(a as MlxArray, k as number, (ax ?? null) as number | null),
  topk: ([a, k, ax]) => mx.topk(a as MlxArray, k as number, (ax ?? null) as number | null),
  reshape: ([a, s]) => mx.reshape(a as MlxArray, s as number[]),
  flatten: ([a, s, e]) => mx.flatten(a as MlxArray, s as number, e as number),
  unflatten: ([a, ax, s]) => mx.unflatten(a as MlxArray, ax as number, s as number[]),
  transpose: ([a, ax]) => mx.transpose(a as MlxArray, ax as number[] | undefined),
  swapaxes: ([a, x, y]) => mx.swapaxes(a as MlxArray, x as number, y as number),
  moveaxis: ([a, x, y]) => mx.moveaxis(a as MlxArray, x as number, y as number),
  expandDims: ([a, ax]) => mx.expandDims(a as MlxArray, ax as number),
  squeeze: ([a, ax]) => mx.squeeze(a as MlxArray, ax as number | undefined),
  broadcastTo: ([a, s]) => mx.broadcastTo(a as MlxArray, s as number[]),
  concatenate: ([as, ax]) => mx.concatenate(as as MlxArray[], ax as number),
  stack: ([as, ax]) => mx.stack(as as MlxArray[], ax as number),
  split: ([a, n, ax]) => mx.split(a as MlxArray, n as number, ax as number),
  slice: ([a, s, e, st]) => mx.slice(a as MlxArray, s as number[], e as number[], st as number[] | undefined),
  sliceDynamic: ([a, s, ax, sz]) => mx.sliceDynamic(a as MlxArray, s as MlxArray, ax as number[], sz as number[]),
  sliceUpdate: ([a, u, s, e, st]) => mx.sliceUpdate(a as MlxArray, u as MlxArray, s as number[], e as number[], st as number[] | undefined),
  sliceUpdateDynamic: ([a, u, s, ax]) => mx.sliceUpdateDynamic(a as MlxArray, u as MlxArray, s as MlxArray, ax as number[]),
  take: ([a, i, ax]) => mx.take(a as MlxArray, i as MlxArray, ax as number | undefined),
  takeAlongAxis: ([a, i, ax]) => mx.takeAlongAxis(a as MlxArray, i as MlxArray, ax as number),
  putAlongAxis: ([a, i, v, ax]) => mx.putAlongAxis(a as MlxArray, i as MlxArray, v as MlxArray, ax as number),
  roll: ([a, s, ax]) => mx.roll(a as MlxArray, s as number, ax as number | undefined),
  repeat: ([a, r, ax]) => mx.repeat(a as MlxArray, r as number, ax as number | undefined),
  tile: ([a, r]) => mx.tile(a as MlxArray, r as number[]),
  pad: ([a, w, v]) => mx.pad(a as MlxArray, pairs(w as number[]), v as MlxArray),
  addmm: ([c, a, b, al, be]) => mx.addmm(c as MlxArray, a as MlxArray, b as MlxArray, al as number, be as number),
  quantize: ([w, q]) => mx.quantize(w as MlxArray, q as mx.QuantArgs),
  dequantize: ([w, s, b, q]) => mx.dequantize(w as MlxArray, s as MlxArray, (b ?? null) as MlxArray | null, q as mx.QuantArgs),
  quantizedMatmul: ([x, w, s, b, q, t]) => mx.quantizedMatmul(x as MlxArray, w as MlxArray, s as MlxArray, (b ?? null) as MlxArray | null, { ...(q as mx.QuantArgs), transpose: t as boolean }),
  // A real quantization (params p) read back with other params q: the mismatch must be refused or computed, never crash.
  quantizeRoundTrip: ([w, p, q, x], _s) => {
    const parts = mx.quantize(w as MlxArray, p as mx.QuantArgs);
    try {
      const [wq, scales, biases] = parts;
      const deq = mx.dequantize(wq!, scales!, biases ?? null, q as mx.QuantArgs);
      consumeNow(deq);
      return mx.quantizedMatmul(x as MlxArray, wq!, scales!, biases ?? null, q as mx.QuantArgs);
    } finally {
      for (const a of parts) a.dispose();
    }
  },
  gatherMm: ([a, b, l, r, s]) => mx.gatherMm(a as MlxArray, b as MlxArray, { lhsIndices: (l ?? null) as MlxArray | null, rhsIndices: (r ?? null) as MlxArray | null, sortedIndices: s as boolean }),
  gatherQmm: ([x, w, s, b, l, r, q]) => mx.gatherQmm(x as MlxArray, w as MlxArray, s as MlxArray, (b ?? null) as MlxArray | null, { ...(q as mx.QuantArgs), lhsIndices: (l ?? null) as MlxArray | null, rhsIndices: (r ?? null) as MlxArray | null }),
  rmsNorm: ([x, w, e]) => mx.fast.rmsNorm(x as MlxArray, (w ?? null) as MlxArray | null, e as number),
  layerNorm: ([x, w, b, e]) => mx.fast.layerNorm(x as MlxArray, (w ?? null) as MlxArray | null, (b ?? null) as MlxArray | null, e as number),
  rope: ([x, dims, trad, base, freqs, scale, offset]) =>
    mx.fast.rope(x as MlxArray, dims as number, { traditional: trad as boolean, base: (base ?? null) as number | null, freqs: (freqs ?? null) as MlxArray | null, scale: scale as number, offset: offset as number | MlxArray }),
  sdpa: ([q, k, v, scale, mask]) => mx.fast.scaledDotProductAttention(q as MlxArray, k as MlxArray, v as MlxArray, { scale: scale as number, mask: (mask ?? null) as MlxArray | "causal" | null }),
  randomKey: ([s]) => mx.random.key(s as number),
  randomSplit: ([k, n]) => mx.random.split(k as MlxArray, n as number),
  randomUniform: ([lo, hi, s, d]) => withKey((key) => mx.random.uniform({ low: lo as number, high: hi as number, shape: s as number[], dtype: d as Dtype, key })),
  randomNormal: ([s, d, loc, sc]) => withKey((key) => mx.random.normal({ shape: s as number[], dtype: d as Dtype, loc: loc as number, scale: sc as number, key })),
  randomCategorical: ([l, ax, s, n]) => withKey((key) => mx.random.categorical(l as MlxArray, { axis: ax as number, shape: s as number[] | undefined, numSamples: n as number | undefined, key })),
  item: ([a]) => void (a as MlxArray).item(),
  toNumbers: ([a]) => void (a as MlxArray).toNumbers(),
  alias: ([a]) => mx.alias(a as MlxArray),
  depends: ([a, b]) => mx.depends(a as MlxArray[], b as MlxArray[]),
  saveSafetensors: ([name, arrays, meta], scratch) => {
    const path = join(scratch, name as string);
    const existed = existsSync(path);
    try {
      mx.saveSafetensors(path, arrays as Record<string, MlxArray>, meta as Record<string, string>);
    } catch (e) {
      // a failed save leaves nothing behind: no file at the path, no temporary beside it
      const left = readdirSync(scratch);
      if (left.length || (!existed && existsSync(path))) throw new Error(`a failed save left files behind: ${left.join(", ")} (${(e as Error).message})`);
      throw e;
    }
  },
};

function withKey(fn: (key: MlxArray) => unknown): unknown {
  using key = mx.random.key(7);
  return fn(key);
}

function consumeNow(out: unknown): void {
  const arrays = out instanceof MlxArray ? [out] : Array.isArray(out) ? out.filter((a): a is MlxArray => a instanceof MlxArray) : [];
  try {
    const small = arrays.filter((a) => !a.disposed && a.nbytes <= 64 << 20);
    if (small.length) {
      mx.evaluate(small);
      for (const a of small) a.toBytes();
    }
  } finally {
    for (const a of arrays) a.dispose();
  }
}

/** Makes the call, evaluates and reads back its (small enough) outputs, and frees every array. */
export function callOp(c: OpCall, scratch: string): void {
  const live: MlxArray[] = [];
  try {
    const vals = c.args.map((a) => value(a, live));
    consumeNow(CALLS[c.op]!(vals, scratch));
  } finally {
    for (const a of live) a.dispose();
  }
}

export const OP_NAMES = Object.keys(ARGS);
for (const op of OP_NAMES) if (!CALLS[op]) throw new Error(`fuzz op ${op} has arguments but no call`);
