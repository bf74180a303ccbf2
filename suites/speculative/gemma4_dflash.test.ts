// DFlash speculative decoding with a gemma4_dflash drafter (model/speculative/dflash.ts,
// model/speculative/drafters/{gemma4_dflash,qwen3_dflash}/) against mlx-vlm 0.7.10's
// _dflash_rounds, round by round (oracle/speculative_dflash.ts dflashParity): the drafter's
// resolved config; the prefill's first token, logprobs, target caches and captured prompt hidden;
// per round the block size, drafted tokens, drafter logits, every drafter cache, the verify input,
// the target's verify logits and captured hidden, the accepted count and every target cache after
// the rollback (raw buffers, byte for byte); then the tokens and accept/draft lengths. And the
// DFlash tokens against plain greedy decoding for f32 targets on the CPU device (see rows.ts; for
// bf16 / quantized targets, grid only, TS must reach mlx-vlm's own verdict). The drafters are
// make_speculative_fixtures.py's `<fx>_dflash` (built with mlx-vlm's Gemma4DFlashDraftModel).
// The drafter mutations are caught in suites/mutations/drafters.test.ts.
// The adaptive block size against mlx-vlm's _dflash_next_block_size on 400 random histories.
// SPEC_FULL=1 runs the larger grid and rewrites gemma4_dflash.full.json.
import { describe, expect, it } from "vitest";
import { join } from "node:path";
import { ROWS_INVARIANT } from "./rows.ts";
import { sharedOracle } from "../../oracle/client.ts";
import { dflashParity, type DFlashResult } from "../../oracle/speculative_dflash.ts";
import { dflashNextBlockSize } from "../../model/speculative/dflash.ts";
import { limit } from "../../tests/time_limit.ts";
import { CK, type DrafterScenario, filePools, prompt, SP, summarizeDFlashResults } from "./helpers.ts";

const FULL = process.env.SPEC_FULL === "1";
const { pool, drafters } = filePools();

type Scenario = DrafterScenario;

const DEFAULT: Scenario[] = [
  { label: "dense, P=3", fx: "c1_dense", P: 3, N: 16 },
  { label: "MoE, P=3", fx: "c5_moe", P: 3, N: 16 },
  { label: "E2B-like (per-layer inputs, KV sharing), P=9", fx: "c3_e2b", P: 9, N: 24 },
];
const GRID: Scenario[] = [
  { label: "dense, P=1", fx: "c1_dense", P: 1, N: 24 },
  { label: "dense, P=12, 40 tokens (past the window of 8)", fx: "c1_dense", P: 12, N: 40 },
  { label: "dense, P=9, block 3", fx: "c1_dense", P: 9, N: 24, block: 3 },
  { label: "dense, P=5, block 8 (adaptive sizes)", fx: "c1_dense", P: 5, N: 32, block: 8 },
  { label: "dense window 64, P=20, 40 tokens", fx: "c1_dense", target: "speculative/c1_dense_w64", P: 20, N: 40 },
  { label: "MoE, P=12, 40 tokens", fx: "c5_moe", P: 12, N: 40 },
  { label: "E2B-like, P=3, 40 tokens", fx: "c3_e2b", P: 3, N: 40 },
  { label: "E2B-like window 64, P=30, block 4", fx: "c3_e2b", target: "speculative/c3_e2b_w64", P: 30, N: 24, block: 4 },
  { label: "dense bf16 target, P=3", fx: "c1_dense", target: "c1_dense/bf16", P: 3, N: 24 },
  { label: "dense q4g32 target, P=3", fx: "c1_dense", target: "c1_dense/q4g32", P: 3, N: 24 },
  { label: "MoE mxfp4 target, P=3", fx: "c5_moe", target: "c5_moe/mxfp4", P: 3, N: 24 },
  { label: "E2B-like bf16 target, P=9", fx: "c3_e2b", target: "c3_e2b/bf16", P: 9, N: 24 },
];

const results: DFlashResult[] = [];
summarizeDFlashResults("gemma4_dflash", results, FULL ? join(import.meta.dir, "gemma4_dflash.full.json") : null);

describe("gemma4_dflash speculative decoding vs mlx-vlm, round by round", () => {
  const scenarios = FULL ? [...DEFAULT, ...GRID] : DEFAULT;
  let ran = 0;
  for (const s of scenarios) {
    it(s.label, async () => {
      const r = await dflashParity(await sharedOracle(), pool, drafters, {
        target: join(CK, s.target ?? join(s.fx, "f32")),
        drafter: join(SP, `${s.fx}_dflash`),
        prompt: prompt(s.P),
        maxTokens: s.N,
        draftBlockSize: s.block,
      });
      results.push(r);
      ran++;
      expect(r.vsOracle.first).toBeNull();
      expect(r.tokens.length).toBe(s.N);
      expect(r.rounds).toBeGreaterThan(1);
      // = greedy on the CPU device for f32 targets; for the others TS must reach mlx-vlm's own verdict
      if (ROWS_INVARIANT && !s.target?.match(/bf16|q\d|mxfp/)) expect(r.vsGreedy?.first).toBeNull();
      expect(r.vsGreedy?.first === null).toBe(r.oracleEqualsGreedy);
      if (!FULL) {
        // the default scenarios are chosen to hold both kinds of rounds
        expect(r.acceptRounds).toBeGreaterThan(0);
        expect(r.rejectRounds).toBeGreaterThan(0);
      }
    }, limit(120_000));
  }
  it("ran every scenario", () => expect(ran).toBe(scenarios.length));
});

describe("_dflash_next_block_size vs mlx-vlm's on random acceptance histories", () => {
  it("every case equal (adaptive, fixed, initial sizes, min sizes)", async () => {
    let seed = 26;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed % n;
    };
    const cases = Array.from({ length: 400 }, () => {
      const n = rand(12);
      const draft_lens = Array.from({ length: n }, () => rand(5) === 0 ? 0 : 1 + rand(15));
      const accept_lens = draft_lens.map((d) => (rand(3) === 0 ? d : rand(d + 1)));
      return { requested: 1 + rand(16), remaining: 1 + rand(20), accept_lens, draft_lens, prefer: rand(6) === 0, initial: rand(3) === 0 ? 2 + rand(8) : null, min: 2 + rand(5) };
    });
    const { sizes } = (await (await sharedOracle()).request("dflash_block_sizes", { cases })) as { sizes: number[] };
    const ts = cases.map((c) => dflashNextBlockSize(c.requested, c.remaining, c.accept_lens, c.draft_lens, { preferRequested: c.prefer, initialBlockSize: c.initial, minBlockSize: c.min }));
    expect(sizes.length).toBe(400);
    expect(ts).toEqual(sizes);
    expect(new Set(sizes).size).toBeGreaterThan(6); // the branches give many sizes
  }, limit(60_000));
});
