// parity.html: a self-contained page (no external assets) with inline SVG plots:
// max-abs and ULP divergence per layer on a log scale (one line per step), and a heatmap of
// layers × tap kinds.
import { fmtNum, pct, REFERENCE_HEADER, referenceRow, SUMMARY_HEADER, summaryRow } from "./format.ts";
import { type ParityReport, type RunResult, runOk, type TapResult } from "./schema.ts";

const esc = (s: string) => s.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;").replaceAll('"', "&quot;");

/** Layer axis: model-level taps before the first layer sit at "in", after the last at "out". */
function layerSlots(taps: TapResult[]): { labels: string[]; slot: (t: TapResult) => number } {
  const layers = taps.map((t) => t.layer).filter((l): l is number => l !== null);
  const n = layers.length ? Math.max(...layers) + 1 : 0;
  const labels = ["in", ...Array.from({ length: n }, (_, i) => String(i)), "out"];
  // A model-level tap counts as "in" until the first layer tap of its step has been seen.
  const seenLayer = new Set<number>();
  const slotOf = new Map<TapResult, number>();
  for (const t of taps) {
    if (t.layer !== null) {
      seenLayer.add(t.step);
      slotOf.set(t, t.layer + 1);
    } else slotOf.set(t, seenLayer.has(t.step) ? n + 1 : 0);
  }
  return { labels, slot: (t) => slotOf.get(t)! };
}

const STEP_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

function linePlot(title: string, run: RunResult, metric: (t: TapResult) => number, unit: string): string {
  // The title sits on the first row, the legend on a row of its own below it, the plot under
  // both (T): the legend once ran from the right edge into the title.
  const W = 640, H = 256, L = 56, R = 12, T = 44, B = 36;
  const { labels, slot } = layerSlots(run.taps);
  const steps = [...new Set(run.taps.map((t) => t.step))].sort((a, b) => a - b);
  const perStep = new Map<number, number[]>();
  for (const s of steps) perStep.set(s, new Array(labels.length).fill(0));
  for (const t of run.taps) {
    const arr = perStep.get(t.step)!;
    const i = slot(t);
    arr[i] = Math.max(arr[i]!, metric(t));
  }
  const all = [...perStep.values()].flat().filter((v) => v > 0);
  // Log scale; exact (0) sits on the floor line labelled "exact".
  const lo = all.length ? Math.floor(Math.log10(Math.min(...all))) - 1 : -1;
  const hi = all.length ? Math.ceil(Math.log10(Math.max(...all))) : 0;
  const x = (i: number) => L + ((W - L - R) * i) / Math.max(1, labels.length - 1);
  const y = (v: number) => {
    const lv = v > 0 ? Math.log10(v) : lo;
    return T + ((H - T - B) * (hi - lv)) / Math.max(1, hi - lo);
  };
  const parts: string[] = [];
  parts.push(`<svg class="plot" role="img" aria-label="${esc(title)}" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" xmlns="http://www.w3.org/2000/svg">`);
  parts.push(`<text x="${L}" y="16" class="title">${esc(title)}</text>`);
  for (let e = lo; e <= hi; e++) {
    const yy = y(e === lo ? 0 : 10 ** e);
    parts.push(`<line x1="${L}" x2="${W - R}" y1="${yy}" y2="${yy}" class="grid"/>`);
    parts.push(`<text x="${L - 4}" y="${yy + 3}" class="tick" text-anchor="end">${e === lo ? "exact" : `1e${e}`}</text>`);
  }
  const every = Math.max(1, Math.ceil(labels.length / 24));
  labels.forEach((lab, i) => {
    if (i % every === 0 || i === labels.length - 1) parts.push(`<text x="${x(i)}" y="${H - B + 14}" class="tick" text-anchor="middle">${esc(lab)}</text>`);
  });
  parts.push(`<text x="${(L + W - R) / 2}" y="${H - 4}" class="tick" text-anchor="middle">layer</text>`);
  steps.forEach((s, k) => {
    const vals = perStep.get(s)!;
    const pts = vals.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    const color = STEP_COLORS[k % STEP_COLORS.length];
    parts.push(`<polyline class="series" data-step="${s}" fill="none" stroke="${color}" stroke-width="1.5" points="${pts}"><title>step ${s} (${unit})</title></polyline>`);
  });
  // Legend, left to right on its own row (capped: a long decode shows its first steps and a
  // count); entries are 60 px apart, room for "step 999".
  const shown = steps.slice(0, 8);
  shown.forEach((s, k) => {
    const lx = L + 60 * k;
    parts.push(`<rect x="${lx}" y="26" width="10" height="3" fill="${STEP_COLORS[k % STEP_COLORS.length]}"/><text x="${lx + 13}" y="31" class="tick legend">step ${s}</text>`);
  });
  if (steps.length > shown.length) parts.push(`<text x="${L + 60 * shown.length + 4}" y="31" class="tick legend">+${steps.length - shown.length} more steps</text>`);
  parts.push("</svg>");
  return parts.join("");
}

function heatmap(run: RunResult): string {
  const { labels, slot } = layerSlots(run.taps);
  const kinds = [...new Set(run.taps.map((t) => t.kind))];
  const cell = new Map<string, number>();
  for (const t of run.taps) {
    const k = `${slot(t)}|${t.kind}`;
    cell.set(k, Math.max(cell.get(k) ?? -1, t.maxUlp));
  }
  const cw = 14, ch = 14, L = 44, T = 150;
  const W = L + kinds.length * cw + 10, H = T + labels.length * ch + 10;
  const maxLog = Math.max(1, ...[...cell.values()].map((v) => Math.log10(v + 1)));
  const parts: string[] = [];
  parts.push(`<svg class="heatmap" role="img" aria-label="max ULP by layer and tap kind" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" xmlns="http://www.w3.org/2000/svg">`);
  kinds.forEach((k, j) => {
    const xx = L + j * cw + cw / 2;
    parts.push(`<text transform="translate(${xx},${T - 4}) rotate(-60)" class="tick">${esc(k)}</text>`);
  });
  labels.forEach((lab, i) => {
    parts.push(`<text x="${L - 4}" y="${T + i * ch + ch - 3}" class="tick" text-anchor="end">${esc(lab)}</text>`);
    kinds.forEach((k, j) => {
      const v = cell.get(`${i}|${k}`);
      let fill = "#f4f4f4";
      if (v !== undefined && v >= 0) {
        const a = v === 0 ? 0 : Math.log10(v + 1) / maxLog;
        fill = v === 0 ? "#cfe8cf" : `rgb(255,${Math.round(220 * (1 - a))},${Math.round(200 * (1 - a))})`;
      }
      const tip = v === undefined ? "no tap" : `${v} ULP`;
      parts.push(`<rect class="cell" x="${L + j * cw}" y="${T + i * ch}" width="${cw - 1}" height="${ch - 1}" fill="${fill}"><title>layer ${esc(lab)} · ${esc(k)}: ${tip}</title></rect>`);
    });
  });
  parts.push("</svg>");
  return parts.join("");
}

/** ok, known (diverging first at a recorded MLX bug: unverified from there on) or bad. */
const runClass = (r: RunResult): string => (r.mlxBug ? "known" : runOk(r) ? "ok" : "bad");

function runSection(r: RunResult, open: boolean): string {
  const head = `${esc(r.model)} · ${esc(r.variant)} · ${esc(r.scenario)} — ${r.bitExact}/${r.tapsCompared} bit-exact`;
  const plots = r.taps.length
    ? linePlot("max |TS − mlx-lm| per layer", r, (t) => t.maxAbs, "max abs") + linePlot("max ULP distance per layer", r, (t) => t.maxUlp, "ULP") + heatmap(r)
    : "<p>No taps were compared for this run.</p>";
  return `<details class="run ${runClass(r)}"${open ? " open" : ""}><summary>${head}</summary>${plots}</details>`;
}

export function renderHtml(rep: ParityReport): string {
  const rows = rep.runs.map((r) => `<tr class="${runClass(r)}">${summaryRow(r).map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("");
  const o = rep.opLevel;
  const nonExact = o?.nonExact.length
    ? `<table id="ops-nonexact"><tr><th>case</th><th>status</th><th>detail</th></tr>${o.nonExact.map((c) => `<tr class="${c.status === "fail" ? "bad" : ""}"><td>${esc(c.id)}</td><td>${c.status}${c.sticky ? " (sticky)" : ""}</td><td>${esc(c.detail)}</td></tr>`).join("")}</table>`
    : "";
  const op = o
    ? `<h2>Op-level parity (binding vs Python MLX, ${esc(o.backend)} backend, ${esc(o.device)})</h2><table id="ops"><tr><th>table</th><th>ops</th><th>ops parity-tested</th><th>cases</th><th>bit-exact cases</th><th>unsupported on ${esc(o.backend)}</th><th>at MLX bugs</th><th>failed</th></tr><tr><td>forward</td><td>${o.opsExposed} exposed</td><td>${o.opsTested} (${pct(o.opsTested, o.opsExposed)})</td><td>${o.cases}</td><td>${o.bitExact} (${pct(o.bitExact, o.cases)})</td><td>${o.unsupported}</td><td>${o.mlxBug}</td><td>${o.failed}</td></tr><tr><td>vjp</td><td>${o.vjp.opsDifferentiable} differentiable</td><td>${o.vjp.opsTested} (${pct(o.vjp.opsTested, o.vjp.opsDifferentiable)})</td><td>${o.vjp.cases}</td><td>${o.vjp.bitExact} (${pct(o.vjp.bitExact, o.vjp.cases)})</td><td>${o.vjp.unsupported}</td><td>${o.vjp.mlxBug}</td><td>${o.vjp.failed}</td></tr></table>${nonExact}`
    : "";
  const rf = rep.reference;
  const reference = rf
    ? `<h2>Independent reference (transformers ${esc(rf.versions.transformers ?? "")}, float32, bound ${rf.bound})</h2><table id="reference"><tr>${REFERENCE_HEADER.map((h) => `<th>${h}</th>`).join("")}</tr>${rf.rows.map((r) => `<tr class="${r.ok ? "ok" : "bad"}">${referenceRow(r).map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("")}</table>`
    : "";
  const versions = Object.entries(rep.versions).map(([k, v]) => `<span><b>${esc(k)}</b> ${esc(v)}</span>`).join(" ");
  // Plots: every diverging run opens; with none diverging, the first run opens.
  const firstBad = rep.runs.findIndex((r) => !runOk(r));
  const sections = rep.runs.map((r, i) => runSection(r, firstBad >= 0 ? !runOk(r) : i === 0)).join("");
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Gemma 4 parity report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin-top:24px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:bold}
.verdict.ok{background:#2a7d2a}.verdict.bad{background:#b52a2a}.verdict.known{background:#a86500}
.versions span{margin-right:14px;color:#555}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:13px}
tr.bad td{background:#fde8e8} tr.ok td:nth-child(5){color:#2a7d2a}
details.run{margin:8px 0;border:1px solid #ddd;border-radius:4px;padding:4px 8px} details.bad>summary{color:#b52a2a} tr.known td{background:#fff3dc} details.known>summary{color:#a86500}
svg{display:block;margin:8px 0} .title{font-size:13px;font-weight:bold} .tick{font-size:10px;fill:#555}
.grid{stroke:#e6e6e6}
</style></head><body>
<h1>Gemma 4 parity: TypeScript vs mlx-lm <span class="verdict ${rep.verdict.status === "pass" ? "ok" : rep.verdict.status === "fail" ? "bad" : "known"}">${esc(rep.verdict.text)}</span></h1>
<p class="versions">${versions}</p>
<p>Generated ${esc(rep.createdAt)} · budget ${rep.budget.ulp} ULP, atol ${fmtNum(rep.budget.atol)}</p>
${op}
<h2>Models</h2>
<table id="summary"><tr>${SUMMARY_HEADER.map((h) => `<th>${h}</th>`).join("")}</tr>${rows}</table>
${reference}
<h2>Divergence by layer</h2>
${sections}
</body></html>
`;
}
