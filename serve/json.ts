// JSON as mlx_lm.server reads and writes it: bodies are read with json.loads (a float literal
// such as "0.5" or "1e-3" stays apart from an integer "1", because mlx_lm.server's validation
// tells `float` from `int`) and written with json.dumps(obj) defaults: ", " and ": " separators,
// ensure_ascii (non-ASCII escaped as \uXXXX), floats as Python's repr, NaN/Infinity as bare words.
import { PyFloat, type PyJson, parsePyJson, pyFloatRepr, pyStringLiteral } from "../model/pyjson.ts";

export { PyFloat, type PyJson };

/** json.loads. Throws SyntaxError on malformed text. */
export function loads(text: string): PyJson {
  return parsePyJson(text);
}

/** A value for dumps: JS numbers that must print as Python floats are wrapped in PyFloat. */
export type Out = null | boolean | number | string | PyFloat | Out[] | { [k: string]: Out | undefined };

/** json.dumps(value): integers as integers, PyFloat (and non-integral numbers) as repr(float). */
export function dumps(value: Out | undefined): string {
  if (value === null || value === undefined) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (value instanceof PyFloat) return pyFloatRepr(value.value);
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : pyFloatRepr(value);
  if (typeof value === "string") return pyStringLiteral(value);
  if (Array.isArray(value)) return `[${value.map((v) => dumps(v)).join(", ")}]`;
  const parts = Object.entries(value)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${pyStringLiteral(k)}: ${dumps(v)}`);
  return `{${parts.join(", ")}}`;
}

/** A parsed tree with PyFloat unwrapped to plain numbers (what a chat template sees). */
export function plain(v: PyJson): unknown {
  if (v instanceof PyFloat) return v.value;
  if (Array.isArray(v)) return v.map(plain);
  if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  return v;
}
