// JSON as Python's json module reads and writes it, for the config files mlx-lm writes with
// json.dump(..., indent=4): adapter_config.json, a fused model's config.json. JS has one number
// type, so a JSON float ("30.0", "1e-06") is kept as a PyFloat on parsing and written back with
// Python's repr (shortest round-trip digits, exponent form below 1e-4 and from 1e16 on); an
// integer stays a number. Strings are escaped as ensure_ascii=True does.

/** A Python float value inside a parsed JSON tree. */
export class PyFloat {
  constructor(readonly value: number) {}
}

export type PyJson = null | boolean | number | string | PyFloat | PyJson[] | { [k: string]: PyJson };

/** json.loads, keeping floats apart from ints. */
export function parsePyJson(text: string): PyJson {
  let i = 0;
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i]!)) i++;
  };
  const fail = (what: string): never => {
    throw new SyntaxError(`${what} at position ${i}`);
  };
  const value = (): PyJson => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const o: { [k: string]: PyJson } = {};
      ws();
      if (text[i] === "}") {
        i++;
        return o;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("expected a string key");
        const k = str();
        ws();
        if (text[i++] !== ":") fail("expected ':'");
        o[k] = value();
        ws();
        const d = text[i++];
        if (d === "}") return o;
        if (d !== ",") fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      i++;
      const a: PyJson[] = [];
      ws();
      if (text[i] === "]") {
        i++;
        return a;
      }
      for (;;) {
        a.push(value());
        ws();
        const d = text[i++];
        if (d === "]") return a;
        if (d !== ",") fail("expected ',' or ']'");
      }
    }
    if (c === '"') return str();
    for (const [lit, v] of [["true", true], ["false", false], ["null", null], ["NaN", new PyFloat(Number.NaN)], ["Infinity", new PyFloat(Infinity)], ["-Infinity", new PyFloat(-Infinity)]] as const) {
      if (text.startsWith(lit, i)) {
        i += lit.length;
        return v;
      }
    }
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    if (!m) return fail("unexpected character");
    i += m[0].length;
    const n = Number(m[0]);
    return m[2] !== undefined || m[3] !== undefined ? new PyFloat(n) : n;
  };
  const str = (): string => {
    const start = i;
    i++;
    while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    if (i >= text.length) fail("unterminated string");
    i++;
    return JSON.parse(text.slice(start, i)) as string;
  };
  const v = value();
  ws();
  if (i !== text.length) fail("extra data");
  return v;
}

/** Python's repr(float). */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const [mant, e] = x.toExponential().split("e") as [string, string];
  const exp = Number(e);
  const neg = mant.startsWith("-");
  const digits = mant.replace("-", "").replace(".", "");
  let out: string;
  if (exp < -4 || exp >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    out = `${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  } else if (exp < 0) {
    out = `0.${"0".repeat(-exp - 1)}${digits}`;
  } else if (digits.length <= exp + 1) {
    out = `${digits}${"0".repeat(exp + 1 - digits.length)}.0`;
  } else {
    out = `${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`;
  }
  return neg ? `-${out}` : out;
}

/**
 * json.dumps(s) of one str: the short escapes, other control characters as \\uXXXX, and with
 * ensureAscii (Python's default) every code unit above 0x7e as well (UTF-16 code units, as Python
 * writes an astral character: a surrogate pair of escapes).
 */
export function pyStringLiteral(s: string, ensureAscii = true): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const ch = s[i]!;
    const c = s.charCodeAt(i);
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch === "\b") out += "\\b";
    else if (ch === "\f") out += "\\f";
    else if (c < 0x20 || (ensureAscii && c > 0x7e)) out += `\\u${c.toString(16).padStart(4, "0")}`;
    else out += ch;
  }
  return `${out}"`;
}

/** json.dumps(value, indent=indent) (key order as given; sort before calling for sort_keys). */
export function dumpPyJson(value: PyJson | undefined, indent = 4, level = 0): string {
  const pad = (n: number) => " ".repeat(indent * n);
  if (value === null || value === undefined) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (value instanceof PyFloat) return pyFloatRepr(value.value);
  if (typeof value === "number") {
    if (!Number.isInteger(value)) return pyFloatRepr(value);
    return String(value);
  }
  if (typeof value === "string") return pyStringLiteral(value);
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return `[\n${value.map((v) => pad(level + 1) + dumpPyJson(v, indent, level + 1)).join(",\n")}\n${pad(level)}]`;
  }
  const entries = Object.entries(value).filter(([, v]) => v !== undefined);
  if (entries.length === 0) return "{}";
  return `{\n${entries.map(([k, v]) => `${pad(level + 1)}${pyStringLiteral(k)}: ${dumpPyJson(v, indent, level + 1)}`).join(",\n")}\n${pad(level)}}`;
}

/** mlx_lm.utils.save_config's layout: keys sorted (top level only, as dict(sorted(...))), indent 4. */
export function sortedTop(obj: { [k: string]: PyJson }): { [k: string]: PyJson } {
  return Object.fromEntries(Object.entries(obj).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}
