// The gemma4_unified_assistant drafter (model/speculative/drafters/gemma4_unified_assistant/: mlx-vlm
// 0.7.10's package of that name, gemma4_assistant's model under its own model_type) through the MTP
// round loop against mlx-vlm, round by round (oracle/speculative.ts mtpParity: first token,
// logprobs and caches after the prefill; per round the block size, drafts, drafter logits, accepted
// count, target logits at every walked position and every cache after the rollback), its tokens
// against plain greedy decoding on the CPU device, and the drafter kind resolved from its
// model_type as mlx-vlm's resolve_drafter_kind does. The fixture is make_speculative_fixtures.py's
// c1_dense_unified_assistant (built with mlx-vlm's gemma4_unified_assistant classes).
// Sampled (mlx_vlm.generate --temp --seed: model/speculative/sampling.ts), three scenarios with
// temperature, top-k and top-p (SPEC_FULL=1 adds one on the centroid-head gemma4_assistant, whose
// sampled drafts skip its argmax), each with accepting and rejecting rounds: every round bit-exact as above plus the
// global random key after the walk, and the tokens equal TS plain sampled decoding with the same
// seed on the CPU device (one key per emitted token).
import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { ROWS_INVARIANT } from "./rows.ts";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { ModelPool, mtpParity, type SampledSpec } from "../../oracle/speculative.ts";
import { resolveDrafterKind } from "../../model/speculative/drafters/index.ts";
import { limit } from "../../tests/time_limit.ts";

const CK = join(REPO_ROOT, ".cache", "checkpoints");
const DRAFTER = join(CK, "speculative", "c1_dense_unified_assistant");
const pool = new ModelPool();
afterAll(() => pool.dispose());

describe("gemma4_unified_assistant (MTP) vs mlx-vlm", () => {
  it("its kind is mtp, from its model_type", () => {
    expect(resolveDrafterKind(DRAFTER)).toEqual({ kind: "mtp", modelType: "gemma4_unified_assistant" });
    // an explicit kind that disagrees is overridden, as mlx-vlm does (with a warning there)
    expect(resolveDrafterKind(DRAFTER, "dflash").kind).toBe("mtp");
  });

  it("dense target, P=3, 24 tokens: every round bit-exact, tokens = greedy", async () => {
    const prompt = [11, 48, 85];
    const r = await mtpParity(await sharedOracle(), pool, { target: join(CK, "c1_dense", "f32"), drafter: DRAFTER, prompt, maxTokens: 24 });
    console.log(`[gemma4_unified_assistant] ${r.rounds} rounds, ${r.vsOracle.tensors} tensors and ${r.vsOracle.values} values bit-exact vs mlx-vlm; accepted ${r.accepted}/${r.drafted}`);
    expect(r.vsOracle.first).toBeNull();
    expect(r.tokens.length).toBe(24);
    expect(r.acceptRounds).toBeGreaterThan(0);
    expect(r.rejectRounds).toBeGreaterThan(0);
    if (ROWS_INVARIANT) expect(r.vsGreedy.first).toBeNull();
  }, limit(120_000));
});

describe("sampled MTP vs mlx-vlm, round by round", () => {
  const scenarios: { label: string; drafter: string; fx: string; sampling: SampledSpec }[] = [
    { label: "unified assistant, temp 0.1", drafter: DRAFTER, fx: "c1_dense", sampling: { temp: 0.1, seed: 3 } },
    { label: "unified assistant, temp 0.3 top-k 3", drafter: DRAFTER, fx: "c1_dense", sampling: { temp: 0.3, topK: 3, seed: 7 } },
    { label: "unified assistant, temp 0.1 top-p 0.9 min-p 0.05", drafter: DRAFTER, fx: "c1_dense", sampling: { temp: 0.1, topP: 0.9, minP: 0.05, seed: 3 } },
    ...(process.env.SPEC_FULL === "1" ? [{ label: "gemma4_assistant centroid head (E2B-like), temp 0.5 top-p 0.5", drafter: join(CK, "speculative", "c3_e2b_assistant_ordered"), fx: "c3_e2b", sampling: { temp: 0.5, topP: 0.5, seed: 1 } }] : []),
  ];
  let ran = 0;
  for (const s of scenarios) {
    it(s.label, async () => {
      const r = await mtpParity(await sharedOracle(), pool, { target: join(CK, s.fx, "f32"), drafter: s.drafter, prompt: [11, 48, 85], maxTokens: 20, sampling: s.sampling });
      ran++;
      console.log(`[sampled MTP] ${s.label}: ${r.rounds} rounds, ${r.vsOracle.tensors} tensors and ${r.vsOracle.values} values bit-exact vs mlx-vlm; accepted ${r.accepted}/${r.drafted}`);
      expect(r.vsOracle.first).toBeNull();
      expect(r.tokens.length).toBe(20);
      expect(r.acceptRounds).toBeGreaterThan(0);
      expect(r.rejectRounds).toBeGreaterThan(0);
      if (ROWS_INVARIANT) expect(r.vsGreedy.first).toBeNull(); // = plain sampled decoding, same seed
    }, limit(120_000));
  }
  it("ran every scenario", () => expect(ran).toBe(scenarios.length));
});
