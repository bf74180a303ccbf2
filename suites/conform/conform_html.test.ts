// conform's reports (parity/conform_report.ts) on a synthetic report of 14 calls × (in, 6 layers,
// out) whose error grows from layer 3 on: the terminal and Markdown text (verdict, layer table,
// kinds, the tensors outside); conform.html in a real headless Chromium: the per-layer plot has
// one line per shown call (12) and the floor line, the legend wraps onto rows that overlap
// neither the title nor the plot area nor each other, and the first layer outside is marked.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Browser } from "playwright-core";
import type { TensorComparison } from "../../oracle/conform/tensor_compare.ts";
import { judge, type NoiseFloor, NOISE_FLOOR_SCHEMA } from "../../oracle/conform/verdict.ts";
import { CHROMIUM_ARGS, findChromium } from "../../parity/browser.ts";
import { CONFORM_SCHEMA, type ConformReport, kindSummaries, logitSummary, renderHtml, renderMarkdown, renderText, tensorRows } from "../../parity/conform_report.ts";
import { limit } from "../../tests/time_limit.ts";

const FLOOR: NoiseFloor = { schema: NOISE_FLOOR_SCHEMA, status: "placeholder", measured: null, kinds: {}, default: { rel_l2: 1e-4, kl: 1e-6 } };

function cmp(call: string, layer: number | null, kind: string, relL2: number): TensorComparison {
  const prefix = call === "forward" ? "" : `${call}/`;
  const name = `${prefix}${layer === null ? "" : `layers.${layer}/`}${kind}`;
  return {
    name, oracleName: name, call, layer, kind, engineDtype: "float32", oracleDtype: "bfloat16", shape: [1, 1, 64], mismatches: null, total: 64,
    bitExact: false, exact: relL2 === 0, metrics: { n: 64, maxAbs: relL2, maxUlp: 0, relL2, cosine: 1 - relL2 },
    ...(kind === "logits" ? { logits: { rows: 1, vocab: 256, klMean: relL2 / 100, klMax: relL2 / 100, top1: 1, k: 10, topkOverlap: 1, dpTopMean: 0, dpTopMax: 0 } } : {}),
  };
}

function report(): ConformReport {
  const calls = [...Array.from({ length: 2 }, (_, k) => `prefill${k}`), ...Array.from({ length: 12 }, (_, n) => `step${n}`)];
  const cs: TensorComparison[] = [];
  calls.forEach((c, k) => {
    cs.push(cmp(c, null, "embed_scaled", 1e-7));
    for (let l = 0; l < 6; l++) for (const kind of ["input_layernorm", "output"]) cs.push(cmp(c, l, kind, l >= 3 ? 1e-2 : 1e-7 * (l + 1) * (k + 1)));
    cs.push(cmp(c, null, "norm", 1e-2), cmp(c, null, "logits", 1e-2));
  });
  const v = judge(cs, FLOOR);
  return {
    schema: CONFORM_SCHEMA, createdAt: "2026-12-02T00:00:00Z", versions: { mlx_lm: "0.32.2" },
    dump: { dir: "dump", engine: { name: "synthetic", version: "1", device: "cpu", dtype: "float32" }, checkpoint: "ckpt", promptLength: 9, schedule: { kind: "generate", prefill_step_size: 4, max_tokens: 11 }, level: 1, tensors: cs.length },
    floor: { file: "noise_floor.json", status: FLOOR.status, measured: null },
    verdict: { status: v.status, headline: v.headline, strict: false, firstOutside: v.firstOutside?.name ?? null, firstLayerOutside: v.firstLayerOutside, firstTokenDiff: null },
    tokens: null, notCompared: [], compared: cs.length, bitExact: 0, exact: 0, reordered: 0, logits: logitSummary(cs), layers: v.layers, kinds: kindSummaries(tensorRows(cs, v.tensors)), tensors: tensorRows(cs, v.tensors),
  };
}

type Box = { x: number; y: number; width: number; height: number };
const overlap = (a: Box, b: Box) => a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;

describe("conform's terminal and Markdown reports", () => {
  it("carry the verdict, the layer table, the kinds and the tensors outside", () => {
    const rep = report();
    const outside = rep.tensors.filter((t) => !t.within).length;
    expect(outside).toBe(14 * (3 * 2 + 2)); // layers 3..5 × 2 kinds, norm and logits, in 14 calls
    const text = renderText(rep);
    expect(text).toContain(`verdict: ${rep.verdict.headline}`);
    expect(text.split("\n").filter((l) => /^(in|out|\d) /.test(l)).length).toBe(8);
    expect(text).toContain("tap kinds outside the floor: input_layernorm (42/84");
    const md = renderMarkdown(rep);
    expect(md).toContain(`## Tensors outside the floor (${outside}; first 40)`);
    expect(md.split("\n").filter((l) => l.startsWith("| step") || l.startsWith("| prefill")).length).toBe(40);
    expect(md).toContain("| logits | 14 | 1.00e-2 | 1.00e-4 | 1.00e-4 / KL 1.00e-6 (default) | 14 |");
  });
});

const chromiumPath = findChromium();
const hasPlaywright = existsSync(join(import.meta.dir, "..", "..", "node_modules", "playwright-core"));
// Skipped only where playwright-core or Chromium is missing (as tests/parity/html.test.ts); the reason is in the name.
const skip = !hasPlaywright ? "playwright-core is not installed (the offline GPU bundle leaves it out)" : chromiumPath === null ? "no Chromium is installed (Debian: apt-get install chromium, or set CHROMIUM_PATH)" : null;

describe.skipIf(skip !== null)(`conform.html in headless Chromium${skip === null ? "" : ` — skipped: ${skip}`}`, () => {
  let browser: Browser;
  let dir: string;
  beforeAll(async () => {
    const { chromium } = await import("playwright-core");
    browser = await chromium.launch({ executablePath: chromiumPath!, args: CHROMIUM_ARGS, timeout: 120_000 });
    dir = mkdtempSync(join(tmpdir(), "conform-html-"));
  }, limit(120_000));
  afterAll(async () => {
    await browser?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("plots the error per layer with the floor, the legend clear of the title and the plot", async () => {
    const rep = report();
    expect(rep.verdict.firstLayerOutside).toBe(3);
    const file = join(dir, "conform.html");
    writeFileSync(file, renderHtml(rep));
    const page = await browser.newPage({ viewport: { width: 1000, height: 900 } });
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(`file://${file}`);
    const plot = page.locator("#layer-plot");
    expect(await plot.locator("polyline.series").count()).toBe(12);
    expect(await plot.locator("polyline.floor").count()).toBe(1);
    expect(await plot.locator("line.first-outside").count()).toBe(1);
    expect(await page.locator(".verdict").textContent()).toBe("FLOOR NOT MEASURED");
    expect(await page.locator("#layers tr").count()).toBe(1 + 8); // header + in, 0..5, out
    expect(await page.locator("#kinds tr").count()).toBe(1 + 5); // embed_scaled, input_layernorm, output, norm, logits
    expect(await page.locator("#kinds tr.bad").count()).toBe(4); // all but embed_scaled
    const title = (await plot.locator("text.title").boundingBox())!;
    const legend = await plot.locator("text.legend").evaluateAll((els) => els.map((e) => e.getBoundingClientRect().toJSON() as { x: number; y: number; width: number; height: number }));
    expect(legend.length).toBe(12 + 1 + 1); // 12 calls, the floor, "+2 calls"
    const grid = await plot.locator("line.grid").evaluateAll((els) => els.map((e) => e.getBoundingClientRect().top));
    const plotTop = Math.min(...grid);
    let checked = 0;
    for (const [i, b] of legend.entries()) {
      expect(overlap(b, title), `legend item ${i} overlaps the title`).toBe(false);
      expect(b.y + b.height, `legend item ${i} reaches into the plot`).toBeLessThanOrEqual(plotTop);
      for (const c of legend.slice(i + 1)) expect(overlap(b, c), `legend items overlap`).toBe(false);
      checked++;
    }
    expect(checked).toBe(14);
    expect(errors).toEqual([]);
    await page.close();
  }, limit(120_000));
});
