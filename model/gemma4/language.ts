// mlx_vlm/models/gemma4/language.py (mlx-vlm 0.7.10): where mlx-vlm's Gemma 4 language model
// differs from mlx-lm's (gemma4_text.ts). The modules, their checkpoint keys and every block
// (DecoderLayer, Attention, MLP, MoE) are the same classes, numerically identical on text
// (docs: gemma4-multimodal §7.1); what differs is Gemma4TextModel.__call__:
// - inputs_embeds arrive scaled and merged with the media features (gemma4.ts), and the
//   per-layer token inputs come from get_input_embeddings (media ids → 0), sliced at the cache
//   offset when longer than the call;
// - _make_masks adds the bidirectional overlay on image blocks when the text config says
//   use_bidirectional_attention "vision" and the call has image tokens and L > 1: both the full
//   and the sliding masks become bool arrays and every query sees its whole image block, across
//   the sliding window too (HF transformers differs here: see the README's numerics section);
//   the overlay is skipped where the mask is not square over the call's tokens (a chunked
//   prefill, a cache prefix);
// - logits_to_keep (mlx-vlm's generator always passes 1): h keeps its last rows from the first
//   KV-shared layer on, and only the kept rows get logits;
// - SwitchGLU runs token by token for 1 < L <= 8 (switch_layers.SwitchGLU's decode-block path).

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../cache/index.ts";
import { createAttentionMask, createCausalMask, disposeMask, type Mask } from "../mask.ts";
import type { TextConfig } from "./config.ts";
import { type CacheFactory, defaultCacheFactory, Gemma4TextModel, softcapLogits } from "./gemma4_text.ts";
import { mediaMutated } from "./mutations.ts";
import { Module } from "./nn.ts";
import type { TapSink } from "./taps.ts";

export interface LanguageModelCallOptions {
  inputs_embeds?: MlxArray | null;
  /** single-sequence caches: mlx-vlm's media path has no batch */
  cache?: (KVCacheLike | null)[] | null;
  per_layer_inputs?: MlxArray | null;
  /** (B, L) processor token types: 1 image, 2 video, 3 audio, 0 text. */
  mm_token_type_ids?: MlxArray | null;
  logits_to_keep?: number | null;
  taps?: TapSink;
}

export class LanguageModel extends Module {
  readonly config: TextConfig;
  readonly model_type: string;
  readonly final_logit_softcapping: number | null;
  model: Gemma4TextModel;

  constructor(config: TextConfig) {
    super();
    this.config = config;
    this.model_type = config.model_type;
    this.model = new Gemma4TextModel(config);
    this.final_logit_softcapping = config.final_logit_softcapping;
  }

  get first_kv_shared_layer_idx(): number {
    return this.config.num_hidden_layers - this.config.num_kv_shared_layers;
  }

  /** get_per_layer_inputs(input_ids): embed_tokens_per_layer(ids) * P**0.5, reshaped (B, L, nL, P). */
  get_per_layer_inputs(input_ids: MlxArray, taps?: TapSink): MlxArray {
    const m = this.model;
    using result = m.embed_tokens_per_layer!.call(input_ids);
    if (taps) taps("embed_tokens_per_layer", result);
    using scaled = mx.multiply(result, m.embed_tokens_per_layer_scale!);
    const out = mx.reshape(scaled, [...input_ids.shape, this.config.num_hidden_layers, m.hidden_size_per_layer_input!]);
    if (taps) taps("per_layer_token_inputs", out);
    return out;
  }

  /** project_per_layer_inputs(h, per_layer_inputs): (norm(reshape(proj(h) * H**-0.5)) + pli) * 2**-0.5. */
  project_per_layer_inputs(inputs_embeds: MlxArray, per_layer_inputs: MlxArray | null, taps?: TapSink): MlxArray {
    const m = this.model;
    using stack = new DisposableStack();
    let p = stack.use(m.per_layer_model_projection!.call(inputs_embeds));
    if (taps) taps("per_layer_model_projection", p);
    p = stack.use(mx.multiply(p, m.per_layer_projection_scale!));
    p = stack.use(mx.reshape(p, [...inputs_embeds.shape.slice(0, -1), this.config.num_hidden_layers, m.hidden_size_per_layer_input!]));
    if (taps) taps("per_layer_projection_scaled", p);
    p = stack.use(m.per_layer_projection_norm!.call(p));
    if (taps) taps("per_layer_projection_norm", p);
    if (per_layer_inputs === null) return mx.alias(p);
    const s = stack.use(mx.add(p, per_layer_inputs));
    return mx.multiply(s, m.per_layer_input_scale!);
  }

  /** _block_sequence_ids_for_mask: run id of each contiguous image/video span, -1 elsewhere. */
  static _block_sequence_ids_for_mask(mm_token_type_ids: MlxArray): MlxArray {
    using stack = new DisposableStack();
    const e1 = stack.use(mx.equal(mm_token_type_ids, 1));
    const e2 = stack.use(mx.equal(mm_token_type_ids, 2));
    const is_vision = stack.use(mx.bitwiseOr(e1, e2));
    const [B, L] = is_vision.shape as [number, number];
    const first = stack.use(mx.slice(is_vision, [0, 0], [B, 1]));
    const z = stack.use(mx.zerosLike(first));
    const head = stack.use(mx.slice(is_vision, [0, 0], [B, L - 1]));
    const prev = stack.use(mx.concatenate([z, head], 1));
    const notPrev = stack.use(mx.logicalNot(prev));
    const starts = stack.use(mx.bitwiseAnd(is_vision, notPrev));
    const si = stack.use(mx.astype(starts, "int32"));
    const cs = stack.use(mx.cumsum(si, 1));
    const group_ids = stack.use(mx.subtract(cs, 1));
    const zg = stack.use(mx.zerosLike(group_ids));
    const neg = stack.use(mx.subtract(zg, 1));
    return mx.where(is_vision, group_ids, neg);
  }

  /** base_mask | (same image block), where the mask is square over the call's tokens. */
  static _apply_blockwise_bidirectional_overlay(base_mask: MlxArray, mm_token_type_ids: MlxArray): MlxArray {
    const n = base_mask.ndim;
    if (mm_token_type_ids.shape[1] !== base_mask.shape[n - 1]) return mx.alias(base_mask);
    if (base_mask.shape[n - 2] !== base_mask.shape[n - 1]) return mx.alias(base_mask);
    using stack = new DisposableStack();
    const blk = stack.use(LanguageModel._block_sequence_ids_for_mask(mm_token_type_ids));
    const q_blocks = stack.use(mx.expandDims(blk, -1));
    const k_blocks = stack.use(mx.expandDims(blk, -2));
    const inBlock = stack.use(mx.notEqual(q_blocks, -1));
    const same = stack.use(mx.equal(q_blocks, k_blocks));
    const same_block = stack.use(mx.bitwiseAnd(inBlock, same));
    const sb = stack.use(mx.expandDims(same_block, 1));
    return mx.bitwiseOr(base_mask, sb);
  }

  /** _make_masks(h, cache, mm_token_type_ids): one mask per layer type (first layer of the type). */
  _make_masks(h: MlxArray, cache: readonly (KVCacheLike | null)[], mm_token_type_ids: MlxArray | null, taps?: TapSink): Mask[] {
    const types = this.model.layers.map((l) => l.layer_type);
    return makeMediaMasks(types, this.model.window_size, this.config.use_bidirectional_attention, h.shape, cache, mm_token_type_ids, taps);
  }

  /**
   * LanguageModel.__call__ → Gemma4TextModel.__call__ (mlx-vlm): logits (B, keep or L, V).
   * `inputs` are token ids (embedded here unless inputs_embeds are given).
   */
  call(inputs: MlxArray | null, { inputs_embeds = null, cache = null, per_layer_inputs = null, mm_token_type_ids = null, logits_to_keep = null, taps }: LanguageModelCallOptions = {}): MlxArray {
    const m = this.model;
    using stack = new DisposableStack();
    if (taps && inputs !== null) taps("inputs", inputs);
    let h: MlxArray;
    if (inputs_embeds === null) {
      if (inputs === null) throw new Error("LanguageModel: give input ids or inputs_embeds");
      const emb = stack.use(m.embed_tokens.call(inputs));
      if (taps) taps("embed_tokens", emb);
      h = stack.use(mx.multiply(emb, m.embed_scale));
      if (taps) taps("embed_scaled", h);
    } else {
      h = inputs_embeds;
      if (taps) taps("inputs_embeds", h);
    }
    const caches: (KVCacheLike | null)[] = m.layers.map((_, i) => cache?.[i] ?? null);

    // Per-layer inputs (2B/4B models)
    let pli: MlxArray | null = per_layer_inputs;
    if (m.hidden_size_per_layer_input) {
      if (inputs !== null && pli === null) {
        pli = stack.use(this.get_per_layer_inputs(inputs, taps));
      } else if (pli !== null) {
        const target_len = h.shape[1]!;
        if (pli.shape[1] !== target_len) {
          const cache_offset = caches.find((c) => c !== null)?.offset ?? 0;
          const max_start = Math.max(pli.shape[1]! - target_len, 0);
          const start = Math.min(cache_offset, max_start);
          const s = pli.shape;
          pli = stack.use(mx.slice(pli, [0, start, 0, 0], [s[0]!, start + target_len, s[2]!, s[3]!]));
        }
        if (taps) taps("per_layer_token_inputs", pli);
      }
      if (pli !== null || inputs !== null) {
        pli = stack.use(this.project_per_layer_inputs(h, pli, taps));
        if (taps) taps("per_layer_inputs", pli);
      }
    }

    const masks = this._make_masks(h, caches, mm_token_type_ids, taps);
    stack.defer(() => {
      for (const mk of new Set(masks)) disposeMask(mk);
    });
    const perLayer: (MlxArray | null)[] = m.layers.map((_, i) => {
      if (pli === null) return null;
      const s = pli.shape;
      using sl = mx.slice(pli, [0, 0, i, 0], [s[0]!, s[1]!, i + 1, s[3]!]);
      return stack.use(mx.squeeze(sl, 2));
    });
    const keep = logits_to_keep ? Math.trunc(logits_to_keep) : 0;
    const hl = stack.use(m.runLayers(h, masks, caches, perLayer, taps, { trim: { keep, before: this.first_kv_shared_layer_idx } }));
    let out = stack.use(m.norm.call(hl));
    if (taps) taps("norm", out);
    if (keep) {
      const s = out.shape;
      out = stack.use(mx.slice(out, [0, s[1]! - keep, 0], s));
    }
    // logits_from_hidden: embed_tokens.as_linear + softcap (mlx-vlm has no lm_head path)
    return softcapLogits(m.embed_tokens.asLinear(out), this.final_logit_softcapping, taps);
  }

  /**
   * chunked_prefill_policy: false (one prefill pass) for a 'vision' model whose prompt has
   * image/video tokens and no audio; true otherwise (no drafter).
   */
  chunkedPrefill(mm_token_types: readonly number[] | null): boolean {
    if (this.config.use_bidirectional_attention === "vision" && mm_token_types !== null) {
      const visual = mm_token_types.some((t) => t === 1 || t === 2);
      const audio = mm_token_types.some((t) => t === 3);
      if (visual && !audio) return false;
    }
    return true;
  }

  /** make_cache(): as mlx-lm's (KVCache for full layers, RotatingKVCache(window, keep=0)). */
  makeCache(factory: CacheFactory = defaultCacheFactory): KVCacheLike[] {
    const caches: KVCacheLike[] = [];
    for (let i = 0; i < this.first_kv_shared_layer_idx; i++) {
      if (this.config.layer_types[i] === "full_attention") caches.push(factory.kvCache());
      else caches.push(factory.rotatingKVCache(this.config.sliding_window, 0));
    }
    return caches;
  }
}

/**
 * Gemma4TextModel._make_masks (mlx-vlm) for layers of `layer_types` (h: the call's hidden
 * state, or its shape): a mask per layer, built once per layer type from the cache of the first
 * layer of that type; with use_bidirectional_attention "vision", image tokens in the call and
 * L > 1, both mask kinds become bool arrays with the image-block overlay.
 */
export function makeMediaMasks(
  layer_types: readonly string[],
  window_size: number,
  use_bidirectional_attention: string | null,
  hShape: readonly number[],
  cache: readonly (KVCacheLike | null)[],
  mm_token_type_ids: MlxArray | null,
  taps?: TapSink,
): Mask[] {
  const L = hShape[1]!;
  let has_visual_tokens = false;
  if (mm_token_type_ids !== null) {
    // int(mx.sum((mm == 1) | (mm == 2)).item()) > 0: a host sync, as in Python
    using e1 = mx.equal(mm_token_type_ids, 1);
    using e2 = mx.equal(mm_token_type_ids, 2);
    using v = mx.bitwiseOr(e1, e2);
    using n = mx.sum(v);
    has_visual_tokens = (n.item() as number) > 0;
  }
  // Audio spans are sequential; mlx-vlm keeps mixed image+audio prompts causal through its
  // chunked-prefill policy, not here.
  const use_bidirectional_vision =
    use_bidirectional_attention === "vision" && mm_token_type_ids !== null && has_visual_tokens && L > 1 && !mediaMutated("image_block_causal");
  const byType = new Map<string, Mask>();
  const masks: Mask[] = [];
  try {
    for (let i = 0; i < layer_types.length; i++) {
      const t = layer_types[i]!;
      if (!byType.has(t)) {
        const c = cache[i] ?? null;
        const sliding = t === "sliding_attention";
        let m: Mask;
        if (!sliding) {
          m = createAttentionMask(hShape, c, { returnArray: use_bidirectional_vision });
        } else {
          const return_array = (L > 1 && c !== null && c.offset > 0) || use_bidirectional_vision;
          m = createAttentionMask(hShape, c, { windowSize: window_size, returnArray: return_array });
        }
        if (use_bidirectional_vision && m === "causal") m = createCausalMask(L, 0, sliding ? window_size : null);
        if (use_bidirectional_vision && m instanceof mx.MlxArray) {
          using base = m;
          m = LanguageModel._apply_blockwise_bidirectional_overlay(base, mm_token_type_ids!);
        }
        byType.set(t, m);
        if (taps) taps(`mask/${t}`, m);
      }
      masks.push(byType.get(t)!);
    }
    return masks;
  } catch (e) {
    for (const m of byType.values()) disposeMask(m);
    throw e;
  }
}
