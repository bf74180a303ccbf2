// Sampling in mlx-vlm 0.7.10's speculative round loops (DFlash and MTP), as mlx_vlm.generate
// --temp T --seed S runs them: mx.random.seed(S), then generate_step without a seed argument, so the
// sampler is make_sampler's over the global random state (a positive temperature clamped to at least
// 0.01; top_p, min_p, top_k in make_sampler's order; each filter and the categorical draw compiled
// with the random state: model/sample.ts) and the round loops run with greedy_sampling False and
// _SpeculativeSamplerRNG enabled: the drafter draws from the round's key and its draws are undone
// before the target samples (target_sampled(sync_draft=True) re-syncs the drafter's state to the
// target's after every walk, so this is a save / restore around the draft).
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { GenerateError } from "../generate.ts";
import { greedySampler, makeSampler, type Sampler, SamplerError } from "../sample.ts";
import { drafterMutated } from "./mutations.ts";

export interface SpeculativeSampling {
  temp: number;
  topP?: number;
  topK?: number;
  minP?: number;
}

/** mlx-vlm's clamp_temperature: a positive temperature below 0.01 becomes 0.01 (0 stays greedy). */
export const MIN_SAMPLING_TEMPERATURE = 0.01;
export const clampTemperature = (t: number): number => (t > 0 && t < MIN_SAMPLING_TEMPERATURE ? MIN_SAMPLING_TEMPERATURE : t);

/** mlx-vlm's make_sampler for a round loop (model/sample.ts's, the temperature clamped); greedy at temp 0 or without options. */
export function makeSpeculativeSampler(s: SpeculativeSampling | undefined, vocab: number): Sampler {
  if (!s || s.temp === 0) return greedySampler;
  if (s.topK !== undefined && s.topK > 0 && s.topK >= vocab) throw new GenerateError(`\`top_k\` has to be an integer in the (0, ${vocab}] interval, but is ${s.topK}.`);
  try {
    return makeSampler({ temp: clampTemperature(s.temp), topP: s.topP ?? 0, topK: s.topK ?? 0, minP: s.minP ?? 0 });
  } catch (e) {
    if (e instanceof SamplerError) throw new GenerateError(e.message);
    throw e;
  }
}

/** The sampling options' own errors (temperature, seed, the sampler's arguments), before any work. */
export function validateSampling(o: { sampling?: SpeculativeSampling; seed?: number }, vocab: number): void {
  const temp = o.sampling?.temp;
  if (temp !== undefined && !(typeof temp === "number" && Number.isFinite(temp) && temp >= 0)) throw new GenerateError(`temperature must be a finite number >= 0, got ${temp}`);
  if (o.seed !== undefined && !(Number.isInteger(o.seed) && o.seed >= 0 && o.seed < 2 ** 32)) throw new GenerateError(`seed must be an integer in [0, 2**32), got ${o.seed}`);
  if (o.sampling && temp! > 0) makeSpeculativeSampler(o.sampling, vocab).dispose?.();
}

/**
 * _SpeculativeSamplerRNG.draft_tokens: runs the draft (which must evaluate its tokens) and, when
 * sampling, puts the global key back where it was before it.
 */
export function drawWithoutTargetKeys<T>(sampled: boolean, draft: () => T): T {
  const roundKey = sampled ? mx.random.state.get() : null;
  const out = draft();
  if (roundKey) {
    if (drafterMutated("draft_rng_not_restored")) for (const k of roundKey) k.dispose();
    else mx.random.state.set(roundKey);
  }
  return out;
}

/** The global key after a sampled round's walk (caller-owned), null when greedy. */
export const roundKeyAfterWalk = (sampled: boolean): MlxArray | null => (sampled ? mx.random.state.get()[0]! : null);
