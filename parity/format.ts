// Number and table formatting shared by the terminal, Markdown and HTML reports.
import type { Divergence, ReferenceRow, RunResult } from "./schema.ts";

export function fmtNum(x: number): string {
  if (x === 0) return "0";
  if (!Number.isFinite(x)) return String(x);
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : String(Number(x.toPrecision(4)));
}

export function fmtDivergence(d: Divergence | null): string {
  if (d === null) return "none";
  const where = `step ${d.step} · ${d.tap}`;
  return `${where} (max abs ${fmtNum(d.maxAbs)}, max ULP ${fmtNum(d.maxUlp)}, ${d.mismatches} mismatched)`;
}

export function fmtTokens(r: RunResult): string {
  const same = r.tokens.ts.length === r.tokens.oracle.length && r.tokens.ts.every((t, i) => t === r.tokens.oracle[i]);
  if (r.tokens.ts.length === 0) return "-";
  return same ? `${r.tokens.ts.length} identical` : `TS ${r.tokens.ts.join(",")} ≠ mlx-lm ${r.tokens.oracle.join(",")}`;
}

export const SUMMARY_HEADER = ["model", "variant", "scenario", "taps", "bit-exact", "first divergence", "tokens"] as const;

export function summaryRow(r: RunResult): string[] {
  return [r.model, r.variant, r.scenario, String(r.tapsCompared), `${r.bitExact} (${pct(r.bitExact, r.tapsCompared)})`, `${fmtDivergence(r.firstDivergence)}${r.mlxBug ? ` [MLX bug ${r.mlxBug.id}: ${r.unverifiedTaps} taps unverified]` : ""}`, fmtTokens(r)];
}

export const REFERENCE_HEADER = ["fixture", "TS = mlx-lm", "TS vs transformers (logits / hidden)", "mlx-lm vs transformers (logits)", "within bound"] as const;

export function referenceRow(r: ReferenceRow): string[] {
  const e = (x: number) => x.toExponential(2);
  return [r.checkpoint, r.tsEqualsMlxLm ? "bit for bit" : "DIFFERS", `${e(r.tsVsTransformers.logits)} / ${e(r.tsVsTransformers.hidden)}`, e(r.mlxLmVsTransformers.logits), !r.judged ? "not judged (TF32 on this GPU)" : r.ok ? "yes" : "NO"];
}

export function pct(n: number, d: number): string {
  if (d === 0) return "-";
  return `${((100 * n) / d).toFixed(n === d ? 0 : 2)}%`;
}

/** A plain-text table with aligned columns. */
export function textTable(header: readonly string[], rows: readonly string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) => cells.map((c, i) => c.padEnd(widths[i]!)).join("  ").trimEnd();
  return [line(header), widths.map((w) => "─".repeat(w)).join("  "), ...rows.map(line)].join("\n");
}
