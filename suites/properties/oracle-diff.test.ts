// Differential properties against the live oracle (mlx-lm's own KVCache / RotatingKVCache and
// mask functions): see oracle-diff-lib.ts.
import { beforeAll, describe, it } from "vitest";
import fc from "fast-check";
import { arbKV, arbMask, arbRot, maskCase, runDiff, runMetaDiff, useOracle } from "./oracle-diff-lib.ts";
import { checkProperty, propertyTimeout } from "./harness.ts";
import { limit } from "../../tests/time_limit.ts";

beforeAll(async () => {
  await useOracle();
}, limit(120_000));

describe("caches vs the live oracle (mlx-lm 0.32.2 cache.py)", () => {
  it("RotatingKVCache: random chunks S∈1..3W and trims → identical keys/values/masks/state bytes", async () => {
    await checkProperty("oracle-rotating-cache-ops", fc.asyncProperty(arbRot, async (s) => void (await runDiff(s))));
  }, propertyTimeout(180_000));

  it("KVCache: random chunks S∈1..600 and trims → identical keys/values/masks/state bytes", async () => {
    await checkProperty("oracle-kvcache-ops", fc.asyncProperty(arbKV, async (s) => void (await runDiff(s))));
  }, propertyTimeout(180_000));

  it("cache scalars (offset, keep, max_size, _idx) and buffer shapes identical after every op", async () => {
    await checkProperty("oracle-cache-meta-every-op", fc.asyncProperty(fc.oneof(arbRot, arbKV), async (s) => runMetaDiff(s)));
  }, propertyTimeout(180_000));
});

describe("masks vs the live oracle (base.py / cache.py)", () => {
  it("random window sizes, offsets and prompt lengths → identical mask kind, shape and bytes", async () => {
    await checkProperty(
      "oracle-masks",
      fc.asyncProperty(arbMask, maskCase),
    );
  }, propertyTimeout(120_000));
});
