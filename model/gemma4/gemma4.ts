// mlx_lm/models/gemma4.py: the multimodal wrapper. Only the text path exists in mlx-lm; the
// wrapper nests the text model under `language_model` and maps raw Hugging Face keys onto it.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../cache/index.ts";
import { AudioEncoder } from "./audio.ts";
import type { ModelArgs, MultimodalConfig, VisionConfig } from "./config.ts";
import * as gemma4_text from "./gemma4_text.ts";
import type { AnyLinear } from "./gemma4_text.ts";
import { LanguageModel } from "./language.ts";
import { mediaMutated, videoMutated } from "./mutations.ts";
import { Linear, Module } from "./nn.ts";
import { DECODE_BLOCK_SIZE } from "./switch_layers.ts";
import { prefixed, type TapSink } from "./taps.ts";
import type { Tensor } from "./tensors.ts";
import { VisionModel } from "./vision.ts";

export class Model extends Module {
  readonly model_type: string;
  language_model: gemma4_text.Model;

  /** `text_args` = gemma4_text.ModelArgs.from_dict(args.text_config) (see config.configFromDict). */
  constructor(text_args: ModelArgs, model_type = "gemma4") {
    super();
    this.model_type = model_type;
    this.language_model = new gemma4_text.Model(text_args);
  }

  get args(): ModelArgs {
    return this.language_model.args;
  }

  call(inputs: MlxArray | null, opts: gemma4_text.ModelCallOptions = {}): MlxArray {
    return this.language_model.call(inputs, opts);
  }

  /**
   * gemma4.Model.sanitize: strip "model.", drop the vision/audio towers, keep keys that did not
   * start with "model." verbatim (already-converted MLX checkpoints), map
   * model.language_model.X → language_model.model.X, then the text model's sanitize.
   */
  sanitize(weights: Map<string, Tensor>): Map<string, Tensor> {
    const out = new Map<string, Tensor>();
    const drop = ["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"];
    for (const [k0, v] of weights) {
      const starts_w_model = k0.startsWith("model.");
      let k = starts_w_model ? k0.slice("model.".length) : k0;
      if (drop.some((d) => k.startsWith(d))) {
        v.array.dispose();
        continue;
      }
      if (!starts_w_model) {
        out.set(k, v);
        continue;
      }
      // str.replace replaces EVERY occurrence, as Python's does
      if (k.startsWith("language_model")) k = k.split("language_model.").join("language_model.model.");
      out.set(k, v);
    }
    return this.language_model.sanitize(out);
  }

  /** Releases the weights, the private arrays (RoPE frequencies) and the compiled decode closures. */
  dispose(): void {
    this.language_model.model.disposeCompiled();
    this.disposeArrays();
  }

  get layers(): gemma4_text.DecoderLayer[] {
    return this.language_model.layers;
  }

  makeCache(factory: gemma4_text.CacheFactory = gemma4_text.defaultCacheFactory): KVCacheLike[] {
    return this.language_model.makeCache(factory);
  }
}

// ------------------------------------------------------------------ mlx-vlm: the multimodal model
//
// mlx_vlm/models/gemma4/gemma4.py (mlx-vlm 0.7.10): the same text model (language.ts) plus the
// vision tower (vision.ts), the audio tower (audio.ts) and their embedders; the media features
// replace the placeholder tokens' embeddings (masked_scatter). Where mlx-vlm silently wraps or
// drops features whose count does not match the placeholders, or crashes on media for a tower
// the checkpoint lacks, this port refuses with a MediaError.

/** Bad media input for the model: a placeholder count mismatch, or media without its tower. */
export class MediaError extends Error {
  override readonly name = "MediaError";
}

/**
 * masked_scatter(input, mask, source): the i-th True position of `mask` (flattened) gets the
 * i-th element of `source` (flattened, cumsum index modulo source.size), as mlx-vlm does.
 */
export function masked_scatter(input_tensor: MlxArray, mask: MlxArray, source: MlxArray): MlxArray {
  using stack = new DisposableStack();
  const mf = stack.use(mx.flatten(mask));
  const mask_flat = stack.use(mx.astype(mf, "int32"));
  const cs = stack.use(mx.cumsum(mask_flat, 0));
  const indices = stack.use(mx.subtract(cs, 1));
  const sf = stack.use(mx.flatten(source));
  const rem = stack.use(mx.remainder(indices, source.size));
  const order = mediaMutated("merge_order_reversed") ? stack.use(mx.subtract(source.size - 1, rem)) : rem;
  const aligned = stack.use(mx.take(sf, order, 0));
  const inf = stack.use(mx.flatten(input_tensor));
  const w = stack.use(mx.where(mask_flat, aligned, inf));
  return mx.reshape(w, input_tensor.shape);
}

/** Projects soft tokens from vision/audio into the language model's space: Linear(rms_norm(x, None)). */
export class MultimodalEmbedder extends Module {
  embedding_projection: AnyLinear;
  embedding_pre_projection_norm: gemma4_text.RMSNormNoScale;
  constructor(embedding_dim: number, text_hidden_size: number, eps = 1e-6) {
    super();
    this.embedding_projection = new Linear(embedding_dim, text_hidden_size);
    this.embedding_pre_projection_norm = new gemma4_text.RMSNormNoScale(embedding_dim, eps);
  }

  call(inputs_embeds: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using normed = this.embedding_pre_projection_norm.call(inputs_embeds);
    if (taps) taps(`${tp}embedding_pre_projection_norm`, normed);
    const out = this.embedding_projection.call(normed);
    if (taps) taps(`${tp}embedding_projection`, out);
    return out;
  }
}

/** The media of one prompt, as Gemma4Processor returns it (pixel_values: one batch or a list of images). */
export interface MediaInputs {
  pixel_values?: MlxArray | readonly MlxArray[] | null;
  /** (B, T, 128) float32 log-mel frames. */
  input_features?: MlxArray | null;
  /** (B, T) bool, True = a valid frame (the processor's convention). */
  input_features_mask?: MlxArray | null;
  /** float32 (N videos, frames, max_patches, p*p*3) patches (Gemma4VideoProcessor), or one per video. */
  pixel_values_videos?: MlxArray | readonly MlxArray[] | null;
  /** int64 (N videos, frames, max_patches, 2) patch positions, -1 = padding; a list with a list of videos. */
  video_position_ids?: MlxArray | readonly MlxArray[] | null;
}

/** Disposes the arrays of a MediaInputs. */
export function disposeMediaInputs(m: MediaInputs): void {
  const pv = m.pixel_values;
  if (Array.isArray(pv)) for (const a of pv) a.dispose();
  else (pv as MlxArray | null | undefined)?.dispose();
  m.input_features?.dispose();
  m.input_features_mask?.dispose();
  for (const v of [m.pixel_values_videos, m.video_position_ids]) {
    if (Array.isArray(v)) for (const a of v) a.dispose();
    else (v as MlxArray | null | undefined)?.dispose();
  }
}

export interface InputEmbeddings {
  inputs_embeds: MlxArray;
  per_layer_inputs: MlxArray | null;
}

export interface MultimodalCallOptions extends MediaInputs {
  mm_token_type_ids?: MlxArray | null;
  cache?: (KVCacheLike | null)[] | null;
  logits_to_keep?: number | null;
  taps?: TapSink;
}

/** How many feature rows the vision tower makes for these images (its output length). */
export function imageFeatureRows(pixel_values: MlxArray | readonly MlxArray[], vc: VisionConfig): number {
  const imgs = Array.isArray(pixel_values) ? (pixel_values as readonly MlxArray[]) : [pixel_values as MlxArray];
  let n = 0;
  for (const img of imgs) {
    const s = img.shape;
    const B = s.length === 4 ? s[0]! : 1;
    const [H, W] = s.slice(-2) as [number, number];
    n += B * Math.floor((Math.floor(H / vc.patch_size) * Math.floor(W / vc.patch_size)) / vc.pooling_kernel_size ** 2);
  }
  return n;
}

/** How many feature rows the audio tower makes for (B, T) frames: two stride-2 3x3 convs over T. */
export function audioFeatureRows(input_features: MlxArray): number {
  const [B, T] = input_features.shape as [number, number];
  const t1 = Math.floor((T + 2 - 3) / 2) + 1;
  return B * (Math.floor((t1 + 2 - 3) / 2) + 1);
}

/** The media shapes checkMediaInputs needs (MediaInputs, or just the arrays' shapes). */
export interface MediaShapes {
  pixel_values?: MlxArray | readonly MlxArray[] | null;
  input_features?: MlxArray | null;
  video_position_ids?: MlxArray | readonly MlxArray[] | null;
}

/**
 * How many feature rows the vision tower makes for these videos: per frame, its real
 * (non-padding) patches // pool² (the pooler's valid rows for a processor-made frame, whose
 * patch grid is a multiple of the pooling kernel).
 */
export function videoFeatureRows(video_position_ids: MlxArray | readonly MlxArray[], vc: VisionConfig): number {
  const all = Array.isArray(video_position_ids) ? (video_position_ids as readonly MlxArray[]) : [video_position_ids as MlxArray];
  let n = 0;
  for (const pos of all) {
    const L = pos.shape.at(-2)!;
    const frames = pos.size / (L * 2);
    using neg = mx.equal(pos, -1);
    using pad = mx.all(neg, -1);
    using real = mx.logicalNot(pad);
    using r = mx.astype(real, "int32");
    using per = mx.sum(r, -1);
    const counts = per.toNumbers() as number[];
    if (counts.length !== frames) throw new MediaError(`video_position_ids of shape [${pos.shape.join(", ")}] is not (.., frames, patches, 2)`);
    for (const c of counts) n += Math.floor(c / vc.pooling_kernel_size ** 2);
  }
  return n;
}

/**
 * Refuses media the model cannot take: media for a tower the checkpoint lacks, and a prompt
 * whose image / audio placeholder count differs from the feature rows the towers will make
 * (mlx-vlm's masked_scatter silently wraps the features around, or drops the extra ones).
 */
export function checkMediaInputs(config: MultimodalConfig, towers: { vision: boolean; audio: boolean }, ids: readonly number[], media: MediaShapes): void {
  const count = (tok: number) => ids.filter((t) => t === tok).length;
  const check = (kind: string, tok: number, rows: number) => {
    const n = count(tok);
    if (n !== rows) {
      throw new MediaError(
        `the prompt has ${n} ${kind} placeholder token${n === 1 ? "" : "s"} (id ${tok}) but the ${kind} input gives ${rows} feature row${rows === 1 ? "" : "s"}; ` +
          `each ${kind} needs exactly as many placeholders as its soft tokens (mlx-vlm would silently ${n > rows ? "wrap the features around" : "drop the extra features"})`,
      );
    }
  };
  if (media.pixel_values) {
    if (!towers.vision || !config.vision) throw new MediaError("image input given, but this checkpoint has no vision tower (no vision_tower weights)");
    check("image", config.image_token_id, imageFeatureRows(media.pixel_values, config.vision));
  } else if (towers.vision) {
    check("image", config.image_token_id, 0);
  }
  const videos = media.video_position_ids;
  if (videos) {
    if (!towers.vision || !config.vision) throw new MediaError("video input given, but this checkpoint has no vision tower (no vision_tower weights)");
    if (config.video_token_id === null)
      throw new MediaError(
        "video input given, but this checkpoint's config.json has no video_token_id (null): mlx-vlm would silently drop the video from the prompt; set video_token_id to the tokenizer's <|video|> id",
      );
    check("video", config.video_token_id, videoFeatureRows(videos, config.vision));
  } else if (towers.vision && config.video_token_id !== null) {
    check("video", config.video_token_id, 0);
  }
  if (media.input_features) {
    if (!towers.audio) throw new MediaError("audio input given, but this checkpoint has no audio tower (no audio_tower weights, or audio_config null)");
    check("audio", config.audio_token_id, audioFeatureRows(media.input_features));
  } else if (towers.audio) {
    check("audio", config.audio_token_id, 0);
  }
}

export class MultimodalModel extends Module {
  readonly model_type = "gemma4";
  readonly config: MultimodalConfig;
  language_model: LanguageModel;
  vision_tower: VisionModel | null = null;
  embed_vision: MultimodalEmbedder | null = null;
  audio_tower: AudioEncoder | null = null;
  embed_audio: MultimodalEmbedder | null = null;

  constructor(config: MultimodalConfig) {
    super();
    this.config = config;
    this.language_model = new LanguageModel(config.text);
    for (const l of this.language_model.model.layers) if (l.experts) l.experts.switch_glu.decode_block_size = DECODE_BLOCK_SIZE;
    if (config.vision) {
      this.vision_tower = new VisionModel(config.vision);
      this.embed_vision = new MultimodalEmbedder(config.vision.hidden_size, config.text.hidden_size, config.vision.rms_norm_eps);
    }
    if (config.audio) {
      this.audio_tower = new AudioEncoder(config.audio);
      this.embed_audio = new MultimodalEmbedder(config.audio.output_proj_dims ?? config.audio.hidden_size, config.text.hidden_size, config.audio.rms_norm_eps);
    }
  }

  get args(): ModelArgs {
    return this.language_model.config;
  }

  /** Refuses media the model cannot take, before any tower runs. */
  checkMedia(input_ids: MlxArray, media: MediaInputs): void {
    checkMediaInputs(this.config, { vision: this.vision_tower !== null, audio: this.audio_tower !== null }, input_ids.toNumbers() as number[], media);
  }

  /** get_input_embeddings: scaled token embeddings, the media features scattered over their placeholders. */
  get_input_embeddings(input_ids: MlxArray, media: MediaInputs = {}, taps?: TapSink): InputEmbeddings {
    this.checkMedia(input_ids, media);
    const lm = this.language_model.model;
    using stack = new DisposableStack();
    if (taps) taps("inputs", input_ids);
    const emb = stack.use(lm.embed_tokens.call(input_ids));
    if (taps) taps("embed_tokens", emb);
    let inputs_embeds = stack.use(mx.multiply(emb, lm.embed_scale));
    if (taps) taps("embed_scaled", inputs_embeds);

    let per_layer_inputs: MlxArray | null = null;
    if (lm.hidden_size_per_layer_input) {
      const image_mask_ids = stack.use(mx.equal(input_ids, this.config.image_token_id));
      const audio_mask_ids = stack.use(mx.equal(input_ids, this.config.audio_token_id));
      let mm_mask = stack.use(mx.bitwiseOr(image_mask_ids, audio_mask_ids));
      if (this.config.video_token_id !== null && !videoMutated("video_ple_ids_kept")) {
        const vm = stack.use(mx.equal(input_ids, this.config.video_token_id));
        mm_mask = stack.use(mx.bitwiseOr(mm_mask, vm));
      }
      const text_mask = stack.use(mx.logicalNot(mm_mask));
      const zeros = stack.use(mx.zerosLike(input_ids));
      const tokens = mediaMutated("ple_media_ids_kept") ? input_ids : stack.use(mx.where(text_mask, input_ids, zeros));
      if (taps) taps("per_layer_input_ids", tokens);
      per_layer_inputs = this.language_model.get_per_layer_inputs(tokens, taps);
    }
    try {
      const scatter = (features0: MlxArray, token_id: number, kind: "image" | "video" | "audio") => {
        using features = mx.astype(features0, inputs_embeds.dtype);
        if (taps) taps(`${kind}_features`, features);
        using e = mx.equal(input_ids, token_id);
        using ee = mx.expandDims(e, -1);
        using mask_expanded = mx.broadcastTo(ee, inputs_embeds.shape);
        inputs_embeds = stack.use(masked_scatter(inputs_embeds, mask_expanded, features));
        if (taps) taps(`merge/${kind}`, inputs_embeds);
      };
      if (media.pixel_values && this.vision_tower) {
        using vis = this.vision_tower.call(media.pixel_values, taps);
        using f = this.embed_vision!.call(vis, taps, "embed_vision/");
        scatter(f, this.config.image_token_id, "image");
      }
      if (media.pixel_values_videos && this.vision_tower) {
        // _encode_video: the same tower and embed_vision, on the frames' patches and positions
        if (!media.video_position_ids) throw new MediaError("pixel_values_videos given without video_position_ids");
        using vis = this.vision_tower.callWithPositions(media.pixel_values_videos, media.video_position_ids, taps);
        using f = this.embed_vision!.call(vis, taps, "embed_vision/");
        // checkMedia counted real patches // pool² per frame; the pooler is the authority (a frame
        // grid that is not a multiple of the kernel, e.g. do_resize off, can pool otherwise)
        using eq = mx.equal(input_ids, this.config.video_token_id!);
        using nTok = mx.sum(eq);
        const placeholders = nTok.item() as number;
        if (f.shape[1]! * f.shape[0]! !== placeholders)
          throw new MediaError(`the prompt has ${placeholders} video placeholder tokens but the vision tower gives ${f.shape[0]! * f.shape[1]!} video feature rows (mlx-vlm would silently misplace them)`);
        scatter(f, this.config.video_token_id!, "video");
      }
      if (media.input_features && this.audio_tower) {
        let mask: MlxArray;
        if (media.input_features_mask) {
          using b = mx.astype(media.input_features_mask, "bool");
          mask = stack.use(mediaMutated("audio_mask_not_inverted") ? mx.alias(b) : mx.logicalNot(b));
        } else {
          mask = stack.use(mx.zeros(media.input_features.shape.slice(0, 2), "bool"));
        }
        const [enc, m] = this.audio_tower.call(media.input_features, mask, taps);
        using _enc = enc;
        using _m = m;
        using f = this.embed_audio!.call(enc, taps, "embed_audio/");
        scatter(f, this.config.audio_token_id, "audio");
      }
      return { inputs_embeds: mx.alias(inputs_embeds), per_layer_inputs };
    } catch (e) {
      per_layer_inputs?.dispose();
      throw e;
    }
  }

  /**
   * Model.__call__: get_input_embeddings, then the language model on the merged embeddings.
   * Embed-call taps go to `taps` with the prefix "embed/", the language model's without one.
   */
  call(input_ids: MlxArray, opts: MultimodalCallOptions = {}): MlxArray {
    const { taps } = opts;
    const e = this.get_input_embeddings(input_ids, opts, taps ? prefixed(taps, "embed/") : undefined);
    using inputs_embeds = e.inputs_embeds;
    using per_layer_inputs = e.per_layer_inputs;
    return this.language_model.call(null, {
      inputs_embeds,
      per_layer_inputs,
      cache: opts.cache ?? null,
      mm_token_type_ids: opts.mm_token_type_ids ?? null,
      logits_to_keep: opts.logits_to_keep ?? null,
      taps,
    });
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
   * Model.sanitize, then LanguageModel.sanitize (mlx_vlm.utils.load_model's order): HF expert
   * layouts restacked; clip bounds kept only inside the towers that clip; rotary buffers and an
   * absent audio tower's keys dropped; "model." stripped, language_model.X → language_model.model.X;
   * PyTorch conv layouts transposed to MLX's (a shape heuristic, as mlx-vlm's); the KV-shared
   * layers' own K/V projections and norms dropped.
   */
  sanitize(weights0: Map<string, Tensor>): Map<string, Tensor> {
    const weights = sanitizeExperts(weights0, this.config.text.num_experts);
    const use_clipped = this.config.vision?.use_clipped_linears ?? false;
    const out = new Map<string, Tensor>();
    const drop = (v: Tensor) => v.array.dispose();
    for (const [k, v0] of weights) {
      let v = v0;
      if (["input_max", "input_min", "output_max", "output_min"].some((s) => k.includes(s))) {
        if (k.includes("vision_tower") && !use_clipped) {
          drop(v);
          continue;
        }
        if (!k.includes("vision_tower") && !k.includes("audio_tower")) {
          drop(v);
          continue;
        }
      }
      if (k.includes("rotary_emb")) {
        drop(v);
        continue;
      }
      if (this.audio_tower === null && (k.includes("audio_tower") || k.includes("embed_audio"))) {
        drop(v);
        continue;
      }
      let nk = k.startsWith("model.") ? k.slice("model.".length) : k;
      if (nk.startsWith("language_model.") && !nk.startsWith("language_model.model.")) nk = `language_model.model.${nk.slice("language_model.".length)}`;
      const a = v.array;
      if (nk.includes("subsample_conv_projection") && nk.includes("conv.weight") && a.ndim === 4) {
        const channels = this.config.audio?.subsampling_conv_channels;
        const expected_in = channels ? (nk.includes(".layer0.") ? 1 : nk.includes(".layer1.") ? channels[0]! : null) : null;
        if (expected_in === null || a.shape[3] !== expected_in) v = { ...v, array: transposed(a, [0, 2, 3, 1]) };
      }
      if (nk.includes("depthwise_conv1d.weight") && a.ndim === 3 && a.shape[2] !== 1) v = { ...v, array: transposed(a, [0, 2, 1]) };
      out.set(nk, v);
    }
    // LanguageModel.sanitize: the KV-shared layers' unused k/v projections and norms
    const first = this.language_model.first_kv_shared_layer_idx;
    for (const k of [...out.keys()]) {
      const m = /^language_model\.model\.layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\b/.exec(k);
      if (m && Number(m[1]) >= first && Number(m[1]) < this.config.text.num_hidden_layers && this.config.text.num_kv_shared_layers > 0) {
        drop(out.get(k)!);
        out.delete(k);
      }
    }
    return out;
  }

  /**
   * mlx_vlm.utils._drop_modules_without_weights: a top-level module (not the language model)
   * whose weights the checkpoint neither holds nor declares in its index is removed.
   */
  dropModulesWithoutWeights(keys: ReadonlySet<string>): void {
    const tops = new Set([...keys].map((k) => k.split(".")[0]!));
    for (const name of ["vision_tower", "embed_vision", "audio_tower", "embed_audio"] as const) {
      const m = this[name];
      if (m === null || tops.has(name) || m.parameters().size === 0) continue;
      for (const p of m.parameters().values()) p.dispose();
      this[name] = null;
    }
  }
}

/** A transposed, contiguous copy (the checkpoint array is released). */
function transposed(a: MlxArray, axes: number[]): MlxArray {
  using t = mx.transpose(a, axes);
  const c = mx.contiguous(t);
  a.dispose();
  return c;
}

/**
 * Model.sanitize's expert layouts (switch_layers.stack/split/move_expert_projection): per-expert
 * `experts.N.{gate,up,down}_proj` stacked, a fused `experts.gate_up_proj` split in two on the
 * output rows, `experts.down_proj` moved under switch_glu.
 */
function sanitizeExperts(weights: Map<string, Tensor>, num_experts: number | null): Map<string, Tensor> {
  const prefixes = new Set<string>();
  for (const k of weights.keys()) {
    if (k.includes(".experts.gate_up_proj") || k.includes(".experts.down_proj") || k.includes(".experts.0.")) prefixes.add(`${k.split(".experts.")[0]}.experts`);
  }
  if (prefixes.size === 0) return weights;
  const w = new Map(weights);
  const suffixes = ["weight", "scales", "biases", "bias"];
  for (const prefix of prefixes) {
    for (const name of ["gate_proj", "up_proj", "down_proj"]) {
      for (const suffix of suffixes) {
        const first = w.get(`${prefix}.0.${name}.${suffix}`);
        if (!first || num_experts === null) continue;
        const parts: Tensor[] = [];
        for (let i = 0; i < num_experts; i++) {
          const key = `${prefix}.${i}.${name}.${suffix}`;
          const t = w.get(key);
          if (!t) throw new MediaError(`${first.file}: ${key} is missing (the other experts' ${name} are there)`);
          parts.push(t);
          w.delete(key);
        }
        w.set(`${prefix}.switch_glu.${name}.${suffix}`, { ...first, array: mx.stack(parts.map((t) => t.array)) });
        for (const t of parts) t.array.dispose();
      }
    }
    const fused = w.get(`${prefix}.gate_up_proj`) ?? w.get(`${prefix}.gate_up_proj.weight`);
    if (fused) {
      w.delete(`${prefix}.gate_up_proj`);
      w.delete(`${prefix}.gate_up_proj.weight`);
      const [g, u] = mx.split(fused.array, 2, -2).map((p) => {
        const c = mx.contiguous(p);
        p.dispose();
        return c;
      }) as [MlxArray, MlxArray];
      fused.array.dispose();
      w.set(`${prefix}.switch_glu.gate_proj.weight`, { ...fused, array: g });
      w.set(`${prefix}.switch_glu.up_proj.weight`, { ...fused, array: u });
    }
    const down = w.get(`${prefix}.down_proj`);
    if (down) {
      w.delete(`${prefix}.down_proj`);
      w.set(`${prefix}.switch_glu.down_proj.weight`, down);
    }
  }
  return w;
}
