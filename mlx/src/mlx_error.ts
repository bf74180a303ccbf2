// MlxError: no native dependency, so plain modules (dtype.ts) can throw it too.

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
