// The failure report of the tap comparison: first divergent tap in execution order, with
// mismatch count, first differing index, max abs diff and max ULP; order/missing/extra/kind;
// an empty comparison refused; a golden entry failing on one element 1 ULP off.
import { describe, expect, it } from "vitest";
import { loadGolden, readManifest } from "../../oracle/golden.ts";
import { compareTapLists, formatVerdict, fromOracle, type TapData, toTapData } from "./tap_compare.ts";

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

describe("bit for bit, with nothing compared refused", () => {
  it("refuses two empty lists (a comparison of nothing is no pass)", () => {
    const v = compareTapLists([], []);
    expect(v).toMatchObject({ ok: false, compared: 0, first: { reason: "empty" } });
    expect(formatVerdict("x", v)).toContain("nothing was compared");
  });

  // The goldens' only bound is 0 (oracle/golden.ts goldenRule): a real golden entry matches
  // itself, and a planted change of 1 ULP in any float tap (or 1 in an integer tap) fails it.
  it("fails a golden entry with one element 1 ULP off, in a float32, a bfloat16, an int32 and a uint32 tap", () => {
    const m = readManifest();
    expect(m).toBeDefined();
    const planted: string[] = [];
    for (const id of ["c5_moe/f32/fwd_L13", "c3_e2b/bf16/fwd_L5"]) {
      const g = loadGolden(id);
      const theirs = g.taps.map((t) => fromOracle({ ...t, kind: t.kind ?? "array", array: g.arrays.get(t.name) }));
      expect(compareTapLists(theirs.map((t) => ({ ...t })), theirs)).toMatchObject({ ok: true, compared: theirs.length });
      for (const dtype of ["float32", "bfloat16", "int32", "uint32"]) {
        const k = theirs.findIndex((t) => t.dtype === dtype && t.data && t.data.byteLength > 0);
        if (k < 0) continue;
        const t = theirs[k]!;
        const data = new Uint8Array(t.data!); // a copy; bump the last element's low bits by one
        const w = dtype === "bfloat16" ? 2 : 4;
        const at = data.byteLength - w;
        const dv = new DataView(data.buffer);
        if (w === 2) dv.setUint16(at, dv.getUint16(at, true) + 1, true);
        else dv.setUint32(at, dv.getUint32(at, true) + 1, true);
        const ours = theirs.map((x, j) => (j === k ? { ...x, data } : x));
        const v = compareTapLists(ours, theirs);
        expect(v.first).toMatchObject({ index: k, name: t.name, reason: "value" });
        if (dtype.startsWith("float") || dtype === "bfloat16") expect(v.first!.diff!.maxUlp).toBe(1);
        else expect(v.first!.diff!.maxAbs).toBe(1);
        planted.push(`${id} ${dtype}`);
      }
    }
    expect(planted).toEqual(["c5_moe/f32/fwd_L13 float32", "c5_moe/f32/fwd_L13 int32", "c5_moe/f32/fwd_L13 uint32", "c3_e2b/bf16/fwd_L5 bfloat16", "c3_e2b/bf16/fwd_L5 int32"]);
  });
});
