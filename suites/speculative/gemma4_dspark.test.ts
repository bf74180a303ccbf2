// DSpark speculative decoding with a gemma4_dspark drafter (model/speculative/drafters/{dspark,
// gemma4_dspark}/ over qwen3_dflash, through model/speculative/dflash.ts's round loop with DSpark's
// hooks: fixed block size, ceilings 6 / 4 by context length against the sliding window) against
// mlx-vlm 0.7.10, round by round (oracle/speculative_dflash.ts dflashParity: the resolved config;
// the prefill's first token, logprobs, target caches and captured prompt hidden; per round the block
// size, drafted tokens (after the Markov head), the drafter's base logits, every drafter cache, the
// verify input, the target's verify logits and captured hidden, the accepted count and every target
// cache after the rollback, byte for byte), and the tokens against plain greedy decoding on the CPU
// device for f32 targets (rows.ts; for bf16 / quantized targets TS must reach mlx-vlm's own verdict). Drafters: make_speculative_fixtures.py's `<fx>_dspark` (mlx-vlm's
// Gemma4DSparkDraftModel). Bad input: a drafter for a target of another layer count, and
// attention_k_eq_v on a full-attention layer (mlx-vlm 0.7.10 fails there at the first draft): one
// clear error each. The mutation dspark_markov_from_anchor is caught in suites/mutations/drafters.test.ts.
// SPEC_FULL=1 runs the larger grid and rewrites gemma4_dspark.full.json.
import { afterAll, describe, expect, it } from "vitest";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROWS_INVARIANT } from "./rows.ts";
import { sharedOracle } from "../../oracle/client.ts";
import { dflashParity, type DFlashResult } from "../../oracle/speculative_dflash.ts";
import { GenerateError } from "../../model/generate.ts";
import { ConfigError } from "../../model/gemma4/config.ts";
import { loadDFlashDrafter } from "../../model/speculative/drafters/index.ts";
import { dflashGenerateStep } from "../../model/speculative/dflash.ts";
import { limit } from "../../tests/time_limit.ts";
import { CK, type DrafterScenario, filePools, prompt, SP, summarizeDFlashResults } from "./helpers.ts";

const FULL = process.env.SPEC_FULL === "1";
const { pool, drafters } = filePools();
const tmp = mkdtempSync(join(tmpdir(), "dspark-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const DEFAULT = [
  { label: "dense, P=9 (context past the drafter's window of 4: blocks of 4)", fx: "c1_dense", P: 9, N: 24 },
  { label: "MoE, P=3 (inside it: blocks of 6)", fx: "c5_moe", P: 3, N: 24 },
  { label: "E2B-like, P=3", fx: "c3_e2b", P: 3, N: 24 },
];
const GRID = [
  { label: "dense, P=12, 40 tokens", fx: "c1_dense", P: 12, N: 40 },
  { label: "dense, P=1, block 3", fx: "c1_dense", P: 1, N: 24, block: 3 },
  { label: "MoE, P=3, 40 tokens", fx: "c5_moe", P: 3, N: 40 },
  { label: "E2B-like, P=9, 40 tokens", fx: "c3_e2b", P: 9, N: 40 },
  { label: "E2B-like q8g64 target, P=3", fx: "c3_e2b", target: "c3_e2b/q8g64", P: 3, N: 24 },
  { label: "MoE q4g32 target, P=9", fx: "c5_moe", target: "c5_moe/q4g32", P: 9, N: 24 },
  { label: "dense bf16 target, P=3", fx: "c1_dense", target: "c1_dense/bf16", P: 3, N: 24 },
];

const results: DFlashResult[] = [];
summarizeDFlashResults("gemma4_dspark", results, FULL ? join(import.meta.dir, "gemma4_dspark.full.json") : null);

describe("gemma4_dspark speculative decoding vs mlx-vlm, round by round", () => {
  const scenarios: DrafterScenario[] = FULL ? [...DEFAULT, ...GRID] : DEFAULT;
  let ran = 0;
  for (const s of scenarios) {
    it(s.label, async () => {
      const r = await dflashParity(await sharedOracle(), pool, drafters, { target: join(CK, s.target ?? join(s.fx, "f32")), drafter: join(SP, `${s.fx}_dspark`), prompt: prompt(s.P), maxTokens: s.N, draftBlockSize: s.block });
      results.push(r);
      ran++;
      expect(r.vsOracle.first).toBeNull();
      expect(r.tokens.length).toBe(s.N);
      // = greedy on the CPU device for f32 targets; for the others TS must reach mlx-vlm's own verdict
      if (ROWS_INVARIANT && !s.target?.match(/bf16|q\d|mxfp/)) expect(r.vsGreedy?.first).toBeNull();
      expect(r.vsGreedy?.first === null).toBe(r.oracleEqualsGreedy);
      if (!FULL) {
        expect(r.acceptRounds).toBeGreaterThan(0);
        expect(r.rejectRounds).toBeGreaterThan(0);
        // the fixed policy's ceiling: 6 while the prompt fits the drafter's window (4), else 4
        expect(r.blockSizes[0]).toBe(s.P <= 4 ? 6 : 4);
      }
    }, limit(120_000));
  }
  it("ran every scenario", () => expect(ran).toBe(scenarios.length));
});

describe("gemma4_dspark bad input", () => {
  it("a drafter for a target of another layer count: validate_dflash_target's error", () => {
    const drafter = drafters.drafter(join(SP, "c1_dense_dspark")); // num_target_layers 6
    const target = pool.model(join(CK, "c3_e2b", "f32")).text; // 8 layers, hidden 64, vocabulary 256
    expect(() => dflashGenerateStep(target, drafter, [1, 2, 3])).toThrow(GenerateError);
    expect(() => dflashGenerateStep(target, drafter, [1, 2, 3])).toThrow("DSpark target layer-count mismatch: draft=6, target=8.");
  });

  it("attention_k_eq_v on a full-attention layer (mlx-vlm 0.7.10 fails at the first draft): refused at load", () => {
    const d = join(tmp, "keqv");
    mkdirSync(d);
    const c = JSON.parse(readFileSync(join(SP, "c1_dense_dspark", "config.json"), "utf8"));
    c.attention_k_eq_v = true;
    writeFileSync(join(d, "config.json"), JSON.stringify(c));
    symlinkSync(join(SP, "c1_dense_dspark", "model.safetensors"), join(d, "model.safetensors"));
    expect(() => loadDFlashDrafter(d)).toThrow(ConfigError);
    expect(() => loadDFlashDrafter(d)).toThrow(/attention_k_eq_v: true with a full-attention layer fails in mlx-vlm 0.7.10/);
  });
});
