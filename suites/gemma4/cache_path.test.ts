// The model's cache path, tap by tap: every model call mlx-lm's generate_step makes (prefill
// chunks, then the N=1 steps) is replayed on the TS model with model/cache's KVCache /
// RotatingKVCache, feeding each call exactly the ids (and id dtype: int32 prompt chunks, uint32
// argmax feedback) the oracle recorded. Every model tap of every call must be byte-identical
// (cache_keys/cache_values, offsets read before the update, masks from the caches, shared-layer
// reuse). The sampler taps (logprobs, token) belong to the generation suites and are skipped.
// The reference is the golden full dump when golden/manifest.json has one recorded on this
// platform, else a live capture (goldens of another backend only bound the distance; the bar
// here is bytes). A checkpoint at a recorded MLX bug of this backend is counted apart.

import { describe, expect, it } from "vitest";
import { join } from "node:path";
import { loadModel } from "../../model/gemma4/index.ts";
import { atMlxBug, divergentTapOf, keepMlxBugNote } from "../../oracle/mlx_bugs.ts";
import { CKPT_ROOT, modelTapsOnly, reference, replayTaps } from "./run.ts";
import { compareTapLists, formatVerdict } from "./tap_compare.ts";
import { limit } from "../../tests/time_limit.ts";

// The golden full dumps of generate scenarios (golden/manifest.json full_dumps) cover: the
// rotating cache wrapping during decode (W = 8), a first prefill chunk longer than the window
// (36 > 8) then a re-linearising chunk, KV-shared layers with caches, PLE, k_eq_v, MoE sorted
// (36 × top-2 ≥ 64) and unsorted paths, 4-bit quantized, untied head without softcap.
// Scenarios without a golden full dump would be captured live (slow: every tap of ~25 calls).
const CASES: [string, string][] = [
  ["c1_dense/f32", "gen_P9_S5"],
  ["c3_e2b/bf16", "gen_P9_S5"],
  ["c5_moe/q4g32", "gen_P40_S36"],
  ["c6_sink/f32", "gen_P9_S3"],
];

const totals = { exact: 0, calls: 0, taps: 0, golden: 0 };
const atMlxBugs: string[] = [];

describe("gemma4 cache path vs mlx-lm generate_step", () => {
  for (const [ckpt, scn] of CASES) {
    it(`${ckpt} ${scn}`, async () => {
      const ref = await reference(ckpt, scn);
      const { model } = loadModel(join(CKPT_ROOT, ckpt));
      try {
        const theirs = modelTapsOnly(ref.taps);
        const v = compareTapLists(replayTaps(model, ref.calls, theirs), theirs);
        // counted apart only when the first divergent tap is produced by an op on a recorded MLX bug's path
        const note = v.ok ? null : atMlxBug(join(CKPT_ROOT, ckpt), formatVerdict(`${ckpt} ${scn} (${ref.source})`, v), divergentTapOf(v.first, theirs));
        if (note) {
          keepMlxBugNote(atMlxBugs, "gemma4 cache path", note);
          return;
        }
        if (!v.ok) throw new Error(formatVerdict(`${ckpt} ${scn} (${ref.source})`, v));
        expect(v.ok).toBe(true);
        totals.exact++;
        totals.calls += ref.calls.length;
        totals.taps += v.compared;
        expect(v.arrays, `${ckpt} ${scn}: tap arrays compared`).toBeGreaterThan(0);
        if (ref.source === "golden") totals.golden++;
      } finally {
        model.dispose();
      }
    }, limit(120_000));
  }
  it("summary", () => {
    console.log(
      `[gemma4 cache path] ${totals.exact}/${CASES.length} generate scenarios, ${totals.calls} model calls, ${totals.taps} taps bit-identical ` +
        `(${totals.golden} from goldens, the rest live)` +
        (atMlxBugs.length ? `; ${atMlxBugs.length} at recorded MLX bugs (named above)` : ""),
    );
  });
});
