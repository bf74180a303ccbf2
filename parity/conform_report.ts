// The reports of `npm run conform`: the JSON document, a terminal table, Markdown, and a
// self-contained HTML page with an inline-SVG plot of the relative L2 error per layer (log
// scale, one line per call, the noise floor drawn dashed).
import type { LogitMetrics } from "../oracle/conform/metrics.ts";
import { LOGIT_KINDS, type TensorComparison } from "../oracle/conform/tensor_compare.ts";
import type { LayerSummary, NoiseFloor, Status, TensorVerdict } from "../oracle/conform/verdict.ts";
import { fmtNum, textTable } from "./format.ts";

export const CONFORM_SCHEMA = "gemma4-conform-report/1";

export interface ConformTensorRow extends TensorComparison {
  within: boolean;
  ratio: number;
  floorKey: string;
  floorRelL2: number;
  floorKl?: number;
  reason?: string;
}

export interface ConformReport {
  schema: typeof CONFORM_SCHEMA;
  createdAt: string;
  versions: Record<string, string>;
  dump: { dir: string; engine: Record<string, string>; checkpoint: string; promptLength: number; schedule: Record<string, unknown>; level: number; tensors: number };
  floor: { file: string; status: NoiseFloor["status"]; measured: NoiseFloor["measured"] };
  verdict: { status: Status; headline: string; strict: boolean; firstOutside: string | null; firstLayerOutside: number | null; firstTokenDiff: number | null };
  tokens: { engine: number[]; oracle: number[] } | null;
  /** Tensors of the dump not compared, with the reason (calls after the first differing token). */
  notCompared: { name: string; reason: string }[];
  compared: number;
  bitExact: number;
  /** Tensors whose every value equals mlx-lm's (bit-exact, or the same values in another dtype). */
  exact: number;
  /** MoE top-k tensors whose expert axis was put into mlx-lm's order before the comparison. */
  reordered: number;
  /** Logit rows of every call compared (row-weighted means; a call's logprobs only where it has no logits). */
  logits: (Omit<LogitMetrics, "vocab" | "k"> & { tensors: number }) | null;
  layers: LayerSummary[];
  /** Per tap kind (as parseTapName gives it), the worst over every layer and call. */
  kinds: KindSummary[];
  tensors: ConformTensorRow[];
}

export interface KindSummary {
  kind: string;
  tensors: number;
  /** Largest relative L2 error (absent where none is defined: integers, masks, logprobs against logits). */
  maxRelL2?: number;
  /** Largest per-row KL (logits / logprobs only). */
  maxKl?: number;
  floorKey: string;
  floorRelL2: number;
  floorKl?: number;
  outside: number;
}

/** The per-kind summary of the rows, in order of first appearance. */
export function kindSummaries(rows: readonly ConformTensorRow[]): KindSummary[] {
  const by = new Map<string, KindSummary>();
  for (const r of rows) {
    let k = by.get(r.kind);
    if (!k) {
      k = { kind: r.kind, tensors: 0, floorKey: r.floorKey, floorRelL2: r.floorRelL2, ...(r.floorKl !== undefined && LOGIT_KINDS.has(r.kind) ? { floorKl: r.floorKl } : {}), outside: 0 };
      by.set(r.kind, k);
    }
    k.tensors++;
    if (!r.within) k.outside++;
    const e = r.metrics?.relL2;
    if (e !== undefined && (k.maxRelL2 === undefined || !(e <= k.maxRelL2))) k.maxRelL2 = e;
    const kl = r.logits?.klMax;
    if (kl !== undefined && (k.maxKl === undefined || !(kl <= k.maxKl))) k.maxKl = kl;
  }
  return [...by.values()];
}

const KIND_HEADER = ["tap kind", "tensors", "max rel L2", "max KL", "floor (kind)", "outside"] as const;

function kindRow(k: KindSummary): string[] {
  const floor = `${fmtErr(k.floorRelL2)}${k.floorKl !== undefined ? ` / KL ${fmtErr(k.floorKl)}` : ""} (${k.floorKey})`;
  return [k.kind, String(k.tensors), fmtErr(k.maxRelL2), fmtErr(k.maxKl), floor, String(k.outside)];
}

export function tensorRows(cmp: readonly TensorComparison[], verdicts: readonly TensorVerdict[]): ConformTensorRow[] {
  return cmp.map((c, i) => {
    const v = verdicts[i]!;
    return { ...c, within: v.within, ratio: v.ratio, floorKey: v.floorKey, floorRelL2: v.floor.rel_l2, ...(v.floor.kl !== undefined ? { floorKl: v.floor.kl } : {}), ...(v.reason ? { reason: v.reason } : {}) };
  });
}

/** Row-weighted logit metrics over the logits of every call (its logprobs where the call has no logits: the same rows). */
export function logitSummary(cmp: readonly TensorComparison[]): ConformReport["logits"] {
  const withLogits = new Set(cmp.filter((c) => c.kind === "logits" && c.logits).map((c) => c.call));
  const ls = cmp.filter((c) => c.kind === "logits" || !withLogits.has(c.call)).map((c) => c.logits).filter((l): l is LogitMetrics => l !== undefined);
  if (!ls.length) return null;
  const rows = ls.reduce((a, l) => a + l.rows, 0);
  const mean = (f: (l: LogitMetrics) => number) => ls.reduce((a, l) => a + f(l) * l.rows, 0) / rows;
  return {
    tensors: ls.length, rows,
    klMean: mean((l) => l.klMean), klMax: Math.max(...ls.map((l) => l.klMax)),
    top1: mean((l) => l.top1), topkOverlap: mean((l) => l.topkOverlap),
    dpTopMean: mean((l) => l.dpTopMean), dpTopMax: Math.max(...ls.map((l) => l.dpTopMax)),
  };
}

const REORDERED = (n: number) => `${n} MoE top-k tensors had their expert axis put into mlx-lm's order first, token by token (the router's top-k order is unspecified: mlx-lm's argpartition)`;

/** The MoE top-k tensors with tokens whose router picked another expert set than mlx-lm's (left in the engine's order), or null. */
function topkSetsLine(r: ConformReport): string | null {
  const hit = r.tensors.filter((t) => (t.topkRowsDiffering ?? 0) > 0);
  if (!hit.length) return null;
  const first = hit[0]!;
  return `${hit.length} MoE top-k tensors have tokens whose expert set differs from mlx-lm's (left in the engine's order, counted in the distances as they are; first: ${first.name}, ${first.topkRowsDiffering} of ${(first.shape[0] ?? 1) * (first.shape[1] ?? 1)} tokens)`;
}

const STATUS_WORD: Record<Status, string> = { CONFORMS: "CONFORMS", DIVERGES: "DIVERGES", FLOOR_NOT_MEASURED: "FLOOR NOT MEASURED" };

function fmtErr(x: number | undefined): string {
  return x === undefined ? "-" : x === 0 ? "0" : x.toExponential(2);
}

const LAYER_HEADER = ["layer", "tensors", "max rel L2", "nearest its floor: tensor, rel L2 / floor", "within floor"] as const;

function layerRow(l: LayerSummary): string[] {
  const w = l.worst;
  return [l.slot, String(l.tensors), fmtErr(l.maxRelL2), w ? `${w.kind}: ${fmtErr(w.relL2)} / ${fmtErr(w.floorRelL2)}` : "-", l.within ? "yes" : "NO"];
}

function logitLine(r: ConformReport): string | null {
  const g = r.logits;
  if (!g) return null;
  return `logits (${g.tensors} tensors, ${g.rows} rows): KL mean ${fmtErr(g.klMean)} max ${fmtErr(g.klMax)} · top-1 ${(100 * g.top1).toFixed(2)}% · top-10 overlap ${(100 * g.topkOverlap).toFixed(2)}% · |Δp| top mean ${fmtErr(g.dpTopMean)} max ${fmtErr(g.dpTopMax)}`;
}

function tokenLine(r: ConformReport): string | null {
  if (!r.tokens) return null;
  const d = r.verdict.firstTokenDiff;
  return d === null ? `greedy tokens: ${r.tokens.oracle.length} identical` : `greedy tokens differ from step ${d}: engine ${r.tokens.engine.join(",")} vs mlx-lm ${r.tokens.oracle.join(",")}`;
}

export function renderText(r: ConformReport): string {
  const out: string[] = [];
  out.push(`${r.dump.engine.name ?? "engine"} ${r.dump.engine.version ?? ""} (${r.dump.engine.dtype ?? "?"}, ${r.dump.engine.device ?? "?"}) vs mlx-lm · level L${r.dump.level} · ${r.compared} tensors compared, ${r.bitExact} bit-exact, ${r.exact} equal in value`);
  out.push(`noise floor: ${r.floor.status === "measured" ? `measured (${r.floor.measured?.when ?? "?"})` : "PLACEHOLDER, not measured"}`, "");
  out.push(textTable(LAYER_HEADER, r.layers.map(layerRow)), "");
  for (const l of [logitLine(r), tokenLine(r)]) if (l) out.push(l);
  if (r.notCompared.length) out.push(`${r.notCompared.length} tensors not compared: ${r.notCompared[0]!.reason}`);
  if (r.reordered) out.push(REORDERED(r.reordered));
  const sets = topkSetsLine(r);
  if (sets) out.push(sets);
  const bad = r.kinds.filter((k) => k.outside > 0);
  const shown = bad.slice(0, 6).map((k) => `${k.kind} (${k.outside}/${k.tensors}, max rel L2 ${fmtErr(k.maxRelL2)})`);
  if (bad.length) out.push(`tap kinds outside the floor: ${shown.join(", ")}${bad.length > shown.length ? ` and ${bad.length - shown.length} more (conform.md lists every kind)` : ""}`);
  out.push(`verdict: ${r.verdict.headline}`);
  return out.join("\n") + "\n";
}

const mdEsc = (s: string) => s.replaceAll("|", "\\|");

export function renderMarkdown(r: ConformReport): string {
  const out: string[] = [];
  out.push("# Gemma 4 conformance report", "");
  out.push(`Generated ${r.createdAt}. Verdict: **${STATUS_WORD[r.verdict.status]}**: ${mdEsc(r.verdict.headline)}`, "");
  const e = r.dump.engine;
  out.push(`Engine: ${e.name ?? "?"} ${e.version ?? ""}, ${e.dtype ?? "?"} on ${e.device ?? "?"}; dump \`${r.dump.dir}\` (level L${r.dump.level}, ${r.dump.tensors} tensors, prompt ${r.dump.promptLength} tokens, schedule ${JSON.stringify(r.dump.schedule)}); checkpoint \`${r.dump.checkpoint}\`.`, "");
  out.push(`Noise floor: ${r.floor.status === "measured" ? `measured: ${mdEsc(r.floor.measured?.what ?? "")} (${r.floor.measured?.where}, ${r.floor.measured?.when})` : "**placeholder, not measured** (a run that is not bit-exact cannot be called CONFORMS)"}.`, "");
  out.push("| " + Object.keys(r.versions).join(" | ") + " |", "|" + Object.keys(r.versions).map(() => "---").join("|") + "|", "| " + Object.values(r.versions).map(mdEsc).join(" | ") + " |", "");
  out.push(`${r.compared} tensors compared, ${r.bitExact} bit-exact, ${r.exact} equal in value.`, "");
  out.push("## Per layer (worst over calls)", "", "| " + LAYER_HEADER.join(" | ") + " |", "|" + LAYER_HEADER.map(() => "---").join("|") + "|");
  for (const l of r.layers) out.push("| " + layerRow(l).join(" | ") + " |");
  out.push("", "## Per tap kind (worst over layers and calls)", "", "| " + KIND_HEADER.join(" | ") + " |", "|" + KIND_HEADER.map(() => "---").join("|") + "|");
  for (const k of r.kinds) out.push("| " + kindRow(k).map(mdEsc).join(" | ") + " |");
  out.push("");
  for (const l of [logitLine(r), tokenLine(r)]) if (l) out.push(`- ${mdEsc(l)}`);
  const outside = r.tensors.filter((t) => !t.within);
  if (outside.length) {
    out.push("", `## Tensors outside the floor (${outside.length}; first 40)`, "", "| tensor | dtypes | bit mismatches | max abs | max ULP | rel L2 | cosine | KL max | reason |", "|---|---|---|---|---|---|---|---|---|");
    for (const t of outside.slice(0, 40)) {
      out.push(`| ${mdEsc(t.name)} | ${t.engineDtype} / ${t.oracleDtype} | ${t.mismatches ?? "-"} | ${fmtErr(t.metrics?.maxAbs)} | ${t.metrics?.maxUlp ?? "-"} | ${fmtErr(t.metrics?.relL2)} | ${t.metrics ? fmtNum(t.metrics.cosine) : "-"} | ${fmtErr(t.logits?.klMax)} | ${mdEsc(t.reason ?? "")} |`);
    }
  }
  if (r.notCompared.length) out.push("", `${r.notCompared.length} tensors not compared: ${mdEsc(r.notCompared[0]!.reason)}.`);
  if (r.reordered) out.push("", `${REORDERED(r.reordered)}.`);
  const sets = topkSetsLine(r);
  if (sets) out.push("", `${sets}.`);
  out.push("");
  return out.join("\n");
}

const esc = (s: string) => s.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;").replaceAll('"', "&quot;");

const CALL_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

/** Per call and layer slot (in, 0..n-1, out), the relative L2 error of the tensor nearest its floor. */
function perCallSlots(r: ConformReport): { labels: string[]; calls: string[]; values: Map<string, (number | null)[]>; floor: number[] } {
  const labels = r.layers.map((l) => l.slot);
  const index = new Map(labels.map((l, i) => [l, i]));
  const values = new Map<string, (number | null)[]>();
  const ratios = new Map<string, number[]>();
  const floor = r.layers.map((l) => l.floorRelL2);
  const seenLayer = new Set<string>();
  for (const t of r.tensors) {
    let slot: string;
    if (t.layer !== null) {
      seenLayer.add(t.call);
      slot = String(t.layer);
    } else slot = seenLayer.has(t.call) ? "out" : "in";
    const e = t.bitExact ? 0 : t.metrics?.relL2;
    if (e === undefined) continue;
    if (!values.has(t.call)) {
      values.set(t.call, new Array(labels.length).fill(null));
      ratios.set(t.call, new Array(labels.length).fill(-1));
    }
    const arr = values.get(t.call)!;
    const rat = ratios.get(t.call)!;
    const i = index.get(slot)!;
    // the tensor nearest its floor (as the layer table's), the larger error on a tie
    if (t.ratio > rat[i]! || (t.ratio === rat[i]! && e > (arr[i] ?? 0))) {
      rat[i] = t.ratio;
      arr[i] = e;
    }
  }
  return { labels, calls: [...values.keys()], values, floor };
}

/** The relative L2 error per layer on a log scale; the legend sits on its own row under the title. */
export function layerPlot(r: ConformReport): string {
  const { labels, calls, values, floor } = perCallSlots(r);
  const W = 720, L = 60, R = 16, B = 36;
  const shown = calls.slice(0, 12);
  // Legend items flow left to right under the title and wrap; widths from a generous 6.5 px per
  // character at the 10 px tick font, so items never touch.
  const items: { label: string; color: string; dash?: boolean }[] = [...shown.map((c, k) => ({ label: c, color: CALL_COLORS[k % CALL_COLORS.length]! })), { label: r.floor.status === "measured" ? "noise floor" : "floor (placeholder)", color: "#444", dash: true }];
  if (calls.length > shown.length) items.push({ label: `+${calls.length - shown.length} calls`, color: "none" });
  const placed: { x: number; row: number }[] = [];
  let cx = L;
  let row = 0;
  for (const it of items) {
    const w = 18 + Math.ceil(it.label.length * 6.5) + 14;
    if (cx + w > W - R && cx > L) {
      row++;
      cx = L;
    }
    placed.push({ x: cx, row });
    cx += w;
  }
  const T = 30 + (row + 1) * 16 + 8;
  const H = T + 200 + B;
  const pos = [...values.values()].flat().filter((v): v is number => v !== null && v > 0 && Number.isFinite(v));
  const floorPos = floor.filter((v) => v > 0);
  const all = [...pos, ...floorPos];
  const lo = all.length ? Math.floor(Math.log10(Math.min(...all))) - 1 : -8;
  const hi = all.length ? Math.max(lo + 2, Math.ceil(Math.log10(Math.max(...all)))) : 0;
  const x = (i: number) => L + ((W - L - R) * i) / Math.max(1, labels.length - 1);
  const y = (v: number) => {
    const lv = v > 0 && Number.isFinite(v) ? Math.log10(v) : v > 0 ? hi : lo;
    return T + ((H - T - B) * (hi - lv)) / Math.max(1, hi - lo);
  };
  const parts: string[] = [];
  parts.push(`<svg class="plot" id="layer-plot" role="img" aria-label="relative L2 error per layer" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" xmlns="http://www.w3.org/2000/svg">`);
  parts.push(`<text x="${L}" y="16" class="title">relative L2 error ‖engine − mlx-lm‖₂ / ‖mlx-lm‖₂ per layer (the tensor nearest its floor)</text>`);
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
  // The floor: a dashed step line through each slot's floor value.
  const fl = floor.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  parts.push(`<polyline class="floor" fill="none" stroke="#444" stroke-width="1.2" stroke-dasharray="5,3" points="${fl}"><title>noise floor (${esc(r.floor.status)})</title></polyline>`);
  shown.forEach((c, k) => {
    const vals = values.get(c)!;
    const pts = vals.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`)).filter((p) => p !== null).join(" ");
    parts.push(`<polyline class="series" data-call="${esc(c)}" fill="none" stroke="${CALL_COLORS[k % CALL_COLORS.length]}" stroke-width="1.5" points="${pts}"><title>${esc(c)}</title></polyline>`);
  });
  if (r.verdict.firstLayerOutside !== null) {
    const i = labels.indexOf(String(r.verdict.firstLayerOutside));
    if (i >= 0) parts.push(`<line class="first-outside" x1="${x(i)}" x2="${x(i)}" y1="${T}" y2="${H - B}" stroke="#b52a2a" stroke-width="1" stroke-dasharray="2,2"><title>first layer outside the floor: ${r.verdict.firstLayerOutside}</title></line>`);
  }
  // Legend rows between the title and the plot area.
  items.forEach((it, j) => {
    const lx = placed[j]!.x;
    const ly = 30 + placed[j]!.row * 16;
    if (it.color !== "none") parts.push(`<line class="legend-key" x1="${lx}" x2="${lx + 14}" y1="${ly - 3}" y2="${ly - 3}" stroke="${it.color}" stroke-width="2"${it.dash ? ' stroke-dasharray="4,2"' : ""}/>`);
    parts.push(`<text class="legend tick" x="${lx + 18}" y="${ly}">${esc(it.label)}</text>`);
  });
  parts.push("</svg>");
  return parts.join("");
}

export function renderHtml(r: ConformReport): string {
  const ok = r.verdict.status === "CONFORMS";
  const versions = Object.entries(r.versions).map(([k, v]) => `<span><b>${esc(k)}</b> ${esc(v)}</span>`).join(" ");
  const layerRows = r.layers.map((l) => `<tr class="${l.within ? "ok" : "bad"}">${layerRow(l).map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("");
  const allOutside = r.tensors.filter((t) => !t.within);
  const outside = allOutside.slice(0, 40);
  const outsideTable = outside.length
    ? `<h2>Tensors outside the floor</h2><details id="outside-list"${allOutside.length <= 10 ? " open" : ""}><summary>${allOutside.length} tensors outside the floor${allOutside.length > outside.length ? ` (the first ${outside.length} in execution order listed; conform.json has every one)` : ""}</summary><table id="outside"><tr><th>tensor</th><th>dtypes</th><th>bit mismatches</th><th>max abs</th><th>max ULP</th><th>rel L2</th><th>cosine</th><th>KL max</th><th>reason</th></tr>${outside.map((t) => `<tr class="bad"><td>${esc(t.name)}</td><td>${t.engineDtype} / ${t.oracleDtype}</td><td>${t.mismatches ?? "-"}</td><td>${fmtErr(t.metrics?.maxAbs)}</td><td>${t.metrics?.maxUlp ?? "-"}</td><td>${fmtErr(t.metrics?.relL2)}</td><td>${t.metrics ? fmtNum(t.metrics.cosine) : "-"}</td><td>${fmtErr(t.logits?.klMax)}</td><td>${esc(t.reason ?? "")}</td></tr>`).join("")}</table></details>`
    : "";
  const e = r.dump.engine;
  const lines = [logitLine(r), tokenLine(r), r.reordered ? REORDERED(r.reordered) : null, topkSetsLine(r)].filter((l): l is string => l !== null).map((l) => `<li>${esc(l)}</li>`).join("");
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Gemma 4 conformance report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin-top:24px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:bold}
.verdict.ok{background:#2a7d2a}.verdict.bad{background:#b52a2a}
.versions span{margin-right:14px;color:#555}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:13px}
tr.bad td{background:#fde8e8}
svg{display:block;margin:8px 0} .title{font-size:13px;font-weight:bold} .tick{font-size:10px;fill:#555}
.grid{stroke:#e6e6e6}
</style></head><body>
<h1>Gemma 4 conformance: ${esc(e.name ?? "engine")} vs mlx-lm <span class="verdict ${ok ? "ok" : "bad"}">${STATUS_WORD[r.verdict.status]}</span></h1>
<p id="headline">${esc(r.verdict.headline)}</p>
<p class="versions">${versions}</p>
<p>Generated ${esc(r.createdAt)} · engine ${esc(e.name ?? "?")} ${esc(e.version ?? "")}, ${esc(e.dtype ?? "?")} on ${esc(e.device ?? "?")} · level L${r.dump.level} · ${r.compared} tensors compared, ${r.bitExact} bit-exact, ${r.exact} equal in value · noise floor ${r.floor.status === "measured" ? `measured ${esc(r.floor.measured?.when ?? "")}` : "<b>placeholder, not measured</b>"}</p>
<ul>${lines}</ul>
<h2>Error per layer</h2>
${layerPlot(r)}
<table id="layers"><tr>${LAYER_HEADER.map((h) => `<th>${h}</th>`).join("")}</tr>${layerRows}</table>
<h2>Per tap kind</h2>
<table id="kinds"><tr>${KIND_HEADER.map((h) => `<th>${h}</th>`).join("")}</tr>${r.kinds.map((k) => `<tr class="${k.outside ? "bad" : "ok"}">${kindRow(k).map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("")}</table>
${outsideTable}
</body></html>
`;
}
