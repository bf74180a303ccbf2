// The tap scheme of oracle/taps.json expanded for one model call (same rules as oracle/python/taps.py).
// The TS model emits exactly expandTaps(config, call) (each prefixed by callPrefix) in this order.

import tapsJson from "./taps.json" with { type: "json" };

export interface TapTemplate {
  name: string;
  repeat: "model" | "layer" | "mask" | "vision_layer" | "audio_layer";
  when: string[];
  observed: "input" | "output";
  source: string;
  shape: string;
}

export const TAP_SPEC = tapsJson as {
  version: number;
  conditions: Record<string, string>;
  taps: TapTemplate[];
  media_conditions: Record<string, string>;
  media_taps: TapTemplate[];
};

/** The config fields the expansion needs, with mlx-lm's defaults (ModelArgs, not HF's). */
export interface TapConfig {
  num_hidden_layers: number;
  layer_types: string[];
  num_kv_shared_layers: number;
  attention_k_eq_v: boolean;
  enable_moe_block: boolean;
  top_k_experts: number;
  hidden_size_per_layer_input: number;
}

/** From a config.json object (flat gemma4_text, or the gemma4 wrapper's text_config). */
export function tapConfig(config: Record<string, unknown>): TapConfig {
  const c = (config.text_config as Record<string, unknown> | undefined) ?? config;
  const n = Number(c.num_hidden_layers ?? 35);
  let types = c.layer_types as string[] | undefined;
  if (!types) {
    const period = Number(c.sliding_window_pattern ?? 5);
    const pattern = [...Array<string>(period - 1).fill("sliding_attention"), "full_attention"];
    types = Array.from({ length: n }, (_, i) => pattern[i % period] as string);
  }
  return {
    num_hidden_layers: n,
    layer_types: types,
    num_kv_shared_layers: Number(c.num_kv_shared_layers ?? 20),
    attention_k_eq_v: Boolean(c.attention_k_eq_v ?? false),
    enable_moe_block: Boolean(c.enable_moe_block ?? false),
    top_k_experts: Number(c.top_k_experts ?? 0),
    hidden_size_per_layer_input: Number(c.hidden_size_per_layer_input ?? 256),
  };
}

export interface CallShape {
  batch: number;
  length: number;
  /** A cache is passed (generate). */
  cache: boolean;
  /** A generate_step _step call (adds logprobs/token). */
  step: boolean;
  /**
   * mlx-vlm's LanguageModel calls (the defaults are mlx-lm's, where all but `embeds` hold): ids
   * passed; the call embeds them itself; inputs_embeds passed; per-layer token inputs looked up
   * in this call (not passed in); SwitchGLU on its batched path (not 1 < L <= 8).
   */
  ids?: boolean;
  embed?: boolean;
  embeds?: boolean;
  pliLookup?: boolean;
  moeBatched?: boolean;
}

export function layerConditions(cfg: TapConfig, i: number, call: CallShape): Set<string> {
  const hasKv = i < cfg.num_hidden_layers - cfg.num_kv_shared_layers;
  const kEqV = cfg.attention_k_eq_v && cfg.layer_types[i] !== "sliding_attention";
  const s = new Set<string>([hasKv ? "has_kv" : "kv_shared"]);
  if (hasKv && !kEqV) s.add("v_proj");
  if (hasKv && call.cache) s.add("cache");
  if (cfg.enable_moe_block) {
    s.add("moe");
    if (call.moeBatched ?? true) {
      s.add("moe_batched");
      if (call.batch * call.length * cfg.top_k_experts >= 64) s.add("sorted");
    }
  } else {
    s.add("dense");
  }
  if (cfg.hidden_size_per_layer_input) s.add("ple");
  return s;
}

/** Ordered tap names (without call prefix) for one call. */
export function expandTaps(cfg: TapConfig, call: CallShape): string[] {
  const model = new Set<string>();
  if (cfg.hidden_size_per_layer_input) model.add("ple");
  if (call.step) model.add("step");
  if (call.ids ?? true) model.add("ids");
  if (call.embed ?? true) model.add("embed");
  if (call.embeds ?? false) model.add("embeds");
  if (call.pliLookup ?? true) model.add("pli_lookup");
  const maskTypes = [...new Set(cfg.layer_types)];
  const out: string[] = [];
  const entries = TAP_SPEC.taps;
  for (let k = 0; k < entries.length; ) {
    const e = entries[k] as TapTemplate;
    if (e.repeat === "layer") {
      const block: TapTemplate[] = [];
      while (k < entries.length && (entries[k] as TapTemplate).repeat === "layer") block.push(entries[k++] as TapTemplate);
      for (let i = 0; i < cfg.num_hidden_layers; i++) {
        const conds = layerConditions(cfg, i, call);
        for (const b of block) if (b.when.every((w) => conds.has(w))) out.push(b.name.replace("{i}", String(i)));
      }
      continue;
    }
    if (e.repeat === "mask") for (const t of maskTypes) out.push(e.name.replace("{type}", t));
    else if (e.when.every((w) => model.has(w))) out.push(e.name);
    k++;
  }
  return out;
}

/** "" for a forward, "prefill{k}/" or "step{n}/" inside generate_step. */
export function callPrefix(kind: "forward" | "prefill" | "step", index = 0): string {
  return kind === "forward" ? "" : `${kind}${index}/`;
}

/** Chunk sizes generate_step prefills (every prompt token but the last). */
export function prefillChunks(promptLength: number, prefillStepSize: number): number[] {
  const out: number[] = [];
  for (let done = 0; promptLength - done > 1; ) {
    const n = Math.min(prefillStepSize, promptLength - done - 1);
    out.push(n);
    done += n;
  }
  return out;
}

/** The config fields the media expansion needs (mlx-vlm's gemma4 config.json). */
export interface MediaTapConfig {
  ple: boolean;
  vision_layers: number;
  vision_clip: boolean;
  audio_layers: number;
  audio_clip: boolean;
  audio_proj: boolean;
  /** A gemma4_unified model: images go through its encoder-free VisionEmbedder (condition "unified"). */
  unified: boolean;
}

/** From a gemma4 config.json object with vision_config / audio_config (mlx-vlm's defaults). */
export function mediaTapConfig(config: Record<string, unknown>): MediaTapConfig {
  const t = (config.text_config ?? {}) as Record<string, unknown>;
  const v = (config.vision_config ?? {}) as Record<string, unknown>;
  const a = config.audio_config as Record<string, unknown> | null | undefined;
  return {
    ple: Boolean(t.hidden_size_per_layer_input ?? 256),
    vision_layers: Number(v.num_hidden_layers ?? 16),
    vision_clip: Boolean(v.use_clipped_linears ?? false),
    audio_layers: a ? Number(a.num_hidden_layers ?? 12) : 0,
    audio_clip: a ? Boolean(a.use_clipped_linears ?? true) : false,
    audio_proj: a ? (a.output_proj_dims === undefined ? true : a.output_proj_dims !== null) : false,
    unified: config.model_type === "gemma4_unified",
  };
}

/** Ordered tap names (without the "embed/" prefix) of one mlx-vlm get_input_embeddings call. */
export function expandMediaTaps(cfg: MediaTapConfig, media: { image: boolean; audio: boolean; imageList?: boolean; video?: boolean }): string[] {
  // video: the frames through the vision tower as one batch (condition "video"); the scheme
  // covers images or videos in one embed call, not both (the tower would run twice)
  if (media.video && media.image) throw new Error("the tap scheme covers an embed call with images or videos, not both");
  const conds = new Set<string>();
  if (cfg.ple) conds.add("ple");
  if ((media.image || media.video) && cfg.unified) {
    conds.add("unified");
  } else if (media.image || media.video) {
    conds.add(media.video ? "video" : "image");
    conds.add("tower");
    if (!media.imageList) conds.add("image_batch");
    if (cfg.vision_clip) conds.add("vision_clip");
  }
  if (media.audio && cfg.unified) {
    conds.add("unified_audio");
  } else if (media.audio) {
    conds.add("audio");
    if (cfg.audio_clip) conds.add("audio_clip");
    if (cfg.audio_proj) conds.add("audio_proj");
  }
  const layers: Record<string, number> = { vision_layer: conds.has("image_batch") ? cfg.vision_layers : 0, audio_layer: media.audio && !cfg.unified ? cfg.audio_layers : 0 };
  const out: string[] = [];
  const entries = TAP_SPEC.media_taps;
  for (let k = 0; k < entries.length; ) {
    const e = entries[k] as TapTemplate;
    if (e.repeat in layers) {
      const block: TapTemplate[] = [];
      while (k < entries.length && (entries[k] as TapTemplate).repeat === e.repeat) block.push(entries[k++] as TapTemplate);
      for (let i = 0; i < layers[e.repeat]!; i++) {
        for (const b of block) if (b.when.every((w) => conds.has(w))) out.push(b.name.replace("{i}", String(i)));
      }
      continue;
    }
    if (e.when.every((w) => conds.has(w))) out.push(e.name);
    k++;
  }
  // a gemma4_unified video: get_video_features runs the image path (the "unified" entries, under
  // their names); only its merge is the video one (video_features, merge/video at that place)
  if (media.video && cfg.unified) return out.map((n) => (n === "image_features" ? "video_features" : n === "merge/image" ? "merge/video" : n));
  return out;
}

/**
 * The CallShape of one mlx-vlm language-model call of a multimodal forward or generate_step
 * (capture_mm.py): the forward's call gets only inputs_embeds (+ per-layer inputs); prefill
 * chunks and the first _step get the ids, their embeddings slice and the per-layer inputs; the
 * decode steps embed their own token. SwitchGLU leaves its batched path for 1 < L <= 8.
 */
export function mmCallShape(cfg: TapConfig, call: { kind: "forward" | "prefill" | "step"; index: number; batch: number; length: number }): CallShape {
  const decode = call.kind === "step" && call.index > 0;
  return {
    batch: call.batch,
    length: call.length,
    cache: call.kind !== "forward",
    step: call.kind === "step",
    ids: call.kind !== "forward",
    embed: decode,
    embeds: !decode,
    pliLookup: decode,
    moeBatched: !(cfg.enable_moe_block && call.length > 1 && call.length <= 8),
  };
}
