// What one fuzz target is: an input format the project accepts from outside, a generator of
// (mostly malformed) inputs for it, and how to feed one input to the code that reads it.
// The table of every target is targets.ts; a new command or input format is one entry there.
import type fc from "fast-check";

/** Prefix of the worker's protocol lines on stdout (anything else printed there is ignored). */
export const MARK = "\x01FUZZ ";

// Inputs cross to the worker as JSON, which has no NaN or infinities: they travel tagged.
const TAG = "$fuzz_number";
export const encodeInput = (v: unknown): string =>
  JSON.stringify(v, (_k, x: unknown) => (typeof x === "number" && !Number.isFinite(x) ? { [TAG]: String(x) } : x));
export const decodeInput = (s: string): unknown =>
  JSON.parse(s, (_k, x: unknown) => (x !== null && typeof x === "object" && TAG in x ? Number((x as Record<string, string>)[TAG]) : x));

/** Per-input context in the worker process: a fresh scratch directory and the fixture paths. */
export interface FuzzContext {
  /** Empty directory for this input (removed afterwards). */
  scratch: string;
  /** Repository root. */
  root: string;
}

/**
 * Why an error is not a clear one (null when it is). A clear error is one of the project's own
 * error classes (MlxError, ConfigError, WeightsError, UsageError, OracleError) with a message
 * that names what the user must fix (a file, a key, a flag).
 */
export type Judge<I> = (error: unknown, input: I, ctx: FuzzContext) => string | null;

export interface FuzzTarget<I = unknown> {
  /** "<family>/<what>", e.g. "safetensors/binding". */
  name: string;
  /** Inputs in the bounded sample of `npm test`; the soak scales these. */
  sample: number;
  /** JSON-serialisable inputs (they travel to the worker process as JSON lines). */
  arbitrary: () => fc.Arbitrary<I>;
  /** Feeds one input to the code under test; throws on refusal. Everything it creates it frees. */
  run: (input: I, ctx: FuzzContext) => unknown;
  judge: Judge<I>;
  /** Per-input limit before the input counts as a hang (default 20 s). */
  timeoutMs?: number;
}

export function target<I>(t: FuzzTarget<I>): FuzzTarget<unknown> {
  return t as unknown as FuzzTarget<unknown>;
}

/** A judge: the error must be an instance of one of `classes`, and its message must contain every `mentions` string. */
export function expectError<I>(classes: readonly (abstract new (...a: never[]) => Error)[], mentions: (input: I, ctx: FuzzContext) => string[] = () => []): Judge<I> {
  return (e, input, ctx) => {
    if (!classes.some((c) => e instanceof c)) {
      const what = e instanceof Error ? `${e.constructor.name}: ${e.message}` : `non-error ${JSON.stringify(e)}`;
      return `not a clear error (expected ${classes.map((c) => c.name).join(" or ")}): ${what.slice(0, 400)}`;
    }
    const msg = (e as Error).message;
    if (msg.trim().length < 4) return `empty error message: ${JSON.stringify(msg)}`;
    for (const m of mentions(input, ctx)) if (!msg.includes(m)) return `error does not name ${JSON.stringify(m)}: ${msg.slice(0, 400)}`;
    return null;
  };
}
