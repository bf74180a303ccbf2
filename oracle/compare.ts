// Bitwise tensor comparison for the suites and the parity command (oracle/tensor_diff.ts), plus the helpers
// that read MlxArrays and npy records into raw tensors.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { NpyRecord } from "./npy.ts";
import { compareRaw, type RawTensor, type TensorDiff } from "./tensor_diff.ts";

export { compareRaw, firstDivergence, formatDiff, type RawTensor, type TensorDiff } from "./tensor_diff.ts";

export function rawOf(a: MlxArray): RawTensor {
  return { dtype: a.dtype, shape: a.shape, data: a.toBytes() };
}

export function rawOfNpy(r: NpyRecord): RawTensor {
  return { dtype: r.dtype, shape: r.shape, data: r.data };
}

export function compareArray(name: string, actual: MlxArray, expected: NpyRecord | RawTensor): TensorDiff {
  return compareRaw(name, rawOf(actual), expected);
}

/** A throwaway helper for tests: an MlxArray from a RawTensor. */
export function arrayOfRaw(t: RawTensor): MlxArray {
  return mx.fromBytes(t.data, t.shape, t.dtype as mx.Dtype);
}
