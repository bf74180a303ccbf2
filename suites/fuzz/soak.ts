// The fuzz soak: `FUZZ_SOAK=10000 bun suites/fuzz/soak.ts` runs about that many inputs over every
// target (in proportion to their bounded samples), prints the findings and one summary line
//   fuzz: N inputs, N clear errors, 0 aborts, 0 hangs
// and exits 1 on any abort, hang, leak or unclear error. FUZZ_ONLY=<substring> picks targets;
// FUZZ_FINDINGS=<file> writes every finding with its whole input.
import { writeFileSync } from "node:fs";
import { REPO_ROOT } from "../../oracle/client.ts";
import { runFuzz, summaryLine } from "./runner.ts";
import { TARGETS } from "./targets.ts";

const want = Number(process.env.FUZZ_SOAK ?? 10_000);
const only = process.env.FUZZ_ONLY;
const targets = TARGETS.filter((t) => !only || t.name.includes(only));
const base = targets.reduce((s, t) => s + t.sample, 0);
let last = 0;
const tally = await runFuzz({
  root: REPO_ROOT,
  targets,
  scale: want / base,
  onInput: (done, total) => {
    if (process.stderr.isTTY || done - last >= 500 || done === total) {
      last = done;
      process.stderr.write(`\r[fuzz] ${done}/${total}`);
    }
  },
});
process.stderr.write("\n");
for (const [name, per] of Object.entries(tally.perTarget)) console.log(`  ${name.padEnd(28)} ${JSON.stringify(per)}`);
for (const f of tally.findings.slice(0, 30)) console.log(`${f.verdict.toUpperCase()} ${f.target} #${f.index} (seed ${f.seed}): ${f.detail}\n  input: ${JSON.stringify(f.input).slice(0, 600)}`);
// FUZZ_FINDINGS=file.json: every finding with its whole input.
if (process.env.FUZZ_FINDINGS) writeFileSync(process.env.FUZZ_FINDINGS, `${JSON.stringify(tally.findings, null, 1)}\n`);
console.log(summaryLine(tally));
process.exit(tally.findings.length ? 1 : 0);
