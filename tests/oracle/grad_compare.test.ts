// The gradient-tree comparison names the divergent parameter (oracle/grad_compare.ts).
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { rawOf } from "../../oracle/compare.ts";
import { compareGrads, formatGradComparison } from "../../oracle/grad_compare.ts";

describe("compareGrads", () => {
  it("names the first divergent gradient by path, in tree and in backward order, and the missing/extra paths", () => {
    using a = mx.array([1, 2, 3], [3], "float32");
    using b = mx.array([0.5, 0.25], [2], "float32");
    using c = mx.array([4, 5], [2], "bfloat16");
    const ref = [
      ["layers.0.w", rawOf(a)],
      ["layers.1.w", rawOf(b)],
      ["head.w", rawOf(c)],
      ["gone", rawOf(b)],
    ] as const;
    // layers.0.w one ULP off in element 1, head.w off by a lot, an extra path
    const bumped = new Uint8Array(a.toBytes());
    new DataView(bumped.buffer).setUint32(4, new DataView(bumped.buffer).getUint32(4, true) + 1, true);
    using a2 = mx.fromBytes(bumped, [3], "float32");
    using c2 = mx.array([4, 6], [2], "bfloat16");
    using extra = mx.zeros([1]);
    const cmp = compareGrads({ layers: [{ w: a2 }, { w: b }], head: { w: c2 }, extra }, ref);
    expect(cmp.diffs.map((d) => [d.name, d.equal])).toEqual([["layers.0.w", false], ["layers.1.w", true], ["head.w", false]]);
    expect(cmp.first?.name).toBe("layers.0.w");
    expect(cmp.first?.maxUlp).toBe(1);
    expect(cmp.first?.firstIndex).toBe(1);
    expect(cmp.firstBackward?.name).toBe("head.w");
    expect(cmp.missing).toEqual(["gone"]);
    expect(cmp.extra).toEqual(["extra"]);
    const text = formatGradComparison(cmp);
    expect(text).toContain("gradients: 1/3 bit-exact");
    expect(text).toContain("first divergent in backward order: head.w");
  });
});
