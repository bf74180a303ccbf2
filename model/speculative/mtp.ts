// Gemma 4 MTP speculative decoding with the gemma4_assistant / gemma4_unified_assistant drafter, as
// mlx-vlm 0.7.10 runs it for one sequence, greedy or sampled:
//
//   generate/ar.py generate_step     prefill prompt[:-1] in chunks (2048), then the last prompt
//                                    token with return_hidden / return_shared_kv: the first
//                                    (bonus) token, the last layer's pre-norm hidden and the K/V
//                                    of the last layer of each type
//   speculative/utils.py             run_speculative_rounds: every RotatingKVCache becomes a
//                                    BufferedRotatingKVCache (slack of max(32, min(128, 8 x block)))
//   speculative/mtp.py _mtp_rounds   each round: bs = block size; the drafter drafts bs - 1 tokens
//                                    from (bonus, norm(hidden)); the target verifies
//                                    [bonus, drafts] in ONE forward (skip_final_norm, shared-KV
//                                    sink); the walk projects logits position by position
//                                    (norm → tied embedding → softcap) and accepts while the
//                                    target's argmax equals the draft; rejected positions are
//                                    trimmed from every cache (rollback_speculative_cache); the
//                                    next round starts from the hidden of the accepted slot and
//                                    the shared K/V minus the rejected tail.
//
// Exact-match acceptance of the target's own greedy token: the output is greedy decoding's.
//
// Sampled (temperature > 0, mlx_vlm.generate --temp T --seed S; sampling.ts): the first token is
// sampled from the prefill's logprobs; draft_block runs with greedy=False (no centroid argmax: the
// drafter's logits go through the sampler at every step) under _SpeculativeSamplerRNG, so its draws
// are undone before the target samples; the verify forward samples nothing (sample_target_tokens
// False) and the deferred walk samples the target one position at a time (one key each) while it
// equals the draft. As for DFlash, every emitted token costs one key of the global sequence.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { BufferedRotatingKVCache } from "../cache/buffered_rotating.ts";
import { type KVCacheLike, RotatingKVCache } from "../cache/index.ts";
import type { LayerType } from "../gemma4/config.ts";
import { type KV, logit_softcap, type Model as TargetModel } from "../gemma4/gemma4_text.ts";
import { GenerateError } from "../generate.ts";
import { checkPromptIds, positiveIntOption, prefillChunks } from "../generate_speculative.ts";
import { greedySampler, type Sampler } from "../sample.ts";
import { drawWithoutTargetKeys, isPositioned, makeSpeculativeSampler, roundKeyAfterWalk, type SpeculativeSampling, validateSampling } from "./sampling.ts";
import { disposeKVMap, type Gemma4AssistantDraftModel } from "./drafters/gemma4_assistant/gemma4_assistant.ts";

export interface MtpOptions {
  /** Tokens to generate (> 0). Default 256. */
  maxTokens?: number;
  /** Block size (drafts + 1) instead of the drafter's configured block_size (--draft-block-size). */
  draftBlockSize?: number;
  /** Default 2048 (mlx-vlm's DEFAULT_PREFILL_STEP_SIZE). */
  prefillStepSize?: number;
  /** make_sampler's options (mlx-vlm's: a positive temperature clamped to >= 0.01); absent or temp 0: greedy. */
  sampling?: SpeculativeSampling;
  /** mx.random.seed first (mlx_vlm.generate --seed). */
  seed?: number;
  /** After the prefill step: the first token's logprobs (1, V), borrowed. */
  onPrefill?: (p: { token: number; logprobs: MlxArray; cache: readonly KVCacheLike[] }) => void;
  /** After each round's commit; arrays are borrowed (valid during the call). */
  onRound?: (r: MtpRound) => void;
}

export interface MtpRound {
  blockSize: number;
  /** The drafter's bs - 1 tokens. */
  drafted: number[];
  /** The drafter's logits (1, 1, V) per draft step (none with the greedy centroid head). */
  draftLogits: MlxArray[];
  accepted: number;
  /** The target's logits (1, V) at each walked position (accepted + 1 of them, or fewer at the budget). */
  targetLogits: MlxArray[];
  /** Tokens emitted this round. */
  emitted: number[];
  /** The target's caches after the rollback. */
  cache: readonly KVCacheLike[];
  /** Sampled runs: the global random key after the round's walk (null when greedy). */
  rngKey: MlxArray | null;
}

export interface MtpToken {
  token: number;
  /** 0-based index of the generated token. */
  n: number;
  /** True for tokens of the MTP rounds that were accepted drafts. */
  fromDraft: boolean;
}

/** _effective_mtp_block_size: a block larger than the configured one only after repeated full-depth accepts. */
export function effectiveMtpBlockSize(requested: number, configured: number, acceptLens: readonly number[], remaining: number): number {
  const blockTotal = Math.min(requested, remaining);
  const conf = Math.min(configured, blockTotal);
  if (blockTotal <= conf || conf <= 1) return blockTotal;
  if (acceptLens.length < 8) return conf;
  const recent = acceptLens.slice(-32);
  const hits = recent.filter((a) => a >= conf - 1).length;
  if (hits / recent.length < 0.65) return conf;
  return blockTotal;
}

/** _buffer_mtp_target_cache: the BufferedRotatingKVCache slack for a block size. */
export function mtpBufferSize(configured: number, requested: number | undefined): number {
  return Math.max(32, Math.min(128, Math.max(configured, requested ?? configured) * 8));
}

function tokensI32(tokens: readonly number[]): MlxArray {
  return mx.array(Int32Array.from(tokens), [1, tokens.length], "int32");
}

/** speculative_logits_from_hidden: logits_from_hidden(norm(hidden)) = softcap(embed.as_linear(norm(h))). */
function logitsFromHidden(target: TargetModel, hidden: MlxArray): MlxArray {
  using normed = target.model.norm.call(hidden);
  const logits = target.model.embed_tokens.asLinear(normed);
  if (target.final_logit_softcapping === null) return logits;
  using l = logits;
  return logit_softcap(target.final_logit_softcapping, l);
}

/** One forward of the target's text model: pre-norm hidden and the shared-K/V sink. */
function targetForward(target: TargetModel, inputs: MlxArray, cache: KVCacheLike[]): [MlxArray, Map<LayerType, KV>] {
  const sink = new Map<LayerType, KV>();
  try {
    return [target.model.call(inputs, { cache, shared_kv_sink: sink, skip_final_norm: true }), sink];
  } catch (e) {
    disposeKVMap(sink);
    throw e;
  }
}

function validate(target: TargetModel, draft: Gemma4AssistantDraftModel, prompt: readonly number[], o: MtpOptions): { maxTokens: number; prefill: number } {
  const maxTokens = positiveIntOption("maxTokens", o.maxTokens, 256);
  const prefill = positiveIntOption("prefillStepSize", o.prefillStepSize, 2048);
  if (o.draftBlockSize !== undefined && (!Number.isInteger(o.draftBlockSize) || o.draftBlockSize < 2)) {
    throw new GenerateError(`draftBlockSize must be an integer >= 2 (one draft token at least), got ${o.draftBlockSize}`);
  }
  const V = target.args.vocab_size;
  checkPromptIds(prompt, V);
  // validate_drafter_compatibility (mtp): the drafter reads the target's hidden state.
  if (draft.config.backbone_hidden_size !== target.args.hidden_size) {
    throw new GenerateError(`the drafter is for a target of hidden size ${draft.config.backbone_hidden_size}, this target has ${target.args.hidden_size}: use the drafter checkpoint for the same target family and size`);
  }
  if (draft.config.text_config.vocab_size !== V) throw new GenerateError(`the drafter's vocabulary (${draft.config.text_config.vocab_size}) differs from the target's (${V})`);
  if (!target.tie_word_embeddings) throw new GenerateError("MTP needs a target with tied embeddings (mlx-vlm's Gemma 4 language model has no lm_head)");
  for (const t of new Set(draft.config.text_config.layer_types)) {
    if (!target.args.layer_types.slice(0, target.args.num_hidden_layers).includes(t)) throw new GenerateError(`the drafter has ${t} layers, the target has none to share K/V from`);
  }
  validateSampling(o, V);
  // mlx-vlm's positioned MTP path drafts through _PositionedTargetSampler.__call__, which draws from
  // the global key that generate_step(seed=...) never seeds: its drafts are not reproducible.
  if (isPositioned(o.sampling)) throw new GenerateError("positioned sampling (generate_step's seed argument) is ported for the DFlash loop only: mlx-vlm's MTP loop drafts it from the unseeded global random key");
  return { maxTokens, prefill };
}

/**
 * mlx-vlm's generate_step with draft_kind="mtp", one sequence, greedy or sampled: yields every token.
 * Argument errors throw synchronously as GenerateError.
 */
export function mtpGenerateStep(target: TargetModel, draft: Gemma4AssistantDraftModel, prompt: readonly number[], opts: MtpOptions = {}): AsyncGenerator<MtpToken> {
  const v = validate(target, draft, prompt, opts);
  return run(target, draft, prompt, opts, v.maxTokens, v.prefill);
}

async function* run(target: TargetModel, draft: Gemma4AssistantDraftModel, prompt: readonly number[], opts: MtpOptions, maxTokens: number, prefill: number): AsyncGenerator<MtpToken> {
  if (opts.seed !== undefined) mx.random.seed(opts.seed);
  const sampler = makeSpeculativeSampler(opts.sampling, target.args.vocab_size);
  const cache: KVCacheLike[] = target.makeCache();
  const model = { makeCache: () => cache, forward: (inp: MlxArray, c: KVCacheLike[]) => target.call(inp, { cache: c }) };
  let sharedKv: Map<LayerType, KV> | null = null;
  let hidden: MlxArray | null = null;
  try {
    // generate_step: chunked prefill, then _step(last token) with return_hidden / return_shared_kv.
    const rest = prefillChunks(model, cache, prompt, prefill, tokensI32);
    let bonus: number;
    {
      using inp = tokensI32(rest);
      const [h, sink] = targetForward(target, inp, cache);
      sharedKv = sink;
      using _h = h;
      using logits3 = logitsFromHidden(target, h);
      const [B, L, V] = logits3.shape as [number, number, number];
      using last = mx.slice(logits3, [0, L - 1, 0], [B, L, V]);
      using logits = mx.squeeze(last, 1);
      using lse = mx.logsumexp(logits, -1, true);
      using logprobs = mx.subtract(logits, lse);
      using y = sampler(logprobs);
      hidden = target.model.norm.call(h); // _mtp_draft_hidden(hidden[:, -1:]) (L = 1 here)
      // run_speculative_rounds: buffer the rotating caches, then yield the first token.
      const configured = draft.config.block_size;
      const bufferSize = mtpBufferSize(configured, opts.draftBlockSize);
      for (let i = 0; i < cache.length; i++) {
        const c = cache[i]!;
        if (c instanceof BufferedRotatingKVCache) c.bufferSize = Math.max(c.bufferSize, bufferSize);
        else if (c instanceof RotatingKVCache && c.keep === 0) {
          cache[i] = BufferedRotatingKVCache.fromCache(c, bufferSize);
          c.dispose();
        }
      }
      mx.evaluate(y);
      bonus = y.item() as number;
      opts.onPrefill?.({ token: bonus, logprobs, cache });
    }
    yield { token: bonus, n: 0, fromDraft: false };
    const h0 = hidden;
    const kv0 = sharedKv;
    hidden = null;
    sharedKv = null;
    yield* mtpRounds(target, draft, cache, h0, kv0, bonus, maxTokens, opts, sampler);
  } finally {
    hidden?.dispose();
    disposeKVMap(sharedKv);
    for (const c of cache) c.dispose();
    sampler.dispose?.();
  }
}

/**
 * _mtp_rounds: takes ownership of `hidden` (the target's pre-norm... normed hidden of the last
 * position, (1, 1, H)) and `sharedKv`.
 */
async function* mtpRounds(
  target: TargetModel,
  draft: Gemma4AssistantDraftModel,
  cache: KVCacheLike[],
  hidden0: MlxArray,
  sharedKv0: Map<LayerType, KV>,
  firstBonus: number,
  maxTokens: number,
  opts: MtpOptions,
  sampler: Sampler,
): AsyncGenerator<MtpToken> {
  const sampled = sampler !== greedySampler;
  const configured = draft.config.block_size;
  const blockTotal = opts.draftBlockSize ?? configured; // _dflash_block_total
  draft.reset(target);
  let hidden = hidden0;
  let kvOffset = cache[0]?.offset ?? 0; // _mtp_cache_offset_max: the first cache's offset
  draft.setSharedKv(sharedKv0, kvOffset, Math.max(kvOffset - 1, 0), kvOffset);
  let b = firstBonus;
  let emitted = 1;
  try {
    while (emitted < maxTokens) {
      const bs = effectiveMtpBlockSize(blockTotal, configured, draft.accept_lens, maxTokens - emitted + 1);
      if (bs <= 1) break;
      const draftLogits: MlxArray[] = [];
      const targetLogits: MlxArray[] = [];
      try {
        // _mtp_draft_kwargs: greedy (the centroid argmax) only when greedy; sampled drafts draw their own keys
        using draftTokens = drawWithoutTargetKeys(sampled, () => {
          const t = draft.draftBlock(b, hidden, bs, sampler, !sampled, (l) => draftLogits.push(mx.alias(l)));
          if (sampled) mx.evaluate(t);
          else mx.asyncEval(t);
          return t;
        });
        using bArr = mx.array(Int32Array.from([b]), [1, 1], "int32");
        using verifyInput = mx.concatenate([bArr, draftTokens], 1);
        const [vHidden, vShared] = targetForward(target, verifyInput, cache);
        let sliced: Map<LayerType, KV> | null = null;
        try {
          // _speculative_walk_deferred_greedy: logits only until the first rejection.
          mx.asyncEval(vHidden);
          const drafted = draftTokens.toNumbers();
          const budget = maxTokens - emitted;
          const nDraft = drafted.length;
          let accepted = 0;
          const newTokens: number[] = [];
          const H = vHidden.shape[2]!;
          for (let pos = 0; pos <= nDraft; pos++) {
            using hpos = mx.slice(vHidden, [0, pos, 0], [1, pos + 1, H]);
            using l3 = logitsFromHidden(target, hpos);
            const logits = mx.squeeze(l3, 1); // logits[:, 0, :]
            targetLogits.push(logits);
            using lse = mx.logsumexp(logits, -1, true);
            using logprobs = mx.subtract(logits, lse);
            using t = sampler(logprobs);
            mx.evaluate(t);
            const token = t.item() as number;
            if (pos < nDraft && token === drafted[pos]) {
              accepted += 1;
              if (newTokens.length < budget) newTokens.push(token);
              continue;
            }
            if (newTokens.length < budget) newTokens.push(token);
            break;
          }
          // _record_speculative_round
          draft.accept_lens.push(accepted);
          draft.draft_lens.push(bs - 1);
          // commit_speculative_round → rollback_speculative_cache: trim the rejected tail.
          const trim = bs - (accepted + 1);
          if (accepted < bs - 1 && trim > 0) for (const c of cache) c.trim(Math.min(trim, c.offset));
          using rngKey = roundKeyAfterWalk(sampled);
          opts.onRound?.({ blockSize: bs, drafted, draftLogits, accepted, targetLogits, emitted: newTokens, cache, rngKey });
          for (const [i, tok] of newTokens.entries()) {
            yield { token: tok, n: emitted, fromDraft: i < accepted };
            emitted += 1;
            if (emitted >= maxTokens) return;
          }
          // Next round: the hidden of the accepted slot, the shared K/V minus the rejected tail.
          using hs = mx.slice(vHidden, [0, accepted, 0], [1, accepted + 1, H]);
          const nextHidden = target.model.norm.call(hs);
          hidden.dispose();
          hidden = nextHidden;
          b = newTokens.length ? newTokens[newTokens.length - 1]! : b;
          sliced = sliceSharedKvAfterReject(vShared, bs - (accepted + 1));
          kvOffset += accepted + 1;
          draft.setSharedKv(sliced, kvOffset, kvOffset - 1, kvOffset);
          sliced = null;
          if (emitted % 256 === 0) mx.clearCache();
        } finally {
          vHidden.dispose();
          disposeKVMap(vShared);
          disposeKVMap(sliced);
        }
      } finally {
        for (const a of [...draftLogits, ...targetLogits]) a.dispose();
      }
    }
  } finally {
    hidden.dispose();
  }
}

/** _slice_shared_kv_after_reject: drop the rejected tail (keep at least one position). Fresh handles. */
export function sliceSharedKvAfterReject(shared: Map<LayerType, KV>, rejected: number): Map<LayerType, KV> {
  const out = new Map<LayerType, KV>();
  for (const [type, [K, V]] of shared) {
    const len = K.shape[K.ndim - 2]!;
    const valid = len - rejected;
    const keep = rejected <= 0 || valid >= len ? len : valid <= 0 ? 1 : valid;
    const cut = (x: MlxArray) => {
      if (keep === len) return mx.alias(x);
      const s = x.shape;
      return mx.slice(x, [0, 0, 0, 0], [s[0]!, s[1]!, keep, s[3]!]);
    };
    out.set(type, [cut(K), cut(V)]);
  }
  return out;
}
