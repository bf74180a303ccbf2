// Evaluation.
import { handles, type MlxArray } from "./array.ts";
import { checkStatus } from "./errors.ts";
import { lib } from "./native.ts";

/** mx.eval(*arrays). */
export function evaluate(...arrays: (MlxArray | readonly MlxArray[])[]): void {
  const hs = handles(arrays.flat());
  checkStatus(lib.mlxb_eval(hs, hs.length), "eval");
}

/** mx.async_eval(*arrays). */
export function asyncEval(...arrays: (MlxArray | readonly MlxArray[])[]): void {
  const hs = handles(arrays.flat());
  checkStatus(lib.mlxb_async_eval(hs, hs.length), "async_eval");
}

export { evaluate as eval };
