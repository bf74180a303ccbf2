// Ownership: a forward (with and without cache, with and without taps) leaves no native handle
// behind once the caller disposes what it owns (logits, caches): every intermediate is freed by
// the model itself, not left to the FinalizationRegistry backstop.
import { describe, expect, it } from "vitest";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { sharedOracle } from "../../oracle/client.ts";
import { loadModel } from "../../model/gemma4/index.ts";
import { cacheFactory, CKPT_ROOT } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

const oracle = await sharedOracle();
await oracle.request("make_checkpoints", { only: ["c6_sink/q4g32", "c3_e2b/bf16", "c5_moe/f32"] }, limit(600_000));

describe("no leaked handles", () => {
  for (const ckpt of ["c6_sink/q4g32", "c3_e2b/bf16", "c5_moe/f32"]) {
    it(ckpt, () => {
      const { model } = loadModel(join(CKPT_ROOT, ckpt));
      try {
        const ids = Array.from({ length: 40 }, (_, i) => (i * 37 + 11) % 256);
        const run = () => {
          using x = mx.array(ids, [1, 40], "int32");
          using l0 = model.call(x); // no cache, sorted MoE path where MoE
          mx.evaluate(l0);
          let seen = 0;
          using l1 = model.call(x, { taps: () => void seen++ });
          mx.evaluate(l1);
          const caches = model.makeCache(cacheFactory);
          for (const n of [9, 1, 1, 12, 1]) {
            using y = mx.array(ids.slice(0, n), [1, n], "int32");
            using l = model.call(y, { cache: caches });
            const st = caches.flatMap((c) => c.state); // caller-owned handles
            mx.evaluate(l, ...st);
            for (const a of st) a.dispose();
          }
          for (const c of caches) c.dispose();
        };
        run(); // warm-up: compiled helpers, RoPE tables are created once
        const before = mx.liveHandles();
        run();
        run();
        expect(mx.liveHandles()).toBe(before);
      } finally {
        model.dispose();
      }
    }, limit(60_000));
  }
});
