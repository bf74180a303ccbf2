// Sampled DFlash / DSpark speculative decoding (model/speculative/dflash.ts, temperature > 0)
// against mlx-vlm 0.7.10's _dflash_rounds on its non-positioned sampled path, which is the path
// `mlx_vlm.generate --temp T --seed S` takes (mx.random.seed(S), make_sampler over the global random
// state, _SpeculativeSamplerRNG around the draft, _sample_dflash_target_walk), round by round
// through oracle/speculative_dflash.ts dflashParity with a seed: the drafter's resolved config; the
// prefill's sampled first token, logprobs, target caches and captured prompt hidden; per round the
// block size, drafted tokens (sampled from the drafter's logits), drafter logits, every drafter
// cache, the verify input, the target's verify logits and captured hidden, the global random key
// after the walk, the accepted count, the emitted tokens and every target cache after the rollback
// (raw buffers, byte for byte); then the tokens and accept/draft lengths.
// Three scenarios per drafter kind (gemma4_dflash, gemma4_dspark), with plain temperature, top-k and
// top-p / min-p, each chosen to hold rounds that accept a sampled draft and rounds that reject one
// (asserted). And the relation the loop implies: every emitted token costs one key of the global
// sequence, so on the CPU device (rows.ts) and f32 targets the tokens equal TS plain sampled
// generate_step with the same seed and sampler.
// Then mlx-vlm's positioned path (generate_step(seed=S), its API and server: _PositionedTargetSampler,
// keys hashed from seed and position, the drafter sampled with the target's keys, the verify block
// sampled at once), two scenarios per drafter kind, the same comparisons without the global key
// (never used), and the tokens against plain decoding drawing token n with position n's key.
// Bad sampling input, one GenerateError each: a negative temperature, top-k past the vocabulary,
// positioned without a seed or with min-p, positioned with the MTP loop (mlx-vlm drafts it from the
// unseeded global key: its drafts differ run to run, so there is nothing to be bit-exact with). SPEC_FULL=1 adds a grid (bf16 and quantized targets,
// 40 tokens, fixed blocks, temperature 1, sampler combinations) and rewrites dflash_sampled.full.json.
import { describe, expect, it } from "vitest";
import { join } from "node:path";
import { ROWS_INVARIANT } from "./rows.ts";
import { sharedOracle } from "../../oracle/client.ts";
import { dflashParity, type DFlashResult, type DFlashSpec } from "../../oracle/speculative_dflash.ts";
import { limit } from "../../tests/time_limit.ts";
import { GenerateError } from "../../model/generate.ts";
import { dflashGenerateStep } from "../../model/speculative/dflash.ts";
import { mtpGenerateStep } from "../../model/speculative/mtp.ts";
import { CK, type DrafterScenario, filePools, prompt, SP, summarizeDFlashResults } from "./helpers.ts";

const FULL = process.env.SPEC_FULL === "1";
const { pool, drafters } = filePools();

interface Scenario extends DrafterScenario {
  kind: "dflash" | "dspark";
  sampling: NonNullable<DFlashSpec["sampling"]>;
}

// Random-weight fixtures give near-flat distributions: low temperatures and small top-k make sampled
// drafts match the target's sample often enough for accepting rounds (seeds picked for that).
const SAMPLED_SCENARIOS: Scenario[] = [
  { label: "dflash dense, temp 0.1", fx: "c1_dense", kind: "dflash", P: 3, N: 20, sampling: { temp: 0.1, seed: 3 } },
  { label: "dflash MoE, temp 0.1", fx: "c5_moe", kind: "dflash", P: 3, N: 20, sampling: { temp: 0.1, seed: 3 } },
  { label: "dflash dense, temp 0.5 top-p 0.5 min-p 0.05", fx: "c1_dense", kind: "dflash", P: 3, N: 20, sampling: { temp: 0.5, topP: 0.5, minP: 0.05, seed: 1 } },
  { label: "dspark E2B-like, temp 0.3 top-k 3", fx: "c3_e2b", kind: "dspark", P: 3, N: 20, sampling: { temp: 0.3, topK: 3, seed: 7 } },
  { label: "dspark MoE, temp 0.1", fx: "c5_moe", kind: "dspark", P: 3, N: 20, sampling: { temp: 0.1, seed: 3 } },
  { label: "dspark E2B-like, temp 0.1", fx: "c3_e2b", kind: "dspark", P: 3, N: 20, sampling: { temp: 0.1, seed: 3 } },
  { label: "positioned: dflash dense, temp 0.7", fx: "c1_dense", kind: "dflash", P: 3, N: 20, sampling: { temp: 0.7, seed: 3, positioned: true } },
  { label: "positioned: dflash MoE, temp 1.0 top-p 0.9", fx: "c5_moe", kind: "dflash", P: 3, N: 20, sampling: { temp: 1.0, topP: 0.9, seed: 7, positioned: true } },
  { label: "positioned: dspark dense, temp 0.7", fx: "c1_dense", kind: "dspark", P: 3, N: 20, sampling: { temp: 0.7, seed: 3, positioned: true } },
  { label: "positioned: dspark E2B-like, temp 1.0 top-p 0.9", fx: "c3_e2b", kind: "dspark", P: 3, N: 20, sampling: { temp: 1.0, topP: 0.9, seed: 7, positioned: true } },
];

const GRID: Scenario[] = [
  { label: "dflash dense, temp 1.0, 40 tokens", fx: "c1_dense", kind: "dflash", P: 12, N: 40, sampling: { temp: 1.0, seed: 5 } },
  { label: "dflash dense, temp 0.7 top-k 20 top-p 0.95, block 3", fx: "c1_dense", kind: "dflash", P: 5, N: 24, block: 3, sampling: { temp: 0.7, topK: 20, topP: 0.95, seed: 11 } },
  { label: "dflash E2B-like, temp 0.1, P=9", fx: "c3_e2b", kind: "dflash", P: 9, N: 24, sampling: { temp: 0.1, seed: 3 } },
  { label: "dflash MoE, temp 0.005 (clamped to 0.01)", fx: "c5_moe", kind: "dflash", P: 3, N: 24, sampling: { temp: 0.005, seed: 2 } },
  { label: "dflash dense bf16 target, temp 0.1", fx: "c1_dense", target: "c1_dense/bf16", kind: "dflash", P: 3, N: 24, sampling: { temp: 0.1, seed: 3 } },
  { label: "dflash dense q4g32 target, temp 0.3 top-k 3", fx: "c1_dense", target: "c1_dense/q4g32", kind: "dflash", P: 3, N: 24, sampling: { temp: 0.3, topK: 3, seed: 7 } },
  { label: "dspark dense, temp 0.1, P=9", fx: "c1_dense", kind: "dspark", P: 9, N: 24, sampling: { temp: 0.1, seed: 3 } },
  { label: "dspark MoE, temp 1.0 min-p 0.1, 40 tokens", fx: "c5_moe", kind: "dspark", P: 3, N: 40, sampling: { temp: 1.0, minP: 0.1, seed: 4 } },
  { label: "dspark E2B-like q8g64 target, temp 0.3 top-k 3", fx: "c3_e2b", target: "c3_e2b/q8g64", kind: "dspark", P: 3, N: 24, sampling: { temp: 0.3, topK: 3, seed: 7 } },
  { label: "dspark dense, block 3, temp 0.5 top-p 0.5", fx: "c1_dense", kind: "dspark", P: 1, N: 24, block: 3, sampling: { temp: 0.5, topP: 0.5, seed: 1 } },
  { label: "positioned: dflash MoE, temp 0.5 top-k 20", fx: "c5_moe", kind: "dflash", P: 3, N: 20, sampling: { temp: 0.5, topK: 20, seed: 1, positioned: true } },
  { label: "positioned: dflash dense, temp 0.7 top-k 50 top-p 0.95, 40 tokens", fx: "c1_dense", kind: "dflash", P: 12, N: 40, sampling: { temp: 0.7, topK: 50, topP: 0.95, seed: 9, positioned: true } },
  { label: "positioned: dflash dense bf16 target, temp 0.7", fx: "c1_dense", target: "c1_dense/bf16", kind: "dflash", P: 3, N: 24, sampling: { temp: 0.7, seed: 3, positioned: true } },
  { label: "positioned: dspark MoE q4g32 target, temp 1.0", fx: "c5_moe", target: "c5_moe/q4g32", kind: "dspark", P: 9, N: 24, sampling: { temp: 1.0, seed: 2, positioned: true } },
];

const results: DFlashResult[] = [];
summarizeDFlashResults("dflash sampled", results, FULL ? join(import.meta.dir, "dflash_sampled.full.json") : null);

describe("sampled DFlash / DSpark decoding vs mlx-vlm, round by round", () => {
  const scenarios = FULL ? [...SAMPLED_SCENARIOS, ...GRID] : SAMPLED_SCENARIOS;
  let ran = 0;
  for (const s of scenarios) {
    it(s.label, async () => {
      const r = await dflashParity(await sharedOracle(), pool, drafters, { target: join(CK, s.target ?? join(s.fx, "f32")), drafter: join(SP, `${s.fx}_${s.kind}`), prompt: prompt(s.P), maxTokens: s.N, draftBlockSize: s.block, sampling: s.sampling });
      results.push(r);
      ran++;
      expect(r.vsOracle.first).toBeNull();
      expect(r.tokens.length).toBe(s.N);
      if (SAMPLED_SCENARIOS.includes(s)) {
        // the default scenarios are chosen to hold both kinds of rounds
        expect(r.acceptRounds).toBeGreaterThan(0);
        expect(r.rejectRounds).toBeGreaterThan(0);
      }
      // one key per emitted token, as plain sampled decoding (f32 targets, CPU rows invariant); else TS must reach mlx-vlm's own verdict
      if (ROWS_INVARIANT && !s.target?.match(/bf16|q\d|mxfp/)) expect(r.vsGreedy?.first).toBeNull();
      expect(r.vsGreedy?.first === null).toBe(r.oracleEqualsGreedy);
    }, limit(120_000));
  }
  it("ran every scenario, both drafter kinds", () => {
    expect(ran).toBe(scenarios.length);
    for (const kind of ["dflash", "dspark"]) {
      expect(SAMPLED_SCENARIOS.filter((s) => s.kind === kind && !s.sampling.positioned).length).toBeGreaterThanOrEqual(3);
      expect(SAMPLED_SCENARIOS.filter((s) => s.kind === kind && s.sampling.positioned).length).toBeGreaterThanOrEqual(2);
    }
  });
});

describe("sampled speculative decoding: bad sampling input", () => {
  it("one clear GenerateError each, before any work", () => {
    const target = pool.model(join(CK, "c1_dense", "f32")).text;
    const drafter = drafters.drafter(join(SP, "c1_dense_dflash"));
    const cases: [object, RegExp][] = [
      [{ sampling: { temp: -1 } }, /temperature must be a finite number >= 0, got -1/],
      [{ sampling: { temp: 0.5, topK: 256 }, seed: 1 }, /`top_k` has to be an integer in the \(0, 256\] interval, but is 256/],
      [{ sampling: { temp: 0.5, positioned: true } }, /positioned sampling needs a seed/],
      [{ sampling: { temp: 0.5, minP: 0.1, positioned: true }, seed: 1 }, /positioned sampling takes min_p 0/],
    ];
    for (const [o, message] of cases) {
      expect(() => dflashGenerateStep(target, drafter, [1, 2, 3], o)).toThrow(GenerateError);
      expect(() => dflashGenerateStep(target, drafter, [1, 2, 3], o)).toThrow(message);
    }
    const assistant = pool.drafter(join(SP, "c1_dense_unified_assistant"));
    expect(() => mtpGenerateStep(target, assistant, [1, 2, 3], { sampling: { temp: 0.7, positioned: true }, seed: 3 })).toThrow(/ported for the DFlash loop only/);
  });
});
