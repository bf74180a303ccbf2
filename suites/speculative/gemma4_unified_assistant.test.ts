// The gemma4_unified_assistant drafter (model/speculative/drafters/gemma4_unified_assistant/: mlx-vlm
// 0.7.10's package of that name, gemma4_assistant's model under its own model_type) through the MTP
// round loop against mlx-vlm, round by round (oracle/speculative.ts mtpParity: first token,
// logprobs and caches after the prefill; per round the block size, drafts, drafter logits, accepted
// count, target logits at every walked position and every cache after the rollback), its tokens
// against plain greedy decoding on the CPU device, and the drafter kind resolved from its
// model_type as mlx-vlm's resolve_drafter_kind does. The fixture is make_speculative_fixtures.py's
// c1_dense_unified_assistant (built with mlx-vlm's gemma4_unified_assistant classes).
import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { ROWS_INVARIANT } from "./rows.ts";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { ModelPool, mtpParity } from "../../oracle/speculative.ts";
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
