// mlx_vlm/speculative/drafters/gemma4_assistant/config.py (mlx-vlm 0.7.10): Gemma4AssistantConfig,
// the drafter config for Gemma 4 multi-token prediction, with its nested gemma4 text config.
import { ConfigError, type ModelArgs, modelArgsFromDict } from "../../../gemma4/config.ts";

export interface Gemma4AssistantConfig {
  model_type: string;
  /** The target's hidden size (the drafter reads the target's hidden state and embeddings). */
  backbone_hidden_size: number;
  use_ordered_embeddings: boolean;
  num_centroids: number;
  centroid_intermediate_top_k: number;
  tie_word_embeddings: boolean;
  /** Tokens per MTP round: block_size - 1 drafts plus the bonus token. */
  block_size: number;
  text_config: ModelArgs;
}

const DEFAULTS = {
  model_type: "gemma4_assistant",
  backbone_hidden_size: 1536,
  use_ordered_embeddings: false,
  num_centroids: 2048,
  centroid_intermediate_top_k: 32,
  tie_word_embeddings: true,
  block_size: 4,
};

/**
 * mlx-vlm's gemma4 TextConfig defaults differ from mlx-lm's ModelArgs in one field that a
 * drafter config may omit: the full-attention partial_rotary_factor (1.0 there, 0.25 here).
 */
function vlmRopeDefaults(): Record<string, unknown> {
  return {
    full_attention: { partial_rotary_factor: 1.0, rope_theta: 1000000.0, rope_type: "proportional" },
    sliding_attention: { partial_rotary_factor: 1.0, rope_theta: 10000.0, rope_type: "default" },
  };
}

/**
 * Gemma4AssistantConfig.from_dict + __post_init__: unknown keys are dropped; an unset or zero
 * text_config.num_kv_shared_layers becomes num_hidden_layers (every drafter layer reads the
 * target's K/V).
 */
export function assistantConfigFromDict(d: Record<string, unknown>, file = "config.json"): Gemma4AssistantConfig {
  const out: Record<string, unknown> = { ...DEFAULTS };
  for (const k of Object.keys(DEFAULTS)) if (k in d && d[k] !== undefined) out[k] = d[k];
  const tc = d.text_config;
  if (tc === undefined || tc === null || typeof tc !== "object" || Array.isArray(tc)) {
    throw new ConfigError(file, "text_config", "Gemma4AssistantConfig.text_config must be set (an object)");
  }
  const text: Record<string, unknown> = { ...(tc as Record<string, unknown>) };
  if (text.rope_parameters === undefined || text.rope_parameters === null) text.rope_parameters = vlmRopeDefaults();
  const shared = text.num_kv_shared_layers;
  const all = !shared || shared === text.num_hidden_layers;
  if (all) text.num_kv_shared_layers = 0; // validated as a target config, then every layer shared
  const args = modelArgsFromDict(text, file, "text_config.");
  if (all) args.num_kv_shared_layers = args.num_hidden_layers;
  // mlx-vlm's ProportionalRoPE rotates 2 * int(p * dims // 2) dims, mlx-lm's int(dims * p).
  for (const [type, rp] of Object.entries(args.rope_parameters)) {
    const p = rp.partial_rotary_factor ?? 1.0;
    const dims = type === "full_attention" && args.global_head_dim ? args.global_head_dim : args.head_dim;
    if ((rp.rope_type ?? rp.type) === "proportional" && 2 * Math.floor(Math.floor(p * dims) / 2) !== Math.trunc(dims * p)) {
      throw new ConfigError(file, `text_config.rope_parameters.${type}.partial_rotary_factor`, `${p} x ${dims} dims rotates an odd number of dims, which mlx-vlm and mlx-lm round differently`);
    }
  }
  for (const k of ["backbone_hidden_size", "block_size", "num_centroids", "centroid_intermediate_top_k"] as const) {
    const v = out[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1) throw new ConfigError(file, k, `must be a positive integer, got ${JSON.stringify(v)}`);
  }
  if (out.use_ordered_embeddings && args.vocab_size % (out.num_centroids as number) !== 0) {
    throw new ConfigError(file, "num_centroids", `vocab_size ${args.vocab_size} is not a multiple of num_centroids ${out.num_centroids}`);
  }
  return { ...(out as Omit<Gemma4AssistantConfig, "text_config">), text_config: args };
}
