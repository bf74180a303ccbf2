// Mutation checks for the drafters of issue 26 (gemma4_dflash, gemma4_dspark and the DFlash round
// loop they share, model/speculative/dflash.ts; the sampled MTP loop of gemma4_unified_assistant,
// model/speculative/mtp.ts; the sampling both share, model/speculative/sampling.ts): each case
// re-introduces ONE port bug through the test-only switch (model/speculative/mutations.ts
// DRAFTER_MUTATIONS), runs the round-by-round comparison of the drafter suites against live mlx-vlm
// 0.7.10 (oracle/speculative_dflash.ts dflashParity: config, prefill, then per round block size,
// drafts, drafter logits and caches, verify input, target logits and captured hidden, random key when
// sampling, accepted count, emitted tokens, target caches; oracle/speculative.ts mtpParity likewise
// for MTP) and asserts that the FIRST mismatch is the value where the bug lives. The unmutated runs
// of the same specs are bit-exact (controls). Every listed mutation has a case (asserted) and the
// score caught / applied is printed.
import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { sharedOracle } from "../../oracle/client.ts";
import { DrafterPool, dflashParity, type DFlashSpec } from "../../oracle/speculative_dflash.ts";
import { mtpParity, type MtpSpec } from "../../oracle/speculative.ts";
import { DRAFTER_MUTATIONS, type DrafterMutation, withDrafterMutation } from "../../model/speculative/mutations.ts";
import { limit } from "../../tests/time_limit.ts";
import { CK, filePools, prompt, SP } from "../speculative/helpers.ts";

const { pool } = filePools();

const GREEDY: DFlashSpec = { target: join(CK, "c1_dense", "f32"), drafter: join(SP, "c1_dense_dflash"), prompt: prompt(3), maxTokens: 8, skipGreedy: true };
const DSPARK: DFlashSpec = { target: join(CK, "c1_dense", "f32"), drafter: join(SP, "c1_dense_dspark"), prompt: prompt(3), maxTokens: 16, skipGreedy: true };
const SAMPLED: DFlashSpec = { ...GREEDY, maxTokens: 12, sampling: { temp: 0.1, seed: 3 } };
const POSITIONED: DFlashSpec = { ...GREEDY, maxTokens: 12, sampling: { temp: 0.7, seed: 3, positioned: true } };
const MTP_SAMPLED: MtpSpec = { target: join(CK, "c1_dense", "f32"), drafter: join(SP, "c1_dense_unified_assistant"), prompt: prompt(3), maxTokens: 12, sampling: { temp: 0.1, seed: 3 } };

type Spec = { dflash: DFlashSpec } | { mtp: MtpSpec };

/** The spec's round-by-round comparison: where it first differs (null: bit-exact) and its rejecting rounds. */
async function compare(spec: Spec, drafters: DrafterPool): Promise<{ first: string | null; rejectRounds: number }> {
  const r = "dflash" in spec ? await dflashParity(await sharedOracle(), pool, drafters, spec.dflash) : await mtpParity(await sharedOracle(), pool, spec.mtp);
  return { first: r.vsOracle.first?.where ?? null, rejectRounds: r.rejectRounds };
}

interface Case {
  mutation: DrafterMutation;
  why: string;
  spec: Spec;
  /** The value where the bug lives: the first mismatch must be this one. */
  first: RegExp;
}

const CASES: Case[] = [
  { mutation: "drafter_rollback_keeps_one", why: "the rollback trims one rejected position too few", spec: { dflash: GREEDY }, first: /^round 0 cache\[0\]\.offset$/ },
  { mutation: "dflash_context_all_rows", why: "the next context keeps every verified row, not accepted + 1", spec: { dflash: GREEDY }, first: /^round 1 drafter logits$/ },
  { mutation: "gemma4_dflash_mask_default_lost", why: "Gemma4DFlashConfig without its mask-token default (4)", spec: { dflash: GREEDY }, first: /^config$/ },
  { mutation: "dspark_markov_from_anchor", why: "the Markov correction conditioned on the anchor at every step", spec: { dflash: DSPARK }, first: /^round \d+ drafted$/ },
  { mutation: "dflash_acceptance_off_by_one", why: "the greedy walk accepts the first mismatching draft too", spec: { dflash: GREEDY }, first: /^round 0 accepted$/ },
  { mutation: "dflash_target_layers_shifted", why: "the drafter reads target_layer_ids + 1", spec: { dflash: GREEDY }, first: /^prefill hidden$/ },
  { mutation: "positioned_draft_keys_shifted", why: "positioned DFlash: the drafter samples with the keys of the next positions", spec: { dflash: POSITIONED }, first: /^round 0 drafted$/ },
  { mutation: "draft_rng_not_restored", why: "sampled DFlash: the drafter's draws are not undone before the target samples", spec: { dflash: SAMPLED }, first: /^round 0 random key$/ },
  { mutation: "draft_rng_not_restored", why: "sampled MTP (unified assistant): the same, in the MTP loop", spec: { mtp: MTP_SAMPLED }, first: /^round 0 random key$/ },
];

const score = { applied: 0, caught: 0, lines: [] as string[] };
afterAll(() => console.log(`[drafter mutations] score ${score.caught}/${score.applied}\n  ${score.lines.join("\n  ")}`));

describe("drafter mutations (model/speculative/mutations.ts), each caught first at its own value", () => {
  it("every drafter mutation has a case", () => {
    expect(new Set(CASES.map((c) => c.mutation))).toEqual(new Set(DRAFTER_MUTATIONS));
    expect(CASES.length).toBeGreaterThanOrEqual(DRAFTER_MUTATIONS.length);
  });

  it("controls: the unmutated runs are bit-exact", async () => {
    const drafters = new DrafterPool();
    try {
      for (const spec of [{ dflash: GREEDY }, { dflash: DSPARK }, { dflash: SAMPLED }, { dflash: POSITIONED }, { mtp: MTP_SAMPLED }]) {
        const r = await compare(spec, drafters);
        expect(r.first).toBeNull();
        expect(r.rejectRounds).toBeGreaterThan(0); // the rollback and walk mutations have a rejected draft to act on
      }
    } finally {
      drafters.dispose();
    }
  }, limit(60_000));

  let ran = 0;
  for (const c of CASES) {
    it(`${c.mutation}: ${c.why}`, async () => {
      const drafters = new DrafterPool(); // loaded under the mutation (the config ones act at load)
      try {
        const r = await withDrafterMutation(c.mutation, () => compare(c.spec, drafters));
        const where = r.first ?? "(not caught)";
        score.applied++;
        if (c.first.test(where)) score.caught++;
        score.lines.push(`${c.mutation}: first at ${where}`);
        ran++;
        expect(where).toMatch(c.first);
      } finally {
        drafters.dispose();
      }
    }, limit(60_000));
  }
  it("ran every case", () => expect(ran).toBe(CASES.length));
});
