// Command-line parsing shared by `npm run parity` and `npm run generate`: every flag is
// declared once with its help text; unknown flags and bad values are errors.

import { ConfigError } from "../model/gemma4/config.ts";
import { WeightsError } from "../model/gemma4/weights.ts";
import { PromptCacheError } from "../model/cache/prompt_cache.ts";

export class UsageError extends Error {
  override readonly name = "UsageError";
}

/** Bad usage or bad input (a checkpoint or prompt-cache file the loaders refuse): the commands exit 2 for these. */
export function isInputError(e: unknown): boolean {
  return e instanceof UsageError || e instanceof ConfigError || e instanceof WeightsError || e instanceof PromptCacheError;
}

export interface FlagSpec {
  name: string;
  /** "bool" takes no value. */
  kind: "bool" | "string" | "int" | "number";
  help: string;
  valueName?: string;
  default?: string | number | boolean;
  /** "string" only: the flag may repeat; the value is the list of every occurrence. */
  multiple?: boolean;
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
    if (spec.kind === "string" && spec.multiple) out[name] = [...((out[name] as string[] | undefined) ?? []), value];
    else if (spec.kind === "string") out[name] = value;
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
    const left = `  --${s.name}${s.kind === "bool" ? "" : ` <${s.valueName ?? s.kind}>`}${s.multiple ? " ..." : ""}`;
    const def = s.default !== undefined && s.kind !== "bool" ? ` (default: ${s.default})` : "";
    return [left, s.help + def] as const;
  });
  const w = Math.max(...rows.map(([l]) => l.length)) + 2;
  return [`Usage: ${usage}`, "", summary, "", "Options:", ...rows.map(([l, r]) => l.padEnd(w) + r), footer].join("\n").trimEnd() + "\n";
}

/**
 * Runs a command's main(argv) and exits with its code; an error prints one line (a stack trace
 * with --verbose) and exits with `exitCode(err)` when that gives one (a command's own documented
 * codes), else 2 for bad usage or input (isInputError), 1 otherwise.
 */
export function runMain(main: (argv: string[]) => Promise<number>, message: (err: Error) => string = (err) => `error: ${err.message}\n`, exitCode: (err: Error) => number | undefined = () => undefined): void {
  const verbose = process.argv.includes("--verbose");
  const fail = (e: unknown): never => {
    if (verbose) console.error(e);
    else process.stderr.write(message(e as Error));
    process.exit(exitCode(e as Error) ?? (isInputError(e) ? 2 : 1));
  };
  // Keeps the event loop alive until main settles: bun exits (code 0, silently) when only a
  // promise that holds no handle is pending, as the WebAssembly instantiation of the JPEG
  // decoder (model/media/jpeg.ts) is.
  const alive = setInterval(() => {}, 1 << 30);
  main(process.argv.slice(2)).then((code) => process.exit(code), fail).finally(() => clearInterval(alive));
}
