// oracle/conform/metrics.ts against numpy: every metric (max abs, max float32 ULP, relative L2,
// cosine; KL, top-1, top-k overlap, |Δp| of the oracle's top token) on the same seeded inputs,
// computed by numpy in the oracle's Python (suites/conform/metrics_ref.py) from the same bytes.
// Edge cases: identical tensors, zero vectors, one changed element, bfloat16 / float16 inputs,
// logprobs in place of logits, (1, V) against (1, 1, V) rows, a vocabulary smaller than k.
import { describe, expect, it } from "vitest";
import { firstDifferingStep, logitMetrics, type LogitMetrics, logSoftmax, rawFromFloat64, type RawTensor, tensorMetrics, type TensorMetrics } from "../../oracle/conform/metrics.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { join } from "node:path";

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function normals(n: number, seed: number, scale = 1): Float64Array {
  const u = rng(seed);
  return Float64Array.from({ length: n }, () => scale * Math.sqrt(-2 * Math.log(1 - u())) * Math.cos(2 * Math.PI * u()));
}

const f32 = (v: ArrayLike<number>, shape: number[]) => rawFromFloat64(v, shape, "float32");
const bf16 = (v: ArrayLike<number>, shape: number[]) => rawFromFloat64(v, shape, "bfloat16");
function f16(v: ArrayLike<number>, shape: number[]): RawTensor {
  return { dtype: "float16", shape, data: new Uint8Array(new Float16Array(Array.from(v)).buffer) };
}
const plus = (a: Float64Array, b: Float64Array) => a.map((x, i) => x + b[i]!);

interface Case { name: string; kind: "tensor" | "logits"; a: RawTensor; b: RawTensor; k?: number }

const T = [2, 3, 64];
const nT = 2 * 3 * 64;
const base = normals(nT, 1);
const changed = Float64Array.from(base);
changed[77] = changed[77]! + 0.5;
const V = 50;
const logitsB = normals(4 * V, 7, 3);
const logitsA = plus(logitsB, normals(4 * V, 8, 0.3));
const logprobsA = Float64Array.from({ length: 4 * V }, (_, i) => logSoftmax(logitsA.subarray(Math.floor(i / V) * V, Math.floor(i / V) * V + V))[i % V]!);
const small = normals(2 * 6, 11, 2);

const CASES: Case[] = [
  { name: "random f32", kind: "tensor", a: f32(plus(base, normals(nT, 2, 1e-3)), T), b: f32(base, T) },
  { name: "identical", kind: "tensor", a: f32(base, T), b: f32(base, T) },
  { name: "both zero", kind: "tensor", a: f32(new Float64Array(8), [8]), b: f32(new Float64Array(8), [8]) },
  { name: "zero oracle", kind: "tensor", a: f32(normals(8, 3), [8]), b: f32(new Float64Array(8), [8]) },
  { name: "zero engine", kind: "tensor", a: f32(new Float64Array(8), [8]), b: f32(normals(8, 3), [8]) },
  { name: "one changed element", kind: "tensor", a: f32(changed, T), b: f32(base, T) },
  { name: "bf16 engine vs f32 oracle", kind: "tensor", a: bf16(base, T), b: f32(base, T) },
  { name: "bf16 both", kind: "tensor", a: bf16(plus(base, normals(nT, 4, 0.05)), T), b: bf16(base, T) },
  { name: "f16 engine vs f32 oracle", kind: "tensor", a: f16(base, T), b: f32(base, T) },
  { name: "logits f32", kind: "logits", a: f32(logitsA, [1, 4, V]), b: f32(logitsB, [1, 4, V]) },
  { name: "logprobs engine", kind: "logits", a: f32(logprobsA, [1, 4, V]), b: f32(logitsB, [1, 4, V]) },
  { name: "logits identical", kind: "logits", a: f32(logitsB, [1, 4, V]), b: f32(logitsB, [1, 4, V]) },
  { name: "logits bf16 engine", kind: "logits", a: bf16(logitsA, [1, 4, V]), b: f32(logitsB, [1, 4, V]) },
  { name: "step row (1,V) vs (1,1,V)", kind: "logits", a: f32(logitsA.subarray(0, V), [1, V]), b: f32(logitsB.subarray(0, V), [1, 1, V]) },
  { name: "vocab 6 < k", kind: "logits", a: f32(plus(small, normals(12, 12, 0.5)), [2, 6]), b: f32(small, [2, 6]) },
  { name: "top-3", kind: "logits", a: f32(logitsA, [4, V]), b: f32(logitsB, [4, V]), k: 3 },
];

function numpyResults(cases: Case[]): Record<string, Record<string, number | string>> {
  const wire = cases.map((c) => ({ name: c.name, kind: c.kind, k: c.k, a: { ...c.a, b64: Buffer.from(c.a.data).toString("base64"), data: undefined }, b: { ...c.b, b64: Buffer.from(c.b.data).toString("base64"), data: undefined } }));
  const p = Bun.spawnSync([join(REPO_ROOT, ".venv", "bin", "python"), "-I", join(REPO_ROOT, "suites", "conform", "metrics_ref.py")], { stdin: Buffer.from(JSON.stringify(wire)), stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`metrics_ref.py failed: ${p.stderr.toString()}`);
  return JSON.parse(p.stdout.toString());
}

/** Float metrics agree to 1e-12 relative (summation order differs from numpy's pairwise sums); counts exactly. */
function expectClose(name: string, got: TensorMetrics | LogitMetrics, want: Record<string, number | string>): number {
  let n = 0;
  for (const [key, w] of Object.entries(want)) {
    const g = (got as unknown as Record<string, number>)[key];
    const expected = w === "Infinity" ? Infinity : (w as number);
    if (!Number.isFinite(expected) || Number.isInteger(expected)) expect(g, `${name}: ${key}`).toBe(expected);
    else expect(Math.abs(g! - expected), `${name}: ${key} = ${g}, numpy ${expected}`).toBeLessThanOrEqual(1e-12 * Math.max(1, Math.abs(expected)));
    n++;
  }
  return n;
}

describe("conformance metrics against numpy", () => {
  const ours = new Map(CASES.map((c) => [c.name, c.kind === "tensor" ? tensorMetrics(c.a, c.b) : logitMetrics(c.a, c.b, c.k)]));
  const np = numpyResults(CASES);

  it("every case agrees with numpy, metric by metric", () => {
    let checked = 0;
    for (const c of CASES) checked += expectClose(c.name, ours.get(c.name)!, np[c.name]!);
    // 9 tensor cases × 5 values + 7 logit cases × 9 values
    expect(checked).toBe(9 * 5 + 7 * 9);
  });

  it("edge cases take their defined values", () => {
    const id = ours.get("identical") as TensorMetrics;
    expect([id.maxAbs, id.maxUlp, id.relL2, id.cosine]).toEqual([0, 0, 0, 1]);
    expect((ours.get("both zero") as TensorMetrics).cosine).toBe(1);
    expect((ours.get("zero oracle") as TensorMetrics).relL2).toBe(Infinity);
    expect((ours.get("zero engine") as TensorMetrics).cosine).toBe(0);
    const one = ours.get("one changed element") as TensorMetrics;
    expect(one.maxAbs).toBeCloseTo(0.5, 6);
    expect(one.maxUlp).toBeGreaterThan(0);
    const lid = ours.get("logits identical") as LogitMetrics;
    expect([lid.klMean, lid.klMax, lid.top1, lid.topkOverlap, lid.dpTopMax]).toEqual([0, 0, 1, 1, 0]);
    expect((ours.get("vocab 6 < k") as LogitMetrics).k).toBe(6);
  });

  it("logprobs in place of logits give the same distribution metrics", () => {
    const fromLogits = ours.get("logits f32") as LogitMetrics;
    const fromLogprobs = ours.get("logprobs engine") as LogitMetrics;
    expect(fromLogprobs.top1).toBe(fromLogits.top1);
    expect(fromLogprobs.topkOverlap).toBe(fromLogits.topkOverlap);
    // the engine's side went through float32 as log-probabilities: equal to float32 rounding
    expect(Math.abs(fromLogprobs.klMean - fromLogits.klMean)).toBeLessThan(1e-5);
    expect(fromLogits.klMean).toBeGreaterThan(0);
  });

  it("first differing greedy step", () => {
    expect(firstDifferingStep([1, 2, 3], [1, 2, 3])).toBeNull();
    expect(firstDifferingStep([1, 2, 4], [1, 2, 3])).toBe(2);
    expect(firstDifferingStep([5, 2, 3], [1, 2, 3])).toBe(0);
    expect(firstDifferingStep([1, 2], [1, 2, 3])).toBe(2);
  });

  it("refuses tensors of different sizes", () => {
    expect(() => tensorMetrics(f32([1, 2], [2]), f32([1, 2, 3], [3]))).toThrow(/2 elements \[2\] vs the oracle's 3 \[3\]/);
    expect(() => logitMetrics(f32([1, 2], [1, 2]), f32([1, 2, 3], [1, 3]))).toThrow(/vocabulary 2 vs the oracle's 3/);
  });
});
