// .npy <-> plain records, raw bytes only (no numeric conversion, no dependency on the mlx binding).
// bfloat16 has no numpy dtype: it travels as '<u2' data with the tag "bfloat16" kept next to it.

// The dtype list is the binding's (a pure module: importing it loads no native code).
import { DTYPES, type Dtype } from "../mlx/src/dtype.ts";

export const DTYPE_NAMES = DTYPES;
export type DtypeName = Dtype;

/** One tensor as raw little-endian C-order bytes. */
export interface NpyRecord {
  dtype: DtypeName;
  shape: number[];
  data: Uint8Array;
}

const DESCR: Record<DtypeName, string> = {
  bool: "|b1",
  uint8: "|u1",
  uint16: "<u2",
  uint32: "<u4",
  uint64: "<u8",
  int8: "|i1",
  int16: "<i2",
  int32: "<i4",
  int64: "<i8",
  float16: "<f2",
  float32: "<f4",
  float64: "<f8",
  bfloat16: "<u2",
  complex64: "<c8",
};

const ITEMSIZE: Record<DtypeName, number> = {
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

const FROM_DESCR = new Map<string, DtypeName>(
  (Object.entries(DESCR) as [DtypeName, string][]).filter(([name]) => name !== "bfloat16").map(([n, d]) => [d, n]),
);

export function isDtypeName(s: string): s is DtypeName {
  return (DTYPE_NAMES as readonly string[]).includes(s);
}

export function itemSize(dtype: DtypeName): number {
  return ITEMSIZE[dtype];
}

export function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

export class NpyError extends Error {
  override name = "NpyError";
}

/** Parse .npy bytes. `tag` (e.g. "bfloat16") reinterprets the stored dtype; it must be bit-compatible. */
export function parseNpy(buf: Uint8Array, tag?: string): NpyRecord {
  if (buf.length < 10 || buf[0] !== 0x93 || String.fromCharCode(...buf.subarray(1, 6)) !== "NUMPY") {
    throw new NpyError("not a .npy file (bad magic)");
  }
  const major = buf[6];
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let headerLen: number;
  let start: number;
  if (major === 1) {
    headerLen = dv.getUint16(8, true);
    start = 10;
  } else if (major === 2 || major === 3) {
    headerLen = dv.getUint32(8, true);
    start = 12;
  } else {
    throw new NpyError(`unsupported .npy version ${major}`);
  }
  const header = new TextDecoder("latin1").decode(buf.subarray(start, start + headerLen));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*(True|False)/.exec(header)?.[1];
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1];
  if (descr === undefined || fortran === undefined || shapeText === undefined) {
    throw new NpyError(`malformed .npy header: ${header.trim()}`);
  }
  if (fortran === "True") throw new NpyError("fortran-order .npy is not supported");
  const shape = shapeText
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s.length > 0)
    .map((s) => Number.parseInt(s, 10));
  if (!shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw new NpyError(`malformed .npy shape (${shapeText})`);
  let dtype = FROM_DESCR.get(descr);
  if (dtype === undefined) throw new NpyError(`unsupported .npy dtype ${descr}`);
  if (tag !== undefined && tag !== dtype) {
    if (!isDtypeName(tag)) throw new NpyError(`unknown dtype tag ${tag}`);
    if (DESCR[tag] !== descr) throw new NpyError(`dtype tag ${tag} does not match stored ${descr}`);
    dtype = tag;
  }
  const offset = start + headerLen;
  const nbytes = numel(shape) * ITEMSIZE[dtype];
  if (buf.length - offset < nbytes) {
    throw new NpyError(`truncated .npy: need ${nbytes} data bytes, have ${buf.length - offset}`);
  }
  return { dtype, shape, data: buf.slice(offset, offset + nbytes) };
}

/** Serialize a record to .npy (v1.0; bfloat16 written as '<u2'). */
export function toNpy(rec: NpyRecord): Uint8Array {
  const want = numel(rec.shape) * ITEMSIZE[rec.dtype];
  if (rec.data.byteLength !== want) {
    throw new NpyError(`data has ${rec.data.byteLength} bytes, ${rec.dtype}${JSON.stringify(rec.shape)} needs ${want}`);
  }
  const shape = rec.shape.length === 1 ? `(${rec.shape[0]},)` : `(${rec.shape.join(", ")})`;
  let header = `{'descr': '${DESCR[rec.dtype]}', 'fortran_order': False, 'shape': ${shape}, }`;
  const unpadded = 10 + header.length + 1;
  header += " ".repeat((64 - (unpadded % 64)) % 64) + "\n";
  const out = new Uint8Array(10 + header.length + want);
  out.set([0x93, ...new TextEncoder().encode("NUMPY"), 1, 0], 0);
  new DataView(out.buffer).setUint16(8, header.length, true);
  out.set(new TextEncoder().encode(header), 10);
  out.set(rec.data, 10 + header.length);
  return out;
}
