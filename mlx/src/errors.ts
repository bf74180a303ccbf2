// The one place native failures become JS errors.
import { cstring } from "./native.ts";
import { lib } from "./native.ts";

/** An error raised by MLX (or by the binding's own argument checks), naming the op. */
export class MlxError extends Error {
  override readonly name = "MlxError";
  constructor(
    readonly op: string,
    readonly detail: string,
  ) {
    super(`[${op}] ${detail}`);
  }
}

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
