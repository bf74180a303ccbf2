// mlx_vlm/speculative/drafters/dspark/dspark.py (mlx-vlm 0.7.10): the DSpark proposal model, a
// DFlash drafter whose block is [anchor, mask x (proposal_length - 1)] (sample_from_anchor: the
// anchor's own output proposes the first token) and whose proposals go through a low-rank Markov
// correction, token by token: logits_t = base_t + markov_w2(markov_w1(previous token)).
// Round-loop hooks: a fixed block size by default (block_size_policy "fixed"), and a ceiling of 6
// while the context fits the sliding window, 4 past it.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../../../cache/index.ts";
import type { AnyEmbedding, AnyLinear, Model as TargetModel } from "../../../gemma4/gemma4_text.ts";
import { Embedding, Linear, Module } from "../../../gemma4/nn.ts";
import type { Sampler } from "../../../sample.ts";
import { drafterMutated } from "../../mutations.ts";
import { DFlashDraftModel } from "../qwen3_dflash/dflash.ts";
import type { DSparkConfig } from "./config.ts";

/** Low-rank token-transition correction used by DSpark proposals. */
export class VanillaMarkov extends Module {
  markov_w1: AnyEmbedding;
  markov_w2: AnyLinear;
  constructor(vocabSize: number, rank: number) {
    super();
    this.markov_w1 = new Embedding(vocabSize, rank);
    this.markov_w2 = new Linear(rank, vocabSize);
  }

  get_prev_embeddings(tokenIds: MlxArray): MlxArray {
    return this.markov_w1.call(tokenIds);
  }

  apply_step_logits(logits: MlxArray, tokenIds: MlxArray): MlxArray {
    using e = this.get_prev_embeddings(tokenIds);
    using m = this.markov_w2.call(e);
    return mx.add(logits, m);
  }

  /** sample_block: one sampler call per proposal position, each conditioned on the previous token. */
  sample_block(baseLogits: MlxArray, firstPrevTokens: MlxArray, sampler: Sampler): MlxArray {
    const [B, P, V] = baseLogits.shape as [number, number, number];
    if (P === 0) return mx.zeros([B, 0], "int32");
    using stack = new DisposableStack();
    let previous = stack.use(mx.reshape(firstPrevTokens, [-1]));
    const sampled: MlxArray[] = [];
    for (let step = 0; step < P; step++) {
      using sl = mx.slice(baseLogits, [0, step, 0], [B, step + 1, V]);
      using stepBase = mx.squeeze(sl, 1); // base_logits[:, step]
      using anchorPrev = drafterMutated("dspark_markov_from_anchor") ? mx.reshape(firstPrevTokens, [-1]) : null;
      using stepLogits = this.apply_step_logits(stepBase, anchorPrev ?? previous);
      using s = sampler(stepLogits);
      previous = stack.use(mx.reshape(s, [-1]));
      sampled.push(stack.use(mx.expandDims(previous, 1)));
    }
    return mx.concatenate(sampled, 1);
  }
}

export class DSparkConfidenceHead extends Module {
  readonly with_markov: boolean;
  proj: Linear;
  constructor(hiddenSize: number, markovRank: number, withMarkov = true) {
    super();
    this.with_markov = withMarkov;
    this.proj = new Linear(withMarkov ? hiddenSize + markovRank : hiddenSize, 1, true);
  }
  call(hiddenStates: MlxArray, markovEmbeddings: MlxArray): MlxArray {
    using features = this.with_markov ? mx.concatenate([hiddenStates, markovEmbeddings], -1) : mx.alias(hiddenStates);
    using p = this.proj.call(features);
    using sq = mx.squeeze(p, -1);
    using f = mx.astype(sq, "float32");
    return mx.sigmoid(f);
  }
}

/** validate_dspark_target (compatibility.validate_dflash_target): hidden size, layer count, vocabulary. */
export function validateDSparkTarget(config: DSparkConfig, target: TargetModel): void {
  const a = target.args;
  if (a.hidden_size !== config.hidden_size) throw new Error(`DSpark target hidden-size mismatch: draft=${config.hidden_size}, target=${a.hidden_size}.`);
  const layers = target.model.layers.length;
  if (layers !== config.num_target_layers) throw new Error(`DSpark target layer-count mismatch: draft=${config.num_target_layers}, target=${layers}.`);
  if (a.vocab_size !== config.vocab_size) throw new Error(`DSpark target vocabulary mismatch: draft=${config.vocab_size}, target=${a.vocab_size}.`);
}

export class DSparkDraftModel extends DFlashDraftModel {
  declare readonly config: DSparkConfig;
  markov_head: VanillaMarkov;
  confidence_head?: DSparkConfidenceHead;

  constructor(config: DSparkConfig) {
    super(config);
    this.prefer_requested_block_size = config.block_size_policy === "fixed";
    this.dflash_initial_block_size = config.dflash_initial_block_size;
    this.markov_head = new VanillaMarkov(config.vocab_size, config.markov_rank);
    if (config.enable_confidence_head) this.confidence_head = new DSparkConfidenceHead(config.hidden_size, config.markov_rank, config.confidence_head_with_markov);
  }

  override validateTargetCompatibility(target: TargetModel): void {
    validateDSparkTarget(this.config, target);
  }

  override chooseInitialBlockSize(contextLength: number, requested: number): number | null {
    const window = this.config.sliding_window;
    if (window !== null && contextLength <= window) return Math.min(6, requested);
    return this.dflash_initial_block_size;
  }

  override chooseBlockCeiling(contextLength: number, requested: number): number {
    const window = this.config.sliding_window;
    if (window !== null && contextLength <= window) return Math.min(6, requested);
    if (window !== null) return Math.min(4, requested);
    return requested;
  }

  override bind(target: TargetModel): this {
    this.validateTargetCompatibility(target);
    return super.bind(target);
  }

  /** draft_block (draft_block_greedy is the same): the anchor block, base logits, the Markov walk. */
  override draftBlock(lastBonus: number, hidden: MlxArray, cache: KVCacheLike[], blockSize: number, sampler: Sampler, onLogits?: (logits: MlxArray) => void): MlxArray {
    const proposalLength = blockSize - 1;
    if (proposalLength <= 0) return mx.zeros([1, 0], "int32");
    const maskCount = proposalLength - (this.config.sample_from_anchor ? 1 : 0);
    const ids = Int32Array.from([lastBonus, ...Array(maskCount).fill(this.config.mask_token_id)]);
    using inputs = mx.array(ids, [1, ids.length], "int32");
    using anchor = mx.array(Int32Array.from([lastBonus]), [1], "int32");
    using draftHidden0 = this._hidden(inputs, hidden, cache);
    const s = draftHidden0.shape;
    using draftHidden = this.config.sample_from_anchor ? mx.alias(draftHidden0) : mx.slice(draftHidden0, [0, 1, 0], [s[0]!, s[1]!, s[2]!]);
    using baseLogits = this._logits(draftHidden);
    onLogits?.(baseLogits);
    using tokens = this.markov_head.sample_block(baseLogits, anchor, sampler);
    return mx.astype(tokens, "int32");
  }

  /** sanitize: a leading "model." is dropped (a duplicate after that is an error). */
  override sanitize<T extends { array: MlxArray }>(weights: Map<string, T>): Map<string, T> {
    const out = new Map<string, T>();
    for (const [k0, v] of weights) {
      const k = k0.startsWith("model.") ? k0.slice("model.".length) : k0;
      if (out.has(k)) throw new Error(`Duplicate DSpark weight key after sanitization: ${k}`);
      out.set(k, v);
    }
    if (out.has("embed_tokens.weight") && !this.embed_tokens) this.embed_tokens = new Embedding(this.config.vocab_size, this.config.hidden_size);
    return out;
  }
}
