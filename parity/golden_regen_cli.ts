// npm run golden:regen [-- --only <glob> ...] [-- --dry-run]: the command face of the golden
// regeneration (oracle/golden_regen.ts does the work). Exit status: 0 done, 1 on a failure, 2 on
// bad usage (a bad flag, a selection that matches no planned entry).
import { GoldenSelectionError, regenerateGoldens } from "../oracle/golden_regen.ts";
import { type FlagSpec, helpText, parseArgs, UsageError } from "./args.ts";

export const FLAGS: FlagSpec[] = [
  {
    name: "only",
    kind: "string",
    multiple: true,
    valueName: "glob",
    help: "regenerate only entries whose id <fixture>/<variant>/<scenario> matches ('*' spans '/': 'c1_dense/*', '*/fwd_L13', 'c5_moe/q4g32/gen_*'); repeatable. A checkpoint's logits-only scenarios share one file, which is regenerated as a whole; the other files are carried over from the current golden/ unchanged",
  },
  { name: "dry-run", kind: "bool", help: "print the plan and exit" },
  { name: "help", kind: "bool", help: "show this help" },
];

const FOOTER = `
Plan: oracle/golden_plan.json. Output: golden/manifest.json; full dumps as
golden/<fixture>/<variant>/<scenario>.npz + .json; logits-only scenarios of a checkpoint in
golden/<fixture>/<variant>/logits.npz + .json.
Exit status: 0 done, 1 on a failure, 2 on bad usage.`;

/** The flags (null for --help); a bad flag is a UsageError (exit 2). */
export function regenArgs(argv: readonly string[]): { only: string[]; dryRun: boolean } | null {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  const only = (a.only as string[] | undefined) ?? [];
  if (only.some((g) => g.trim() === "")) throw new UsageError("--only needs a glob, e.g. --only 'c1_dense/*' or --only '*/fwd_L13'");
  return { only, dryRun: a["dry-run"] === true };
}

async function main(argv: readonly string[]): Promise<number> {
  const args = regenArgs(argv);
  if (args === null) {
    process.stdout.write(helpText("npm run golden:regen -- [options]", "Regenerates golden/ from the live oracle (atomic; prints a diff against the previous manifest).", FLAGS, FOOTER));
    return 0;
  }
  return regenerateGoldens(args);
}

if (import.meta.main) {
  main(process.argv.slice(2)).then(
    (rc) => process.exit(rc),
    (e: unknown) => {
      const usage = e instanceof UsageError || e instanceof GoldenSelectionError;
      console.error(usage ? `error: ${(e as Error).message}` : `golden:regen failed: ${e instanceof Error ? e.message : String(e)}`);
      process.exit(usage ? 2 : 1);
    },
  );
}
