// Command-line parsing shared by `npm run parity` and `npm run generate`: every flag is
// declared once with its help text; unknown flags and bad values are errors.

export class UsageError extends Error {
  override readonly name = "UsageError";
}

export interface FlagSpec {
  name: string;
  /** "bool" takes no value. */
  kind: "bool" | "string" | "int" | "number";
  help: string;
  valueName?: string;
  default?: string | number | boolean;
  /** May be given more than once (kind "string"): the values are collected, in order, into an array. */
  repeat?: boolean;
}

export type Parsed = Record<string, string | number | boolean | string[] | undefined>;

export function parseArgs(argv: readonly string[], specs: readonly FlagSpec[]): Parsed {
  const byName = new Map(specs.map((s) => [s.name, s]));
  const out: Parsed = {};
  for (const s of specs) if (s.default !== undefined) out[s.name] = s.default;
  for (let i = 0; i < argv.length; i++) {
    const raw = argv[i]!;
    if (!raw.startsWith("--")) throw new UsageError(`unexpected argument '${raw}' (flags start with --; see --help)`);
    const eq = raw.indexOf("=");
    const name = raw.slice(2, eq >= 0 ? eq : undefined);
    const spec = byName.get(name);
    if (!spec) throw new UsageError(`unknown flag --${name} (see --help)`);
    if (spec.kind === "bool") {
      if (eq >= 0) throw new UsageError(`--${name} takes no value`);
      out[name] = true;
      continue;
    }
    let value: string | undefined = eq >= 0 ? raw.slice(eq + 1) : argv[++i];
    if (value === undefined || (eq < 0 && value.startsWith("--"))) throw new UsageError(`--${name} needs a value (${spec.valueName ?? spec.kind})`);
    if (spec.kind === "string") {
      const prev = out[name];
      out[name] = spec.repeat ? [...(Array.isArray(prev) ? prev : []), value] : value;
    }
    else {
      const n = Number(value);
      if (!Number.isFinite(n) || (spec.kind === "int" && !Number.isInteger(n))) throw new UsageError(`--${name} needs ${spec.kind === "int" ? "an integer" : "a number"}, got '${value}'`);
      out[name] = n;
    }
  }
  return out;
}

export function helpText(usage: string, summary: string, specs: readonly FlagSpec[], footer = ""): string {
  const rows = specs.map((s) => {
    const left = `  --${s.name}${s.kind === "bool" ? "" : ` <${s.valueName ?? s.kind}>`}${s.repeat ? " ..." : ""}`;
    const def = s.default !== undefined && s.kind !== "bool" ? ` (default: ${s.default})` : "";
    return [left, s.help + def] as const;
  });
  const w = Math.max(...rows.map(([l]) => l.length)) + 2;
  return [`Usage: ${usage}`, "", summary, "", "Options:", ...rows.map(([l, r]) => l.padEnd(w) + r), footer].join("\n").trimEnd() + "\n";
}
