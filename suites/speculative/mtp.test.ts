// MTP speculative decoding with the gemma4_assistant drafter (model/speculative/) against
// mlx-vlm 0.7.10, round by round (oracle/speculative.ts mtpParity): the first token, its logprobs
// and the caches after the prefill; then per round the block size, the drafted tokens, the
// drafter's logits per step, the accepted count, the target's logits at every walked position
// and every cache (KVCache, BufferedRotatingKVCache) after the rollback. And
// Gemma4ExactSpeculativeVerifier against mlx-vlm's class. SPEC_FULL=1 adds a block-size override
// and a 40-token run whose buffered sliding window compacts.
import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { ROWS_INVARIANT } from "./rows.ts";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { exactVerifyParity, ModelPool, mtpParity, type MtpResult } from "../../oracle/speculative.ts";
import { limit } from "../../tests/time_limit.ts";

const CK = join(REPO_ROOT, ".cache", "checkpoints");
const SP = join(CK, "speculative");
const FULL = process.env.SPEC_FULL === "1";
const pool = new ModelPool();
afterAll(() => pool.dispose());
const prompt = (P: number) => Array.from({ length: P }, (_, i) => (i * 37 + 11) % 256);

const results: MtpResult[] = [];
afterAll(() => {
  const t = results.reduce((s, r) => s + r.vsOracle.tensors, 0);
  console.log(`[mtp] ${results.length} scenarios, ${results.reduce((s, r) => s + r.rounds, 0)} rounds, ${t} tensors bit-exact vs mlx-vlm; accepted ${results.reduce((s, r) => s + r.accepted, 0)}/${results.reduce((s, r) => s + r.drafted, 0)} drafts`);
});

describe("MTP speculative decoding vs mlx-vlm, round by round", () => {
  const scenarios = [
    { label: "dense, P=3", fx: "c1_dense", drafter: "c1_dense_assistant", P: 3, N: 24, both: true },
    { label: "MoE, P=3", fx: "c5_moe", drafter: "c5_moe_assistant", P: 3, N: 24, both: true },
    { label: "E2B-like, P=9", fx: "c3_e2b", drafter: "c3_e2b_assistant", P: 9, N: 24, both: true },
    { label: "E2B-like, centroid head (use_ordered_embeddings), P=20", fx: "c3_e2b", drafter: "c3_e2b_assistant_ordered", P: 20, N: 8, both: false },
    ...(FULL
      ? [
          { label: "dense, P=1, block 3", fx: "c1_dense", drafter: "c1_dense_assistant", P: 1, N: 20, block: 3, both: true },
          { label: "dense, P=12, 40 tokens (the buffered window compacts)", fx: "c1_dense", drafter: "c1_dense_assistant", P: 12, N: 40, both: true, compacts: true },
        ]
      : []),
  ];
  for (const s of scenarios) {
    it(s.label, async () => {
      const r = await mtpParity(await sharedOracle(), pool, { target: join(CK, s.fx, "f32"), drafter: join(SP, s.drafter), prompt: prompt(s.P), maxTokens: s.N, draftBlockSize: s.block });
      results.push(r);
      expect(r.vsOracle.first).toBeNull();
      expect(r.vsGreedy.first).toBeNull();
      expect(r.tokens.length).toBe(s.N);
      if (s.both) {
        expect(r.acceptRounds).toBeGreaterThan(0);
        expect(r.rejectRounds).toBeGreaterThan(0);
      }
      if (s.compacts) expect(r.maxStartPosition).toBeGreaterThan(0);
    }, limit(120_000));
  }
});

describe("Gemma4ExactSpeculativeVerifier vs mlx-vlm's", () => {
  for (const fx of ["c1_dense", "c3_e2b", "c5_moe"]) {
    it(fx, async () => {
      const oracle = await sharedOracle();
      const block = [7, 60, 113, 166];
      const inWindow = await exactVerifyParity(oracle, pool, join(CK, fx, "f32"), prompt(3), block);
      const past = await exactVerifyParity(oracle, pool, join(CK, fx, "f32"), prompt(12), block);
      expect(inWindow.vsOracle.first).toBeNull();
      expect(past.vsOracle.first).toBeNull();
      // what the verifier leaves out shows against mlx-vlm's own forward: past the window on the
      // dense model, and always where it skips per-layer inputs / shared layers (E2B) or experts (MoE)
      // (a relation of mlx-vlm's own numbers: see rows.ts)
      if (ROWS_INVARIANT) expect(inWindow.oracleEqualsForward).toBe(fx === "c1_dense");
      expect(past.oracleEqualsForward).toBe(false);
    }, limit(120_000));
  }
});
