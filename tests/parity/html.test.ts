// The HTML report renders in a real headless Chromium: plots, heatmap and tables are present.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Browser } from "playwright-core";
import { CHROMIUM_ARGS, findChromium } from "../../parity/browser.ts";
import { renderHtml } from "../../parity/html.ts";
import { type NonExactCase, reportOk, reportVerdict, type RunResult, SCHEMA_ID, type TapResult } from "../../parity/schema.ts";
import { limit } from "../time_limit.ts";

function tap(step: number, layer: number | null, kind: string, maxUlp: number): TapResult {
  const name = `step${step}/${layer === null ? "" : `layers.${layer}/`}${kind}`;
  return { step, name, layer, kind, dtype: "bfloat16", shape: [1, 4, 64], size: 256, mismatches: maxUlp ? 3 : 0, maxAbs: maxUlp * 1e-3, maxUlp, firstIndex: maxUlp ? 7 : -1 };
}

// A small synthetic report: one exact run, one diverging from layer 2 of step 1 on.
function runWith(diverge: boolean, steps = 3): RunResult {
  const taps: TapResult[] = [];
  for (let step = 0; step < steps; step++) {
    taps.push(tap(step, null, "embed_scaled", 0));
    for (let layer = 0; layer < 4; layer++) {
      for (const kind of ["input_layernorm", "self_attn/q_norm", "mlp/down_proj", "layer_scalar"]) {
        taps.push(tap(step, layer, kind, diverge && step >= 1 && layer >= 2 ? (layer - 1) * 4 : 0));
      }
    }
    taps.push(tap(step, null, "logits", diverge && step >= 1 ? 12 : 0));
  }
  const bad = taps.filter((t) => t.maxUlp > 0);
  const first = bad[0];
  return {
    model: diverge ? "perturbed" : "c1_dense", variant: "bfloat16 · flat", scenario: "gen L=5", steps,
    tapsCompared: taps.length, bitExact: taps.length - bad.length, withinBudget: taps.length - bad.length,
    firstDivergence: first ? { step: first.step, tap: first.name, layer: first.layer, maxAbs: first.maxAbs, maxUlp: first.maxUlp, mismatches: first.mismatches, firstIndex: first.firstIndex } : null,
    tokens: { ts: [1, 2, 3], oracle: diverge ? [1, 2, 4] : [1, 2, 3] }, taps, seconds: 0.1,
  };
}

const chromiumPath = findChromium();
// package.json installs playwright-core; the offline GPU bundle leaves it out of node_modules (no
// Chromium there either), so it is loaded only where it is there, and a broken install still fails.
const hasPlaywright = existsSync(join(import.meta.dir, "..", "..", "node_modules", "playwright-core"));
const skip = !hasPlaywright ? "playwright-core is not installed (the offline GPU bundle leaves it out)" : chromiumPath === null ? "no Chromium is installed (Debian: apt-get install chromium, or set CHROMIUM_PATH)" : null;
const runs = [runWith(false), runWith(true)];
const report = { schema: SCHEMA_ID, createdAt: "2026-11-30T00:00:00Z", versions: { mlx: "0.32.4" }, budget: { ulp: 0, atol: 0 }, opLevel: { opsExposed: 10, opsTested: 10, cases: 30, bitExact: 29, unsupported: 1, mlxBug: 0, failed: 0, backend: "cuda", device: "gpu", workers: 2, vjp: { opsDifferentiable: 8, opsTested: 8, cases: 20, bitExact: 20, unsupported: 0, mlxBug: 0, failed: 0 }, nonExact: [{ id: "astype/float64", op: "astype", status: "unsupported" as const, detail: "float64 is not supported on the GPU", sticky: false }] as NonExactCase[] }, runs, verdict: reportVerdict(runs, null), ok: reportOk(runs, null) } as const;

// Skipped only where playwright-core or Chromium is missing (setup installs Debian's chromium when
// it runs as root); the reason is in the name: bun lists a skipped test by its name only.
describe.skipIf(skip !== null)(`parity.html in headless Chromium${skip === null ? "" : ` — skipped: ${skip}`}`, () => {
  let browser: Browser;
  let dir: string;
  // Launching Chromium takes seconds on a loaded 2-core machine.
  beforeAll(async () => {
    const { chromium } = await import("playwright-core");
    browser = await chromium.launch({ executablePath: chromiumPath!, args: CHROMIUM_ARGS, timeout: 120_000 });
    dir = mkdtempSync(join(tmpdir(), "parity-html-"));
  }, limit(120_000));
  afterAll(async () => {
    await browser?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("renders the tables, one line per step, and the heatmap", async () => {
    const file = join(dir, "parity.html");
    writeFileSync(file, renderHtml({ ...report, runs: [...runs] }));
    const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(`file://${file}`);
    expect(await page.locator("#summary tr").count()).toBe(3); // header + 2 runs
    expect(await page.locator("#summary tr.bad").count()).toBe(1);
    expect(await page.locator(".verdict").textContent()).toBe("FAIL");
    // Every non-exact op case is listed, unsupported ones apart from failures.
    expect(await page.locator("#ops-nonexact tr").count()).toBe(2);
    expect(await page.locator("#ops").textContent()).toContain("unsupported on cuda");
    // The diverging run opens by default: two line plots with 3 steps each, and a heatmap.
    const open = page.locator("details.run[open]");
    expect(await open.count()).toBe(1);
    expect(await open.locator("svg.plot").count()).toBe(2);
    expect(await open.locator("svg.plot").first().locator("polyline.series").count()).toBe(3);
    // 6 layer slots (in, 0..3, out) × 6 tap kinds.
    expect(await open.locator("svg.heatmap rect.cell").count()).toBe(36);
    const box = await open.locator("svg.plot").first().boundingBox();
    expect(box!.width).toBeGreaterThan(300);
    expect(errors).toEqual([]);
    mkdirSync("report/screenshots", { recursive: true });
    await page.screenshot({ path: "report/screenshots/parity-html.png", fullPage: true });
    await page.close();
  }, limit(120_000));

  it("no legend entry overlaps a plot's title or another entry (a run of 10 decode steps: 8 entries and a count)", async () => {
    const long = runWith(true, 10);
    const file = join(dir, "legend.html");
    writeFileSync(file, renderHtml({ ...report, runs: [long], verdict: reportVerdict([long], null), ok: false }));
    const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
    await page.goto(`file://${file}`);
    // runs in the page (the project's type check has no DOM library: the few members used, typed here)
    interface SvgNode {
      textContent: string | null;
      getBBox(): { x: number; y: number; width: number; height: number };
      getAttribute(name: string): string | null;
      querySelector(sel: string): SvgNode | null;
      querySelectorAll(sel: string): ArrayLike<SvgNode>;
    }
    const boxes = await page.evaluate(() => {
      const doc = (globalThis as unknown as { document: SvgNode }).document;
      const box = (e: SvgNode) => {
        const b = e.getBBox();
        return { x: b.x, y: b.y, w: b.width, h: b.height, text: e.textContent ?? "" };
      };
      return Array.from(doc.querySelectorAll("svg.plot")).map((svg) => ({ title: box(svg.querySelector(".title")!), legend: Array.from(svg.querySelectorAll(".legend")).map(box), width: Number(svg.getAttribute("width")) }));
    });
    await page.close();
    expect(boxes.length).toBe(2);
    const overlap = (a: { x: number; y: number; w: number; h: number }, b: typeof a) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
    for (const p of boxes) {
      expect(p.legend.map((l) => l.text)).toEqual([...Array.from({ length: 8 }, (_, s) => `step ${s}`), "+2 more steps"]);
      for (const l of p.legend) {
        expect(overlap(p.title, l), `"${p.title.text}" vs "${l.text}"`).toBe(false);
        expect(l.x + l.w, `${l.text} inside the plot`).toBeLessThanOrEqual(p.width);
      }
      for (let i = 0; i < p.legend.length; i++) for (let j = i + 1; j < p.legend.length; j++) expect(overlap(p.legend[i]!, p.legend[j]!), `${p.legend[i]!.text} vs ${p.legend[j]!.text}`).toBe(false);
    }
  }, limit(120_000));
});
