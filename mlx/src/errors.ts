// The one place native failures become JS errors.
import { cstring } from "./native.ts";
import { lib } from "./native.ts";

import { MlxError } from "./mlx_error.ts";

export { MlxError };

function lastError(op: string): MlxError {
  const msg = cstring(lib.mlxb_last_error()) || "unknown native error";
  lib.mlxb_clear_error();
  // The shim prefixes messages with its own entry name ("where: what"); keep the TS op name.
  const sep = msg.indexOf(": ");
  return new MlxError(op, sep >= 0 ? msg.slice(sep + 2) : msg);
}

/** Checks a handle-returning native call. */
export function checkPtr(p: number | null, op: string): number {
  if (p === null || p === 0) throw lastError(op);
  return p;
}

/** Checks a status-returning native call (negative means failure). */
export function checkStatus(rc: number, op: string): number {
  if (rc < 0) throw lastError(op);
  return rc;
}
