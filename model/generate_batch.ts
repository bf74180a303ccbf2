// Batched generation following mlx_lm/generate.py (mlx-lm 0.32.2): StopSequences,
// PromptProcessingBatch, GenerationBatch, BatchGenerator (continuous batching) and batch_generate.
//
// How a sequence moves through BatchGenerator.next():
//  1. insert() splits each prompt into segments [..., prompt[:-1], [prompt[-1]]] and gives it a
//     fresh per-sequence cache (model.makeCache()); the sequences wait in a queue.
//  2. next() first runs one decode step of the generation batch (if any), then moves up to
//     prefill_batch_size queued sequences into the prompt batch (their caches merged into batch
//     caches), splits off the sequences whose only remaining segment is their last token into a
//     new GenerationBatch (whose constructor already runs the first decode step on those tokens)
//     and extends the generation batch with it, and finally prefills the next <= prefill_step_size
//     tokens of every remaining prompt, right-padded to a common length (the batch caches roll
//     the padding to the left in finalize()).
//  3. A decode step is pipelined as in Python: the step that computes token n+1 is issued before
//     token n is returned, so a sequence costs max_tokens + 1 forward rows. A sequence finishes on
//     max_tokens ("length") or a stop sequence ("stop"); its response carries its extracted
//     single-sequence cache and all its tokens, and it is filtered out of the batch.
//
// Parity: every step's logprobs, tokens and batch-cache state are bit-exact against mlx-lm's
// BatchGenerator on the same inputs (suites/batch). They are NOT in general bit-exact against
// single-sequence generation: once a sliding-window cache rotates, a padded sequence sees its keys
// in another physical order (docs: mlxlm-extras §5.5).
//
// Ownership: a response's `logprobs` is borrowed, valid until the generator's next call (as in
// model/generate.ts); its `promptCache` likewise, unless taken with takePromptCache(). close()
// frees everything the generator holds. Logits processors are not supported (mlx-lm's
// logits_processors / TokenBuffer): no Gemma 4 face uses them.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVCache, type KVCacheLike, RotatingKVCache } from "./cache/index.ts";
import { type BatchCacheLike, mergeCaches } from "./cache/batch.ts";
import { GenerateError } from "./generate.ts";
import type { LoadedModel } from "./gemma4/index.ts";
import { cacheFactory } from "./runtime.ts";
import { greedySampler, type Sampler } from "./sample.ts";

/** The model as batched generation sees it. forward(inputs (B, L) int, batch caches) → logits (B, L, V), caller-owned. */
export interface BatchModel {
  /** One sequence's cache list (make_prompt_cache). */
  makeCache(): KVCacheLike[];
  forward(inputs: MlxArray, cache: BatchCacheLike[]): MlxArray;
  /** max_position_embeddings, when known: insert() refuses prompts that cannot fit. */
  readonly maxPositions?: number;
}

/** Wraps a loaded Gemma 4 checkpoint for batched generation. */
export function batchModel(loaded: LoadedModel): BatchModel {
  const { model } = loaded;
  return {
    makeCache: () => model.makeCache(cacheFactory),
    forward: (inputs, cache) => model.call(inputs, { cache }),
    maxPositions: loaded.text.args.max_position_embeddings,
  };
}

export const DEFAULT_MAX_TOKENS = 100;

// ------------------------------------------------------------------------------ StopSequences

interface TrieNode {
  next: Map<number, TrieNode>;
  fail: TrieNode | null;
  match: readonly number[] | null;
}

const node = (): TrieNode => ({ next: new Map(), fail: null, match: null });

/** _build_trie: an Aho-Corasick automaton over token sequences (empty patterns are skipped). */
function buildTrie(sequences: readonly (readonly number[])[]): TrieNode {
  const root = node();
  for (const seq of sequences) {
    let n = root;
    for (const tok of seq) {
      let c = n.next.get(tok);
      if (!c) n.next.set(tok, (c = node()));
      n = c;
    }
    if (n === root) continue; // an empty pattern would make the root match every token
    n.match = [...seq];
  }
  // BFS to set failure links and propagate matches.
  const queue: TrieNode[] = [];
  for (const child of root.next.values()) {
    child.fail = root;
    queue.push(child);
  }
  while (queue.length) {
    const parent = queue.shift()!;
    for (const [key, child] of parent.next) {
      queue.push(child);
      let fail = parent.fail!;
      while (!fail.next.has(key) && fail !== root) fail = fail.fail!;
      child.fail = fail.next.get(key) ?? root;
      if (child.match === null && child.fail.match !== null) child.match = child.fail.match;
    }
  }
  return root;
}

/** An immutable Aho-Corasick automaton over stop sequences; a Matcher holds one stream's position. */
export class StopSequences {
  private readonly root: TrieNode;

  constructor(stopSequences: readonly (readonly number[])[] | null = null) {
    if (stopSequences !== null) {
      if (!Array.isArray(stopSequences)) throw new GenerateError("stop sequences must be a list of token-id lists");
      for (const s of stopSequences) {
        if (!Array.isArray(s) || s.some((t) => !Number.isInteger(t) || t < 0)) throw new GenerateError(`a stop sequence must be a list of non-negative token ids, got ${JSON.stringify(s)}`);
      }
    }
    this.root = stopSequences && stopSequences.length ? buildTrie(stopSequences) : node();
  }

  matcher(): StopMatcher {
    return new StopMatcher(this.root);
  }
}

export class StopMatcher {
  private node: TrieNode;
  constructor(private readonly root: TrieNode) {
    this.node = root;
  }

  /** Consumes one token; whether a stop sequence completed. */
  advance(token: number): boolean {
    let n = this.node;
    // Fail back until the token continues a match, or we hit the root.
    while (!n.next.has(token) && n !== this.root) n = n.fail!;
    n = n.next.get(token) ?? n;
    this.node = n;
    return n.match !== null;
  }
}

// ------------------------------------------------------------------------------ helpers

function evalStates(caches: readonly BatchCacheLike[]): void {
  const states = caches.flatMap((c) => c.state);
  try {
    mx.evaluate(...states);
  } finally {
    for (const s of states) s.dispose();
  }
}

/** _extend_cache(a, b): a when b is empty, b when a is empty, else each a[i].extend(b[i]) (b is consumed). */
function extendCaches(a: BatchCacheLike[], b: BatchCacheLike[]): BatchCacheLike[] {
  if (a.length === 0) return b;
  if (b.length === 0) return a;
  a.forEach((ca, i) => ca.extend(b[i]!));
  for (const c of b) c.dispose();
  return a;
}

function pick<T>(xs: readonly T[], keep: readonly number[]): T[] {
  return keep.map((i) => xs[i]!);
}

function disposeAll(xs: Iterable<{ dispose(): void } | null | undefined>): void {
  for (const x of xs) x?.dispose();
}

/** A single-sequence cache list with its own handles (for extractCache of a queued sequence). */
function cloneCaches(caches: readonly KVCacheLike[]): KVCacheLike[] {
  return caches.map((c) => {
    const st = c.state;
    try {
      if (c instanceof KVCache) return KVCache.fromState(st, c.metaState);
      if (c instanceof RotatingKVCache) return RotatingKVCache.fromState(st, c.metaState);
      throw new GenerateError(`cannot copy a ${c.constructor.name}`);
    } finally {
      disposeAll(st);
    }
  });
}

// ------------------------------------------------------------------------------ batches

/**
 * What PromptProcessingBatch and GenerationBatch share (Python repeats it in both classes): the
 * sequences' uids, their batch caches, the tokens in those caches, and the per-sequence sampler,
 * stop sequences and token budget, kept in step by filter and extend.
 */
abstract class SequenceBatch {
  uids: number[];
  promptCache: BatchCacheLike[];
  /** Per sequence: the tokens contained in the cache. */
  tokens: number[][];
  samplers: Sampler[];
  stopSequences: StopSequences[];
  maxTokens: number[];

  constructor(uids: number[], promptCache: BatchCacheLike[], tokens: number[][], samplers: Sampler[], stopSequences: StopSequences[], maxTokens: number[]) {
    this.uids = uids;
    this.promptCache = promptCache;
    this.tokens = tokens;
    this.samplers = samplers;
    this.stopSequences = stopSequences;
    this.maxTokens = maxTokens;
  }

  get length(): number {
    return this.uids.length;
  }

  extractCache(idx: number): KVCacheLike[] {
    return this.promptCache.map((c) => c.extract(idx));
  }

  /** Appends the other batch's sequences (its caches are consumed). */
  protected extendSequences(batch: SequenceBatch): void {
    this.uids.push(...batch.uids);
    this.promptCache = extendCaches(this.promptCache, batch.promptCache);
    batch.promptCache = [];
    this.tokens.push(...batch.tokens);
    this.samplers.push(...batch.samplers);
    this.maxTokens.push(...batch.maxTokens);
    this.stopSequences.push(...batch.stopSequences);
  }

  /** Keeps the given sequences (an empty list clears the caches). */
  filter(keep: readonly number[]): void {
    this.uids = pick(this.uids, keep);
    if (keep.length === 0) {
      disposeAll(this.promptCache);
      this.promptCache = [];
    } else {
      for (const c of this.promptCache) c.filter(keep);
    }
    this.tokens = pick(this.tokens, keep);
    this.samplers = pick(this.samplers, keep);
    this.maxTokens = pick(this.maxTokens, keep);
    this.stopSequences = pick(this.stopSequences, keep);
  }
}

// ------------------------------------------------------------------------ PromptProcessingBatch

export interface PromptResponse {
  uid: number;
  /** (tokens processed, total prompt tokens). */
  progress: [number, number];
  endOfSegment: boolean;
  endOfPrompt: boolean;
}

/** Batched prompt processing (prefill) of sequences that have not started generating. */
export class PromptProcessingBatch extends SequenceBatch {
  constructor(
    readonly model: BatchModel,
    uids: number[],
    caches: readonly (readonly KVCacheLike[])[],
    readonly prefillStepSize: number,
    readonly fallbackSampler: Sampler,
    tokens: number[][],
    samplers: Sampler[],
    stopSequences: StopSequences[],
    maxTokens: number[],
  ) {
    super(uids, mergeCaches(caches), tokens, samplers, stopSequences, maxTokens);
  }

  static empty(model: BatchModel, fallbackSampler: Sampler, prefillStepSize = 2048): PromptProcessingBatch {
    return new PromptProcessingBatch(model, [], [], prefillStepSize, fallbackSampler, [], [], [], []);
  }

  extend(batch: PromptProcessingBatch): void {
    this.extendSequences(batch);
  }

  private copy(): PromptProcessingBatch {
    const b = PromptProcessingBatch.empty(this.model, this.fallbackSampler, this.prefillStepSize);
    b.uids = [...this.uids];
    b.promptCache = this.promptCache.map((c) => c.copy());
    b.tokens = [...this.tokens];
    b.samplers = [...this.samplers];
    b.stopSequences = [...this.stopSequences];
    b.maxTokens = [...this.maxTokens];
    return b;
  }

  /** Splits the given sequences off into a new batch (a copy filtered both ways, as Python). */
  split(indices: readonly number[]): PromptProcessingBatch {
    const sorted = [...indices].sort((a, b) => a - b);
    const left = this.uids.map((_, i) => i).filter((i) => !sorted.includes(i));
    const nb = this.copy();
    this.filter(left);
    nb.filter(sorted);
    return nb;
  }

  /** Runs the prompt tokens through the model, right-padded to one length, in prefill_step_size chunks. */
  prompt(tokens: readonly (readonly number[])[]): void {
    if (this.uids.length !== tokens.length) throw new GenerateError("The batch length doesn't match the number of inputs");
    if (tokens.length === 0) return;
    // self.tokens represents the tokens contained in the KV cache.
    tokens.forEach((t, i) => this.tokens[i]!.push(...t));
    const lengths = tokens.map((p) => p.length);
    const maxLength = Math.max(...lengths);
    const padding = lengths.map((l) => maxLength - l);
    const maxPadding = Math.max(...padding);
    const flat = new Int32Array(tokens.length * maxLength); // _right_pad_prompts: pads with token 0
    tokens.forEach((t, i) => flat.set(t, i * maxLength));
    if (maxPadding > 0) for (const c of this.promptCache) c.prepare({ lengths, rightPadding: padding });
    let rest = mx.array(flat, [tokens.length, maxLength], "int32");
    try {
      while (rest.shape[1]! > 0) {
        const [B, L] = rest.shape as [number, number];
        const n = Math.min(this.prefillStepSize, L);
        {
          using chunk = mx.slice(rest, [0, 0], [B, n]);
          const logits = this.model.forward(chunk, this.promptCache);
          logits.dispose(); // never evaluated, as in Python
        }
        evalStates(this.promptCache);
        mx.clearCache();
        rest = replaceArr(rest, mx.slice(rest, [0, n], [B, L]));
      }
    } finally {
      rest.dispose();
    }
    if (maxPadding > 0) {
      for (const c of this.promptCache) c.finalize();
      evalStates(this.promptCache);
      mx.clearCache();
    }
  }

  /** Moves to generation: prefills all but the last tokens, and starts a GenerationBatch on the last ones. */
  generate(tokens: readonly (readonly number[])[]): GenerationBatch {
    if (tokens.some((t) => t.length > 1)) this.prompt(tokens.map((t) => t.slice(0, -1)));
    const last = mx.array(Int32Array.from(tokens.map((t) => t[t.length - 1]!)), [tokens.length], "int32");
    const gen = new GenerationBatch(this.model, this.uids, last, this.promptCache, this.tokens, this.samplers, this.fallbackSampler, this.stopSequences, this.maxTokens);
    this.uids = [];
    this.promptCache = [];
    this.tokens = [];
    this.samplers = [];
    this.stopSequences = [];
    this.maxTokens = [];
    return gen;
  }

  dispose(): void {
    disposeAll(this.promptCache);
    this.promptCache = [];
  }
}

function replaceArr(old: MlxArray, next: MlxArray): MlxArray {
  old.dispose();
  return next;
}

// ---------------------------------------------------------------------------- GenerationBatch

export type FinishReason = "length" | "stop";

export class GenerationResponse {
  constructor(
    readonly uid: number,
    readonly token: number,
    /** (V,) log-probabilities of this step; BORROWED: valid until the generator's next call. */
    readonly logprobs: MlxArray,
    readonly finishReason: FinishReason | null,
    private cache: KVCacheLike[] | null,
    /** On finish: every token in the sequence's cache (prompt and generated). */
    readonly allTokens: readonly number[] | null,
  ) {}

  /** On finish: the sequence's extracted single-sequence caches; BORROWED like logprobs. */
  get promptCache(): readonly KVCacheLike[] | null {
    return this.cache;
  }

  /** Takes ownership of the extracted caches (the generator will not free them). */
  takePromptCache(): KVCacheLike[] | null {
    const c = this.cache;
    this.cache = null;
    return c;
  }

  dispose(): void {
    disposeAll(this.cache ?? []);
    this.cache = null;
  }
}

/** The decode phase of a batch of sequences: one token per sequence per step. */
export class GenerationBatch extends SequenceBatch {
  private currentLogprobs: MlxArray[] = [];
  private nextTokens: MlxArray | null;
  private nextLogprobs: MlxArray[] = [];
  private numTokens: number[];
  private matchers: StopMatcher[];

  constructor(
    readonly model: BatchModel,
    uids: number[],
    inputs: MlxArray,
    promptCache: BatchCacheLike[],
    tokens: number[][],
    samplers: Sampler[],
    readonly fallbackSampler: Sampler,
    stopSequences: StopSequences[],
    maxTokens: number[],
  ) {
    super(uids, promptCache, tokens, samplers, stopSequences, maxTokens);
    if (samplers.length && samplers.length !== uids.length) throw new GenerateError("Insufficient number of samplers provided");
    this.nextTokens = inputs;
    this.numTokens = uids.map(() => 0);
    this.matchers = stopSequences.map((s) => s.matcher());
    if (this.uids.length) this.step();
  }

  static empty(model: BatchModel, fallbackSampler: Sampler): GenerationBatch {
    return new GenerationBatch(model, [], mx.zeros([0], "uint32"), [], [], [], fallbackSampler, [], []);
  }

  /** Appends another generation batch (which is consumed). */
  extend(batch: GenerationBatch): void {
    this.extendSequences(batch);
    this.currentLogprobs.push(...batch.currentLogprobs);
    if (this.nextTokens === null) this.nextTokens = batch.nextTokens;
    else if (batch.nextTokens !== null) {
      const cat = mx.concatenate([this.nextTokens, batch.nextTokens]);
      this.nextTokens.dispose();
      batch.nextTokens.dispose();
      this.nextTokens = cat;
    }
    this.nextLogprobs.push(...batch.nextLogprobs);
    this.numTokens.push(...batch.numTokens);
    this.matchers.push(...batch.matchers);
    batch.currentLogprobs = [];
    batch.nextTokens = null;
    batch.nextLogprobs = [];
  }

  /** One decode step: feeds the pending tokens, samples the next ones (async), returns the pending ones. */
  private step(): [number[], MlxArray[]] {
    disposeAll(this.currentLogprobs);
    const inputs = this.nextTokens!;
    this.currentLogprobs = this.nextLogprobs;
    this.nextTokens = null;
    this.nextLogprobs = [];
    try {
      let logprobs: MlxArray;
      {
        using inp = mx.expandDims(inputs, 1); // inputs[:, None]
        using all = this.model.forward(inp, this.promptCache);
        const [B, L, V] = all.shape as [number, number, number];
        using last = mx.slice(all, [0, L - 1, 0], [B, L, V]);
        using logits = mx.squeeze(last, 1); // logits[:, -1, :]
        using lse = mx.logsumexp(logits, -1, true);
        logprobs = mx.subtract(logits, lse);
      }
      using _lp = logprobs;
      // One batched sampler call when the batch shares a sampler.
      const samplers = this.samplers.length ? this.samplers : this.uids.map(() => this.fallbackSampler);
      if (samplers.every((s) => s === samplers[0])) {
        this.nextTokens = samplers[0]!(logprobs);
      } else {
        const V = logprobs.shape[1]!;
        const parts = samplers.map((s, e) => {
          using row = mx.slice(logprobs, [e, 0], [e + 1, V]);
          return s(row);
        });
        try {
          this.nextTokens = mx.concatenate(parts, 0);
        } finally {
          disposeAll(parts);
        }
      }
      // list(logprobs): one (V,) row per sequence
      const V = logprobs.shape[1]!;
      this.nextLogprobs = this.uids.map((_, e) => {
        using row = mx.slice(logprobs, [e, 0], [e + 1, V]);
        return mx.squeeze(row, 0);
      });
      mx.asyncEval(this.nextTokens, ...this.nextLogprobs);
      // Eval the current tokens and logprobs; self.tokens always holds the tokens in the cache.
      mx.evaluate(inputs, ...this.currentLogprobs);
      const toks = inputs.toNumbers();
      toks.forEach((t, i) => this.tokens[i]!.push(t));
      return [toks, this.currentLogprobs];
    } finally {
      inputs.dispose();
    }
  }

  override filter(keep: readonly number[]): void {
    super.filter(keep);
    if (this.nextTokens !== null) {
      const old = this.nextTokens;
      if (keep.length) {
        using idx = mx.array(Int32Array.from(keep), [keep.length], "int32");
        this.nextTokens = mx.take(old, idx, 0);
      } else this.nextTokens = null;
      old.dispose();
    }
    const kept = new Set(keep);
    this.nextLogprobs.forEach((a, i) => {
      if (!kept.has(i)) a.dispose();
    });
    this.nextLogprobs = pick(this.nextLogprobs, keep);
    this.numTokens = pick(this.numTokens, keep);
    this.matchers = pick(this.matchers, keep);
  }

  /** The tokens of the previous step, one response per sequence; finished sequences leave the batch. */
  next(): GenerationResponse[] {
    if (this.uids.length === 0) return [];
    const [tokens, logprobs] = this.step();
    const keep: number[] = [];
    const responses: GenerationResponse[] = [];
    for (let i = 0; i < this.uids.length; i++) {
      let finish: FinishReason | null = null;
      this.numTokens[i]! += 1;
      if (this.numTokens[i]! >= this.maxTokens[i]!) finish = "length";
      if (this.matchers[i]!.advance(tokens[i]!)) finish = "stop";
      if (finish !== null) {
        responses.push(new GenerationResponse(this.uids[i]!, tokens[i]!, logprobs[i]!, finish, this.extractCache(i), [...this.tokens[i]!]));
      } else {
        keep.push(i);
        responses.push(new GenerationResponse(this.uids[i]!, tokens[i]!, logprobs[i]!, null, null, null));
      }
    }
    if (keep.length < this.uids.length) this.filter(keep);
    return responses;
  }

  dispose(): void {
    disposeAll(this.promptCache);
    disposeAll(this.currentLogprobs);
    disposeAll(this.nextLogprobs);
    this.nextTokens?.dispose();
    this.promptCache = [];
    this.currentLogprobs = [];
    this.nextLogprobs = [];
    this.nextTokens = null;
  }
}

// ----------------------------------------------------------------------------- BatchGenerator

/** mlx-lm's BatchCounters: never decrease, so two readings bound an interval. */
export interface BatchCounters {
  promptTokens: number;
  /** Seconds. */
  promptTime: number;
  generationTokens: number;
  generationSteps: number;
  /** Seconds. */
  decodeTime: number;
}

/** mlx-lm's BatchStats: the work between two readings, with wall time and peak memory. */
export interface BatchStats extends BatchCounters {
  wallTime: number;
  /** GB. */
  peakMemory: number;
  promptTps: number;
  generationTps: number;
  decodeTps: number;
}

export interface BatchGeneratorOptions {
  /** Default per-sequence token budget (128). */
  maxTokens?: number;
  /** Stop sequences (token-id lists) for every sequence. */
  stopTokens?: readonly (readonly number[])[] | null;
  /** Default sampler (greedy). */
  sampler?: Sampler;
  completionBatchSize?: number;
  prefillBatchSize?: number;
  prefillStepSize?: number;
}

interface Pending {
  uid: number;
  segments: number[][];
  maxTokens: number;
  cache: KVCacheLike[];
  ownCache: boolean;
  allTokens: number[];
  sampler: Sampler;
  stop: StopSequences;
}

export interface InsertOptions {
  maxTokens?: readonly number[];
  /** Pre-computed per-sequence caches (not modified; merged by copy). */
  caches?: readonly (readonly KVCacheLike[] | null)[];
  /** The tokens already in those caches. */
  allTokens?: readonly (readonly number[])[];
  samplers?: readonly (Sampler | null)[];
  stopSequences?: readonly StopSequences[];
}

function checkPositive(name: string, v: number): number {
  if (!Number.isInteger(v) || v <= 0) throw new GenerateError(`${name} must be a positive integer, got ${v}`);
  return v;
}

/** Continuous batching: sequences of different lengths join, generate and leave independently. */
export class BatchGenerator {
  readonly maxTokens: number;
  readonly sampler: Sampler;
  readonly prefillStepSize: number;
  readonly prefillBatchSize: number;
  readonly completionBatchSize: number;
  promptBatch: PromptProcessingBatch;
  generationBatch: GenerationBatch;
  private readonly defaultStop: StopSequences;
  private uidCount = 0;
  private unprocessed: Pending[] = [];
  /** Per prompt-batch sequence: [segments, processed, total]. */
  private processing: [number[][], number, number][] = [];
  private counters: BatchCounters = { promptTokens: 0, promptTime: 0, generationTokens: 0, generationSteps: 0, decodeTime: 0 };
  private lastResponses: GenerationResponse[] = [];

  constructor(
    readonly model: BatchModel,
    { maxTokens = 128, stopTokens = null, sampler, completionBatchSize = 32, prefillBatchSize = 8, prefillStepSize = 2048 }: BatchGeneratorOptions = {},
  ) {
    this.maxTokens = checkPositive("maxTokens", maxTokens);
    this.prefillStepSize = checkPositive("prefillStepSize", prefillStepSize);
    this.prefillBatchSize = checkPositive("prefillBatchSize", prefillBatchSize);
    this.completionBatchSize = Math.max(checkPositive("completionBatchSize", completionBatchSize), prefillBatchSize);
    this.sampler = sampler ?? greedySampler;
    this.defaultStop = new StopSequences(stopTokens && stopTokens.length ? stopTokens : null);
    this.promptBatch = PromptProcessingBatch.empty(model, this.sampler, prefillStepSize);
    this.generationBatch = GenerationBatch.empty(model, this.sampler);
  }

  /** Queues prompts (token-id lists); returns their uids. */
  insert(prompts: readonly (readonly number[])[], opts: InsertOptions = {}): number[] {
    if (!Array.isArray(prompts)) throw new GenerateError("prompts must be a list of token-id lists");
    return this.insertSegments(prompts.map((p) => [p]), opts);
  }

  /** Queues sequences given as segments (processing stops at segment boundaries). */
  insertSegments(segments: readonly (readonly (readonly number[])[])[], opts: InsertOptions = {}): number[] {
    const n = segments.length;
    const maxTokens = opts.maxTokens?.length ? opts.maxTokens : segments.map(() => this.maxTokens);
    const allTokens = opts.allTokens?.length ? opts.allTokens : segments.map(() => []);
    const samplers = opts.samplers?.length ? opts.samplers.map((s) => s ?? this.sampler) : segments.map(() => this.sampler);
    const stops = opts.stopSequences?.length ? opts.stopSequences : segments.map(() => this.defaultStop);
    const caches = opts.caches?.length ? opts.caches : segments.map(() => null);
    // Validate before touching any state.
    for (const [k, v] of Object.entries({ max_tokens: maxTokens, caches, all_tokens: allTokens, samplers, stop_sequences: stops })) {
      if (v.length !== n) throw new GenerateError(`Option ${k} must have one entry per segment: expected ${n}, got ${v.length}.`);
    }
    const pending: Pending[] = [];
    try {
      segments.forEach((seq0, i) => {
        const uid = this.uidCount + i;
        if (!Array.isArray(seq0)) throw new GenerateError(`Sequence ${uid} must be a list of token-id lists`);
        const seq = seq0.filter((s) => s.length > 0).map((s) => [...s]);
        if (seq.length === 0) throw new GenerateError(`Sequence ${uid} has an empty prompt.`);
        for (const s of seq) for (const t of s) if (!Number.isInteger(t) || t < 0) throw new GenerateError(`Sequence ${uid}: token ids must be non-negative integers, got ${t}`);
        const m = maxTokens[i]!;
        if (!Number.isInteger(m) || m <= 0) throw new GenerateError(`Sequence ${uid}'s max_tokens must be > 0.`);
        const total = allTokens[i]!.length + seq.reduce((a, s) => a + s.length, 0);
        const limit = this.model.maxPositions;
        if (limit !== undefined && total + m > limit) {
          throw new GenerateError(`Sequence ${uid}: its prompt (${total} tokens) plus max_tokens ${m} exceeds the model's max_position_embeddings (${limit})`);
        }
        if (seq[seq.length - 1]!.length !== 1) {
          const lastSeg = seq[seq.length - 1]!;
          seq[seq.length - 1] = lastSeg.slice(0, -1);
          seq.push(lastSeg.slice(-1));
        }
        const given = caches[i];
        pending.push({ uid, segments: seq, maxTokens: m, cache: given ? [...given] : this.model.makeCache(), ownCache: !given, allTokens: [...allTokens[i]!], sampler: samplers[i]!, stop: stops[i]! });
      });
    } catch (e) {
      for (const p of pending) if (p.ownCache) disposeAll(p.cache);
      throw e;
    }
    this.unprocessed.push(...pending);
    this.uidCount += n;
    return pending.map((p) => p.uid);
  }

  private findUids(uids: readonly number[]): Map<number, [0 | 1 | 2, number]> {
    const want = new Set(uids);
    const out = new Map<number, [0 | 1 | 2, number]>();
    this.generationBatch.uids.forEach((u, i) => want.has(u) && out.set(u, [2, i]));
    this.promptBatch.uids.forEach((u, i) => want.has(u) && out.set(u, [1, i]));
    this.unprocessed.forEach((p, i) => want.has(p.uid) && out.set(p.uid, [0, i]));
    return out;
  }

  /** Per uid: its caches (caller-owned) and the tokens they contain. */
  extractCache(uids: readonly number[]): Map<number, { cache: KVCacheLike[]; tokens: number[] }> {
    const out = new Map<number, { cache: KVCacheLike[]; tokens: number[] }>();
    for (const [uid, [stage, idx]] of this.findUids(uids)) {
      if (stage === 0) out.set(uid, { cache: cloneCaches(this.unprocessed[idx]!.cache), tokens: [...this.unprocessed[idx]!.allTokens] });
      else if (stage === 1) out.set(uid, { cache: this.promptBatch.extractCache(idx), tokens: [...this.promptBatch.tokens[idx]!] });
      else out.set(uid, { cache: this.generationBatch.extractCache(idx), tokens: [...this.generationBatch.tokens[idx]!] });
    }
    return out;
  }

  /** Drops sequences wherever they are (queue, prompt batch, generation batch). */
  remove(uids: readonly number[], returnPromptCaches = false): Map<number, { cache: KVCacheLike[]; tokens: number[] }> {
    const caches = returnPromptCaches ? this.extractCache(uids) : new Map();
    const keep: [Set<number>, Set<number>, Set<number>] = [
      new Set(this.unprocessed.map((_, i) => i)),
      new Set(this.promptBatch.uids.map((_, i) => i)),
      new Set(this.generationBatch.uids.map((_, i) => i)),
    ];
    for (const [stage, idx] of this.findUids(uids).values()) keep[stage].delete(idx);
    if (keep[0].size < this.unprocessed.length) {
      this.unprocessed = this.unprocessed.filter((p, i) => {
        if (!keep[0].has(i) && p.ownCache) disposeAll(p.cache);
        return keep[0].has(i);
      });
    }
    if (keep[1].size < this.promptBatch.length) {
      const k = [...keep[1]].sort((a, b) => a - b);
      this.promptBatch.filter(k);
      this.processing = pick(this.processing, k);
    }
    if (keep[2].size < this.generationBatch.length) this.generationBatch.filter([...keep[2]].sort((a, b) => a - b));
    return caches;
  }

  get promptCacheNbytes(): number {
    let total = 0;
    for (const p of this.unprocessed) for (const c of p.cache) total += c.nbytes;
    for (const c of this.promptBatch.promptCache) total += c.nbytes;
    for (const c of this.generationBatch.promptCache) total += c.nbytes;
    return total;
  }

  private makeBatch(n: number): PromptProcessingBatch {
    const seqs = this.unprocessed.splice(0, n);
    for (const s of seqs) this.processing.push([s.segments, 0, s.segments.reduce((a, x) => a + x.length, 0)]);
    try {
      return new PromptProcessingBatch(
        this.model,
        seqs.map((s) => s.uid),
        seqs.map((s) => s.cache),
        this.prefillStepSize,
        this.sampler,
        seqs.map((s) => s.allTokens),
        seqs.map((s) => s.sampler),
        seqs.map((s) => s.stop),
        seqs.map((s) => s.maxTokens),
      );
    } finally {
      // merged by copy: the per-sequence caches the generator made are no longer needed
      for (const s of seqs) if (s.ownCache) disposeAll(s.cache);
    }
  }

  /** One round: a decode step of the generation batch, then admission and prefill. Responses are borrowed until the next call. */
  next(): [PromptResponse[], GenerationResponse[]] {
    disposeAll(this.lastResponses);
    this.lastResponses = [];
    const promptResponses: PromptResponse[] = [];
    let generationResponses: GenerationResponse[] = [];

    // Generate tokens first.
    if (this.generationBatch.length > 0) {
      const tic = performance.now();
      generationResponses = this.generationBatch.next();
      this.lastResponses = generationResponses;
      this.counters.decodeTime += (performance.now() - tic) / 1000;
      this.counters.generationTokens += generationResponses.length;
      this.counters.generationSteps += 1;
      if (this.counters.generationSteps % 512 === 0) mx.clearCache();
    }
    // Exit early because we already have our hands full with decoding.
    if (this.generationBatch.length >= this.completionBatchSize) return [promptResponses, generationResponses];

    // Move queued sequences into the prompt batch.
    const n = Math.min(this.prefillBatchSize - this.promptBatch.length, this.completionBatchSize - this.generationBatch.length, this.unprocessed.length);
    if (n > 0) {
      const b = this.makeBatch(n);
      this.promptBatch.extend(b);
    }

    // Split off the sequences whose only remaining segment is their last token and start generating them.
    const keep: number[] = [];
    const split: number[] = [];
    this.processing.forEach(([segments], i) => (segments.length === 1 && segments[0]!.length === 1 ? split : keep).push(i));
    if (split.length) {
      const lastInputs = split.map((i) => this.processing[i]![0][0]!);
      const progress = split.map((i) => this.processing[i]![2]);
      this.processing = pick(this.processing, keep);
      const gen = this.promptBatch.split(split).generate(lastInputs);
      progress.forEach((p, i) => promptResponses.push({ uid: gen.uids[i]!, progress: [p, p], endOfSegment: true, endOfPrompt: true }));
      this.generationBatch.extend(gen);
    }

    // The next prompt inputs.
    const prompts: number[][] = [];
    this.processing.forEach((seq, i) => {
      const r: PromptResponse = { uid: this.promptBatch.uids[i]!, progress: [0, 0], endOfSegment: false, endOfPrompt: false };
      const segments = seq[0];
      const k = Math.min(segments[0]!.length, this.prefillStepSize);
      prompts.push(segments[0]!.slice(0, k));
      segments[0] = segments[0]!.slice(k);
      if (segments[0]!.length === 0) {
        segments.shift();
        r.endOfSegment = true;
      }
      seq[1] += prompts[prompts.length - 1]!.length;
      r.progress = [seq[1], seq[2]];
      promptResponses.push(r);
    });
    this.counters.promptTokens += prompts.reduce((a, p) => a + p.length, 0);
    const tic = performance.now();
    this.promptBatch.prompt(prompts);
    this.counters.promptTime += (performance.now() - tic) / 1000;
    return [promptResponses, generationResponses];
  }

  /** next() until a round yields generated tokens (empty when nothing is left). */
  nextGenerated(): GenerationResponse[] {
    while (true) {
      const [p, g] = this.next();
      if (g.length === 0 && p.length > 0) continue;
      return g;
    }
  }

  /** A reading of the counters; stats(reading) gives the work done since. */
  reading(): BatchCounters & { at: number; peak: number } {
    return { ...this.counters, at: performance.now(), peak: mx.getPeakMemory() };
  }

  stats(since: BatchCounters & { at: number; peak: number }): BatchStats {
    const c = this.counters;
    const s: BatchCounters = {
      promptTokens: c.promptTokens - since.promptTokens,
      promptTime: c.promptTime - since.promptTime,
      generationTokens: c.generationTokens - since.generationTokens,
      generationSteps: c.generationSteps - since.generationSteps,
      decodeTime: c.decodeTime - since.decodeTime,
    };
    const wallTime = (performance.now() - since.at) / 1000;
    const generationTime = Math.max(0, wallTime - s.promptTime);
    return {
      ...s,
      wallTime,
      peakMemory: Math.max(since.peak, mx.getPeakMemory()) / 1e9,
      promptTps: s.promptTime <= 0 ? 0 : s.promptTokens / s.promptTime,
      generationTps: generationTime <= 0 ? 0 : s.generationTokens / generationTime,
      decodeTps: s.decodeTime <= 0 ? 0 : s.generationTokens / s.decodeTime,
    };
  }

  /** Frees every array and cache the generator holds. */
  close(): void {
    disposeAll(this.lastResponses);
    this.lastResponses = [];
    this.promptBatch.dispose();
    this.generationBatch.dispose();
    for (const p of this.unprocessed) if (p.ownCache) disposeAll(p.cache);
    this.unprocessed = [];
    this.processing = [];
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

// ----------------------------------------------------------------------------- batch_generate

/** What batch_generate needs of a tokenizer: its EOS ids (stop tokens) and decode. */
export interface BatchTokenizer {
  eosTokenIds: readonly number[];
  decode(ids: number[]): string;
}

export interface BatchGenerateOptions extends Omit<BatchGeneratorOptions, "maxTokens" | "stopTokens"> {
  /** Per prompt or for all (128). */
  maxTokens?: number | readonly number[];
  promptCaches?: readonly (readonly KVCacheLike[] | null)[];
  returnPromptCaches?: boolean;
  /** Called as sequences finish (verbose progress). */
  onFinish?: (finished: number, total: number) => void;
}

export interface BatchResponse {
  texts: string[];
  stats: BatchStats;
  /** Per prompt, with returnPromptCaches: caller-owned. */
  caches: KVCacheLike[][] | null;
  tokenIds: number[][];
  /** The logprob of each generated token. */
  logprobs: number[][];
}

/** batch_generate: every prompt to completion; the EOS token itself is dropped, as in Python. */
export function batchGenerate(model: BatchModel, tokenizer: BatchTokenizer, prompts: readonly (readonly number[])[], opts: BatchGenerateOptions = {}): BatchResponse {
  if (!Array.isArray(prompts) || prompts.length === 0) throw new GenerateError("batch_generate needs at least one prompt (mlx-lm returns an empty response for an empty batch)");
  const { maxTokens = 128, promptCaches, returnPromptCaches = false, onFinish, ...genOpts } = opts;
  const perPrompt = typeof maxTokens === "number" ? prompts.map(() => maxTokens) : [...maxTokens];
  const gen = new BatchGenerator(model, { ...genOpts, stopTokens: tokenizer.eosTokenIds.map((t) => [t]) });
  const kept = new Map<number, KVCacheLike[]>();
  try {
    const uids = gen.insert(prompts, { maxTokens: perPrompt, caches: promptCaches });
    const tokens = new Map(uids.map((u) => [u, [] as number[]]));
    const logprobs = new Map(uids.map((u) => [u, [] as number[]]));
    const start = gen.reading();
    let finished = 0;
    for (let rs = gen.nextGenerated(); rs.length; rs = gen.nextGenerated()) {
      for (const r of rs) {
        if (r.finishReason !== null) {
          if (returnPromptCaches) kept.set(r.uid, r.takePromptCache()!);
          onFinish?.(++finished, prompts.length);
        }
        if (r.finishReason !== "stop") {
          tokens.get(r.uid)!.push(r.token);
          using lp = mx.slice(r.logprobs, [r.token], [r.token + 1]);
          logprobs.get(r.uid)!.push(lp.item() as number);
        }
      }
    }
    const stats = gen.stats(start);
    const tokenIds = uids.map((u) => tokens.get(u)!);
    const caches = returnPromptCaches ? uids.map((u) => kept.get(u)!) : null;
    kept.clear();
    return { texts: tokenIds.map((t) => tokenizer.decode(t)), stats, caches, tokenIds, logprobs: uids.map((u) => logprobs.get(u)!) };
  } finally {
    for (const c of kept.values()) disposeAll(c);
    gen.close();
  }
}
