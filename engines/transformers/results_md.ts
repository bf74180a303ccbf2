// Prints the Markdown tables of engines/RESULTS.md for the two PyTorch engines from their
// checked-in grid results (engines/transformers/results.json, engines/gemma4_pt_claude/results.json).
//   bun engines/transformers/results_md.ts
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import type { GridResult } from "./grid.ts";

const e = (v: number | null | undefined) => (v === null || v === undefined ? "–" : v === 0 ? "0" : v.toExponential(1));

export function table(results: readonly GridResult[]): string {
  const head = "| checkpoint | computed in | schedule | level | verdict | first outside the floor | rel L2 L1 (residual) | rel L2 L2 (other taps) | rel L2 logits | KL max | top-1 |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  const rows = results.map((r) => {
    const sched = r.schedule ? `generate (${r.schedule.kind === "generate" ? `${r.schedule.prefill_step_size}/${r.schedule.max_tokens}` : ""}; tokens ${r.firstTokenDiff === null || r.firstTokenDiff === undefined ? "identical" : `differ at step ${r.firstTokenDiff}`})` : "forward";
    if (r.refused) return `| ${r.checkpoint} | ${r.dtype} | ${sched} | – | REFUSED | ${r.refused.split("\n")[0]} | – | – | – | – | – |`;
    const verdict = r.status === "CONFORMS" ? "CONFORMS" : `**${r.status}**`;
    return `| ${r.checkpoint} | ${r.dtype} | ${sched} | L${r.level} | ${verdict} | ${r.firstOutside ? `\`${r.firstOutside}\`` : "–"} | ${e(r.residualRelL2)} | ${e(r.l2RelL2)} | ${e(r.logitsRelL2)} | ${e(r.klMax)} | ${r.top1 === null ? "–" : (r.top1 * 100).toFixed(0) + " %"} |`;
  });
  return head + rows.join("\n") + "\n";
}

if (import.meta.main) {
  for (const folder of ["transformers", "gemma4_pt_claude"]) {
    const f = join(REPO_ROOT, "engines", folder, "results.json");
    if (!existsSync(f)) continue;
    const j = JSON.parse(readFileSync(f, "utf8")) as { engine: string; when: string; results: GridResult[] };
    process.stdout.write(`### ${j.engine} (grid of ${j.when.slice(0, 10)})\n\n${table(j.results)}\n`);
  }
}
