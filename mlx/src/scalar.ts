// Weak scalars: how a JS number combines with an array, exactly as a Python scalar does.
//
// Python MLX turns `array OP scalar` into `OP(array, to_array(scalar, array.dtype))`:
// a Python float is rounded to float32 and then to the array's dtype when that is floating
// (else it stays float32), a Python int takes the array's dtype. JS has one number type, so:
// - an integer-valued number (a safe integer, |v| < 2^53) is a Python int, any other number a
//   Python float;
// - `pyFloat(v)` / `pyInt(v)` state the Python type explicitly (write `pyFloat(2)` where the
//   Python source has `2.0` against a possibly-integer array).
// The conversion itself happens in the shim (weak_scalar), next to the op, in one place.

export type ScalarKind = 0 | 1 | 2; // float, int, bool (shim ScalarKind)

export class PyScalar {
  constructor(
    readonly value: number,
    readonly kind: ScalarKind,
  ) {}
}

export const pyFloat = (v: number): PyScalar => new PyScalar(v, 0);
export const pyInt = (v: number): PyScalar => {
  if (!Number.isInteger(v)) throw new TypeError(`pyInt needs an integer, got ${v}`);
  return new PyScalar(v, 1);
};

export type Scalar = number | boolean | PyScalar;

export function isScalar(x: unknown): x is Scalar {
  return typeof x === "number" || typeof x === "boolean" || x instanceof PyScalar;
}

/** The (value, kind) pair the shim takes for a weak scalar. */
export function scalarParts(s: Scalar): [number, ScalarKind] {
  if (s instanceof PyScalar) return [s.value, s.kind];
  if (typeof s === "boolean") return [s ? 1 : 0, 2];
  // Integers beyond 2^53 (e.g. finfo(bfloat16).min) are floats in practice: only safe integers
  // count as Python ints.
  return [s, Number.isSafeInteger(s) && !Object.is(s, -0) ? 1 : 0];
}
