// Drafter port bugs for the mutation checks of the DFlash-loop drafters (issue 26), on the one
// test-only switch (model/mutation_switch.ts). Each is caught in suites/speculative/ against live
// mlx-vlm at the first value it changes; production code never switches anything on.
import { switchedOn, withSwitchAsync } from "../mutation_switch.ts";

export const DRAFTER_MUTATIONS = [
  "drafter_rollback_keeps_one", // the rollback trims one rejected position too few from the target caches
  "dflash_context_all_rows", // the next round's drafter context keeps every verified row, not accepted + 1
  "gemma4_dflash_mask_default_lost", // Gemma4DFlashConfig without its mask-token default (4): the Qwen default
  "dspark_markov_from_anchor", // the Markov correction conditioned on the anchor at every step, not the previous draft
  "dflash_acceptance_off_by_one", // the greedy walk accepts the first mismatching draft too
  "dflash_target_layers_shifted", // the drafter reads target layers target_layer_ids + 1 (mod the layer count)
  "positioned_draft_keys_shifted", // positioned: the drafter samples with the keys of the next positions (emitted + 1, ...)
  "draft_rng_not_restored", // sampled (DFlash and MTP loops): the drafter's random draws are not undone before the target samples
] as const;

export type DrafterMutation = (typeof DRAFTER_MUTATIONS)[number];

/** True when the named drafter bug is switched on (tests only). */
export const drafterMutated = (name: DrafterMutation): boolean => switchedOn(name);

/** Runs an async fn with exactly one drafter bug on (tests only). */
export function withDrafterMutation<T>(name: DrafterMutation, fn: () => T | Promise<T>): Promise<T> {
  return withSwitchAsync(name, fn);
}
