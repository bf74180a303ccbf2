// Speculative decoding with a draft model, following mlx_lm/generate.py speculative_generate_step
// (mlx-lm 0.32.2) call for call:
//
//  1. y = prompt.astype(uint32); caches = make_prompt_cache(model) / (draft_model);
//  2. prefill the draft, then the target, with prefill_step_size (default 512): every prompt
//     token but the last, in chunks, caches evaluated and the buffer cache cleared after each;
//  3. each round: k = min(max_tokens - ntoks, num_draft_tokens) draft tokens, one at a time
//     (_step(draft, y) → logits[:, -1:, :] → logprobs → sampler); the target runs ONCE on
//     [y, d_1 … d_k] and samples k + 1 tokens from logits[:, -(k+1):, :];
//  4. accept while the target's token equals the draft's (yielded with fromDraft = true), then the
//     target's own token (fromDraft = false); rewind: target by k - n, draft by max(k - n - 1, 0);
//     with every draft accepted, the next draft input is [d_k, new token];
//  5. the round in flight is rewound once more on exit (Python's finally).
//
// One difference, on purpose: the rewind. mlx-lm trims with trim_prompt_cache, which becomes a
// silent no-op for ALL caches once any RotatingKVCache has filled its window, so from the first
// rejection past the window its output leaves greedy decoding (docs: mlxlm-extras §6;
// suites/speculative/mlxlm_divergence.py shows it). Here the draft caches rewind by replay and the
// target verifies through WindowVerifyCache views (model/cache/rewind.ts), so the output equals
// plain greedy generate_step bit for bit, logprobs included, at every length. While every cache
// is within its window the calls are mlx-lm's exactly (same ops, same trims, same cache bytes).
//
// Another: mlx-lm splits one `prompt_cache` list as [:len(model.layers)] / [len(model.layers):],
// which is wrong for Gemma 4 models with KV-shared layers (they make fewer caches than layers);
// here the target's and the draft's prompt caches are separate options.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "./cache/index.ts";
import { commitVerify, RecordingCache, verifyCaches } from "./cache/rewind.ts";
import { type CallInfo, GenerateError, type GenerateModel } from "./generate.ts";
import { greedySampler, makeSampler, type Sampler, type SamplerOptions } from "./sample.ts";

export interface SpeculativeStepOptions {
  /** Draft tokens per round (>= 1). Default 2, as speculative_generate_step. */
  numDraftTokens?: number;
  /** Tokens to generate (> 0). Default 256. */
  maxTokens?: number;
  /** One sampler for the draft and the target (default greedy); exclusive with samplerOptions. */
  sampler?: Sampler;
  samplerOptions?: SamplerOptions;
  /** The target's pre-computed caches (updated in place); default model.makeCache(). */
  promptCache?: KVCacheLike[];
  /** The draft's pre-computed caches (updated in place); default draft.makeCache(). */
  draftPromptCache?: KVCacheLike[];
  /** Default 512, as speculative_generate_step. */
  prefillStepSize?: number;
  /** Seed the global MLX random state first (mx.random.seed). */
  seed?: number;
  /** Called once per round, once its acceptance is known and before its tokens are yielded. */
  onRound?: (r: SpeculativeRound) => void;
}

export interface SpeculativeRound {
  /** Draft tokens proposed this round. */
  drafted: number[];
  /** How many of them the target accepted. */
  accepted: number;
  /** The target's k + 1 sampled tokens. */
  target: number[];
}

export interface SpeculativeToken {
  token: number;
  /** (V,) log-probabilities; BORROWED: valid until the iterator is resumed. */
  logprobs: MlxArray;
  /** True when the token was a draft token the target accepted. */
  fromDraft: boolean;
  /** 0-based index of the generated token. */
  n: number;
}

function u32(tokens: readonly number[]): MlxArray {
  return mx.array(Uint32Array.from(tokens), [1, tokens.length], "uint32");
}

/**
 * The prefill of generate_step / speculative_generate_step: every token but the last, in chunks
 * of `step`, evaluating the caches and clearing the buffer cache after each. Returns the tokens
 * left (the last one).
 */
export function prefillChunks(model: GenerateModel, cache: KVCacheLike[], tokens: readonly number[], step: number, ids: (t: readonly number[]) => MlxArray = u32): number[] {
  let rest = tokens.slice();
  let k = 0;
  while (rest.length > 1) {
    const n = Math.min(step, rest.length - 1);
    const call: CallInfo = { kind: "prefill", index: k++ };
    {
      using inp = ids(rest.slice(0, n));
      model.forward(inp, cache, call).dispose(); // logits never evaluated, as in Python
    }
    const states = cache.flatMap((c) => c.state);
    try {
      mx.evaluate(states);
    } finally {
      for (const s of states) s.dispose();
    }
    rest = rest.slice(n);
    mx.clearCache();
  }
  return rest;
}

/** An option that must be a positive integer (its default when absent); GenerateError otherwise. */
export function positiveIntOption(name: string, v: number | undefined, def: number): number {
  const x = v ?? def;
  if (!Number.isInteger(x) || x < 1) throw new GenerateError(`${name} must be a positive integer, got ${x}`);
  return x;
}

/** The prompt must hold token ids in [0, vocab). */
export function checkPromptIds(prompt: readonly number[], vocab = Infinity): void {
  if (prompt.length === 0) throw new GenerateError("the prompt must contain at least one token");
  const bad = prompt.find((t) => !Number.isInteger(t) || t < 0 || t >= vocab);
  if (bad !== undefined) throw new GenerateError(`prompt token ids must be integers in [0, ${vocab}), got ${bad}`);
}

function validate(prompt: readonly number[], o: SpeculativeStepOptions): { k: number; maxTokens: number; prefill: number } {
  checkPromptIds(prompt);
  if (o.sampler && o.samplerOptions) throw new GenerateError("give either sampler or samplerOptions, not both");
  return { k: positiveIntOption("numDraftTokens", o.numDraftTokens, 2), maxTokens: positiveIntOption("maxTokens", o.maxTokens, 256), prefill: positiveIntOption("prefillStepSize", o.prefillStepSize, 512) };
}

/**
 * speculative_generate_step as an async iterator. Argument errors throw synchronously as
 * GenerateError. The target and the draft must share the vocabulary.
 */
export function speculativeGenerateStep(model: GenerateModel, draft: GenerateModel, prompt: readonly number[], opts: SpeculativeStepOptions = {}): AsyncGenerator<SpeculativeToken> {
  const v = validate(prompt, opts);
  return run(model, draft, prompt, opts, v.k, v.maxTokens, v.prefill);
}

async function* run(model: GenerateModel, draft: GenerateModel, prompt: readonly number[], opts: SpeculativeStepOptions, numDraftTokens: number, maxTokens: number, prefill: number): AsyncGenerator<SpeculativeToken> {
  if (opts.seed !== undefined) mx.random.seed(opts.seed);
  const ownSampler = opts.sampler === undefined && opts.samplerOptions !== undefined;
  const sampler: Sampler = opts.sampler ?? (opts.samplerOptions ? makeSampler(opts.samplerOptions) : greedySampler);
  const modelCache = opts.promptCache ?? model.makeCache();
  const draftCache = opts.draftPromptCache ?? draft.makeCache();
  let index = 0;

  // _step(model, cache, y, n_predict): logits[:, -n_predict:, :].squeeze(0) → logprobs → sampler.
  const step = (m: GenerateModel, cache: KVCacheLike[], y: MlxArray, nPredict: number): [MlxArray, MlxArray] => {
    using inp = mx.expandDims(y, 0);
    using all = m.forward(inp, cache, { kind: "step", index: index++ });
    const [B, L, V] = all.shape as [number, number, number];
    using last = mx.slice(all, [0, L - nPredict, 0], [B, L, V]);
    using logits = mx.squeeze(last, 0);
    using lse = mx.logsumexp(logits, -1, true);
    const logprobs = mx.subtract(logits, lse);
    return [sampler(logprobs), logprobs];
  };

  let targetViews: KVCacheLike[] | null = null;
  let draftRound: RecordingCache[] | null = null;
  let numDraft = 0;
  let accepted = 0;
  // _rewind_cache(num_draft, num_accept), each round exactly once.
  const rewind = (): void => {
    if (targetViews) commitVerify(targetViews, numDraft + 1, accepted + 1);
    if (draftRound) for (const c of draftRound) c.rewind(Math.max(numDraft - accepted - 1, 0));
    targetViews = draftRound = null;
  };
  const live: MlxArray[] = [];
  const drop = (): void => {
    for (const a of live.splice(0)) a.dispose();
  };

  try {
    let draftY = prefillChunks(draft, draftCache, prompt, prefill);
    let y = prefillChunks(model, modelCache, prompt, prefill);
    let ntoks = 0;
    while (true) {
      numDraft = Math.min(maxTokens - ntoks, numDraftTokens);
      accepted = 0;
      // _draft_generate(draft_y, num_draft)
      draftRound = draftCache.map((c) => new RecordingCache(c));
      const drafts: MlxArray[] = [];
      let draftList: number[];
      let tokenList: number[];
      try {
        let dy = mx.array(Uint32Array.from(draftY), [draftY.length], "uint32");
        for (let i = 0; i < numDraft; i++) {
          const [t, lp] = step(draft, draftRound, dy, 1);
          lp.dispose();
          dy.dispose();
          mx.asyncEval(t);
          drafts.push(t);
          dy = mx.alias(t);
        }
        dy.dispose();
        using draftTokens = mx.concatenate(drafts, 0);
        using yArr = mx.array(Uint32Array.from(y), [y.length], "uint32");
        using verify = mx.concatenate([yArr, draftTokens], 0);
        const views = verifyCaches(modelCache, numDraft + 1);
        try {
          live.push(...step(model, views, verify, numDraft + 1));
        } catch (e) {
          for (const c of views) if (!modelCache.includes(c)) c.dispose();
          throw e;
        }
        targetViews = views;
        mx.evaluate(live[0]!, draftTokens);
        draftList = draftTokens.toNumbers();
        tokenList = live[0]!.toNumbers();
      } catch (e) {
        for (const c of draftRound) c.finish();
        draftRound = null;
        throw e;
      } finally {
        for (const d of drafts) d.dispose();
      }
      const logprobs = live[1]!;
      const rowOf = (n: number): MlxArray => {
        const V = logprobs.shape[1]!;
        using r = mx.slice(logprobs, [n, 0], [n + 1, V]);
        const row = mx.squeeze(r, 0);
        live.push(row);
        return row;
      };
      // The round is reported before its tokens are yielded (as mlx-vlm records a round before it
      // yields): a consumer that stops on one of its accepted drafts (EOS, or its token budget)
      // closes this generator at that yield, and a report after the walk would never run. The
      // walk below accepts the leading matches, up to the token budget.
      let willAccept = 0;
      while (willAccept < numDraft && tokenList[willAccept] === draftList[willAccept] && ntoks + willAccept < maxTokens) willAccept++;
      opts.onRound?.({ drafted: draftList, accepted: willAccept, target: tokenList });
      while (accepted < numDraft) {
        if (tokenList[accepted] !== draftList[accepted]) break;
        const tn = tokenList[accepted]!;
        const lp = rowOf(accepted);
        accepted += 1;
        ntoks += 1;
        yield { token: tn, logprobs: lp, fromDraft: true, n: ntoks - 1 };
        if (ntoks === maxTokens) break;
      }
      if (ntoks < maxTokens) {
        ntoks += 1;
        yield { token: tokenList[accepted]!, logprobs: rowOf(accepted), fromDraft: false, n: ntoks - 1 };
      }
      if (ntoks === maxTokens) break;
      y = [tokenList[accepted]!];
      // Every draft accepted: the last draft token has not been through the draft model yet.
      draftY = accepted === numDraft ? [draftList[numDraft - 1]!, y[0]!] : y;
      rewind();
      drop();
    }
  } finally {
    try {
      rewind();
    } finally {
      drop();
      if (ownSampler) sampler.dispose?.();
      if (opts.promptCache === undefined) for (const c of modelCache) c.dispose();
      if (opts.draftPromptCache === undefined) for (const c of draftCache) c.dispose();
    }
  }
}
