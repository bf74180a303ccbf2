// Token generation following mlx_lm/generate.py generate_step (mlx-lm 0.32.2):
//
//  1. cache = model.makeCache() unless a prompt cache is given;
//  2. prefill: while more than one prompt token is left, run the model on the next
//     min(prefillStepSize, remaining - 1) tokens (logits discarded), eval every cache's state,
//     clear the MLX buffer cache;
//  3. _step(tokens): logits = model(tokens[None])[:, -1, :];
//     logprobs = logits - logsumexp(logits, keepdims=True); y = sampler(logprobs);
//  4. the decode loop pipelines: step n+1 is issued (async_eval) before token n is yielded, so
//     max_tokens tokens cost max_tokens + 1 model calls, as in Python (the sampler, and hence the
//     global random key, is consumed max_tokens + 1 times); clear_cache every 256 tokens.
//
// generate() adds stream_generate's stopping rule: stop after an EOS id (yielded, with
// finishReason "stop") or after maxTokens tokens (finishReason "length").
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "./cache/index.ts";
import { greedySampler, makeSampler, type Sampler, type SamplerOptions } from "./sample.ts";

export class GenerateError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "GenerateError";
  }
}

/** Which model call this is, in the oracle's tap-prefix vocabulary (prefill{k}/, step{n}/). */
export interface CallInfo {
  kind: "prefill" | "step";
  index: number;
}

/** The model as generation sees it. forward(inputs (1, L) int32, cache) → logits (1, L, V), caller-owned. */
export interface GenerateModel {
  makeCache(): KVCacheLike[];
  forward(inputs: MlxArray, cache: KVCacheLike[], call: CallInfo): MlxArray;
}

/** What a step hook sees; every array is borrowed (valid during the call only). */
export interface StepInfo {
  call: CallInfo;
  /** The input tokens of this model call. */
  inputs: readonly number[];
  cache: readonly KVCacheLike[];
  /** Only for kind "step": logits[:, -1, :] (1, V), logprobs (1, V) (the sampler's input), sampled token (1,). */
  logits?: MlxArray;
  logprobs?: MlxArray;
  sampled?: MlxArray;
}

export interface GenerateStepOptions {
  /** Tokens to generate (> 0). Default 256. */
  maxTokens?: number;
  /** A sampler (logprobs → token ids); default greedy. Mutually exclusive with samplerOptions. */
  sampler?: Sampler;
  /** make_sampler options (temp, topP, minP, minTokensToKeep, topK). */
  samplerOptions?: SamplerOptions;
  /** Pre-computed caches (updated in place); default model.makeCache(). */
  promptCache?: KVCacheLike[];
  /** Default 2048. */
  prefillStepSize?: number;
  /**
   * false: no prefill chunks, the whole prompt goes to the first _step (mlx-vlm's generate_step
   * when its chunked-prefill policy says no: prefill_step_size = None). Default true.
   */
  chunkedPrefill?: boolean;
  /** Called after every model call (prefill chunks and steps), e.g. to read caches for parity. */
  onStep?: (info: StepInfo) => void;
  /** Seed the global MLX random state first (mx.random.seed). */
  seed?: number;
  /**
   * Called on the cache list after every model call (each prefill chunk before its eval, each
   * _step after the forward), where generate_step calls quantize_cache_fn (mlx-lm's and
   * mlx-vlm's); it may replace entries (cache/kv_quantize.ts makeKvQuantizer).
   */
  quantizeCache?: (cache: KVCacheLike[]) => void;
}

export interface GeneratedToken {
  token: number;
  /** (V,) log-probabilities of this step; BORROWED: valid until the iterator is resumed. */
  logprobs: MlxArray;
  /** 0-based index of the generated token. */
  n: number;
}

function validate(prompt: readonly number[], o: GenerateStepOptions): { maxTokens: number; prefill: number } {
  const maxTokens = o.maxTokens ?? 256;
  if (!Number.isInteger(maxTokens) || maxTokens <= 0) throw new GenerateError(`maxTokens must be a positive integer, got ${maxTokens}`);
  const prefill = o.prefillStepSize ?? 2048;
  if (!Number.isInteger(prefill) || prefill <= 0) throw new GenerateError(`prefillStepSize must be a positive integer, got ${prefill}`);
  if (prompt.length === 0) throw new GenerateError("the prompt must contain at least one token");
  for (const t of prompt) if (!Number.isInteger(t) || t < 0) throw new GenerateError(`prompt token ids must be non-negative integers, got ${t}`);
  if (o.sampler && o.samplerOptions) throw new GenerateError("give either sampler or samplerOptions, not both");
  const temp = o.samplerOptions?.temp;
  if (temp !== undefined && !(typeof temp === "number" && temp >= 0 && Number.isFinite(temp))) {
    throw new GenerateError(`temperature must be a finite number >= 0, got ${temp}`);
  }
  return { maxTokens, prefill };
}

function tokensArray(tokens: readonly number[]): MlxArray {
  // prompt[None] of an int32 prompt (mx.array(list) is int32).
  return mx.array(Int32Array.from(tokens), [1, tokens.length], "int32");
}

/**
 * generate_step as an async iterator of (token, logprobs). Argument errors throw synchronously
 * (before the first await) as GenerateError.
 */
export function generateStep(model: GenerateModel, prompt: readonly number[], opts: GenerateStepOptions = {}): AsyncGenerator<GeneratedToken> {
  const { maxTokens, prefill } = validate(prompt, opts);
  return run(model, prompt, opts, maxTokens, prefill);
}

async function* run(model: GenerateModel, prompt: readonly number[], opts: GenerateStepOptions, maxTokens: number, prefillStep: number): AsyncGenerator<GeneratedToken> {
  if (opts.seed !== undefined) mx.random.seed(opts.seed);
  const ownSampler = opts.sampler === undefined && opts.samplerOptions !== undefined;
  const sampler: Sampler = opts.sampler ?? (opts.samplerOptions ? makeSampler(opts.samplerOptions) : greedySampler);
  const cache = opts.promptCache ?? model.makeCache();
  const ownCache = opts.promptCache === undefined;
  let stepIndex = 0;

  // tokens: the remaining prompt (int32) or the previous step's sampled y (uint32, shape (1,)),
  // fed lazily as Python does (`_step(y)` → `y[None]`), keeping the decode pipelined.
  const step = (tokens: readonly number[] | MlxArray): [MlxArray, MlxArray] => {
    const call: CallInfo = { kind: "step", index: stepIndex++ };
    using inp = Array.isArray(tokens) ? tokensArray(tokens) : mx.expandDims(tokens as MlxArray, 0);
    using all = model.forward(inp, cache, call);
    opts.quantizeCache?.(cache);
    const [B, L, V] = all.shape as [number, number, number];
    using last = mx.slice(all, [0, L - 1, 0], [B, L, V]);
    using logits = mx.squeeze(last, 1); // logits[:, -1, :]
    using lse = mx.logsumexp(logits, null, true);
    using logprobs = mx.subtract(logits, lse);
    const sampled = sampler(logprobs);
    const lp = mx.squeeze(logprobs, 0);
    if (opts.onStep) {
      const inputs = Array.isArray(tokens) ? tokens : (tokens as MlxArray).toNumbers();
      opts.onStep({ call, inputs, cache, logits, logprobs, sampled });
    }
    return [sampled, lp];
  };

  // Arrays alive across yields, disposed on exit whatever happens.
  const live = new Set<MlxArray>();
  const hold = (p: [MlxArray, MlxArray]): [MlxArray, MlxArray] => {
    live.add(p[0]);
    live.add(p[1]);
    return p;
  };
  const drop = (p: [MlxArray, MlxArray]): void => {
    for (const a of p) {
      live.delete(a);
      a.dispose();
    }
  };
  try {
    let rest = prompt.slice();
    let k = 0;
    while (opts.chunkedPrefill !== false && rest.length > 1) {
      const n = Math.min(prefillStep, rest.length - 1);
      const chunk = rest.slice(0, n);
      const call: CallInfo = { kind: "prefill", index: k++ };
      {
        using inp = tokensArray(chunk);
        const logits = model.forward(inp, cache, call);
        logits.dispose(); // never evaluated, as in Python
      }
      opts.quantizeCache?.(cache);
      const states = cache.flatMap((c) => c.state);
      try {
        mx.evaluate(states);
      } finally {
        for (const s of states) s.dispose();
      }
      if (opts.onStep) opts.onStep({ call, inputs: chunk, cache });
      rest = rest.slice(n);
      mx.clearCache();
    }

    let cur = hold(step(rest));
    mx.asyncEval(cur[0], cur[1]);
    let n = 0;
    while (true) {
      let next: [MlxArray, MlxArray] | null = null;
      if (n !== maxTokens) {
        next = hold(step(cur[0]));
        mx.asyncEval(next[0], next[1]);
      }
      if (n === 0) mx.evaluate(cur[0]);
      if (n === maxTokens) break;
      yield { token: cur[0].item() as number, logprobs: cur[1], n };
      if (n % 256 === 0) mx.clearCache();
      drop(cur);
      cur = next!;
      n += 1;
    }
  } finally {
    for (const a of live) a.dispose();
    if (ownSampler) sampler.dispose?.();
    if (ownCache) for (const c of cache) c.dispose();
  }
}

export interface GenerateOptions extends GenerateStepOptions {
  /** Stop after any of these ids (the EOS token is yielded, finishReason "stop"). */
  eosTokenIds?: readonly number[];
}

export interface GenerationResponse extends GeneratedToken {
  /** "stop" after an EOS id, "length" on the maxTokens-th token, else null. */
  finishReason: "stop" | "length" | null;
}

/** stream_generate's loop over generate_step: EOS / maxTokens stopping, streamed. */
export function generate(model: GenerateModel, prompt: readonly number[], opts: GenerateOptions = {}): AsyncGenerator<GenerationResponse> {
  const maxTokens = opts.maxTokens ?? 256;
  const inner = generateStep(model, prompt, opts);
  const eos = new Set(opts.eosTokenIds ?? []);
  return (async function* () {
    try {
      for await (const t of inner) {
        const stop = eos.has(t.token);
        const finishReason = stop ? "stop" : t.n + 1 === maxTokens ? "length" : null;
        yield { ...t, finishReason };
        if (stop) return;
      }
    } finally {
      await inner.return(undefined);
    }
  })();
}
