// mlx_vlm/models/gemma4_unified/gemma4_unified.py (mlx-vlm 0.7.10): the 12B "unified" Gemma 4,
// encoder-free vision. `VisionEmbedder` turns the processor's raw model patches into soft tokens
// (LayerNorm, Linear, LayerNorm, a learned 2-D position table indexed by image_position_ids with
// -1 masked, LayerNorm); gemma4's MultimodalEmbedder projects them and masked_scatter puts them
// over the image placeholders; the language model is gemma4's (mlx-vlm language.py, ../gemma4/
// language.ts). Attribute names are the checkpoint keys (vision_embedder.*, embed_vision.*,
// embed_audio.*, language_model.model.*).
//
// Where mlx-vlm silently wraps or drops features whose count does not match the placeholders, this
// port refuses with a MediaError (as the gemma4 port does). `call` is Model.__call__: mlx-vlm drops
// mm_token_type_ids there, so a direct forward runs plain causal masks; generation passes them to
// the language model (runtime.ts here), where a 'vision' text config makes image blocks
// bidirectional.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../cache/index.ts";
import type { ModelArgs } from "../gemma4/config.ts";
import { type InputEmbeddings, MediaError, masked_scatter, MultimodalEmbedder } from "../gemma4/gemma4.ts";
import * as gemma4_text from "../gemma4/gemma4_text.ts";
import { LanguageModel } from "../gemma4/language.ts";
import { Linear, Module, placeholder } from "../gemma4/nn.ts";
import { DECODE_BLOCK_SIZE } from "../gemma4/switch_layers.ts";
import { prefixed, type TapSink } from "../gemma4/taps.ts";
import type { Tensor } from "../gemma4/tensors.ts";
import type { ModelConfig, VisionConfig } from "./config.ts";
import { unifiedMutated } from "./mutations.ts";

/** nn.LayerNorm(dims) with its defaults (eps 1e-5, affine, bias): mx.fast.layer_norm(x, weight, bias, eps). */
export class LayerNorm extends Module {
  weight: MlxArray;
  bias: MlxArray;
  constructor(
    dims: number,
    readonly eps = 1e-5,
  ) {
    super();
    this.weight = placeholder([dims]);
    this.bias = placeholder([dims]);
  }

  call(x: MlxArray): MlxArray {
    return mx.fast.layerNorm(x, this.weight, this.bias, this.eps);
  }
}

/**
 * _compact_prefix_rows(features, valid_mask): each batch row's first `count` rows (count = its
 * number of valid positions: a prefix, as the processor pads at the end), concatenated.
 */
export function _compact_prefix_rows(features: MlxArray, validCounts: readonly number[]): MlxArray {
  const [, N, D] = features.shape as [number, number, number];
  const rows: MlxArray[] = [];
  try {
    validCounts.forEach((length, b) => {
      if (length) rows.push(mx.reshape(mx.slice(features, [b, 0, 0], [b + 1, length, D]), [length, D]));
    });
    if (rows.length === 0) {
      using flat = mx.reshape(features, [-1, D]);
      return mx.slice(flat, [0, 0], [0, D]);
    }
    void N;
    return mx.concatenate(rows, 0);
  } finally {
    for (const r of rows) r.dispose();
  }
}

/** Encoder-free Gemma 4 unified vision embedder. */
export class VisionEmbedder extends Module {
  readonly model_type: string;
  readonly patch_dim: number;
  patch_ln1: LayerNorm;
  patch_dense: Linear;
  patch_ln2: LayerNorm;
  pos_embedding: MlxArray;
  pos_norm: LayerNorm;

  constructor(config: VisionConfig) {
    super();
    this.model_type = config.model_type;
    const patch_dim = config.model_patch_size * config.model_patch_size * 3;
    this.patch_dim = patch_dim;
    this.patch_ln1 = new LayerNorm(patch_dim);
    this.patch_dense = new Linear(patch_dim, config.mm_embed_dim, true);
    this.patch_ln2 = new LayerNorm(config.mm_embed_dim);
    this.pos_embedding = placeholder([config.mm_posemb_size, 2, config.mm_embed_dim]);
    this.pos_norm = new LayerNorm(config.mm_embed_dim);
  }

  /** Taps under "vision_embedder/" (oracle/taps.json media_taps, condition "unified"). */
  call(pixel_values0: MlxArray, image_position_ids: MlxArray | null, taps?: TapSink): MlxArray {
    using stack = new DisposableStack();
    let pixel_values = pixel_values0;
    if (pixel_values.ndim === 4 && pixel_values.shape[3] === this.patch_dim) {
      pixel_values = stack.use(mx.reshape(pixel_values, [pixel_values.shape[0]!, -1, this.patch_dim]));
    }
    if (taps) {
      taps("vision_embedder/pixel_values", pixel_values);
      if (image_position_ids) taps("vision_embedder/image_position_ids", image_position_ids);
    }
    let h = stack.use(this.patch_ln1.call(pixel_values));
    if (taps) taps("vision_embedder/patch_ln1", h);
    h = stack.use(this.patch_dense.call(h));
    if (taps) taps("vision_embedder/patch_dense", h);
    h = stack.use(this.patch_ln2.call(h));
    if (taps) taps("vision_embedder/patch_ln2", h);

    if (image_position_ids) {
      const pos = image_position_ids;
      const mx0 = stack.use(mx.maximum(pos, 0));
      const clamped = stack.use(mx.astype(mx0, "int32"));
      const ne = stack.use(mediaPaddingKept() ? mx.greaterEqual(pos, -1) : mx.notEqual(pos, -1));
      const valid = stack.use(mx.astype(ne, h.dtype));
      const S = pos.shape;
      const last = (a: MlxArray, i: number) => stack.use(mx.squeeze(stack.use(mx.slice(a, [...S.slice(0, -1).map(() => 0), i], [...S.slice(0, -1), i + 1])), -1));
      const [xi, yi] = unifiedMutated("position_xy_swapped") ? [1, 0] : [0, 1];
      // pos_embedding[clamped[..., 0], 0] and pos_embedding[clamped[..., 1], 1]: a row gather, then the table column
      const column = (idx: MlxArray, col: number) => {
        const rows = stack.use(mx.take(this.pos_embedding, idx, 0)); // (..., 2, D)
        const R = rows.shape;
        const D = R[R.length - 1]!;
        const sl = stack.use(mx.slice(rows, [...R.slice(0, -2).map(() => 0), col, 0], [...R.slice(0, -2), col + 1, D]));
        return stack.use(mx.squeeze(sl, -2));
      };
      const x_pos = column(last(clamped, xi), 0);
      const y_pos = column(last(clamped, yi), 1);
      const vx = stack.use(mx.expandDims(last(valid, 0), -1));
      const vy = stack.use(mx.expandDims(last(valid, 1), -1));
      const xt = stack.use(mx.multiply(x_pos, vx));
      const yt = stack.use(mx.multiply(y_pos, vy));
      const sum = stack.use(mx.add(xt, yt));
      h = stack.use(mx.add(h, sum));
    }
    if (taps) taps("vision_embedder/position_added", h);
    const out = this.pos_norm.call(h);
    if (taps) taps("vision_embedder/pos_norm", out);
    return out;
  }
}

function mediaPaddingKept(): boolean {
  return unifiedMutated("padding_not_masked");
}

/** The media of one unified prompt, as Gemma4UnifiedProcessor returns it. */
export interface UnifiedMediaInputs {
  /** (B, N, p*p*3) float32 model patches (zero rows at padding). */
  pixel_values?: MlxArray | null;
  /** (B, N, 2) int positions [x, y], -1 at padding. */
  image_position_ids?: MlxArray | null;
  /** (B, T, S) float32 raw audio frames (Gemma4UnifiedAudioFeatureExtractor). */
  input_features?: MlxArray | null;
  /** (B, T) bool, True = a real frame. */
  input_features_mask?: MlxArray | null;
  /** (sum of frames, N, p*p*3) float32 model patches of every video frame (Gemma4UnifiedVideoProcessor), or (videos, frames, N, p*p*3). */
  pixel_values_videos?: MlxArray | null;
  /** (sum of frames, N, 2) int positions [x, y], -1 at padding (or (videos, frames, N, 2)). */
  video_position_ids?: MlxArray | null;
}

export function disposeUnifiedMedia(m: UnifiedMediaInputs): void {
  m.pixel_values?.dispose();
  m.image_position_ids?.dispose();
  m.input_features?.dispose();
  m.input_features_mask?.dispose();
  m.pixel_values_videos?.dispose();
  m.video_position_ids?.dispose();
}

/** Per row, how many entries of a (B, T) mask are true (the prefix _compact_prefix_rows keeps). */
function trueCounts(mask: MlxArray): number[] {
  const [B, T] = mask.shape as [number, number];
  const flat = mask.toNumbers() as number[];
  return Array.from({ length: B }, (_, b) => flat.slice(b * T, (b + 1) * T).filter((v) => v !== 0).length);
}

export interface UnifiedCallOptions extends UnifiedMediaInputs {
  /** Accepted and dropped, as mlx-vlm's Model.__call__ drops it (a forward is plain causal). */
  mm_token_type_ids?: MlxArray | null;
  cache?: (KVCacheLike | null)[] | null;
  logits_to_keep?: number | null;
  taps?: TapSink;
}

/** Valid rows per image (or video frame): positions not all -1 (mx.all(image_position_ids == -1, -1) inverted), counted. */
export function validRowCounts(image_position_ids: MlxArray): number[] {
  const S = image_position_ids.shape;
  const N = S[S.length - 2]!;
  const B = S.slice(0, -2).reduce((a, b) => a * b, 1);
  const flat = image_position_ids.toNumbers() as number[];
  const out: number[] = [];
  for (let b = 0; b < B; b++) {
    let n = 0;
    for (let i = 0; i < N; i++) {
      const p = (b * N + i) * 2;
      if (!(flat[p] === -1 && flat[p + 1] === -1)) n++;
    }
    out.push(n);
  }
  return out;
}

export class Model extends Module {
  readonly model_type = "gemma4_unified";
  readonly config: ModelConfig;
  language_model: LanguageModel;
  vision_embedder: VisionEmbedder | null = null;
  embed_vision: MultimodalEmbedder | null = null;
  embed_audio: MultimodalEmbedder | null = null;

  constructor(config: ModelConfig) {
    super();
    this.config = config;
    this.language_model = new LanguageModel(config.text);
    for (const l of this.language_model.model.layers) if (l.experts) l.experts.switch_glu.decode_block_size = DECODE_BLOCK_SIZE;
    if (config.vision) {
      this.vision_embedder = new VisionEmbedder(config.vision);
      this.embed_vision = new MultimodalEmbedder(config.vision.output_proj_dims, config.text.hidden_size, config.vision.rms_norm_eps);
    }
    if (config.audio) {
      this.embed_audio = new MultimodalEmbedder(config.audio.output_proj_dims, config.text.hidden_size, config.audio.rms_norm_eps);
    }
  }

  get args(): ModelArgs {
    return this.language_model.config;
  }

  /**
   * Refuses media the model cannot take, before anything runs: images without an embedder, a
   * placeholder count other than the valid rows the images give (mlx-vlm's masked_scatter wraps
   * the features around or drops the extra ones), images without positions.
   */
  checkMedia(input_ids: MlxArray, media: UnifiedMediaInputs): { image: number[] | null; video: number[] | null; audio: number[] | null } {
    const ids = input_ids.toNumbers() as number[];
    return { image: this.checkImages(ids, media), video: this.checkVideos(ids, media), audio: this.checkAudio(ids, media) };
  }

  /**
   * Videos: the embedder, a config video_token_id, positions of the patches' shape, and as many
   * video placeholders as the frames' valid rows (get_video_features compacts each frame's rows).
   */
  private checkVideos(ids: readonly number[], media: UnifiedMediaInputs): number[] | null {
    const vid = this.config.video_token_id;
    const n = vid === null ? 0 : ids.filter((t) => t === vid).length;
    const pv = media.pixel_values_videos;
    if (!pv) {
      if (this.vision_embedder && n > 0) throw new MediaError(`the prompt has ${n} video placeholder tokens (id ${vid}) but no video input`);
      return null;
    }
    if (!this.vision_embedder) throw new MediaError("video input given, but this checkpoint has no vision embedder (no vision_embedder weights, or vision_config null)");
    if (vid === null) throw new MediaError("video input given, but this checkpoint's config.json has video_token_id null: mlx-vlm would silently drop the video; set it to the tokenizer's <|video|> id");
    const pos = media.video_position_ids;
    if (!pos) throw new MediaError("video input given without video_position_ids (Gemma4UnifiedVideoProcessor gives both)");
    const dim = this.vision_embedder.patch_dim;
    const s = pv.shape;
    if (!((s.length === 3 || s.length === 4) && s[s.length - 1] === dim)) throw new MediaError(`pixel_values_videos of shape (${s.join(", ")}): expected (frames, N, ${dim}) or (videos, frames, N, ${dim}) model patches`);
    const ps = pos.shape;
    if (ps.length !== s.length || ps[ps.length - 1] !== 2 || ps.slice(0, -1).join() !== s.slice(0, -1).join()) {
      throw new MediaError(`video_position_ids of shape (${ps.join(", ")}) do not match pixel_values_videos of shape (${s.join(", ")}): expected (${[...s.slice(0, -1), 2].join(", ")})`);
    }
    const counts = validRowCounts(pos);
    const rows = counts.reduce((a, b) => a + b, 0);
    if (n !== rows) {
      throw new MediaError(
        `the prompt has ${n} video placeholder token${n === 1 ? "" : "s"} (id ${vid}) but the video frames give ${rows} valid patch row${rows === 1 ? "" : "s"}; ` +
          `each frame needs exactly as many placeholders as its model patches (mlx-vlm would silently ${n > rows ? "wrap the features around" : "drop the extra features"})`,
      );
    }
    return counts;
  }

  /** Audio: the placeholder count must equal the frames the clips give (their mask counts, or every frame). */
  private checkAudio(ids: readonly number[], media: UnifiedMediaInputs): number[] | null {
    const n = ids.filter((t) => t === this.config.audio_token_id).length;
    const x = media.input_features;
    if (!x) {
      if (this.embed_audio && n > 0) throw new MediaError(`the prompt has ${n} audio placeholder tokens (id ${this.config.audio_token_id}) but no audio input`);
      return null;
    }
    if (!this.embed_audio) throw new MediaError("audio input given, but this checkpoint has no embed_audio (no embed_audio weights, or audio_config null)");
    const S = this.config.audio!.output_proj_dims;
    if (x.ndim !== 3 || x.shape[2] !== S) throw new MediaError(`input_features of shape (${x.shape.join(", ")}): expected (B, T, ${S}) raw frames`);
    const m = media.input_features_mask;
    if (m && (m.ndim !== 2 || m.shape[0] !== x.shape[0] || m.shape[1] !== x.shape[1])) {
      throw new MediaError(`input_features_mask of shape (${m.shape.join(", ")}) does not match input_features (${x.shape.join(", ")})`);
    }
    const counts = m ? trueCounts(m) : Array<number>(x.shape[0]!).fill(x.shape[1]!);
    const rows = counts.reduce((a, b) => a + b, 0);
    if (n !== rows) {
      throw new MediaError(
        `the prompt has ${n} audio placeholder token${n === 1 ? "" : "s"} (id ${this.config.audio_token_id}) but the audio gives ${rows} frame${rows === 1 ? "" : "s"} ` +
          `(mlx-vlm would silently ${n > rows ? "wrap the features around" : "drop the extra features"})`,
      );
    }
    return counts;
  }

  private checkImages(ids: readonly number[], media: UnifiedMediaInputs): number[] | null {
    const n = ids.filter((t) => t === this.config.image_token_id).length;
    if (!media.pixel_values) {
      if (this.vision_embedder && n > 0) throw new MediaError(`the prompt has ${n} image placeholder tokens (id ${this.config.image_token_id}) but no image input`);
      return null;
    }
    if (!this.vision_embedder) throw new MediaError("image input given, but this checkpoint has no vision embedder (no vision_embedder weights, or vision_config null)");
    if (!media.image_position_ids) throw new MediaError("image input given without image_position_ids (Gemma4UnifiedImageProcessor gives both)");
    const pv = media.pixel_values.shape;
    const ps = media.image_position_ids.shape;
    if (ps.length !== 3 || ps[2] !== 2 || pv[0] !== ps[0] || pv[1] !== ps[1]) {
      throw new MediaError(`image_position_ids of shape (${ps.join(", ")}) do not match pixel_values of shape (${pv.join(", ")}): expected (${pv[0]}, ${pv[1]}, 2)`);
    }
    const counts = validRowCounts(media.image_position_ids);
    const rows = counts.reduce((a, b) => a + b, 0);
    if (n !== rows) {
      throw new MediaError(
        `the prompt has ${n} image placeholder token${n === 1 ? "" : "s"} (id ${this.config.image_token_id}) but the images give ${rows} valid patch row${rows === 1 ? "" : "s"}; ` +
          `each image needs exactly as many placeholders as its soft tokens (mlx-vlm would silently ${n > rows ? "wrap the features around" : "drop the extra features"})`,
      );
    }
    return counts;
  }

  /** get_image_features: embedder, embed_vision, the valid prefix rows of each image. */
  get_image_features(pixel_values: MlxArray, image_position_ids: MlxArray, counts: readonly number[], taps?: TapSink): MlxArray {
    using embedded = this.vision_embedder!.call(pixel_values, image_position_ids, taps);
    using projected = this.embed_vision!.call(embedded, taps, "embed_vision/");
    return _compact_prefix_rows(projected, counts);
  }

  /**
   * get_video_features: (videos, frames, N, D) patches (and positions) reshaped to (videos*frames,
   * N, ·), then get_image_features; each frame's valid prefix rows.
   */
  get_video_features(pixel_values_videos: MlxArray, video_position_ids: MlxArray, counts: readonly number[], taps?: TapSink): MlxArray {
    if (pixel_values_videos.ndim === 4) {
      const [v, f, n, d] = pixel_values_videos.shape as [number, number, number, number];
      using pv = mx.reshape(pixel_values_videos, [v * f, n, d]);
      using pos = mx.reshape(video_position_ids, [v * f, n, 2]);
      return this.get_image_features(pv, pos, counts, taps);
    }
    return this.get_image_features(pixel_values_videos, video_position_ids, counts, taps);
  }

  /** get_audio_features: embed_audio on the raw frames, each clip's valid prefix rows. */
  get_audio_features(input_features: MlxArray, input_features_mask: MlxArray | null, counts: readonly number[], taps?: TapSink): MlxArray {
    if (taps) {
      taps("embed_audio/input_features", input_features);
      taps("embed_audio/input_features_mask", input_features_mask);
    }
    using projected = this.embed_audio!.call(input_features, taps, "embed_audio/");
    if (input_features_mask === null) return mx.reshape(projected, [-1, projected.shape[projected.ndim - 1]!]);
    return _compact_prefix_rows(projected, counts);
  }

  /** get_input_embeddings: scaled token embeddings, per-layer inputs (media ids → 0), image, video, then audio features scattered. */
  get_input_embeddings(input_ids: MlxArray, media: UnifiedMediaInputs = {}, taps?: TapSink): InputEmbeddings {
    const { image: counts, video: videoCounts, audio: audioCounts } = this.checkMedia(input_ids, media);
    const lm = this.language_model.model;
    using stack = new DisposableStack();
    if (taps) taps("inputs", input_ids);
    const emb = stack.use(lm.embed_tokens.call(input_ids));
    if (taps) taps("embed_tokens", emb);
    let inputs_embeds = stack.use(mx.multiply(emb, lm.embed_scale));
    if (taps) taps("embed_scaled", inputs_embeds);

    let per_layer_inputs: MlxArray | null = null;
    if (lm.hidden_size_per_layer_input) {
      let mm_mask = stack.use(mx.bitwiseOr(stack.use(mx.equal(input_ids, this.config.image_token_id)), stack.use(mx.equal(input_ids, this.config.audio_token_id))));
      if (this.config.video_token_id !== null && !unifiedMutated("unified_video_ple_ids_kept")) mm_mask = stack.use(mx.bitwiseOr(mm_mask, stack.use(mx.equal(input_ids, this.config.video_token_id))));
      const text_mask = stack.use(mx.logicalNot(mm_mask));
      const tokens = stack.use(mx.where(text_mask, input_ids, stack.use(mx.zerosLike(input_ids))));
      if (taps) taps("per_layer_input_ids", tokens);
      per_layer_inputs = this.language_model.get_per_layer_inputs(tokens, taps);
    }
    try {
      if (media.pixel_values && counts) {
        using projected = this.get_image_features(media.pixel_values, media.image_position_ids!, counts, taps);
        using features = mx.astype(projected, inputs_embeds.dtype);
        if (taps) taps("image_features", features);
        using e = mx.equal(input_ids, this.config.image_token_id);
        using ee = mx.expandDims(e, -1);
        using mask = mx.broadcastTo(ee, inputs_embeds.shape);
        inputs_embeds = stack.use(masked_scatter(inputs_embeds, mask, features));
        if (taps) taps("merge/image", inputs_embeds);
      }
      if (media.pixel_values_videos && videoCounts) {
        using projected = this.get_video_features(media.pixel_values_videos, media.video_position_ids!, videoCounts, taps);
        using features = mx.astype(projected, inputs_embeds.dtype);
        if (taps) taps("video_features", features);
        using e = mx.equal(input_ids, this.config.video_token_id!);
        using ee = mx.expandDims(e, -1);
        using mask = mx.broadcastTo(ee, inputs_embeds.shape);
        inputs_embeds = stack.use(masked_scatter(inputs_embeds, mask, features));
        if (taps) taps("merge/video", inputs_embeds);
      }
      if (media.input_features && audioCounts) {
        using projected = this.get_audio_features(media.input_features, media.input_features_mask ?? null, audioCounts, taps);
        using features = mx.astype(projected, inputs_embeds.dtype);
        if (taps) taps("audio_features", features);
        using e = mx.equal(input_ids, this.config.audio_token_id);
        using ee = mx.expandDims(e, -1);
        using mask = mx.broadcastTo(ee, inputs_embeds.shape);
        inputs_embeds = stack.use(masked_scatter(inputs_embeds, mask, features));
        if (taps) taps("merge/audio", inputs_embeds);
      }
      return { inputs_embeds: mx.alias(inputs_embeds), per_layer_inputs };
    } catch (e) {
      per_layer_inputs?.dispose();
      throw e;
    }
  }

  /**
   * Model.__call__: get_input_embeddings (taps under "embed/"), then the language model on the
   * merged embeddings without mm_token_type_ids (mlx-vlm drops them here: plain causal masks).
   */
  call(input_ids: MlxArray, opts: UnifiedCallOptions = {}): MlxArray {
    const { taps } = opts;
    const e = this.get_input_embeddings(input_ids, opts, taps ? prefixed(taps, "embed/") : undefined);
    using inputs_embeds = e.inputs_embeds;
    using per_layer_inputs = e.per_layer_inputs;
    return this.language_model.call(null, { inputs_embeds, per_layer_inputs, cache: opts.cache ?? null, logits_to_keep: opts.logits_to_keep ?? null, taps });
  }

  makeCache(factory: gemma4_text.CacheFactory = gemma4_text.defaultCacheFactory): KVCacheLike[] {
    return this.language_model.makeCache(factory);
  }

  /** Releases the weights and the compiled decode closures that hold them. */
  dispose(): void {
    this.language_model.model.disposeCompiled();
    for (const p of this.parameters().values()) p.dispose();
  }

  /**
   * Model.sanitize, then LanguageModel.sanitize (load_model's order; VisionEmbedder has none):
   * rotary buffers and lm_head.weight dropped, embed_audio dropped when the config has no audio;
   * "model." stripped, language_model.X → language_model.model.X; HF expert layouts moved under
   * switch_glu (gate_up_proj split on its output rows); then the KV-shared layers' own K/V
   * projections and norms, and clip bounds outside a vision/audio tower, dropped.
   */
  sanitize(weights: Map<string, Tensor>): Map<string, Tensor> {
    const out = new Map<string, Tensor>();
    const drop = (v: Tensor) => v.array.dispose();
    for (const [k, v] of weights) {
      if (k.includes("rotary_emb") || k === "lm_head.weight" || (this.embed_audio === null && k.includes("embed_audio"))) {
        drop(v);
        continue;
      }
      let nk = k.startsWith("model.") ? k.slice("model.".length) : k;
      if (nk.startsWith("language_model.") && !nk.startsWith("language_model.model.")) nk = `language_model.model.${nk.slice("language_model.".length)}`;
      if (nk.endsWith(".experts.down_proj")) nk = nk.replace(".experts.down_proj", ".experts.switch_glu.down_proj.weight");
      if (nk.endsWith(".experts.gate_up_proj")) {
        // v.swapaxes(-1, -2)[..., :mid].swapaxes(-1, -2): the first half of axis -2
        const a = v.array;
        const s = a.shape;
        const mid = Math.floor(s[s.length - 2]! / 2);
        const half = (from: number, to: number) => {
          using p = mx.slice(a, s.map((_, i) => (i === s.length - 2 ? from : 0)), s.map((d, i) => (i === s.length - 2 ? to : d)));
          return mx.contiguous(p);
        };
        out.set(nk.replace(".experts.gate_up_proj", ".experts.switch_glu.gate_proj.weight"), { ...v, array: half(0, mid) });
        out.set(nk.replace(".experts.gate_up_proj", ".experts.switch_glu.up_proj.weight"), { ...v, array: half(mid, s[s.length - 2]!) });
        a.dispose();
        continue;
      }
      out.set(nk, v);
    }
    // LanguageModel.sanitize
    const first = this.language_model.first_kv_shared_layer_idx;
    const nLayers = this.language_model.model.layers.length;
    for (const k of [...out.keys()]) {
      const m = /^language_model\.model\.layers\.(\d+)\.self_attn\.([^.]+)\./.exec(k);
      const shared = m && this.config.text.num_kv_shared_layers > 0 && Number(m[1]) < nLayers && Number(m[1]) >= first && ["k_proj", "v_proj", "k_norm", "v_norm"].includes(m[2]!);
      const clip = ["input_max", "input_min", "output_max", "output_min"].some((s) => k.includes(s)) && !k.includes("vision_tower") && !k.includes("audio_tower");
      if (shared || clip) {
        drop(out.get(k)!);
        out.delete(k);
      }
    }
    return out;
  }

  /** mlx_vlm.utils._drop_modules_without_weights for the unified parts. */
  dropModulesWithoutWeights(keys: ReadonlySet<string>): void {
    const tops = new Set([...keys].map((k) => k.split(".")[0]!));
    for (const name of ["vision_embedder", "embed_vision", "embed_audio"] as const) {
      const m = this[name];
      if (m === null || tops.has(name) || m.parameters().size === 0) continue;
      for (const p of m.parameters().values()) p.dispose();
      this[name] = null;
    }
  }
}

export { VisionEmbedder as VisionModel };
