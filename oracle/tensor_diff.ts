// Bitwise tensor comparison: a tensor is equal only if dtype, shape and every byte agree. On a
// difference it reports the mismatch count, the first differing index, the largest absolute
// difference and the largest ULP distance. Pure (no native code): used by the parity suites,
// the parity command and the golden diff alike.
import { DTYPES, type Dtype, f16ToNumber, itemSize } from "../mlx/src/dtype.ts";

/** A tensor as raw little-endian C-order bytes (an NpyRecord, or read from an MlxArray). */
export interface RawTensor {
  dtype: string;
  shape: number[];
  data: Uint8Array;
}

export interface TensorDiff {
  name: string;
  equal: boolean;
  /** Set when dtype or shape differ (then the element statistics are not computed). */
  note?: string;
  dtype: string;
  shape: number[];
  mismatches: number;
  total: number;
  firstIndex: number;
  /** Multi-dimensional index of the first mismatch. */
  firstIndexNd?: number[];
  actualAtFirst?: number;
  expectedAtFirst?: number;
  maxAbs: number;
  maxUlp: number;
}



function ordered(bits: number, width: 16 | 32): number {
  const sign = width === 16 ? 0x8000 : 0x80000000;
  return bits & sign ? -(bits & (sign - 1)) : bits;
}



/** Element readers of a raw tensor: its value as a number, and (float dtypes) its ordered bit pattern. */
export function reader(t: RawTensor): { num: (i: number) => number; ulp?: (i: number) => number } {
  const dv = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  switch (t.dtype) {
    case "float32":
      return { num: (i) => dv.getFloat32(i * 4, true), ulp: (i) => ordered(dv.getUint32(i * 4, true), 32) };
    case "float16":
      return { num: (i) => f16ToNumber(dv.getUint16(i * 2, true)), ulp: (i) => ordered(dv.getUint16(i * 2, true), 16) };
    case "bfloat16": {
      const tmp = new DataView(new ArrayBuffer(4));
      return {
        num: (i) => {
          tmp.setUint32(0, dv.getUint16(i * 2, true) << 16);
          return tmp.getFloat32(0);
        },
        ulp: (i) => ordered(dv.getUint16(i * 2, true), 16),
      };
    }
    case "float64":
      return { num: (i) => dv.getFloat64(i * 8, true) };
    case "bool":
    case "uint8":
      return { num: (i) => dv.getUint8(i) };
    case "int8":
      return { num: (i) => dv.getInt8(i) };
    case "uint16":
      return { num: (i) => dv.getUint16(i * 2, true) };
    case "int16":
      return { num: (i) => dv.getInt16(i * 2, true) };
    case "uint32":
      return { num: (i) => dv.getUint32(i * 4, true) };
    case "int32":
      return { num: (i) => dv.getInt32(i * 4, true) };
    default:
      return { num: (i) => Number(dv.getBigInt64(i * 8, true)) };
  }
}

function ndIndex(i: number, shape: number[]): number[] {
  const out: number[] = [];
  for (let d = shape.length - 1; d >= 0; d--) {
    out.unshift(i % shape[d]!);
    i = Math.floor(i / shape[d]!);
  }
  return out;
}

/** Compares `actual` against `expected` byte for byte, with statistics on a difference. */
export function compareRaw(name: string, actual: RawTensor, expected: RawTensor): TensorDiff {
  const base = { name, dtype: actual.dtype, shape: actual.shape, mismatches: 0, total: 0, firstIndex: -1, maxAbs: 0, maxUlp: 0 };
  if (actual.dtype !== expected.dtype || actual.shape.join() !== expected.shape.join()) {
    return { ...base, equal: false, mismatches: Number.NaN, note: `dtype/shape ${actual.dtype}[${actual.shape}] vs expected ${expected.dtype}[${expected.shape}]` };
  }
  const a = actual.data;
  const b = expected.data;
  const item = DTYPES.includes(actual.dtype as Dtype) ? itemSize(actual.dtype as Dtype) : 1;
  const total = Math.floor(a.byteLength / item);
  if (a.byteLength === b.byteLength && Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0) {
    return { ...base, equal: true, total };
  }
  const ra = reader(actual);
  const rb = reader(expected);
  let mismatches = 0;
  let firstIndex = -1;
  let maxAbs = 0;
  let maxUlp = 0;
  for (let i = 0; i < total; i++) {
    let same = true;
    for (let k = 0; k < item; k++) if (a[i * item + k] !== b[i * item + k]) same = false;
    if (same) continue;
    mismatches++;
    if (firstIndex < 0) firstIndex = i;
    const x = ra.num(i);
    const y = rb.num(i);
    const d = Math.abs(x - y);
    maxAbs = Number.isNaN(d) ? Number.NaN : Math.max(maxAbs, d);
    if (ra.ulp && rb.ulp) maxUlp = Math.max(maxUlp, Math.abs(ra.ulp(i) - rb.ulp(i)));
  }
  return {
    ...base,
    equal: false,
    total,
    mismatches,
    firstIndex,
    firstIndexNd: ndIndex(firstIndex, actual.shape),
    actualAtFirst: ra.num(firstIndex),
    expectedAtFirst: rb.num(firstIndex),
    maxAbs,
    maxUlp,
  };
}


export function formatDiff(d: TensorDiff): string {
  if (d.equal) return `${d.name}: equal (${d.dtype}[${d.shape}])`;
  if (d.note) return `${d.name}: ${d.note}`;
  const ulp = d.dtype.startsWith("float") || d.dtype === "bfloat16" ? `, max ULP ${d.maxUlp}` : "";
  return (
    `${d.name} (${d.dtype}[${d.shape}]): ${d.mismatches}/${d.total} elements differ, first at flat ${d.firstIndex} ` +
    `[${d.firstIndexNd}] (actual ${d.actualAtFirst}, expected ${d.expectedAtFirst}), max |d| ${d.maxAbs}${ulp}`
  );
}

/** First non-equal entry of an ordered list of comparisons, or null. */
export function firstDivergence(diffs: Iterable<TensorDiff>): TensorDiff | null {
  for (const d of diffs) if (!d.equal) return d;
  return null;
}

