// Quantization scoring (bench/quant_score.ts) on one tiny fixture pair, c1_dense/q4g32 against its
// source c1_dense/bf16, over a seeded 64-token prompt through mlx-lm's capture (the oracle server):
// - the scorer's numbers equal a direct computation from the same two captures through
//   oracle/conform/metrics.ts (logitMetrics over the whole logits tensor: KL mean and max, top-1,
//   top-10 overlap, |Δp| mean and max; tensorMetrics per L1 tap: rel L2), and its KL median and
//   99th percentile equal numpy's percentile of the per-position KLs (each from logitMetrics on
//   one position's row);
// - a checkpoint scored against a second capture of itself: KL 0, top-1 1, every tap identical;
// - metrics.ts's one-pass topK (made for the E2B's 262,144-token rows) = a full sort's order on
//   seeded rows with ties and infinities;
// - a planted defect, a copy of c1_dense/f32 with layer 3's MLP gate projection scaled by 1.05,
//   is first seen at layers.3/output: embed_scaled and layers 0-2 bit-identical, layer 3 not
//   (the gate goes through the GELU; a scaled down-projection would be undone by the
//   post-feedforward RMS norm: measured rel L2 9e-6 at layer 3).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_PYTHON, type OracleClient, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { logitMetrics, type RawTensor, tensorMetrics, topK } from "../../oracle/conform/metrics.ts";
import { captureL1, percentile, type Score, scoreCaptures, seededPrompt } from "../../bench/quant_score.ts";
import { limit } from "../../tests/time_limit.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints");
const PROMPT = seededPrompt(64, 256, 24);

let oracle: OracleClient;
let tmp: string;
let source: Map<string, RawTensor>;
let quant: Map<string, RawTensor>;
let score: Score;
beforeAll(async () => {
  oracle = await sharedOracle();
  tmp = mkdtempSync(join(tmpdir(), "quant-score-"));
  source = await captureL1(oracle, join(CKPT, "c1_dense", "bf16"), PROMPT);
  quant = await captureL1(oracle, join(CKPT, "c1_dense", "q4g32"), PROMPT);
  score = scoreCaptures(quant, source);
}, limit(120_000));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** One position's row of a (1, L, V) tensor, as a (V,) tensor. */
function rowOf(t: RawTensor, r: number): RawTensor {
  const V = t.shape.at(-1)!;
  const b = t.data.length / t.shape.reduce((a, x) => a * x, 1);
  return { dtype: t.dtype, shape: [V], data: t.data.subarray(r * V * b, (r + 1) * V * b) };
}

/** numpy's percentile (default, linear) of the values. */
function numpyPercentiles(values: number[], qs: number[]): number[] {
  const code = "import json,sys,numpy as np; d=json.load(sys.stdin); print(json.dumps([float(np.percentile(np.array(d['v'],dtype=np.float64), q)) for q in d['q']]))";
  const r = spawnSync(DEFAULT_PYTHON, ["-c", code], { input: JSON.stringify({ v: values, q: qs }), encoding: "utf8" });
  if (r.status !== 0) throw new Error(`numpy: ${r.stderr}`);
  return JSON.parse(r.stdout) as number[];
}

describe("quantization scoring", () => {
  it("c1_dense/q4g32 vs bf16: the scorer's numbers = metrics.ts on the two captures", () => {
    const s = source.get("logits")!, q = quant.get("logits")!;
    expect(s.shape).toEqual([1, 64, 256]);
    const direct = logitMetrics(q, s);
    const l = score.logits;
    expect(l.rows).toBe(64);
    expect(l.klMean).toBe(direct.klMean);
    expect(l.klMax).toBe(direct.klMax);
    expect(l.top1).toBe(direct.top1);
    expect(l.topkOverlap).toBe(direct.topkOverlap);
    expect(l.dpTopMean).toBe(direct.dpTopMean);
    expect(l.dpTopMax).toBe(direct.dpTopMax);
    // a 4-bit quantization is not the source: the numbers measure something
    expect(l.klMean).toBeGreaterThan(0);
    const perRow = Array.from({ length: 64 }, (_, r) => logitMetrics(rowOf(q, r), rowOf(s, r)).klMean);
    const [p50, p99] = numpyPercentiles(perRow, [50, 99]);
    expect(l.klMedian).toBeCloseTo(p50!, 14);
    expect(l.klP99).toBeCloseTo(p99!, 14);
    // every L1 tap, in order: embed_scaled, the 6 layers, logits
    expect(score.taps.map((t) => t.tap)).toEqual(["embed_scaled", ...Array.from({ length: 6 }, (_, i) => `layers.${i}/output`), "logits"]);
    for (const t of score.taps) expect(t.relL2).toBe(tensorMetrics(quant.get(t.tap)!, source.get(t.tap)!).relL2);
    expect(score.firstDifferent).toBe("embed_scaled");
  });

  it("percentile is numpy's linear percentile", () => {
    const v = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.05].sort((a, b) => a - b);
    const qs = [0, 1, 50, 90, 99, 100];
    const np = numpyPercentiles(v, qs);
    qs.forEach((q, i) => expect(percentile(v, q)).toBeCloseTo(np[i]!, 15));
  });

  it("topK (one pass) = the k first of a full sort, larger first, lower index on a tie", () => {
    let seed = 11;
    const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 4294967296;
    let cases = 0;
    for (let t = 0; t < 400; t++) {
      const row = Float64Array.from({ length: 1 + Math.floor(rnd() * 40) }, () => {
        const u = rnd();
        return u < 0.1 ? Infinity : u < 0.2 ? -Infinity : u < 0.5 ? Math.floor(rnd() * 4) : rnd();
      });
      const sorted = Array.from(row.keys()).sort((i, j) => (row[j]! > row[i]! ? 1 : row[j]! < row[i]! ? -1 : i - j));
      for (const k of [1, 3, 10, 50]) {
        expect(topK(row, k)).toEqual(sorted.slice(0, k));
        cases++;
      }
    }
    expect(cases).toBe(1600);
  });

  it("a checkpoint against a second capture of itself: KL 0, top-1 1, every tap identical", async () => {
    const again = await captureL1(oracle, join(CKPT, "c1_dense", "q4g32"), PROMPT);
    const self = scoreCaptures(again, quant);
    expect(self.logits.klMean).toBe(0);
    expect(self.logits.klMax).toBe(0);
    expect(self.logits.top1).toBe(1);
    expect(self.logits.dpTopMax).toBe(0);
    expect(self.taps.length).toBe(8);
    for (const t of self.taps) expect([t.tap, t.identical, t.relL2]).toEqual([t.tap, true, 0]);
    expect(self.firstDifferent).toBeNull();
  }, limit(60_000));

  it("a planted defect (layer 3's gate_proj × 1.05 in a copy) shows up at layers.3/output first", async () => {
    const src = join(CKPT, "c1_dense", "f32");
    const bad = join(tmp, "c1_dense_l3x1.05");
    mkdirSync(bad);
    for (const f of ["config.json", "model.safetensors.index.json"]) copyFileSync(join(src, f), join(bad, f));
    const bytes = new Uint8Array(readFileSync(join(src, "model.safetensors")));
    const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n))) as Record<string, { dtype: string; data_offsets: [number, number] }>;
    const entry = header["model.layers.3.mlp.gate_proj.weight"];
    expect(entry?.dtype).toBe("F32");
    const [a, b] = entry!.data_offsets;
    const w = new Float32Array(bytes.buffer.slice(8 + n + a, 8 + n + b));
    for (let i = 0; i < w.length; i++) w[i]! *= 1.05;
    bytes.set(new Uint8Array(w.buffer), 8 + n + a);
    writeFileSync(join(bad, "model.safetensors"), bytes);

    const good = await captureL1(oracle, src, PROMPT);
    const planted = scoreCaptures(await captureL1(oracle, bad, PROMPT), good);
    expect(planted.firstDifferent).toBe("layers.3/output");
    const by = new Map(planted.taps.map((t) => [t.tap, t]));
    for (const t of ["embed_scaled", "layers.0/output", "layers.1/output", "layers.2/output"]) expect([t, by.get(t)!.identical]).toEqual([t, true]);
    expect(by.get("layers.3/output")!.relL2).toBeGreaterThan(1e-3);
    expect(planted.logits.klMean).toBeGreaterThan(0);
  }, limit(60_000));
});
