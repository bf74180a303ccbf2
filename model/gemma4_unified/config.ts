// mlx_vlm/models/gemma4_unified/config.py (mlx-vlm 0.7.10): AudioConfig, VisionConfig, TextConfig
// (gemma4's TextConfig with the 12B "unified" defaults and its own __post_init__), ModelConfig
// (+ from_dict's eoa_token_index fallback), read as mlx_vlm.utils.load_model reads them:
// BaseModelConfig.from_dict keeps the dataclass fields, missing ones take the defaults; an absent
// vision_config / audio_config becomes {} (load_model's setdefault), so a default part, which
// load_model then drops when the checkpoint has no weights for it; null keeps it None.

import { ConfigError, type LayerType, MODEL_ARGS_DEFAULTS, modelArgsFromDict, type RopeParams, type TextConfig } from "../gemma4/config.ts";

/** config.AudioConfig: the unified model has no audio tower, only embed_audio over raw frames. */
export interface AudioConfig {
  model_type: string;
  audio_samples_per_token: number;
  audio_embed_dim: number;
  hidden_size: number;
  output_proj_dims: number;
  rms_norm_eps: number;
  initializer_range: number;
}

export const AUDIO_CONFIG_DEFAULTS: Readonly<AudioConfig> = Object.freeze({
  model_type: "gemma4_unified_audio",
  audio_samples_per_token: 640,
  audio_embed_dim: 640,
  hidden_size: 640,
  output_proj_dims: 640,
  rms_norm_eps: 1e-6,
  initializer_range: 0.02,
});

/** config.VisionConfig (its `hidden_size` property is output_proj_dims). */
export interface VisionConfig {
  model_type: string;
  patch_size: number;
  pooling_kernel_size: number;
  model_patch_size: number;
  mm_embed_dim: number;
  mm_posemb_size: number;
  num_soft_tokens: number;
  rms_norm_eps: number;
  output_proj_dims: number;
  initializer_range: number;
}

export const VISION_CONFIG_DEFAULTS: Readonly<VisionConfig> = Object.freeze({
  model_type: "gemma4_unified_vision",
  patch_size: 16,
  pooling_kernel_size: 3,
  model_patch_size: 48,
  mm_embed_dim: 3840,
  mm_posemb_size: 1120,
  num_soft_tokens: 280,
  rms_norm_eps: 1e-6,
  output_proj_dims: 3840,
  initializer_range: 0.02,
});

/** The fields config.TextConfig redefines over gemma4's TextConfig (the rest keep gemma4's defaults). */
export const TEXT_CONFIG_DEFAULTS = Object.freeze({
  model_type: "gemma4_unified_text",
  hidden_size: 3840,
  num_hidden_layers: 48,
  intermediate_size: 15360,
  num_attention_heads: 16,
  head_dim: 256,
  global_head_dim: 512,
  vocab_size: 262144,
  vocab_size_per_layer_input: 262144,
  num_key_value_heads: 8,
  num_global_key_value_heads: 1,
  num_kv_shared_layers: 0,
  hidden_size_per_layer_input: 0,
  sliding_window: 1024,
  sliding_window_pattern: 6,
  attention_k_eq_v: true,
  use_double_wide_mlp: false,
  use_bidirectional_attention: "vision" as string | null,
});

/** TextConfig.__post_init__'s rope_parameters (its sliding entry has no partial_rotary_factor). */
export function defaultRopeParameters(): Record<string, RopeParams> {
  return {
    full_attention: { partial_rotary_factor: 0.25, rope_theta: 1000000.0, rope_type: "proportional" },
    sliding_attention: { rope_theta: 10000.0, rope_type: "default" },
  };
}

/** config.ModelConfig after from_dict (null vision / audio: no such part). */
export interface ModelConfig {
  text: TextConfig;
  vision: VisionConfig | null;
  audio: AudioConfig | null;
  vocab_size: number;
  image_token_id: number;
  audio_token_id: number;
  video_token_id: number | null;
  boi_token_id: number;
  eoi_token_id: number;
  boa_token_id: number;
  eoa_token_id: number | null;
  raw: Record<string, unknown>;
  file: string;
}

function isPosInt(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v) && v > 0;
}

function isTokenId(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v) && v >= 0;
}

function part(raw: Record<string, unknown>, key: string, file: string): Record<string, unknown> | null {
  if (!(key in raw)) return {}; // load_model: config.setdefault(key, {})
  const v = raw[key];
  if (v === null) return null;
  if (typeof v !== "object" || Array.isArray(v)) throw new ConfigError(file, key, "must be an object or null");
  return v as Record<string, unknown>;
}

function pick<T extends object>(defaults: Readonly<T>, given: Record<string, unknown>): T {
  const out: Record<string, unknown> = { ...defaults };
  for (const [k, v] of Object.entries(given)) if (k in defaults) out[k] = v;
  return out as T;
}

/** VisionConfig.from_dict + the checks the embedder would otherwise fail on deep inside MLX. */
export function visionConfigFromDict(d: Record<string, unknown>, file = "config.json"): VisionConfig {
  const c = pick(VISION_CONFIG_DEFAULTS, d);
  for (const k of ["patch_size", "pooling_kernel_size", "model_patch_size", "mm_embed_dim", "mm_posemb_size", "num_soft_tokens", "output_proj_dims"] as const) {
    if (!isPosInt(c[k])) throw new ConfigError(file, `vision_config.${k}`, `must be a positive integer, got ${JSON.stringify(c[k])}`);
  }
  if (c.output_proj_dims !== c.mm_embed_dim) {
    // embed_vision is MultimodalEmbedder(output_proj_dims, ...) applied to the embedder's mm_embed_dim rows
    throw new ConfigError(file, "vision_config.output_proj_dims", `must equal mm_embed_dim (${c.mm_embed_dim}): embed_vision projects the embedder's output, got ${c.output_proj_dims}`);
  }
  if (typeof c.rms_norm_eps !== "number" || !(c.rms_norm_eps > 0)) throw new ConfigError(file, "vision_config.rms_norm_eps", "must be a positive number");
  return c;
}

/** AudioConfig.from_dict + checks. */
export function audioConfigFromDict(d: Record<string, unknown>, file = "config.json"): AudioConfig {
  const c = pick(AUDIO_CONFIG_DEFAULTS, d);
  for (const k of ["audio_samples_per_token", "output_proj_dims"] as const) {
    if (!isPosInt(c[k])) throw new ConfigError(file, `audio_config.${k}`, `must be a positive integer, got ${JSON.stringify(c[k])}`);
  }
  if (typeof c.rms_norm_eps !== "number" || !(c.rms_norm_eps > 0)) throw new ConfigError(file, "audio_config.rms_norm_eps", "must be a positive number");
  return c;
}

/**
 * TextConfig.from_dict + __post_init__: the unified defaults under the given fields, rope
 * parameters and layer types filled as its __post_init__ does, then the text model's checks.
 */
export function textConfigFromDict(d: Record<string, unknown>, file = "config.json"): TextConfig {
  const given: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(d)) if (k in MODEL_ARGS_DEFAULTS || k in TEXT_CONFIG_DEFAULTS) given[k] = v;
  const merged: Record<string, unknown> = { ...TEXT_CONFIG_DEFAULTS, ...given };
  if (merged.rope_parameters === undefined || merged.rope_parameters === null) merged.rope_parameters = defaultRopeParameters();
  // layer_types: (pattern * (n // p + 1))[:n], the same rule modelArgsFromDict applies
  const args = modelArgsFromDict(merged, file, "text_config.");
  const bidi = merged.use_bidirectional_attention ?? null;
  if (bidi !== null && typeof bidi !== "string") throw new ConfigError(file, "text_config.use_bidirectional_attention", `must be a string or null, got ${JSON.stringify(bidi)}`);
  return { ...args, layer_types: args.layer_types as LayerType[], use_bidirectional_attention: bidi as string | null };
}

/** A gemma4_unified config.json → ModelConfig (ModelConfig.from_dict as load_model calls it). */
export function modelConfigFromDict(config: Record<string, unknown>, file = "config.json"): ModelConfig {
  const raw = { ...config };
  if (raw.model_type !== "gemma4_unified") {
    throw new ConfigError(file, "model_type", `a unified checkpoint is model_type "gemma4_unified", got ${JSON.stringify(raw.model_type)}`);
  }
  const tc = raw.text_config ?? {};
  if (typeof tc !== "object" || tc === null || Array.isArray(tc)) throw new ConfigError(file, "text_config", "must be an object");
  const v = part(raw, "vision_config", file);
  const a = part(raw, "audio_config", file);
  const ids: Record<string, number | null> = {
    image_token_id: 258880, audio_token_id: 258881, video_token_id: 258884,
    boi_token_id: 255999, eoi_token_id: 258882, boa_token_id: 256000, eoa_token_id: null, eoa_token_index: 258883,
  };
  for (const k of Object.keys(ids)) {
    if (k in raw) {
      const x = raw[k];
      if (x !== null && !isTokenId(x)) throw new ConfigError(file, k, `must be a token id, got ${JSON.stringify(x)}`);
      ids[k] = x as number | null;
    }
  }
  for (const k of ["image_token_id", "audio_token_id", "boi_token_id", "eoi_token_id", "boa_token_id"]) {
    if (ids[k] === null) throw new ConfigError(file, k, "must be a token id, got null");
  }
  // from_dict: eoa_token_id falls back to eoa_token_index
  const eoa = ids.eoa_token_id ?? ids.eoa_token_index ?? null;
  const vocab = raw.vocab_size ?? 262144;
  if (!isPosInt(vocab)) throw new ConfigError(file, "vocab_size", `must be a positive integer, got ${JSON.stringify(vocab)}`);
  return {
    text: textConfigFromDict(tc as Record<string, unknown>, file),
    vision: v === null ? null : visionConfigFromDict(v, file),
    audio: a === null ? null : audioConfigFromDict(a, file),
    vocab_size: vocab,
    image_token_id: ids.image_token_id!,
    audio_token_id: ids.audio_token_id!,
    video_token_id: ids.video_token_id ?? null,
    boi_token_id: ids.boi_token_id!,
    eoi_token_id: ids.eoi_token_id!,
    boa_token_id: ids.boa_token_id!,
    eoa_token_id: eoa,
    raw,
    file,
  };
}
