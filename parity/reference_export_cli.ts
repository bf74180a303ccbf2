// npm run reference:export [-- --only <fixture>]: the command face of the transformers reference
// export (oracle/reference_export.ts does the work). Exit status: 0 done, 1 on a failure, 2 on bad
// usage (a bad flag, an --only that names no float32 fixture checkpoint).
import { exportReference, float32Checkpoints } from "../oracle/reference_export.ts";
import { type FlagSpec, helpText, parseArgs, runMain, UsageError } from "./args.ts";

export const FLAGS: FlagSpec[] = [
  { name: "only", kind: "string", valueName: "fixture", help: "export only this fixture (e.g. c1_dense); the others keep their files" },
  { name: "help", kind: "bool", help: "show this help" },
];

/** The flags and the checkpoints to export (null for --help), before any install or run. */
export function referencePlan(argv: readonly string[]): string[] | null {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  let ids = float32Checkpoints();
  if (typeof a.only === "string") {
    ids = ids.filter((id) => id.split("/")[0] === a.only);
    if (ids.length === 0) throw new UsageError(`--only ${a.only}: no float32 fixture checkpoint of that name`);
  }
  return ids;
}

async function main(argv: string[]): Promise<number> {
  const ids = referencePlan(argv);
  if (ids === null) {
    process.stdout.write(helpText("npm run reference:export -- [options]", "Exports transformers' float32 logits and hidden states for the float32 fixture checkpoints into fixtures/reference/.", FLAGS));
    return 0;
  }
  await exportReference(ids);
  return 0;
}

if (import.meta.main) runMain(main);
