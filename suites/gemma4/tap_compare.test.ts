// The failure report of the tap comparison: first divergent tap in execution order, with
// mismatch count, first differing index, max abs diff and max ULP; order/missing/extra/kind.
import { describe, expect, it } from "vitest";
import { compareTapLists, formatVerdict, type TapData, toTapData } from "./tap_compare.ts";

const f32 = (name: string, vals: number[], shape = [vals.length]): TapData => ({
  name,
  kind: "array",
  dtype: "float32",
  shape,
  data: new Uint8Array(new Float32Array(vals).buffer),
});

describe("tap comparison verdicts", () => {
  const base = [f32("a", [1, 2, 3, 4], [2, 2]), { name: "mask/full_attention", kind: "str", value: "causal" } as TapData, f32("b", [5, 6])];

  it("identical lists", () => {
    const v = compareTapLists(base, base);
    expect(v).toMatchObject({ ok: true, compared: 3, arrays: 2 });
    expect(formatVerdict("x", v)).toBe("x: 3 taps bit-identical");
  });

  it("names the first divergent tap with its statistics", () => {
    const ours = [base[0]!, base[1]!, f32("b", [5, 6 + 4 * 2 ** -21])];
    const theirsB = [...base.slice(0, 2), f32("b", [5, 6])];
    const bad = [f32("a", [1, 2, 3.5, 4.25], [2, 2]), base[1]!, ours[2]!];
    const v = compareTapLists(bad, theirsB);
    expect(v.ok).toBe(false);
    expect(v.first).toMatchObject({ index: 0, name: "a", reason: "value" });
    expect(v.first!.diff).toMatchObject({ mismatches: 2, firstIndex: 2, firstIndexNd: [1, 0], maxAbs: 0.5 });
    const msg = formatVerdict("ck scn", v);
    expect(msg).toContain('first divergent tap #0 "a"');
    expect(msg).toContain("2/4 elements differ");
    expect(msg).toMatch(/max ULP \d+/);
    const v2 = compareTapLists(ours, theirsB);
    expect(v2.first).toMatchObject({ index: 2, name: "b" });
    expect(v2.first!.diff!.maxUlp).toBe(4);
  });

  it("order, missing, extra, kind, dtype", () => {
    expect(compareTapLists([base[1]!, base[0]!, base[2]!], base).first).toMatchObject({ index: 0, name: "a", reason: "name" });
    expect(compareTapLists(base.slice(0, 2), base).first).toMatchObject({ index: 2, name: "b", reason: "missing" });
    expect(compareTapLists([...base, f32("c", [1])], base).first).toMatchObject({ index: 3, name: "c", reason: "extra" });
    expect(compareTapLists([base[0]!, { name: "mask/full_attention", kind: "none" }, base[2]!], base).first).toMatchObject({ index: 1, reason: "kind" });
    const bf = { ...base[2]!, dtype: "bfloat16", data: new Uint8Array(4) };
    expect(compareTapLists([base[0]!, base[1]!, bf], base).first).toMatchObject({ index: 2, reason: "dtype/shape" });
  });

  it("a no-cache offset is an int32 scalar marked python_int", () => {
    const t = toTapData("layers.0/self_attn/offset", 0);
    expect(t).toMatchObject({ kind: "array", dtype: "int32", shape: [], meta: { python_int: true } });
    const arr = { ...t, meta: { python_int: false } };
    expect(compareTapLists([t], [arr]).first).toMatchObject({ reason: "python_int" });
  });
});

describe("cross-platform ULP budget (goldens from another fingerprint)", () => {
  it("float taps within the budget match, beyond it fail; ints stay exact", () => {
    const a = f32("x", [1, 2]);
    const b = f32("x", [1, 2 + 3 * 2 ** -22]);
    expect(compareTapLists([b], [a]).ok).toBe(false);
    expect(compareTapLists([b], [a], { float32: 4 }).ok).toBe(true);
    expect(compareTapLists([b], [a], { float32: 2 }).ok).toBe(false);
    const i = (v: number): TapData => ({ name: "i", kind: "array", dtype: "int32", shape: [1], data: new Uint8Array(new Int32Array([v]).buffer) });
    expect(compareTapLists([i(1)], [i(2)], { float32: 64 }).ok).toBe(false);
  });

  it("an integer dtype's budget is an absolute difference (a measured one has them), never passed by a ULP of 0", () => {
    const u = (v: number): TapData => ({ name: "router/inds", kind: "array", dtype: "uint32", shape: [1], data: new Uint8Array(new Uint32Array([v]).buffer) });
    // an integer has no ULP: a budget of 0 for its dtype keeps it exact
    expect(compareTapLists([u(3)], [u(5)], { uint32: 0 }).ok).toBe(false);
    expect(compareTapLists([u(3)], [u(5)], { uint32: 1 }).ok).toBe(false);
    expect(compareTapLists([u(3)], [u(5)], { uint32: 2 }).ok).toBe(true);
    expect(compareTapLists([u(5)], [u(5)], { uint32: 0 }).ok).toBe(true);
  });
});
