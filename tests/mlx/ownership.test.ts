// Ownership: handles are freed (explicitly or by the FinalizationRegistry backstop), MLX memory
// returns to its baseline, RSS stays flat, and FFI results are never stale.
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { limit } from "../time_limit.ts";

const MB = 1024 * 1024;

async function settle(): Promise<void> {
  // FinalizationRegistry callbacks run on a later macrotask (Bun): collect, then yield. A GPU
  // backend releases buffers in its stream's completion handlers: synchronize runs them.
  mx.synchronize();
  for (let i = 0; i < 3; i++) {
    Bun.gc(true);
    await Bun.sleep(0);
  }
}

describe("ownership", () => {
  it("100,000 op calls: active memory back to baseline, RSS growth < 50 MB, no live handles left", async () => {
    await settle();
    mx.clearCache();
    const handles0 = mx.liveHandles();
    const active0 = mx.getActiveMemory();
    const rss0 = process.memoryUsage().rss;

    using x = mx.full([256], mx.pyFloat(1.5), "float32");
    using y = mx.full([256], mx.pyFloat(0.25), "float32");
    let calls = 0;
    let check = 0;
    for (let i = 0; i < 25_000; i++) {
      using a = mx.add(x, y);
      using b = mx.multiply(a, 2);
      using c = mx.subtract(b, x);
      using d = mx.sum(c);
      calls += 4;
      if (i % 250 === 0) {
        // evaluate some of them, so buffers are really allocated and released
        check += d.item() as number;
      }
    }
    expect(calls).toBe(100_000);
    expect(check).toBe(100 * 256 * 2);
    await settle();
    const active1 = mx.getActiveMemory();
    mx.clearCache();
    const rss1 = process.memoryUsage().rss;
    const handles1 = mx.liveHandles();
    console.log(
      `[ownership] 100000 op calls: MLX active memory ${active0} B -> ${active1} B (baseline +2 inputs of 1 KiB); ` +
        `RSS ${(rss0 / MB).toFixed(1)} MB -> ${(rss1 / MB).toFixed(1)} MB (growth ${((rss1 - rss0) / MB).toFixed(1)} MB); ` +
        `live handles ${handles0} -> ${handles1} (+2 inputs)`,
    );
    // the two inputs x, y are still alive (2 × 1 KiB); everything else is gone
    expect(active1).toBeLessThanOrEqual(active0 + 2 * 1024);
    expect(rss1 - rss0).toBeLessThan(50 * MB);
    expect(handles1).toBe(handles0 + 2);
  }, limit(120_000));

  it("arrays dropped without dispose() are freed by the FinalizationRegistry backstop", async () => {
    await settle();
    const handles0 = mx.liveHandles();
    const active0 = mx.getActiveMemory();
    (() => {
      using x = mx.ones([1024], "float32");
      for (let i = 0; i < 2_000; i++) {
        const leaked = mx.multiply(x, i); // never disposed
        if (i % 100 === 0) mx.evaluate(leaked);
      }
    })();
    expect(mx.liveHandles()).toBeGreaterThan(handles0);
    await settle();
    await settle();
    console.log(`[ownership] 2000 undisposed arrays: live handles back to ${mx.liveHandles()} (baseline ${handles0}); active ${mx.getActiveMemory()} B (baseline ${active0} B)`);
    expect(mx.liveHandles()).toBe(handles0);
    expect(mx.getActiveMemory()).toBeLessThanOrEqual(active0);
  }, limit(60_000));

  it("stale-read guard: 50,000 calls of one FFI path, every result checked", () => {
    // copy-out into caller memory (the path an out-parameter would take) with a changing value
    let bad = 0;
    for (let i = 0; i < 50_000; i++) {
      const v = (i * 7919) % 100_003;
      using s = mx.scalar(v, "int32");
      if (s.item() !== v) bad++;
    }
    expect(bad).toBe(0);
  });

  it("stale-read guard: 50,000 shape/dtype reads of alternating arrays, every result checked", () => {
    const arrays: MlxArray[] = [mx.zeros([3, 5], "float16"), mx.zeros([7], "int32"), mx.zeros([2, 1, 4], "bfloat16"), mx.zeros([], "bool")];
    const want = arrays.map((a) => [a.ndim, a.size, a.dtype] as const);
    const shapes = [[3, 5], [7], [2, 1, 4], []];
    let bad = 0;
    for (let i = 0; i < 50_000; i++) {
      const k = (i * 31) % 4;
      const a = arrays[k]!;
      const [nd, sz, dt] = want[k]!;
      if (a.ndim !== nd || a.size !== sz || a.dtype !== dt) bad++;
      // the shape getter is cached per array: read it through a fresh handle too
      if (i % 10 === 0) {
        using b = mx.alias(a);
        if (b.shape.join(",") !== shapes[k]!.join(",")) bad++;
      }
    }
    for (const a of arrays) a.dispose();
    expect(bad).toBe(0);
  });
});
