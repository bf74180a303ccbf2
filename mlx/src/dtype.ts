// MLX dtypes, in the order of mlx::core::Dtype::Val (the shim passes the enum value).
import { MlxError } from "./mlx_error.ts";

export const DTYPES = [
  "bool",
  "uint8",
  "uint16",
  "uint32",
  "uint64",
  "int8",
  "int16",
  "int32",
  "int64",
  "float16",
  "float32",
  "float64",
  "bfloat16",
  "complex64",
] as const;

export type Dtype = (typeof DTYPES)[number];

const SIZES: Record<Dtype, number> = {
  bool: 1,
  uint8: 1,
  uint16: 2,
  uint32: 4,
  uint64: 8,
  int8: 1,
  int16: 2,
  int32: 4,
  int64: 8,
  float16: 2,
  float32: 4,
  float64: 8,
  bfloat16: 2,
  complex64: 8,
};

const CODES = new Map<Dtype, number>(DTYPES.map((d, i) => [d, i]));

export function dtypeCode(d: Dtype): number {
  const c = CODES.get(d);
  if (c === undefined) throw new MlxError("dtype", `unknown dtype ${String(d)}; expected one of ${DTYPES.join(", ")}`);
  return c;
}

export function dtypeFromCode(c: number): Dtype {
  const d = DTYPES[c];
  if (d === undefined) throw new MlxError("dtype", `unknown dtype code ${c}`);
  return d;
}

export function itemSize(d: Dtype): number {
  return SIZES[d];
}

export interface Finfo {
  dtype: Dtype;
  bits: number;
  min: number;
  max: number;
  eps: number;
  smallestNormal: number;
}

const FINFO: Partial<Record<Dtype, Omit<Finfo, "dtype">>> = {
  float16: { bits: 16, min: -65504, max: 65504, eps: 2 ** -10, smallestNormal: 2 ** -14 },
  bfloat16: { bits: 16, min: -3.3895313892515355e38, max: 3.3895313892515355e38, eps: 2 ** -7, smallestNormal: 2 ** -126 },
  float32: { bits: 32, min: -3.4028234663852886e38, max: 3.4028234663852886e38, eps: 2 ** -23, smallestNormal: 2 ** -126 },
  float64: { bits: 64, min: -Number.MAX_VALUE, max: Number.MAX_VALUE, eps: Number.EPSILON, smallestNormal: 2 ** -1022 },
};

/** mx.finfo(dtype) for the floating dtypes (values as Python reports them). */
export function finfo(d: Dtype): Finfo {
  const f = FINFO[d];
  if (!f) throw new MlxError("finfo", `finfo needs a floating dtype, got ${d}`);
  return { dtype: d, ...f };
}

export function isFloating(d: Dtype): boolean {
  return d === "float16" || d === "float32" || d === "float64" || d === "bfloat16";
}

export function isInteger(d: Dtype): boolean {
  return d.startsWith("int") || d.startsWith("uint");
}

/** The typed array that holds one element of each dtype's bit pattern (f16/bf16 as raw uint16). */
export type TypedArrayFor = Uint8Array | Int8Array | Uint16Array | Int16Array | Uint32Array | Int32Array |
  BigUint64Array | BigInt64Array | Float32Array | Float64Array;

export function typedView(d: Dtype, bytes: Uint8Array): TypedArrayFor {
  const { buffer, byteOffset, byteLength } = bytes;
  const n = byteLength / SIZES[d];
  switch (d) {
    case "bool":
    case "uint8":
      return new Uint8Array(buffer, byteOffset, n);
    case "int8":
      return new Int8Array(buffer, byteOffset, n);
    case "uint16":
    case "float16":
    case "bfloat16":
      return new Uint16Array(buffer, byteOffset, n);
    case "int16":
      return new Int16Array(buffer, byteOffset, n);
    case "uint32":
      return new Uint32Array(buffer, byteOffset, n);
    case "int32":
      return new Int32Array(buffer, byteOffset, n);
    case "uint64":
      return new BigUint64Array(buffer, byteOffset, n);
    case "int64":
      return new BigInt64Array(buffer, byteOffset, n);
    case "float32":
      return new Float32Array(buffer, byteOffset, n);
    case "float64":
      return new Float64Array(buffer, byteOffset, n);
    case "complex64":
      return new Float32Array(buffer, byteOffset, n * 2);
  }
}

/** bfloat16 bits → number (exact). */
export function bf16ToNumber(bits: number): number {
  const f = new Float32Array(new Uint32Array([bits << 16]).buffer);
  return f[0]!;
}

/** float16 bits → number (exact). */
export function f16ToNumber(bits: number): number {
  const s = bits & 0x8000 ? -1 : 1;
  const e = (bits >> 10) & 0x1f;
  const m = bits & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}
