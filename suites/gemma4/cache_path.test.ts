// The model's cache path, tap by tap: every model call mlx-lm's generate_step makes (prefill
// chunks, then the N=1 steps) is replayed on the TS model with model/cache's KVCache /
// RotatingKVCache, feeding each call exactly the ids (and id dtype: int32 prompt chunks, uint32
// argmax feedback) the oracle recorded. Every model tap of every call must be byte-identical
// (cache_keys/cache_values, offsets read before the update, masks from the caches, shared-layer
// reuse). The sampler taps (logprobs, token) belong to the generation suites and are skipped.

import { describe, expect, it } from "vitest";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { type CallRecord, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { loadGolden, readManifest } from "../../oracle/golden.ts";
import { KVCache, type KVCacheLike, RotatingKVCache } from "../../model/cache/index.ts";
import { loadModel, prefixed } from "../../model/gemma4/index.ts";
import { compareTapLists, formatVerdict, fromOracle, TapCollector, type TapData } from "./tap_compare.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints");
const factory = {
  kvCache: (): KVCacheLike => new KVCache(),
  rotatingKVCache: (maxSize: number, keep: number): KVCacheLike => new RotatingKVCache(maxSize, keep),
};

// Cover: rotating-cache wrap with chunked prefill longer than the window, shared KV layers with
// caches, PLE, k_eq_v, MoE sorted (chunk of 36 × top-2 ≥ 64) and unsorted paths, quantized.
const CASES: [string, string][] = [
  ["c1_dense/f32", "gen_P21_S8"],
  ["c2_keqv/bf16", "gen_P21_S3"],
  ["c3_e2b/bf16", "gen_P9_S5"],
  ["c4_e4b/q4g64", "gen_P8_S3"],
  ["c5_moe/q4g32", "gen_P40_S36"],
  ["c6_sink/f32", "gen_P9_S3"],
  ["c7_defaults/bf16", "gen_P40_S8"],
];

const manifest = readManifest();
const totals = { calls: 0, taps: 0, golden: 0 };

/** The oracle's record of a scenario: the full golden dump when there is one, else a live capture. */
async function reference(ckpt: string, scn: string): Promise<{ calls: CallRecord[]; taps: TapData[]; source: string }> {
  const gid = `${ckpt}/${scn}`;
  const e = manifest?.entries[gid];
  if (e) {
    const g = loadGolden(gid);
    if (g.scenario.mode === "full" && g.scenario.calls) {
      return {
        calls: g.scenario.calls as unknown as CallRecord[],
        taps: g.taps.map((t) => fromOracle({ ...t, kind: t.kind ?? "array", array: g.arrays.get(t.name) })),
        source: "golden",
      };
    }
  }
  const cap = await (await sharedOracle()).capture(ckpt, scn, { mode: "full" });
  return { calls: cap.calls, taps: cap.taps.map(fromOracle), source: "live" };
}

describe("gemma4 cache path vs live mlx-lm generate_step", () => {
  for (const [ckpt, scn] of CASES) {
    it(`${ckpt} ${scn}`, async () => {
      const cap = await reference(ckpt, scn);
      const { model } = loadModel(join(CKPT, ckpt));
      const caches = model.makeCache(factory);
      try {
        const theirs = cap.taps.filter((t) => !/(^|\/)(logprobs|token)$/.test(t.name));
        const col = new TapCollector();
        for (const call of cap.calls) {
          const inTap = theirs.find((t) => t.name === `${call.prefix}inputs`);
          const dtype = (inTap?.dtype ?? "int32") as mx.Dtype;
          using x = mx.array(call.tokens.flat(), [call.batch, call.length], dtype);
          using logits = model.call(x, { cache: caches, taps: prefixed(col.sink, call.prefix) });
          mx.evaluate(logits, ...caches.flatMap((c) => c.state));
        }
        const v = compareTapLists(col.taps, theirs);
        if (!v.ok) throw new Error(formatVerdict(`${ckpt} ${scn}`, v));
        expect(v.ok).toBe(true);
        totals.calls += cap.calls.length;
        totals.taps += v.compared;
        if (cap.source === "golden") totals.golden++;
      } finally {
        for (const c of caches) c.dispose();
        for (const a of model.parameters().values()) a.dispose();
      }
    }, 120_000);
  }
  it("summary", () => {
    console.log(`[gemma4 cache path] ${CASES.length} generate scenarios, ${totals.calls} model calls, ${totals.taps} taps bit-identical (${totals.golden} scenarios from goldens, the rest live)`);
  });
});
