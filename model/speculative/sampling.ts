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
import { applyTopK, applyTopP, greedySampler, makeSampler, type Sampler, SamplerError } from "../sample.ts";
import { drafterMutated } from "./mutations.ts";

export interface SpeculativeSampling {
  temp: number;
  topP?: number;
  topK?: number;
  minP?: number;
  /**
   * generate_step(seed=...)'s positioned sampler (mlx-vlm's API and server) instead of make_sampler
   * on the global key (its CLI); needs the run's seed, and min_p 0 (mlx-vlm falls back to
   * make_sampler otherwise).
   */
  positioned?: boolean;
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
  if (o.sampling?.positioned) {
    if (o.seed === undefined) throw new GenerateError("positioned sampling needs a seed (its keys are hashes of the seed and the token position)");
    if ((o.sampling.minP ?? 0) !== 0) throw new GenerateError("positioned sampling takes min_p 0 (with min_p, mlx-vlm's generate_step falls back to make_sampler on the unseeded global key)");
  }
  if (o.sampling && temp! > 0) makeSpeculativeSampler(o.sampling, vocab).dispose?.();
}

/** Positioned sampling is on: a temperature above 0 and `positioned` (generate_step's seed argument). */
export const isPositioned = (s: SpeculativeSampling | undefined): boolean => !!s?.positioned && s.temp > 0;

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

// ------------------------------------------------------------------ positioned sampling
//
// mlx-vlm's other sampled path: generate_step(seed=S) (its API and mlx_vlm.server, never its CLI)
// with temperature > 0 and the default min_p / top_n_sigma / typical_p builds a
// _PositionedTargetSampler (generate/ar.py): every draw has its own key, mx.random.key of a 32-bit
// hash of (seed, row, position of the generated token), so the global random state is never used.
// The round loops then draft with the SAME keys as the target at the same positions
// (_PositionedDraftSampler calls sample_target on the drafter's logits), sample the whole verify
// block at once and walk it as greedy's walk does.

/** _position_seed: the 32-bit hash of (seed, row, position). */
export function positionSeed(seed: number, row: number, position: number): number {
  let x = (seed ^ 0x9e3779b9) >>> 0;
  x = (x + Math.imul(row + 1, 0x85ebca6b)) >>> 0;
  x = (x ^ Math.imul(position + 1, 0xc2b2ae35)) >>> 0;
  x = (x ^ (x >>> 16)) >>> 0;
  x = Math.imul(x, 0x7feb352d) >>> 0;
  x = (x ^ (x >>> 15)) >>> 0;
  return x;
}

/**
 * _PositionedTargetSampler.sample_target for one sequence (row 0): top_k on the whole block (the
 * compiled _apply_top_k), then per row with key(position_seed(seed, 0, position)) either
 * top_p_sampling (logits as float32 / T, log-normalized, the compiled apply_top_p, categorical) or
 * categorical(logprobs * (1 / T)). Python vmaps the per-row draw; drawing row by row gives the same
 * bits (a key's draw does not depend on the batch around it). Caller-owned (N,) uint32.
 */
export class PositionedTargetSampler {
  readonly temperature: number;
  private readonly topP: number;
  private readonly topK: number;
  readonly seed: number;
  private readonly topKFn: mx.CompiledFunction<(x: MlxArray) => MlxArray> | null;
  private readonly topPFn: mx.CompiledFunction<(x: MlxArray) => MlxArray> | null;

  constructor(s: SpeculativeSampling, seed: number) {
    this.temperature = clampTemperature(s.temp);
    this.topP = s.topP ?? 0;
    this.topK = s.topK ?? 0;
    this.seed = seed;
    const state = { inputs: mx.random.state, outputs: mx.random.state };
    this.topKFn = this.topK > 0 ? mx.compile((x: MlxArray) => applyTopK(x, this.topK), state) : null;
    this.topPFn = this.topP > 0 && this.topP < 1 ? mx.compile((x: MlxArray) => applyTopP(x, this.topP), state) : null;
  }

  /** sample_target(logprobs (N, V), row_ids [0]*N, positions). */
  sampleTarget(logprobs: MlxArray, positions: readonly number[]): MlxArray {
    if (logprobs.ndim !== 2 || logprobs.shape[0] !== positions.length) throw new GenerateError("row_ids and positions must match logprobs batch size.");
    using filtered = this.topKFn ? (this.topKFn(logprobs) as MlxArray) : mx.alias(logprobs);
    const V = filtered.shape[1]!;
    const draws: MlxArray[] = [];
    try {
      positions.forEach((p, i) => {
        using key = mx.random.key(positionSeed(this.seed, 0, p));
        using row2 = mx.slice(filtered, [i, 0], [i + 1, V]);
        using row = mx.reshape(row2, [V]);
        draws.push(this.drawOne(row, key));
      });
      return mx.stack(draws, 0);
    } finally {
      for (const d of draws) d.dispose();
    }
  }

  private drawOne(row: MlxArray, key: MlxArray): MlxArray {
    if (!this.topPFn) {
      using scaled = mx.multiply(row, mx.pyFloat(1 / this.temperature));
      return mx.random.categorical(scaled, { key });
    }
    // top_p_sampling(logits, top_p, temperature, key=key)
    using f = mx.astype(row, "float32");
    using scaled = mx.divide(f, mx.pyFloat(clampTemperature(this.temperature)));
    using lse = mx.logsumexp(scaled, -1, true);
    using lp = mx.subtract(scaled, lse);
    using kept = this.topPFn(lp) as MlxArray;
    return mx.random.categorical(kept, { key });
  }

  dispose(): void {
    this.topKFn?.dispose();
    this.topPFn?.dispose();
  }
}

/**
 * _PositionedDraftSampler for one sequence: the target sampler's sample_target on the drafter's
 * logits ((1, V) per DSpark step, (1, L, V) for a DFlash block), at positions that start at the
 * round's emitted count and advance by the tokens drawn.
 */
export function positionedDraftSampler(target: PositionedTargetSampler, start: number): Sampler {
  let next = drafterMutated("positioned_draft_keys_shifted") ? start + 1 : start;
  return (logits: MlxArray): MlxArray => {
    const V = logits.shape[logits.ndim - 1]!;
    const length = logits.ndim === 3 ? logits.shape[1]! : 1;
    if (logits.ndim !== 1 && logits.shape[0] !== 1) throw new GenerateError("Draft sampler row count does not match logits batch size.");
    using flat = mx.reshape(logits, [length, V]);
    const positions = Array.from({ length }, (_, k) => next + k);
    next += length;
    using sampled = target.sampleTarget(flat, positions);
    return mx.reshape(sampled, logits.shape.slice(0, -1));
  };
}

/** _sample_dflash_target_block for one sequence: per-position log-softmax of (1, L, V), sampled at base, base + 1, ... Caller-owned (L,). */
export function sampleTargetBlock(target: PositionedTargetSampler, logits: MlxArray, base: number): MlxArray {
  const [, L, V] = logits.shape as [number, number, number];
  const rows: MlxArray[] = [];
  try {
    for (let p = 0; p < L; p++) {
      using r3 = mx.slice(logits, [0, p, 0], [1, p + 1, V]);
      using r = mx.squeeze(r3, 1);
      using lse = mx.logsumexp(r, -1, true);
      rows.push(mx.subtract(r, lse));
    }
    using lps = mx.concatenate(rows, 0); // (L, V): _dflash_target_logprobs stacked, flattened
    return target.sampleTarget(lps, Array.from({ length: L }, (_, p) => base + p));
  } finally {
    for (const r of rows) r.dispose();
  }
}

/**
 * Plain (non-speculative) decoding's use of the positioned sampler: generate_step's _step samples
 * token n at position n (target_sample_position). A Sampler for model/generate.ts, called once per
 * token in order; dispose() releases the target sampler.
 */
export function positionedSequenceSampler(s: SpeculativeSampling, seed: number): Sampler {
  const target = new PositionedTargetSampler(s, seed);
  let n = 0;
  const f = ((logprobs: MlxArray): MlxArray => target.sampleTarget(logprobs, [n++])) as Sampler;
  f.dispose = () => target.dispose();
  return f;
}
