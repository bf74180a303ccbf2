// parity.md: the report as Markdown.
import { fmtDivergence, fmtNum, pct, REFERENCE_HEADER, referenceRow, SUMMARY_HEADER, summaryRow } from "./format.ts";
import type { ParityReport } from "./schema.ts";

const esc = (s: string) => s.replaceAll("|", "\\|");

export function renderMarkdown(rep: ParityReport): string {
  const out: string[] = [];
  out.push("# Gemma 4 parity report: TypeScript vs mlx-lm", "");
  out.push(`Generated ${rep.createdAt}. Verdict: **${rep.verdict.text}** (budget: ${rep.budget.ulp} ULP, atol ${rep.budget.atol}).`, "");
  out.push("| " + Object.keys(rep.versions).join(" | ") + " |", "|" + Object.keys(rep.versions).map(() => "---").join("|") + "|");
  out.push("| " + Object.values(rep.versions).map(esc).join(" | ") + " |", "");
  if (rep.opLevel) {
    const o = rep.opLevel;
    out.push("## Op-level parity (binding vs Python MLX)", "");
    out.push(`Backend ${o.backend}, device ${o.device}.`, "");
    out.push(`| table | ops | ops parity-tested | cases | bit-exact cases | unsupported on ${o.backend} | at MLX bugs | failed |`, "|---|---|---|---|---|---|---|---|");
    out.push(`| forward | ${o.opsExposed} exposed | ${o.opsTested} (${pct(o.opsTested, o.opsExposed)}) | ${o.cases} | ${o.bitExact} (${pct(o.bitExact, o.cases)}) | ${o.unsupported} | ${o.mlxBug} | ${o.failed} |`);
    out.push(`| vjp | ${o.vjp.opsDifferentiable} differentiable | ${o.vjp.opsTested} (${pct(o.vjp.opsTested, o.vjp.opsDifferentiable)}) | ${o.vjp.cases} | ${o.vjp.bitExact} (${pct(o.vjp.bitExact, o.vjp.cases)}) | ${o.vjp.unsupported} | ${o.vjp.mlxBug} | ${o.vjp.failed} |`, "");
    if (o.nonExact.length) {
      out.push("Every case that is not bit-exact (unsupported: both sides raised this same MLX error; mlx-bug: a byte difference on a path of MLX's own proven broken on this backend, with its reproducer):", "", "| case | status | detail |", "|---|---|---|");
      for (const c of o.nonExact) out.push(`| ${esc(c.id)} | ${c.status}${c.sticky ? " (sticky)" : ""} | ${esc(c.detail)} |`);
      out.push("");
    }
  }
  if (rep.runs.length) {
    out.push("## Models", "");
    out.push("| " + SUMMARY_HEADER.join(" | ") + " |", "|" + SUMMARY_HEADER.map(() => "---").join("|") + "|");
    for (const r of rep.runs) out.push("| " + summaryRow(r).map(esc).join(" | ") + " |");
    out.push("");
    const diverged = rep.runs.filter((r) => r.firstDivergence);
    if (diverged.length) {
      out.push("## First divergences", "");
      for (const r of diverged) {
        const d = r.firstDivergence!;
        out.push(`- **${esc(r.model)} · ${esc(r.variant)} · ${esc(r.scenario)}**: ${esc(fmtDivergence(d))}, first differing index ${d.firstIndex}.`);
        if (r.mlxBug) out.push(`  - the first divergent tap \`${esc(r.mlxBug.tap)}\` is produced by a recorded MLX bug (${r.mlxBug.id}): ${esc(r.mlxBug.what)}; reproducer \`${r.mlxBug.reproducer}\`; counted apart, ${r.unverifiedTaps} of its ${r.tapsCompared} taps unverified`);
        if (d.bisect) {
          const ins = d.bisect.inputs.map((i) => `${i.dtype}[${i.shape.join(",")}]`).join(", ");
          out.push(`  - bisect: first differing op \`${d.bisect.op}\` on (${ins}), max abs ${fmtNum(d.bisect.maxAbs)}, max ULP ${fmtNum(d.bisect.maxUlp)}`);
        }
      }
      out.push("");
    }
  }
  if (rep.reference) {
    const rf = rep.reference;
    out.push("## Independent reference (transformers)", "");
    out.push(`TS against mlx-lm (byte for byte) and both against Hugging Face transformers ${rf.versions.transformers} (torch ${rf.versions.torch}), float32, on the reference's tokens; bound ${rf.bound} relative (oracle/reference.ts says why).`, "");
    out.push("| " + REFERENCE_HEADER.join(" | ") + " |", "|" + REFERENCE_HEADER.map(() => "---").join("|") + "|");
    for (const r of rf.rows) out.push("| " + referenceRow(r).map(esc).join(" | ") + " |");
    out.push("");
  }
  return out.join("\n");
}
