// mlx-vlm 0.7.10's batch generation path (generate/ar.py BatchGenerator, PromptProcessingBatch,
// GenerationBatch, _make_cache) for text prompts, with its KV-cache quantization: the path
// mlx_vlm.batch_generate takes (every prompt admitted in one prompt batch:
// prefill_batch_size = completion_batch_size = the number of prompts). It differs from mlx-lm's
// BatchGenerator (generate_batch.ts), so it is a module of its own:
// - insert() sorts the prompts by length (stable); the prompt batch left-pads them: token ids
//   with 0, the embeddings (embed_tokens(ids) * embed_scale, one row at a time as
//   Model.get_input_embeddings gives them) and the per-layer token inputs with zeros;
// - the batch caches are built once from make_cache() (cache/kv_quantize_batch.ts makeBatchCaches:
//   the batch path's conversion rule, with TurboQuant or uniform quantized caches);
// - prompt_step: while more than one column is left, a chunk of min(prefill_step_size, left - 1)
//   columns through the language model (inputs_embeds and the per-layer inputs sliced alike;
//   logits discarded); generate(): the last column with logits_to_keep=1, logprobs = logits -
//   logsumexp, the sampler (greedy argmax here) picks the first tokens;
// - GenerationBatch._step: each row's last token through the language model (B, 1), logprobs,
//   argmax; a response carries the token computed by the previous step (the pipeline of
//   Python's double buffering) and its logprob; a row finishes on its max_tokens ("length");
//   rows that finish are filtered out of the caches (all at once: the cache list is cleared).
// - next() is BatchGenerator._next: a decode step when the generation batch has rows, else the
//   prompt batch's next chunk or its generate(), else the prompt batch is built (and stepped).
// Not ported: stop tokens, logits processors, sampling other than greedy, media, APC, speculative
// drafts, prompts admitted in several prompt batches.
//
// Ownership: a call's `logprobs` and `caches` are borrowed until the next next() call.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { BatchCacheLike } from "./cache/batch.ts";
import type { KVCacheLike } from "./cache/index.ts";
import { type BatchKVQuantConfig, kvSharedBatchConflict, makeBatchCaches } from "./cache/kv_quantize_batch.ts";
import { GenerateError } from "./generate.ts";
import { LanguageModel } from "./gemma4/language.ts";
import type { TextConfig } from "./gemma4/config.ts";
import type { LoadedModel } from "./gemma4/index.ts";
import { KVQuantError } from "./kv_quant.ts";
import { cacheFactory } from "./runtime.ts";

/** mlx-vlm's LanguageModel over a loaded text checkpoint's modules (the same weights, no copy). */
export function vlmLanguageModel(loaded: LoadedModel): LanguageModel {
  const text = loaded.text;
  const lm = Object.create(LanguageModel.prototype) as LanguageModel;
  const config: TextConfig = { ...text.args, use_bidirectional_attention: null };
  Object.assign(lm, { config, model_type: text.model_type, model: text.model, final_logit_softcapping: text.final_logit_softcapping });
  return lm;
}

export interface VlmBatchOptions {
  /** Per prompt (or one for all). */
  maxTokens: number | readonly number[];
  /** null: no chunked prefill (one generate() call). mlx-vlm's default is 2048. */
  prefillStepSize?: number | null;
  /** --kv-bits & co.; null: unquantized. */
  kv?: BatchKVQuantConfig | null;
}

export interface VlmBatchResponse {
  uid: number;
  token: number;
  /** The token's logprob (float32 value). */
  logprob: number;
  finish: "length" | null;
}

export interface VlmBatchCall {
  /** The logprobs matrices (B, V) the sampler saw during this call (borrowed). */
  logprobs: MlxArray[];
  responses: VlmBatchResponse[];
  /** The prompt batch's caches while prefilling, then the generation batch's (borrowed). */
  caches: readonly BatchCacheLike[];
}

interface Row {
  uid: number;
  prompt: number[];
  maxTokens: number;
}

function sliceCols(a: MlxArray, start: number, end: number): MlxArray {
  const s = a.shape;
  const st = s.map(() => 0);
  st[1] = start;
  const stop = [...s];
  stop[1] = end;
  return mx.slice(a, st, stop);
}

function replace(old: MlxArray | null, next: MlxArray): MlxArray {
  old?.dispose();
  return next;
}

class PromptBatch {
  inputIds: MlxArray;
  embeds: MlxArray;
  perLayer: MlxArray | null;
  readonly caches: BatchCacheLike[];

  constructor(
    private readonly lm: LanguageModel,
    readonly rows: Row[],
    readonly prefillStepSize: number | null,
    kv: BatchKVQuantConfig | null,
  ) {
    const lengths = rows.map((r) => r.prompt.length);
    const maxLen = Math.max(...lengths);
    const leftPadding = lengths.map((l) => maxLen - l);
    const ids = rows.flatMap((r, i) => [...new Array<number>(leftPadding[i]!).fill(0), ...r.prompt]);
    this.inputIds = mx.array(Int32Array.from(ids), [rows.length, maxLen], "int32");
    const m = lm.model;
    const embRows: MlxArray[] = [];
    const pliRows: MlxArray[] = [];
    try {
      for (const [i, r] of rows.entries()) {
        using id = mx.array(Int32Array.from(r.prompt), [1, r.prompt.length], "int32");
        using e0 = m.embed_tokens.call(id);
        using e = mx.multiply(e0, m.embed_scale);
        embRows.push(padLeft(e, leftPadding[i]!));
        if (m.hidden_size_per_layer_input) {
          using p = lm.get_per_layer_inputs(id);
          pliRows.push(padLeft(p, leftPadding[i]!));
        }
      }
      this.embeds = mx.concatenate(embRows, 0);
      this.perLayer = pliRows.length ? mx.concatenate(pliRows, 0) : null;
    } finally {
      for (const a of [...embRows, ...pliRows]) a.dispose();
    }
    try {
      this.caches = makeBatchCaches(lm.makeCache(cacheFactory), leftPadding, kv, maxLen);
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  needsProcessing(): boolean {
    return this.prefillStepSize !== null && this.embeds.shape[1]! > 1;
  }

  /** prompt_step: one chunk of min(step, left - 1) columns. */
  promptStep(): void {
    const left = this.embeds.shape[1]!;
    const n = Math.min(this.prefillStepSize!, left - 1);
    if (n <= 0) return;
    {
      using ids = sliceCols(this.inputIds, 0, n);
      using emb = sliceCols(this.embeds, 0, n);
      using pli = this.perLayer ? sliceCols(this.perLayer, 0, n) : null;
      using logits = this.lm.call(ids, { inputs_embeds: emb, per_layer_inputs: pli, cache: this.caches as unknown as KVCacheLike[] });
      evalStates(this.caches);
    }
    this.inputIds = replace(this.inputIds, sliceCols(this.inputIds, n, left));
    this.embeds = replace(this.embeds, sliceCols(this.embeds, n, left));
    if (this.perLayer) this.perLayer = replace(this.perLayer, sliceCols(this.perLayer, n, left));
  }

  /** generate(): the remaining columns with logits_to_keep=1 → logprobs (B, V) and the first tokens. */
  finish(): { logprobs: MlxArray; tokens: MlxArray } {
    using logits = this.lm.call(this.inputIds, { inputs_embeds: this.embeds, per_layer_inputs: this.perLayer, cache: this.caches as unknown as KVCacheLike[], logits_to_keep: 1 });
    return logprobsAndTokens(logits);
  }

  dispose(): void {
    this.inputIds.dispose();
    this.embeds.dispose();
    this.perLayer?.dispose();
  }
}

/** x (1, L, ...) with `n` zero rows in front on axis 1 (mx.zeros + concatenate, as Python). */
function padLeft(x: MlxArray, n: number): MlxArray {
  if (n === 0) return mx.alias(x);
  const s = [...x.shape];
  s[1] = n;
  using z = mx.zeros(s, x.dtype);
  return mx.concatenate([z, x], 1);
}

function evalStates(caches: readonly BatchCacheLike[]): void {
  const st = caches.flatMap((c) => c.state);
  try {
    mx.evaluate(st);
  } finally {
    for (const a of st) a.dispose();
  }
}

/** logits (B, L, V) → logprobs of the last column (logits - logsumexp) and their argmax. */
function logprobsAndTokens(logits: MlxArray): { logprobs: MlxArray; tokens: MlxArray } {
  const [B, L, V] = logits.shape as [number, number, number];
  using last0 = mx.slice(logits, [0, L - 1, 0], [B, L, V]);
  using last = mx.reshape(last0, [B, V]);
  using lse = mx.logsumexp(last, -1, true);
  const logprobs = mx.subtract(last, lse);
  const tokens = mx.argmax(logprobs, -1);
  return { logprobs, tokens };
}

/** logprobs[arange(B), tokens] */
function pickLogprobs(logprobs: MlxArray, tokens: MlxArray): MlxArray {
  using t = mx.expandDims(tokens, 1);
  using g = mx.takeAlongAxis(logprobs, t, 1);
  return mx.squeeze(g, 1);
}

class GenerationBatch {
  uids: number[];
  maxTokens: number[];
  numTokens: number[];
  caches: BatchCacheLike[];
  nextTokens: MlxArray | null;
  nextLps: MlxArray | null;

  constructor(
    private readonly lm: LanguageModel,
    rows: Row[],
    caches: BatchCacheLike[],
    firstTokens: MlxArray,
    firstLps: MlxArray,
  ) {
    this.uids = rows.map((r) => r.uid);
    this.maxTokens = rows.map((r) => r.maxTokens);
    this.numTokens = rows.map(() => 0);
    this.caches = caches;
    this.nextTokens = firstTokens;
    this.nextLps = firstLps;
  }

  get size(): number {
    return this.uids.length;
  }

  /** next(): one _step, the responses, the finished rows filtered out. `seen` receives the step's logprobs. */
  next(seen: MlxArray[]): VlmBatchResponse[] {
    if (this.size === 0) return [];
    using inputs = this.nextTokens!;
    using currentLps = this.nextLps!;
    this.nextTokens = this.nextLps = null;
    using x = mx.expandDims(inputs, 1);
    using logits = this.lm.call(x, { cache: this.caches as unknown as KVCacheLike[] });
    const { logprobs, tokens } = logprobsAndTokens(logits);
    seen.push(logprobs);
    this.nextTokens = tokens;
    this.nextLps = pickLogprobs(logprobs, tokens);
    const toks = inputs.toNumbers();
    using lp32 = mx.astype(currentLps, "float32");
    const lps = Array.from(lp32.toTypedArray() as Float32Array);
    const keep: number[] = [];
    const out: VlmBatchResponse[] = [];
    for (let i = 0; i < this.size; i++) {
      this.numTokens[i]! += 1;
      const finish = this.numTokens[i]! >= this.maxTokens[i]! ? "length" : null;
      if (finish === null) keep.push(i);
      out.push({ uid: this.uids[i]!, token: toks[i]!, logprob: lps[i]!, finish });
    }
    if (keep.length < this.size) this.filter(keep);
    return out;
  }

  filter(keep: number[]): void {
    this.uids = keep.map((i) => this.uids[i]!);
    this.maxTokens = keep.map((i) => this.maxTokens[i]!);
    this.numTokens = keep.map((i) => this.numTokens[i]!);
    if (keep.length === 0) {
      for (const c of this.caches) c.dispose();
      this.caches = [];
      this.nextTokens?.dispose();
      this.nextLps?.dispose();
      this.nextTokens = this.nextLps = null;
      return;
    }
    for (const c of this.caches) c.filter(keep);
    using k = mx.array(Int32Array.from(keep), [keep.length], "int32");
    this.nextTokens = replace(this.nextTokens, mx.take(this.nextTokens!, k, 0));
    this.nextLps = replace(this.nextLps, mx.take(this.nextLps!, k, 0));
  }

  dispose(): void {
    for (const c of this.caches) c.dispose();
    this.caches = [];
    this.nextTokens?.dispose();
    this.nextLps?.dispose();
    this.nextTokens = this.nextLps = null;
  }
}

export class VlmBatchGenerator {
  private unprocessed: Row[];
  private prompt: PromptBatch | null = null;
  private gen: GenerationBatch | null = null;
  private seen: MlxArray[] = [];
  private readonly completionBatchSize: number;

  constructor(
    private readonly lm: LanguageModel,
    prompts: readonly (readonly number[])[],
    private readonly opts: VlmBatchOptions,
  ) {
    if (prompts.length === 0) throw new GenerateError("VlmBatchGenerator: no prompts");
    const mt = typeof opts.maxTokens === "number" ? prompts.map(() => opts.maxTokens as number) : [...opts.maxTokens];
    if (mt.length !== prompts.length) throw new GenerateError(`VlmBatchGenerator: ${mt.length} max_tokens for ${prompts.length} prompts`);
    for (const [i, p] of prompts.entries()) {
      if (p.length === 0) throw new GenerateError(`VlmBatchGenerator: prompt ${i} is empty`);
      if (!Number.isSafeInteger(mt[i]) || mt[i]! < 1) throw new GenerateError(`VlmBatchGenerator: max_tokens must be a positive integer, got ${mt[i]}`);
    }
    const step = opts.prefillStepSize === undefined ? 2048 : opts.prefillStepSize;
    if (step !== null && (!Number.isSafeInteger(step) || step < 1)) throw new GenerateError(`VlmBatchGenerator: prefill_step_size must be a positive integer or null, got ${step}`);
    const cfg = lm.config;
    if (opts.kv) {
      const conflict = kvSharedBatchConflict(cfg.layer_types, cfg.num_kv_shared_layers);
      if (conflict) {
        throw new KVQuantError(
          `--kv-bits on the batch path of this model: KV-shared layer(s) ${conflict.readers.join(", ")} read layer ${conflict.donor}'s cache, which mlx-vlm's batch path quantizes; its attention then fails inside scaled_dot_product_attention, so the port refuses`,
        );
      }
    }
    this.completionBatchSize = prompts.length;
    // insert(): uids in order, then sorted by prompt length (Python's sorted is stable)
    this.unprocessed = prompts.map((p, uid) => ({ uid, prompt: [...p], maxTokens: mt[uid]! })).sort((a, b) => a.prompt.length - b.prompt.length);
  }

  get hasWork(): boolean {
    return (this.gen?.size ?? 0) > 0 || this.prompt !== null || this.unprocessed.length > 0;
  }

  private disposeSeen(): void {
    for (const a of this.seen) a.dispose();
    this.seen = [];
  }

  private promptToGeneration(p: PromptBatch): void {
    const { logprobs, tokens } = p.finish();
    this.seen.push(logprobs);
    const lps = pickLogprobs(logprobs, tokens);
    this.gen?.dispose();
    this.gen = new GenerationBatch(this.lm, p.rows, p.caches, tokens, lps);
    p.dispose();
    this.prompt = null;
  }

  /** BatchGenerator._next for one prompt batch. */
  next(): VlmBatchCall {
    this.disposeSeen();
    let responses: VlmBatchResponse[] = [];
    const caches = (): readonly BatchCacheLike[] => this.prompt?.caches ?? this.gen?.caches ?? [];
    if (this.gen && this.gen.size > 0) {
      responses = this.gen.next(this.seen);
      if (this.gen.size >= this.completionBatchSize || (this.prompt === null && this.unprocessed.length === 0)) return { logprobs: this.seen, responses, caches: caches() };
    }
    if (this.prompt !== null) {
      if (this.prompt.needsProcessing()) this.prompt.promptStep();
      else this.promptToGeneration(this.prompt);
      return { logprobs: this.seen, responses, caches: caches() };
    }
    if (this.unprocessed.length > 0) {
      const rows = this.unprocessed;
      this.unprocessed = [];
      this.prompt = new PromptBatch(this.lm, rows, this.opts.prefillStepSize === undefined ? 2048 : this.opts.prefillStepSize, this.opts.kv ?? null);
      if (this.prompt.needsProcessing()) this.prompt.promptStep();
      else this.promptToGeneration(this.prompt);
    }
    return { logprobs: this.seen, responses, caches: caches() };
  }

  close(): void {
    this.disposeSeen();
    this.prompt?.dispose();
    if (this.prompt) for (const c of this.prompt.caches) c.dispose();
    this.prompt = null;
    this.gen?.dispose();
    this.gen = null;
  }
}
