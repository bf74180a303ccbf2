// oracle/conform/verdict.ts and tensor_compare.ts on synthetic comparisons (no oracle): the
// noise floor file's checks; the verdict's status rules (bit-exact and value-exact runs conform
// without a floor; a placeholder floor never lets another run be called CONFORMS; a measured one
// judges by relative L2 and, on logits, KL; a logprobs without a floor of its own by KL only;
// --strict wants bytes); the first tensor and layer outside the floor in execution order; one
// tensor's comparison (bit-exact count for the same dtype, (1,V) against (1,1,V) rows, logprobs
// against logits by KL only, token ids); masks given as kinds; the MoE top-k order, put into mlx-lm's token by token (a token
// whose expert set differs is left as it is and listed).
import { describe, expect, it } from "vitest";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { logSoftmax, rawFromFloat64, type RawTensor } from "../../oracle/conform/metrics.ts";
import { compareMask, compareTensor, isIdentityOrder, materializeMask, reorderTopK, type TensorComparison, topkPermutation } from "../../oracle/conform/tensor_compare.ts";
import { exitCodeOf, floorFor, judge, loadNoiseFloor, type NoiseFloor, NOISE_FLOOR_SCHEMA, NoiseFloorError } from "../../oracle/conform/verdict.ts";

const MEASURED: NoiseFloor = {
  schema: NOISE_FLOOR_SCHEMA, status: "measured",
  measured: { what: "synthetic floor of this test", where: "this test", when: "never", versions: {} },
  kinds: { output: { rel_l2: 1e-5 }, logits: { rel_l2: 1e-4, kl: 1e-8 } }, default: { rel_l2: 1e-6 },
};
const PLACEHOLDER: NoiseFloor = { ...MEASURED, status: "placeholder", measured: null };

function c(name: string, layer: number | null, kind: string, relL2: number, extra: Partial<TensorComparison> = {}): TensorComparison {
  return {
    name, oracleName: name, call: "forward", layer, kind, engineDtype: "float32", oracleDtype: "float32", shape: [1, 2, 4], mismatches: relL2 ? 3 : 0, total: 8,
    bitExact: relL2 === 0, exact: relL2 === 0, metrics: { n: 8, maxAbs: relL2, maxUlp: relL2 ? 5 : 0, relL2, cosine: 1 }, ...extra,
  };
}

const run = (errs: [number, number, number]) => [c("embed_scaled", null, "embed_scaled", errs[0]), c("layers.0/output", 0, "output", errs[1]), c("layers.1/output", 1, "output", errs[2])];

describe("the verdict", () => {
  it("a bit-exact run conforms against either floor; exit 0", () => {
    for (const f of [MEASURED, PLACEHOLDER]) {
      const v = judge(run([0, 0, 0]), f);
      expect(v.status).toBe("CONFORMS");
      expect(v.headline).toBe("CONFORMS (every tensor bit-exact)");
      expect(exitCodeOf(v)).toBe(0);
    }
  });

  it("within a measured floor conforms; within a placeholder floor is 'floor not measured', exit 1", () => {
    const m = judge(run([5e-7, 5e-6, 9e-6]), MEASURED);
    expect(m.status).toBe("CONFORMS");
    expect(m.firstOutside).toBeNull();
    const p = judge(run([5e-7, 5e-6, 9e-6]), PLACEHOLDER);
    expect(p.status).toBe("FLOOR_NOT_MEASURED");
    expect(p.headline).toMatch(/^floor not measured/);
    expect(exitCodeOf(p)).toBe(1);
  });

  it("names the first tensor and layer outside, in execution order", () => {
    const v = judge(run([5e-7, 2e-5, 1e-3]), MEASURED);
    expect(v.status).toBe("DIVERGES");
    expect(v.firstOutside?.name).toBe("layers.0/output");
    expect(v.firstLayerOutside).toBe(0);
    expect(v.headline).toBe("DIVERGES at layers.0/output (layer 0): rel L2 2.00e-5 > floor 1.00e-5 (output)");
    expect(v.layers.map((l) => [l.slot, l.within])).toEqual([["in", true], ["0", false], ["1", false]]);
    // against the placeholder: the same names, no DIVERGES either
    const p = judge(run([5e-7, 2e-5, 1e-3]), PLACEHOLDER);
    expect([p.status, p.firstOutside?.name, p.firstLayerOutside]).toEqual(["FLOOR_NOT_MEASURED", "layers.0/output", 0]);
    // a model-level tap first: named, and the first layer outside is the next one
    const e = judge(run([1e-5, 0, 1e-3]), MEASURED);
    expect([e.firstOutside?.name, e.firstLayerOutside]).toEqual(["embed_scaled", 1]);
  });

  it("logits are judged by KL as well; logprobs against logits by KL only", () => {
    const logit = (kl: number) => c("logits", null, "logits", 1e-5, { logits: { rows: 2, vocab: 4, klMean: kl, klMax: kl, top1: 1, k: 4, topkOverlap: 1, dpTopMean: 0, dpTopMax: 0 } });
    expect(judge([logit(1e-9)], MEASURED).status).toBe("CONFORMS");
    const v = judge([logit(1e-6)], MEASURED);
    expect(v.status).toBe("DIVERGES");
    expect(v.tensors[0]!.reason).toBe("KL 1.00e-6 > floor 1.00e-8 (logits)");
    // a logprobs kind falls back on the logits floor (judged by KL only then), then the default
    expect(floorFor(MEASURED, "logprobs").key).toBe("logits");
    const stepLp = (relL2: number, kl: number) => ({ ...logit(kl), name: "step0/logprobs", kind: "logprobs", metrics: { n: 8, maxAbs: relL2, maxUlp: 9, relL2, cosine: 1 } });
    expect(judge([stepLp(1e-3, 1e-9)], MEASURED).status).toBe("CONFORMS");
    expect(judge([stepLp(1e-3, 1e-6)], MEASURED).status).toBe("DIVERGES");
    expect(judge([stepLp(1e-3, 1e-9)], { ...MEASURED, kinds: { ...MEASURED.kinds, logprobs: { rel_l2: 1e-4, kl: 1e-8 } } }).status).toBe("DIVERGES");
    expect(floorFor(MEASURED, "mlp/down_proj").key).toBe("default");
    // with no KL floor recorded, only KL 0 is within
    const noKl = { ...MEASURED, kinds: {} };
    const lp = (kl: number) => ({ ...logit(kl), name: "logprobs", kind: "logprobs", metrics: undefined, bitExact: false, exact: false, mismatches: null });
    expect(judge([lp(0)], noKl).status).toBe("CONFORMS");
    expect(judge([lp(1e-12)], noKl).status).toBe("DIVERGES");
  });

  it("--strict passes bit-exact tensors only; NaN is outside; a differing greedy token diverges", () => {
    expect(judge(run([0, 5e-6, 0]), MEASURED, { strict: true }).status).toBe("DIVERGES");
    expect(judge(run([0, 0, 0]), PLACEHOLDER, { strict: true }).status).toBe("CONFORMS");
    expect(judge(run([0, Number.NaN, 0]), MEASURED).firstOutside?.name).toBe("layers.0/output");
    const t = judge(run([0, 5e-6, 0]), MEASURED, { firstTokenDiff: 2 });
    expect([t.status, t.headline]).toEqual(["DIVERGES", "DIVERGES: greedy tokens differ from step 2"]);
    expect(judge([], MEASURED).status).toBe("DIVERGES");
  });
});

describe("the noise floor file", () => {
  it("the repository's file loads, and a placeholder records no measurement", () => {
    const f = loadNoiseFloor();
    if (f.status === "placeholder") expect(f.measured).toBeNull();
    else expect(f.measured!.what.length).toBeGreaterThan(0);
  });

  it("a malformed file is one NoiseFloorError naming the field", () => {
    const dir = mkdtempSync(join(tmpdir(), "floor-"));
    try {
      const bad: [unknown, RegExp][] = [
        [{ ...MEASURED, schema: "x" }, /schema must be "gemma4-conform-noise-floor\/1"/],
        [{ ...MEASURED, measured: null }, /a measured floor needs measured \{what, where, when, versions\}/],
        [{ ...MEASURED, kinds: { output: { rel_l2: -1 } } }, /kinds\["output"\]\.rel_l2 must be a number ≥ 0/],
        [{ ...MEASURED, default: { rel_l2: 1, kl: "x" } }, /default\.kl must be a number ≥ 0/],
        [{ ...MEASURED, status: "guessed" }, /status must be "measured" or "placeholder"/],
      ];
      let n = 0;
      for (const [j, re] of bad) {
        const p = join(dir, `f${n++}.json`);
        writeFileSync(p, JSON.stringify(j));
        expect(() => loadNoiseFloor(p)).toThrow(NoiseFloorError);
        expect(() => loadNoiseFloor(p)).toThrow(re);
      }
      writeFileSync(join(dir, "nj.json"), "{");
      expect(() => loadNoiseFloor(join(dir, "nj.json"))).toThrow(/not JSON/);
      expect(n).toBe(5);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("one tensor against the oracle's", () => {
  const where = (kind: string) => ({ call: "step0", layer: null, kind });
  const logits = Float64Array.from({ length: 8 }, (_, i) => Math.sin(i + 1) * 3);
  it("same dtype: the bit-exact count, and a (1,V) row against a (1,1,V) one", () => {
    const a = rawFromFloat64(logits, [1, 8], "float32");
    const b = rawFromFloat64(logits, [1, 1, 8], "float32");
    const same = compareTensor("step0/logits", where("logits"), a, "step0/logits", b);
    expect([same.bitExact, same.exact, same.mismatches, same.logits!.klMax]).toEqual([true, true, 0, 0]);
    const off = Float64Array.from(logits);
    off[3] = off[3]! + 0.25;
    const d = compareTensor("step0/logits", where("logits"), rawFromFloat64(off, [1, 8], "float32"), "step0/logits", b);
    expect([d.bitExact, d.mismatches]).toEqual([false, 1]);
    expect(d.metrics!.maxAbs).toBeCloseTo(0.25, 6);
  });

  it("another dtype: no byte count, equal values are exact", () => {
    const v = Float64Array.from([1, -2, 0.5, 3]);
    const r = compareTensor("layers.0/output", { call: "forward", layer: 0, kind: "output" }, rawFromFloat64(v, [1, 1, 4], "float32"), "layers.0/output", rawFromFloat64(v, [1, 1, 4], "bfloat16"));
    expect([r.mismatches, r.bitExact, r.exact, r.metrics!.relL2]).toEqual([null, false, true, 0]);
  });

  it("logprobs against logits: KL / top-k only, no element-wise distance", () => {
    const lp = logSoftmax(logits);
    const r = compareTensor("logprobs", where("logprobs"), rawFromFloat64(lp, [1, 1, 8], "float32"), "logits", rawFromFloat64(logits, [1, 1, 8], "float32"));
    expect(r.metrics).toBeUndefined();
    expect(r.logits!.top1).toBe(1);
    expect(r.logits!.klMax).toBeLessThan(1e-12);
  });

  it("token ids compare by value across integer dtypes; element counts must agree", () => {
    const tok = (dtype: "int32" | "uint32", v: number): RawTensor => {
      const data = new Uint8Array(4);
      new DataView(data.buffer).setUint32(0, v, true);
      return { dtype, shape: [1], data };
    };
    expect(compareTensor("step0/token", where("token"), tok("int32", 7), "step0/token", tok("uint32", 7)).integerEqual).toBe(true);
    expect(compareTensor("step0/token", where("token"), tok("int32", 7), "step0/token", tok("uint32", 8)).integerEqual).toBe(false);
    const n = compareTensor("x", where("output"), rawFromFloat64([1, 2], [2], "float32"), "x", rawFromFloat64([1, 2, 3], [3], "float32"));
    expect(n.note).toBe("2 elements [2] vs the oracle's 3 [3]");
    expect(judge([n], MEASURED).status).toBe("DIVERGES");
  });
});

describe("masks given as a kind on either side", () => {
  const where = { call: "prefill1", layer: null, kind: "mask/full_attention" };
  it("'causal' is the lower-right-aligned causal mask; 'none' lets every query see every key", () => {
    // 3 queries after 2 cached keys: query i sees keys j <= 2 + i
    expect(Array.from(materializeMask("causal", [3, 5]).data)).toEqual([1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1]);
    expect(Array.from(materializeMask("none", [1, 2, 3]).data)).toEqual([1, 1, 1, 1, 1, 1]);
  });

  it("an engine's materialized causal mask equals mlx-lm's 'causal'; one shifted by one key does not", () => {
    const causal = materializeMask("causal", [1, 1, 4, 6]);
    const same = compareMask("prefill1/mask/full_attention", where, causal, "prefill1/mask/full_attention", "causal");
    expect([same.exact, same.bitExact, same.note]).toEqual([true, false, undefined]);
    // off by one: every query also sees the next key (query i sees j <= 3 + i); the last already sees all
    const off = { ...causal, data: Uint8Array.from({ length: 24 }, (_, e) => (e % 6 <= 3 + Math.floor(e / 6) ? 1 : 0)) };
    const d = compareMask("prefill1/mask/full_attention", where, off, "prefill1/mask/full_attention", "causal");
    expect(d.exact).toBe(false);
    expect(d.note).toBe("3 of 24 mask entries differ from the causal mask mlx-lm gives");
    expect(judge([d], MEASURED).firstOutside?.name).toBe("prefill1/mask/full_attention");
    // kinds against kinds, and an engine's kind against mlx-lm's array
    expect(compareMask("m", where, "causal", "m", "none").note).toBe("mask causal where mlx-lm has none");
    expect(compareMask("m", where, "none", "m", materializeMask("none", [2, 2])).exact).toBe(true);
    expect(compareMask("m", where, "causal", "m", materializeMask("none", [2, 2])).note).toBe("1 of 4 mask entries differ from the causal mask the engine gives");
  });
});

describe("the MoE router's top-k axis (its order is unspecified)", () => {
  const u32 = (v: number[], shape: number[]): RawTensor => ({ dtype: "uint32", shape, data: new Uint8Array(Uint32Array.from(v).buffer) });
  it("token by token: a token routed to another expert set is left as it is and listed, the others still get mlx-lm's order", () => {
    // 4 tokens × top-2: mlx-lm [5,1], [0,3], [2,7], [4,6]; the engine sorted each row, and token 1 picked {0,2}
    const oracle = u32([5, 1, 0, 3, 2, 7, 4, 6], [1, 4, 2]);
    const engine = u32([1, 5, 0, 2, 2, 7, 4, 6], [1, 4, 2]);
    const order = topkPermutation(engine, oracle)!;
    expect(order.differingRows).toEqual([1]);
    expect(Array.from(order.perm)).toEqual([1, 0, 0, 1, 0, 1, 0, 1]);
    expect(Array.from(new Uint32Array(reorderTopK(engine, order.perm).data.buffer))).toEqual([5, 1, 0, 2, 2, 7, 4, 6]);
    // a (B, L, K, H) tap of the same layer, equal to mlx-lm's on the three tokens whose sets agree:
    // after the reordering those three compare equal and only token 1 carries distance
    const want = rawFromFloat64([50, 51, 10, 11, 0, 1, 30, 31, 20, 21, 70, 71, 40, 41, 60, 61], [1, 4, 2, 2], "float32");
    const got = rawFromFloat64([10, 11, 50, 51, 0, 1, 99, 99, 20, 21, 70, 71, 40, 41, 60, 61], [1, 4, 2, 2], "float32");
    const r = reorderTopK(got, order.perm);
    expect(Array.from(new Float32Array(r.data.buffer))).toEqual([50, 51, 10, 11, 0, 1, 99, 99, 20, 21, 70, 71, 40, 41, 60, 61]);
    const where = { call: "forward", layer: 0, kind: "experts/switch_glu/down_proj" };
    const differ = (x: RawTensor) => {
      const a = new Float32Array(x.data.buffer);
      const b = new Float32Array(want.data.buffer);
      return [...a.keys()].filter((i) => a[i] !== b[i]);
    };
    expect(differ(r)).toEqual([6, 7]); // token 1's second expert only
    expect(compareTensor("layers.0/experts/switch_glu/down_proj", where, r, "layers.0/experts/switch_glu/down_proj", want).metrics!.relL2).toBeLessThan(
      compareTensor("layers.0/experts/switch_glu/down_proj", where, got, "layers.0/experts/switch_glu/down_proj", want).metrics!.relL2,
    );
  });

  it("the engine's experts are put into mlx-lm's order by id; shapes that do not line up are left alone", () => {
    // 2 tokens × top-2: mlx-lm [5,1], [0,3]; the engine sorted them [1,5], [0,3]
    const order = topkPermutation(u32([1, 5, 0, 3], [1, 2, 2]), u32([5, 1, 0, 3], [1, 2, 2]))!;
    const perm = order.perm;
    expect(Array.from(perm)).toEqual([1, 0, 0, 1]);
    expect(order.differingRows).toEqual([]);
    expect(isIdentityOrder(perm, 2)).toBe(false);
    // shapes that do not line up: nothing to reorder
    expect(topkPermutation(u32([1, 5, 0, 3], [1, 1, 4]), u32([5, 1, 0, 3], [1, 2, 2]))).toBeNull();
    // a (B, L, K, H) tensor follows: rows of H = 2 floats per expert
    const y = rawFromFloat64([10, 11, 50, 51, 0, 1, 30, 31], [1, 2, 2, 2], "float32");
    const r = reorderTopK(y, perm);
    expect(Array.from(new Float32Array(r.data.buffer))).toEqual([50, 51, 10, 11, 0, 1, 30, 31]);
    expect(Array.from(new Uint32Array(reorderTopK(u32([1, 5, 0, 3], [1, 2, 2]), perm).data.buffer))).toEqual([5, 1, 0, 3]);
  });
});
