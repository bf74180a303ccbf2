// mlx_vlm/speculative/drafters/gemma4_assistant/gemma4_assistant.py (mlx-vlm 0.7.10): the Gemma 4
// multi-token-prediction drafter ("assistant"). It has no KV cache of its own: every layer is a
// KV-shared Gemma 4 decoder layer attending over the target's K/V of its last layer of the same
// type. One draft step:
//
//   h = pre_projection(concat([target.embed_tokens(tok) * target.embed_scale, h_prev], -1))
//   h = layers(h, shared_kv = target K/V[type], mask = bidirectional, offset = position)
//   h = norm(h);  h_prev' = post_projection(h);  logits = lm head(h)   (no softcap)
//
// with the query position held constant over the block (kv_offset - 1). The layers are
// model/gemma4's DecoderLayer (mlx-lm's, numerically the same as mlx-vlm's for these calls; the
// MTP parity suite holds them bit-exact against mlx-vlm), built from the drafter's text config.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { LayerType } from "../../../gemma4/config.ts";
import { ConfigError, type LoadedConfig } from "../../../gemma4/config.ts";
import { type AnyEmbedding, DecoderLayer, type KV, type Model as TargetModel } from "../../../gemma4/gemma4_text.ts";
import { Embedding, Linear, Module, RMSNorm } from "../../../gemma4/nn.ts";
import type { Tensor } from "../../../gemma4/tensors.ts";
import type { Sampler } from "../../../sample.ts";
import { assistantConfigFromDict, type Gemma4AssistantConfig } from "./config.ts";
import { makeDrafterMasks } from "./masks.ts";
import { MaskedEmbedder } from "./masked_embedder.ts";
import { loadDrafterWeights, readDrafterConfig } from "../load.ts";

class _DraftInner extends Module {
  embed_tokens: Embedding;
  layers: DecoderLayer[];
  norm: RMSNorm;
  constructor(config: Gemma4AssistantConfig) {
    super();
    const t = config.text_config;
    this.embed_tokens = new Embedding(t.vocab_size, t.hidden_size);
    this.layers = Array.from({ length: t.num_hidden_layers }, (_, i) => new DecoderLayer(t, i));
    this.norm = new RMSNorm(t.hidden_size, t.rms_norm_eps);
  }
}

/** Frees the handles a shared-K/V map owns. */
export function disposeKVMap(m: Map<LayerType, KV> | null): void {
  for (const [k, v] of m?.values() ?? []) {
    k.dispose();
    v.dispose();
  }
}

export class Gemma4AssistantDraftModel extends Module {
  static readonly supports_greedy_draft_argmax = true;
  readonly config: Gemma4AssistantConfig;
  model: _DraftInner;
  pre_projection: Linear;
  post_projection: Linear;
  lm_head?: Linear;
  masked_embedding?: MaskedEmbedder;
  // Bound state (underscore: not parameters)
  private _inputEmbed: AnyEmbedding | null = null;
  private _inputEmbedScale = 1.0;
  private _sharedKv: Map<LayerType, KV> | null = null;
  private _kvOffset = 0;
  private _kvValidLen = 0;
  private _position = 0;
  /** Accepted drafts per round and drafts per round (_record_speculative_round). */
  accept_lens: number[] = [];
  draft_lens: number[] = [];

  constructor(config: Gemma4AssistantConfig) {
    super();
    this.config = config;
    const t = config.text_config;
    this.model = new _DraftInner(config);
    this.pre_projection = new Linear(2 * config.backbone_hidden_size, t.hidden_size);
    this.post_projection = new Linear(t.hidden_size, config.backbone_hidden_size);
    if (!config.tie_word_embeddings) this.lm_head = new Linear(t.hidden_size, t.vocab_size);
    if (config.use_ordered_embeddings) this.masked_embedding = new MaskedEmbedder(config);
  }

  /** bind(target): the target's token embedding and embed_scale feed the drafter's input. */
  bind(target: TargetModel): this {
    this._inputEmbed = target.model.embed_tokens;
    this._inputEmbedScale = target.model.embed_scale;
    return this;
  }

  /** reset(target): bind, clear the round history and the shared K/V. The drafter has no cache. */
  reset(target: TargetModel): void {
    this.bind(target);
    this.accept_lens = [];
    this.draft_lens = [];
    disposeKVMap(this._sharedKv);
    this._sharedKv = null;
    this._kvOffset = 0;
    this._kvValidLen = 0;
  }

  /**
   * set_shared_kv(shared_kv_states, kv_offset, position, kv_valid_len) (unbatched). Takes
   * ownership of the map's arrays.
   */
  setSharedKv(sharedKv: Map<LayerType, KV>, kvOffset: number, position: number = kvOffset, kvValidLen: number = kvOffset): void {
    if (this._sharedKv !== sharedKv) disposeKVMap(this._sharedKv);
    this._kvOffset = kvOffset;
    this._kvValidLen = kvValidLen;
    this._sharedKv = sharedKv;
    this._position = position;
  }

  get kvOffset(): number {
    return this._kvOffset;
  }

  /** The drafter's lm head: masked (centroid) head, tied embedding, or lm_head. */
  private lmHead(h: MlxArray): MlxArray {
    if (this.masked_embedding) return this.masked_embedding.call(h, this.model.embed_tokens.weight);
    if (this.config.tie_word_embeddings) return this.model.embed_tokens.asLinear(h);
    return this.lm_head!.call(h);
  }

  /** __call__(inputs_embeds, shared_kv_states, position_ids) → (last_hidden, logits). */
  call(inputsEmbeds: MlxArray, sharedKv: Map<LayerType, KV>, position: number): [MlxArray, MlxArray] {
    const [lastHidden, h] = this.forwardHidden(inputsEmbeds, sharedKv, position);
    try {
      return [lastHidden, this.lmHead(h)];
    } catch (e) {
      lastHidden.dispose();
      throw e;
    } finally {
      h.dispose();
    }
  }

  /** _forward_hidden: (post_projection(norm(h)), norm(h)). */
  forwardHidden(inputsEmbeds: MlxArray, sharedKv: Map<LayerType, KV>, position: number): [MlxArray, MlxArray] {
    using stack = new DisposableStack();
    const t = this.config.text_config;
    let h = stack.use(this.pre_projection.call(inputsEmbeds));
    const masks = makeDrafterMasks(sharedKv, h.shape[1]!, position, t.sliding_window, h.dtype, this._kvValidLen);
    stack.defer(() => {
      for (const m of masks.values()) m?.dispose();
    });
    const offset = stack.use(mx.array(position)); // mx.array(query_offset)
    for (const layer of this.model.layers) {
      const kv = sharedKv.get(layer.layer_type);
      if (!kv) throw new Error(`the target shares no K/V for a ${layer.layer_type} drafter layer`);
      const [hn, kvOut, off] = layer.call(h, masks.get(layer.layer_type) ?? null, null, null, kv, offset);
      kvOut[0].dispose();
      kvOut[1].dispose();
      if (off instanceof mx.MlxArray) off.dispose();
      h = stack.use(hn);
    }
    const normed = this.model.norm.call(h);
    try {
      return [this.post_projection.call(normed), normed];
    } catch (e) {
      normed.dispose();
      throw e;
    }
  }

  /**
   * draft_block(last_bonus, hidden, cache, block_size, sampler, token_dtype, greedy): block_size - 1
   * autoregressive draft tokens (1, block_size - 1). `hidden` is the target's normed hidden at the
   * position that produced `lastBonus` (borrowed). `onLogits` sees each step's drafter logits.
   */
  draftBlock(lastBonus: number, hidden: MlxArray, blockSize: number, sampler: Sampler, greedy: boolean, onLogits?: (logits: MlxArray) => void): MlxArray {
    if (this._sharedKv === null) throw new Error("Gemma 4 assistant drafter: no shared K/V was set before draftBlock() (the MTP round loop sets it)");
    if (this._inputEmbed === null) throw new Error("bind(target) must be called before draftBlock() so the drafter can use the target's input embeddings");
    const sharedKv = this._sharedKv;
    const tokens: MlxArray[] = [];
    let tok = mx.array(Int32Array.from([lastBonus]), [1, 1], "int32");
    let hPrev = mx.alias(hidden);
    try {
      for (let i = 0; i < blockSize - 1; i++) {
        let next: MlxArray;
        {
          using e = this._inputEmbed.call(tok);
          using tokEmbed = mx.multiply(e, mx.pyFloat(this._inputEmbedScale));
          using inputsEmbeds = mx.concatenate([tokEmbed, hPrev], -1);
          if (greedy && this.masked_embedding) {
            const [hp, h] = this.forwardHidden(inputsEmbeds, sharedKv, this._position);
            using _h = h;
            hPrev.dispose();
            hPrev = hp;
            next = this.masked_embedding.argmax(h, this.model.embed_tokens.weight);
          } else {
            const [hp, logits] = this.call(inputsEmbeds, sharedKv, this._position);
            using _l = logits;
            hPrev.dispose();
            hPrev = hp;
            onLogits?.(logits);
            next = sampler(logits);
          }
        }
        tokens.push(next);
        tok.dispose();
        tok = mx.alias(next);
      }
      return mx.concatenate(tokens, 1);
    } finally {
      tok.dispose();
      hPrev.dispose();
      for (const t of tokens) t.dispose();
    }
  }

  /** sanitize: token_ordering as int32; a tied checkpoint's lm_head.weight is dropped. */
  sanitize(weights: Map<string, Tensor>): Map<string, Tensor> {
    const out = new Map<string, Tensor>();
    for (const [k, v] of weights) {
      if (k === "masked_embedding.token_ordering" && v.array.dtype !== "int32") {
        out.set(k, { ...v, array: mx.astype(v.array, "int32") });
        v.array.dispose();
        continue;
      }
      if (k === "lm_head.weight" && this.config.tie_word_embeddings) {
        v.array.dispose();
        continue;
      }
      out.set(k, v);
    }
    return out;
  }

  /** Releases the weights, the compiled decode closures of the layers and the bound state. */
  dispose(): void {
    for (const l of this.model.layers) l.disposeCompiled();
    disposeKVMap(this._sharedKv);
    this._sharedKv = null;
    for (const p of this.parameters().values()) p.dispose();
  }
}

/** Loads a gemma4_assistant checkpoint (config.json + model*.safetensors, quantized or not). */
export function loadAssistant(dir: string): Gemma4AssistantDraftModel {
  const { raw, file } = readDrafterConfig(dir);
  // gemma4_unified_assistant (mlx-vlm's package of that name) is this model under its own model_type
  if (raw.model_type !== "gemma4_assistant" && raw.model_type !== "gemma4_unified_assistant") {
    throw new ConfigError(file, "model_type", `expected "gemma4_assistant" or "gemma4_unified_assistant" for an MTP drafter, got ${JSON.stringify(raw.model_type)}`);
  }
  const config = assistantConfigFromDict(raw, file);
  const loaded: LoadedConfig = { layout: "gemma4_text", args: config.text_config, raw, file };
  return loadDrafterWeights(new Gemma4AssistantDraftModel(config), dir, loaded);
}
