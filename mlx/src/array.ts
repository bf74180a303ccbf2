// MlxArray: an owned handle to an mlx::core::array.
import { checkPtr, checkStatus, MlxError } from "./errors.ts";
import { lib } from "./native.ts";
import { PyScalar, type Scalar, scalarParts } from "./scalar.ts";
import { bf16ToNumber, type Dtype, dtypeCode, dtypeFromCode, f16ToNumber, itemSize, type TypedArrayFor, typedView } from "./dtype.ts";

// Backstop only: arrays are disposed explicitly (`using` or dispose()); this frees what leaks.
// The registry holds a small cell per array instead of an unregister token: dispose() zeroes the
// cell (no unregister call, which costs as much again as register), and the finalizer of a
// disposed array finds 0 and does nothing. A handle is therefore freed exactly once.
interface Cell {
  h: number;
}
const registry = new FinalizationRegistry<Cell>((cell) => {
  const h = cell.h;
  if (h !== 0) {
    cell.h = 0;
    lib.mlxb_free(h);
  }
});

export class MlxArray implements Disposable {
  #h: number;
  #cell: Cell;
  #shape: number[] | undefined;

  /** Takes ownership of a native handle. Internal: use the creation functions. */
  constructor(handle: number) {
    this.#h = handle;
    this.#cell = { h: handle };
    registry.register(this, this.#cell);
  }

  /** The native handle; throws if the array was disposed. */
  get handle(): number {
    if (this.#h === 0) throw new MlxError("array", "array used after dispose()");
    return this.#h;
  }

  get disposed(): boolean {
    return this.#h === 0;
  }

  get ndim(): number {
    return checkStatus(lib.mlxb_ndim(this.handle), "ndim");
  }

  get shape(): number[] {
    if (this.#shape === undefined) {
      const h = this.handle;
      const n = checkStatus(lib.mlxb_ndim(h), "shape");
      const s = new Array<number>(n);
      for (let i = 0; i < n; i++) s[i] = lib.mlxb_dim(h, i);
      this.#shape = s;
    }
    return this.#shape.slice();
  }

  get dtype(): Dtype {
    return dtypeFromCode(checkStatus(lib.mlxb_dtype(this.handle), "dtype"));
  }

  get size(): number {
    return checkStatus(lib.mlxb_size(this.handle), "size");
  }

  get nbytes(): number {
    return checkStatus(lib.mlxb_nbytes(this.handle), "nbytes");
  }

  /** Evaluates and copies the elements out, packed row-major, as raw bytes (bf16/f16 as bits). */
  toBytes(): Uint8Array {
    const n = this.nbytes;
    const out = new Uint8Array(n);
    checkStatus(lib.mlxb_copy_out(this.handle, out, n), "toBytes");
    return out;
  }

  /** The elements in the dtype's typed array (float16/bfloat16 as raw uint16 bits). */
  toTypedArray(): TypedArrayFor {
    return typedView(this.dtype, this.toBytes());
  }

  /** The elements as JS numbers (exact for every dtype up to 2^53; bf16/f16 decoded). */
  toNumbers(): number[] {
    const d = this.dtype;
    const t = this.toTypedArray();
    if (d === "bfloat16") return Array.from(t as Uint16Array, bf16ToNumber);
    if (d === "float16") return Array.from(t as Uint16Array, f16ToNumber);
    if (d === "complex64") throw new MlxError("toNumbers", "complex64 has no number form");
    return Array.from(t as ArrayLike<number | bigint>, Number);
  }

  /** The single element of a size-1 array. */
  item(): number | boolean {
    if (this.size !== 1) throw new MlxError("item", `item() needs a size-1 array, got shape [${this.shape}]`);
    const v = this.toNumbers()[0]!;
    return this.dtype === "bool" ? v !== 0 : v;
  }

  dispose(): void {
    const h = this.#h;
    if (h === 0) return;
    this.#h = 0;
    this.#cell.h = 0;
    lib.mlxb_free(h);
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  toString(): string {
    return this.#h === 0 ? "MlxArray(<disposed>)" : `MlxArray(shape=[${this.shape}], dtype=${this.dtype})`;
  }
}

/** Wraps a handle returned by a native call, throwing the native error if it is NULL. */
export function own(p: number | null, op: string): MlxArray {
  return new MlxArray(checkPtr(p, op));
}

/** A packed list of handles for native calls that take several arrays. */
export function handles(arrays: readonly MlxArray[]): Float64Array {
  const out = new Float64Array(arrays.length);
  for (let i = 0; i < arrays.length; i++) {
    const a = arrays[i];
    if (!(a instanceof MlxArray)) throw new MlxError("array", `expected an MlxArray at position ${i}`);
    out[i] = a.handle;
  }
  return out;
}

/** Reads a native vector of arrays into owned MlxArrays and frees the vector. */
export function ownVec(p: number | null, op: string): MlxArray[] {
  const v = checkPtr(p, op);
  try {
    const n = checkStatus(lib.mlxb_vec_size(v), op);
    const out: MlxArray[] = [];
    for (let i = 0; i < n; i++) out.push(own(lib.mlxb_vec_get(v, i), op));
    return out;
  } finally {
    lib.mlxb_vec_free(v);
  }
}

export function shapeArg(shape: readonly number[], op: string): Int32Array {
  const s = new Int32Array(shape.length);
  for (let i = 0; i < shape.length; i++) {
    const d = shape[i]!;
    if (!Number.isInteger(d)) throw new MlxError(op, `shape entries must be integers, got ${String(d)}`);
    // Int32Array would wrap an out-of-range entry silently (2**32 + 2 becomes 2).
    if (d > 2147483647 || d < -2147483648) throw new MlxError(op, `shape entries must fit in int32, got ${d}`);
    s[i] = d;
  }
  return s;
}

/** Creates an array from raw bytes (any dtype; bf16/f16 given as their bit patterns). */
export function fromBytes(bytes: Uint8Array | ArrayBufferView, shape: readonly number[], dtype: Dtype): MlxArray {
  const u8 = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const s = shapeArg(shape, "array");
  const want = shape.reduce((a, b) => a * b, 1) * itemSize(dtype);
  if (u8.byteLength !== want) {
    throw new MlxError("array", `got ${u8.byteLength} bytes for shape [${shape}] of ${dtype} (needs ${want})`);
  }
  // An empty buffer still needs a valid pointer argument.
  const data = u8.byteLength === 0 ? new Uint8Array(1) : u8;
  return own(lib.mlxb_from_bytes(data, u8.byteLength, s, s.length, dtypeCode(dtype)), "array");
}

type NumericTyped = Float32Array | Float64Array | Int8Array | Int16Array | Int32Array | Uint8Array | Uint16Array |
  Uint32Array | BigInt64Array | BigUint64Array;

function defaultDtypeOf(t: NumericTyped): Dtype {
  if (t instanceof Float32Array) return "float32";
  if (t instanceof Float64Array) return "float64";
  if (t instanceof Int8Array) return "int8";
  if (t instanceof Int16Array) return "int16";
  if (t instanceof Int32Array) return "int32";
  if (t instanceof Uint8Array) return "uint8";
  if (t instanceof Uint16Array) return "uint16";
  if (t instanceof Uint32Array) return "uint32";
  if (t instanceof BigInt64Array) return "int64";
  return "uint64";
}

/**
 * Creates an array like mx.array: from a typed array (its dtype by default; a Uint16Array may be
 * declared "float16"/"bfloat16" to pass bit patterns), or from JS numbers (converted by MLX's
 * own float32 → dtype conversion, like mx.array(list, dtype)).
 */
export function array(data: NumericTyped | readonly number[] | Scalar, shape?: readonly number[], dtype?: Dtype): MlxArray {
  if (typeof data === "number" || typeof data === "boolean" || data instanceof PyScalar) {
    return scalar(data, dtype);
  }
  if (Array.isArray(data)) {
    const dt = dtype ?? (data.every((v) => Number.isSafeInteger(v)) ? "int32" : "float32");
    const sh = shape ?? [data.length];
    if (dt === "float16" || dt === "bfloat16") {
      using f = fromBytes(new Float32Array(data), sh, "float32");
      return own(lib.mlxb_astype(f.handle, dtypeCode(dt)), "array");
    }
    return fromBytes(toTyped(data, dt), sh, dt);
  }
  const t = data as NumericTyped;
  const dt = dtype ?? defaultDtypeOf(t);
  return fromBytes(t, shape ?? [t.length], dt);
}

function toTyped(data: readonly number[], dt: Dtype): NumericTyped {
  switch (dt) {
    case "bool":
    case "uint8":
      return Uint8Array.from(data, (v) => (dt === "bool" ? (v ? 1 : 0) : v));
    case "int8":
      return Int8Array.from(data);
    case "uint16":
      return Uint16Array.from(data);
    case "int16":
      return Int16Array.from(data);
    case "uint32":
      return Uint32Array.from(data);
    case "int32":
      return Int32Array.from(data);
    case "uint64":
      return BigUint64Array.from(data, (v) => BigInt(v));
    case "int64":
      return BigInt64Array.from(data, (v) => BigInt(v));
    case "float32":
      return Float32Array.from(data);
    case "float64":
      return Float64Array.from(data);
    default:
      throw new MlxError("array", `cannot build ${dt} from a number list`);
  }
}

/**
 * A 0-d array, as mx.array(v, dtype): a JS integer is a Python int, other numbers Python floats
 * (pyFloat/pyInt state the Python type explicitly).
 */
export function scalar(v: Scalar, dtype?: Dtype): MlxArray {
  const [x, kind] = scalarParts(v);
  const dt = dtype ?? (kind === 2 ? "bool" : kind === 1 ? "int32" : "float32");
  return own(lib.mlxb_scalar(x, kind, dtypeCode(dt)), "array");
}
