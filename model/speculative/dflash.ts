// Gemma 4 DFlash speculative decoding with a DFlash drafter (gemma4_dflash, gemma4_dspark), as
// mlx-vlm 0.7.10 runs it for one sequence, greedy or sampled:
//
//   generate/ar.py generate_step     no chunked prefill with a DFlash drafter (the Gemma 4 language
//                                    model's chunked_prefill_policy): the whole prompt in one
//                                    forward with capture_layer_ids = the drafter's target_layer_ids
//                                    and logits_to_keep = 1; the first (bonus) token is the argmax of
//                                    the last position's logprobs; the prompt's captured layer
//                                    outputs, concatenated, are the drafter's first context
//   speculative/utils.py             run_speculative_rounds: yields the bonus, then _dflash_rounds
//                                    (the target's caches stay as they are: no buffering)
//   speculative/dflash.py            _dflash_rounds: drafter.reset (bind + fresh drafter caches);
//                                    KVCache.prefix_cache_reserve(offset + block); each round: block
//                                    size from the recent acceptance (_dflash_next_block_size); the
//                                    drafter drafts bs - 1 tokens from (bonus, context); the target
//                                    verifies [bonus, drafts] in ONE forward (LanguageModel with
//                                    speculative_verify: the ordinary forward without
//                                    exact_speculative_verify) capturing the layers; greedy walk on
//                                    argmax(logits); the next context is the captured hidden of the
//                                    accepted positions (accepted + 1 rows); rejected positions are
//                                    trimmed from every target cache (Gemma 4's
//                                    rollback_speculative_cache). The drafter caches only context,
//                                    which is always committed, so it never rolls back.
//
// Sampled (temperature > 0), as mlx_vlm.generate --temp T --seed S runs it (sampling.ts: make_sampler
// on the global random state) and _dflash_rounds takes its non-positioned sampled path:
//   first token     sampler(logprobs) on the prefill's last row (one key)
//   draft           draft_model.draft_block with the sampler on the drafter's raw logits (DFlash:
//                   one draw over the (1, bs - 1, V) block; DSpark: one per Markov step), under
//                   _SpeculativeSamplerRNG: the drafter starts from the round's key and its draws
//                   are undone before the target samples (the drafter's state is re-synced to the
//                   target's after every walk, so this is save / restore around the draft)
//   walk            _sample_dflash_target_walk: per position, logits - logsumexp (one row at a
//                   time), one sampler call and eval; accept while it equals the draft; the first
//                   differing sample (or the bonus after all drafts) ends the round
// So every emitted token costs exactly one key of the global sequence, as plain sampled decoding.
// Positioned (sampling.positioned: generate_step(seed=S), mlx-vlm's API and server): the first token
// at position 0, the drafter's block sampled with the target's keys for positions emitted, emitted
// + 1, ... (_PositionedDraftSampler), the verify block sampled at once at the same positions
// (_sample_dflash_target_block) and walked as greedy's (_speculative_walk_batch); no global key.
//
// Greedy: exact-match acceptance of the target's own greedy token: the output is greedy decoding's where
// block rows equal single-token rows (the CPU backend). Verify blocks are multi-token, so a sliding
// layer's RotatingKVCache takes them by concatenation (the whole window kept plus the block) and
// the trim drops only the block's rejected tail: every measured run, 40 tokens past a window of 8
// included, equals greedy (suites/speculative/gemma4_dflash.full.json).
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type KVCacheLike, KVCache } from "../cache/index.ts";
import { disposeMask } from "../mask.ts";
import { logit_softcap, type Model as TargetModel } from "../gemma4/gemma4_text.ts";
import { GenerateError } from "../generate.ts";
import { checkPromptIds, positiveIntOption } from "../generate_speculative.ts";
import { greedySampler, type Sampler } from "../sample.ts";
import { drawWithoutTargetKeys, isPositioned, makeSpeculativeSampler, PositionedTargetSampler, positionedDraftSampler, roundKeyAfterWalk, sampleTargetBlock, type SpeculativeSampling, validateSampling } from "./sampling.ts";
import type { DFlashDraftModel } from "./drafters/qwen3_dflash/dflash.ts";
import { drafterMutated } from "./mutations.ts";

export interface DFlashOptions {
  /** Tokens to generate (> 0). Default 256. */
  maxTokens?: number;
  /** Block size (drafts + 1) instead of the drafter's (--draft-block-size): the adaptive loop's ceiling. */
  draftBlockSize?: number;
  /** make_sampler's options (mlx-vlm's: a positive temperature clamped to >= 0.01); absent or temp 0: greedy. */
  sampling?: SpeculativeSampling;
  /** mx.random.seed first (mlx_vlm.generate --seed). */
  seed?: number;
  /** After the prefill: the first token, its logprobs (1, V), the target caches and the captured prompt hidden; borrowed. */
  onPrefill?: (p: { token: number; logprobs: MlxArray; cache: readonly KVCacheLike[]; hidden: MlxArray }) => void;
  /** After each round's commit; arrays are borrowed (valid during the call). */
  onRound?: (r: DFlashRound) => void;
}

export interface DFlashRound {
  blockSize: number;
  /** The drafter's bs - 1 tokens. */
  drafted: number[];
  /** The drafter's logits (1, bs - 1, V). */
  draftLogits: MlxArray;
  /** The drafter's caches after the draft. */
  draftCache: readonly KVCacheLike[];
  /** [bonus, drafts]. */
  verifyInput: number[];
  /** The target's verify logits (1, bs, V) and captured layer outputs, concatenated (1, bs, n * H). */
  targetLogits: MlxArray;
  targetHidden: MlxArray;
  accepted: number;
  /** Tokens emitted this round. */
  emitted: number[];
  /** The target's caches after the rollback. */
  cache: readonly KVCacheLike[];
  /** Sampled runs: the global random key after the round's walk (null when greedy). */
  rngKey: MlxArray | null;
}

export interface DFlashToken {
  token: number;
  /** 0-based index of the generated token. */
  n: number;
  /** True for tokens of the rounds that were accepted drafts. */
  fromDraft: boolean;
}

/** _dflash_block_total: the requested block size, else the config's block_size (capped by runtime_block_size). */
export function dflashBlockTotal(draft: DFlashDraftModel, requested: number | undefined): number {
  if (requested !== undefined) return requested;
  const configured = draft.config.block_size;
  const runtime = draft.config.runtime_block_size;
  if (runtime === null) return configured;
  return Math.min(configured, Math.max(1, runtime));
}

/**
 * _dflash_next_block_size: the requested size with prefer_requested_block_size (DSpark's fixed
 * policy); else the initial size first, then back off when deep positions are mostly rejected and
 * grow back on full accepts.
 */
export function dflashNextBlockSize(requestedTotal: number, remaining: number, acceptLens: readonly number[], draftLens: readonly number[], hooks: { preferRequested?: boolean; initialBlockSize?: number | null; minBlockSize?: number } = {}): number {
  const blockTotal = Math.min(requestedTotal, remaining);
  if (blockTotal <= 1) return blockTotal;
  if (hooks.preferRequested) return blockTotal;
  const minBlockSize = hooks.minBlockSize ?? 4;
  const a8 = acceptLens.slice(-8);
  const d8 = draftLens.slice(-8);
  const recent: [number, number][] = [];
  for (let i = 0; i < Math.min(a8.length, d8.length); i++) if (d8[i]! > 0) recent.push([a8[i]!, d8[i]!]);
  if (!recent.length) {
    const initial = hooks.initialBlockSize ?? null;
    return initial !== null ? Math.min(blockTotal, Math.max(2, Math.trunc(initial))) : blockTotal;
  }
  const current = Math.min(blockTotal, Math.max(2, recent[recent.length - 1]![1] + 1));
  const minTotal = Math.min(blockTotal, Math.max(2, minBlockSize));
  const drafted = recent.reduce((s, [, d]) => s + d, 0);
  const accepted = recent.reduce((s, [a]) => s + a, 0);
  const acceptRate = accepted / drafted;
  const meanAccept = accepted / recent.length;
  if (acceptRate < 0.3 || meanAccept < 2.0) {
    if (current >= 8) return Math.max(minTotal, Math.min(blockTotal, Math.floor(current / 2)));
    return Math.max(minTotal, Math.min(blockTotal, current - 2));
  }
  if (acceptRate < 0.5) return Math.max(minTotal, Math.min(blockTotal, current - 2));
  const fullHitRate = recent.filter(([a, d]) => a >= d).length / recent.length;
  if (acceptRate >= 0.85 && fullHitRate >= 0.75) return Math.min(blockTotal, current + 2);
  return Math.min(blockTotal, current);
}

/** KVCache.prefix_cache_reserve(offset + block) (_reserve_dflash_target_cache): zero capacity up to a multiple of the step. */
export function reserveDFlashTargetCache(cache: readonly KVCacheLike[], blockSize: number): void {
  for (const c of cache) {
    if (!(c instanceof KVCache) || c.keys === null || c.values === null) continue;
    let capacity = Math.max(c.offset, c.offset + blockSize);
    capacity = Math.ceil(capacity / KVCache.step) * KVCache.step;
    const have = c.keys.shape[2]!;
    if (capacity <= have) continue;
    const grow = (x: MlxArray): MlxArray => {
      const s = x.shape;
      using z = mx.zeros([s[0]!, s[1]!, capacity - have, s[3]!], x.dtype);
      return mx.concatenate([x, z], 2);
    };
    const k = grow(c.keys);
    const v = grow(c.values);
    c.keys.dispose();
    c.values.dispose();
    c.keys = k;
    c.values = v;
  }
}

/**
 * mlx-vlm's LanguageModel forward with capture_layer_ids (and logits_to_keep): logits (1, L', V)
 * and the captured layer outputs concatenated on the last axis (1, L, n * H), both caller-owned.
 */
export function targetForwardCapture(target: TargetModel, inputs: MlxArray, cache: KVCacheLike[], layerIds: readonly number[], logitsToKeep = 0): [MlxArray, MlxArray] {
  using stack = new DisposableStack();
  const tm = target.model;
  const [h0, perLayer] = tm.embed(inputs, null, null);
  stack.use(h0);
  for (const p of perLayer) if (p) stack.use(p);
  const caches = tm.layers.map((_, i) => cache[i] ?? null);
  const masks = tm._make_masks(h0, caches);
  stack.defer(() => {
    for (const m of new Set(masks)) disposeMask(m);
  });
  const capture = new Set(layerIds);
  const sink: MlxArray[] = [];
  stack.defer(() => {
    for (const s of sink) s.dispose();
  });
  // logits_to_keep with a hidden sink: trim from max(first KV-shared layer, last captured + 1)
  const firstShared = target.args.num_hidden_layers - target.args.num_kv_shared_layers;
  const trim = logitsToKeep > 0 ? { keep: logitsToKeep, before: Math.max(firstShared, Math.max(...capture) + 1) } : undefined;
  const h = stack.use(tm.runLayers(h0, masks, caches, perLayer, undefined, { trim, capture: { layers: capture, sink } }));
  let out = stack.use(tm.norm.call(h));
  if (logitsToKeep > 0) {
    const s = out.shape;
    out = stack.use(mx.slice(out, [0, s[1]! - logitsToKeep, 0], s));
  }
  const lin = stack.use(tm.embed_tokens.asLinear(out));
  const logits = target.final_logit_softcapping === null ? mx.alias(lin) : logit_softcap(target.final_logit_softcapping, lin);
  return [logits, mx.concatenate(sink, -1)];
}

/** The port's pairing checks (mlx-vlm runs a mismatched pair until a shape error or silently). */
function validate(target: TargetModel, draft: DFlashDraftModel, prompt: readonly number[], o: DFlashOptions): number {
  const maxTokens = positiveIntOption("maxTokens", o.maxTokens, 256);
  if (o.draftBlockSize !== undefined && (!Number.isInteger(o.draftBlockSize) || o.draftBlockSize < 2)) {
    throw new GenerateError(`draftBlockSize must be an integer >= 2 (one draft token at least), got ${o.draftBlockSize}`);
  }
  const V = target.args.vocab_size;
  checkPromptIds(prompt, V);
  const c = draft.config;
  try {
    draft.validateTargetCompatibility?.(target); // validate_drafter_compatibility: the drafter's own check first
  } catch (e) {
    throw new GenerateError((e as Error).message);
  }
  if (c.hidden_size !== target.args.hidden_size) {
    throw new GenerateError(`the drafter is for a target of hidden size ${c.hidden_size}, this target has ${target.args.hidden_size}: use the drafter checkpoint for the same target family and size`);
  }
  if (c.vocab_size !== V) throw new GenerateError(`the drafter's vocabulary (${c.vocab_size}) differs from the target's (${V})`);
  if (c.mask_token_id >= V) throw new GenerateError(`the drafter's mask token ${c.mask_token_id} is outside the target's vocabulary (${V})`);
  const bad = c.target_layer_ids.find((i) => i >= target.args.num_hidden_layers);
  if (bad !== undefined) throw new GenerateError(`the drafter reads target layer ${bad}, this target has ${target.args.num_hidden_layers} layers`);
  if (!target.tie_word_embeddings) throw new GenerateError("DFlash needs a target with tied embeddings (mlx-vlm's Gemma 4 language model has no lm_head)");
  validateSampling(o, V);
  return maxTokens;
}

/**
 * mlx-vlm's generate_step with draft_kind="dflash", one sequence, greedy or sampled: yields every token.
 * Argument errors throw synchronously as GenerateError.
 */
export function dflashGenerateStep(target: TargetModel, draft: DFlashDraftModel, prompt: readonly number[], opts: DFlashOptions = {}): AsyncGenerator<DFlashToken> {
  const maxTokens = validate(target, draft, prompt, opts);
  return run(target, draft, prompt, opts, maxTokens);
}

const tokensI32 = (tokens: readonly number[]): MlxArray => mx.array(Int32Array.from(tokens), [1, tokens.length], "int32");

/** The target layers whose outputs the drafter reads (the mutation shifts them by one). */
function captureLayers(target: TargetModel, draft: DFlashDraftModel): readonly number[] {
  const ids = draft.config.target_layer_ids;
  return drafterMutated("dflash_target_layers_shifted") ? ids.map((i) => (i + 1) % target.args.num_hidden_layers) : ids;
}

async function* run(target: TargetModel, draft: DFlashDraftModel, prompt: readonly number[], opts: DFlashOptions, maxTokens: number): AsyncGenerator<DFlashToken> {
  const positioned = isPositioned(opts.sampling) ? new PositionedTargetSampler(opts.sampling!, opts.seed!) : null;
  if (opts.seed !== undefined && !positioned) mx.random.seed(opts.seed);
  const sampler = positioned ? greedySampler : makeSpeculativeSampler(opts.sampling, target.args.vocab_size);
  const cache: KVCacheLike[] = target.makeCache();
  let hidden: MlxArray | null = null;
  try {
    let bonus: number;
    {
      using inp = tokensI32(prompt);
      const [logits3, h] = targetForwardCapture(target, inp, cache, captureLayers(target, draft), 1);
      hidden = h;
      using _l = logits3;
      using logits = mx.squeeze(logits3, 1); // logits[:, -1, :] (one row kept)
      using lse = mx.logsumexp(logits, -1, true);
      using logprobs = mx.subtract(logits, lse);
      using y = positioned ? positioned.sampleTarget(logprobs, [0]) : sampler(logprobs);
      mx.evaluate(y);
      bonus = y.item() as number;
      opts.onPrefill?.({ token: bonus, logprobs, cache, hidden });
    }
    yield { token: bonus, n: 0, fromDraft: false };
    const h0 = hidden;
    hidden = null;
    yield* dflashRounds(target, draft, cache, h0, bonus, maxTokens, opts, sampler, positioned);
  } finally {
    hidden?.dispose();
    for (const c of cache) c.dispose();
    sampler.dispose?.();
    positioned?.dispose();
  }
}

/** _dflash_target_logprobs then the sampler at each position (_sample_dflash_target_walk, one row). */
function sampledWalk(logits: MlxArray, drafted: readonly number[], sampler: Sampler, budget: number): { accepted: number; newTokens: number[] } {
  const [, L, V] = logits.shape as [number, number, number];
  for (let position = 0; position < L; position++) {
    using row3 = mx.slice(logits, [0, position, 0], [1, position + 1, V]);
    using row = mx.squeeze(row3, 1);
    using lse = mx.logsumexp(row, -1, true);
    using logprobs = mx.subtract(row, lse);
    using t = sampler(logprobs);
    mx.evaluate(t);
    const tok = t.toNumbers()[0]!;
    if (position < drafted.length && tok === drafted[position]) continue;
    const tokens = drafted.slice(0, position);
    if (tokens.length < budget) tokens.push(tok);
    return { accepted: position, newTokens: tokens.slice(0, budget) };
  }
  return { accepted: drafted.length, newTokens: drafted.slice(0, budget) };
}

/** _speculative_walk: drafts up to the first mismatch with the target's greedy tokens, then the target's. */
function greedyWalk(targetRow: readonly number[], drafted: readonly number[], budget: number): { accepted: number; newTokens: number[] } {
  const nDraft = drafted.length;
  let accepted = nDraft;
  for (let i = 0; i < nDraft; i++) {
    if (drafted[i] !== targetRow[i]) {
      accepted = drafterMutated("dflash_acceptance_off_by_one") ? i + 1 : i;
      break;
    }
  }
  return { accepted, newTokens: [...drafted.slice(0, accepted), ...targetRow.slice(accepted, accepted + 1)].slice(0, budget) };
}

/** _dflash_rounds: takes ownership of `hidden0` (the prompt's captured hidden). */
async function* dflashRounds(target: TargetModel, draft: DFlashDraftModel, cache: KVCacheLike[], hidden0: MlxArray, firstBonus: number, maxTokens: number, opts: DFlashOptions, sampler: Sampler, positioned: PositionedTargetSampler | null): AsyncGenerator<DFlashToken> {
  const layerIds = captureLayers(target, draft);
  const sampled = sampler !== greedySampler;
  let blockTotal = dflashBlockTotal(draft, opts.draftBlockSize);
  const contextLength = hidden0.shape[1]!;
  if (draft.chooseBlockCeiling) blockTotal = draft.chooseBlockCeiling(contextLength, blockTotal);
  let initialBlockSize = draft.dflash_initial_block_size;
  if (draft.chooseInitialBlockSize) initialBlockSize = draft.chooseInitialBlockSize(contextLength, blockTotal);
  const draftCache = draft.reset(target);
  reserveDFlashTargetCache(cache, blockTotal);
  let hidden = hidden0;
  let b = firstBonus;
  let emitted = 1; // the first bonus has already been yielded
  const keepRejected = drafterMutated("drafter_rollback_keeps_one") ? 1 : 0;
  try {
    while (emitted < maxTokens) {
      const bs = dflashNextBlockSize(blockTotal, maxTokens - emitted + 1, draft.accept_lens, draft.draft_lens, {
        preferRequested: draft.prefer_requested_block_size,
        initialBlockSize,
        minBlockSize: draft.dflash_min_block_size,
      });
      if (bs <= 1) break;
      let draftLogits: MlxArray | null = null;
      // _SpeculativeSamplerRNG.draft_tokens: the drafter's draws are undone before the target samples
      using draftTokens = drawWithoutTargetKeys(sampled, () => {
        const t = draft.draftBlock(b, hidden, draftCache, bs, positioned ? positionedDraftSampler(positioned, emitted) : sampler, (l) => (draftLogits = mx.alias(l)));
        mx.evaluate(t);
        return t;
      });
      const drafted = draftTokens.toNumbers();
      const verifyInput = [b, ...drafted];
      using vin = tokensI32(verifyInput);
      const [logits, vHidden] = targetForwardCapture(target, vin, cache, layerIds);
      let rngKey: MlxArray | null = null;
      try {
        let walk: { accepted: number; newTokens: number[] };
        if (positioned) {
          // _sample_dflash_target_block, then _speculative_walk_batch (greedy's walk on the sampled tokens)
          using targetTokens = sampleTargetBlock(positioned, logits, emitted);
          mx.evaluate(targetTokens, vHidden);
          walk = greedyWalk(targetTokens.toNumbers(), drafted, maxTokens - emitted);
        } else if (sampled) {
          mx.evaluate(vHidden);
          walk = sampledWalk(logits, drafted, sampler, maxTokens - emitted);
          rngKey = roundKeyAfterWalk(true);
        } else {
          using targetTokens = greedySampler(logits);
          mx.evaluate(targetTokens, vHidden);
          walk = greedyWalk(targetTokens.toNumbers(), drafted, maxTokens - emitted);
        }
        const { accepted, newTokens } = walk;
        draft.accept_lens.push(accepted);
        draft.draft_lens.push(bs - 1);
        const nextHidden = accepted < bs - 1 && !drafterMutated("dflash_context_all_rows") ? mx.slice(vHidden, [0, 0, 0], [1, accepted + 1, vHidden.shape[2]!]) : mx.alias(vHidden);
        hidden.dispose();
        hidden = nextHidden;
        b = newTokens.length ? newTokens[newTokens.length - 1]! : b;
        // commit_speculative_round -> Gemma 4 rollback_speculative_cache: trim the rejected tail
        if (accepted < bs - 1) {
          const trim = bs - (accepted + 1) - keepRejected;
          if (trim > 0) for (const c of cache) c.trim(trim);
        }
        opts.onRound?.({ blockSize: bs, drafted, draftLogits: draftLogits!, draftCache, verifyInput, targetLogits: logits, targetHidden: vHidden, accepted, emitted: newTokens, cache, rngKey });
        for (const [i, tok] of newTokens.entries()) {
          yield { token: tok, n: emitted, fromDraft: i < accepted };
          emitted += 1;
          if (emitted >= maxTokens) return;
        }
      } finally {
        logits.dispose();
        vHidden.dispose();
        (draftLogits as MlxArray | null)?.dispose();
        (rngKey as MlxArray | null)?.dispose();
      }
    }
  } finally {
    hidden.dispose();
    for (const c of draftCache) c.dispose();
  }
}
