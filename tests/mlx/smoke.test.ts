import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";

describe("binding smoke", () => {
  it("reports the pinned libmlx version", () => {
    expect(mx.version()).toBe("0.32.4");
  });

  it("round-trips bytes and shape", () => {
    using a = mx.array(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    using t = mx.transpose(a);
    expect(t.shape).toEqual([3, 2]);
    expect(Array.from(t.toTypedArray() as Float32Array)).toEqual([1, 4, 2, 5, 3, 6]);
  });
});
