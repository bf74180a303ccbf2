// mlx_vlm/speculative/drafters/qwen3_dflash/config.py (mlx-vlm 0.7.10): DFlashConfig, the config of
// a DFlash block-diffusion drafter, and its from_dict (the `dflash_config` block lifted to the top
// level; `rope_parameters` split into rope_theta and rope_scaling; unknown keys dropped).
import { ConfigError } from "../../../gemma4/config.ts";

export interface DFlashConfig {
  model_type: string;
  hidden_size: number;
  intermediate_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads: number;
  head_dim: number;
  rms_norm_eps: number;
  vocab_size: number;
  max_position_embeddings: number;
  rope_theta: number;
  rope_scaling: Record<string, unknown> | null;
  attention_bias: boolean;
  tie_word_embeddings: boolean;
  /** Tokens per verify block (the bonus plus block_size - 1 drafts), the adaptive loop's ceiling. */
  block_size: number;
  /** The token filling the block's draft positions. */
  mask_token_id: number;
  /** The target layers whose outputs (concatenated) are the drafter's context. */
  target_layer_ids: number[];
  num_target_layers: number;
  layer_types: string[];
  sliding_window: number | null;
  final_logit_softcapping: number | null;
  runtime_block_size: number | null;
  draft_window_size: number | null;
  is_causal: boolean;
  attention_sink_bias: boolean;
}

export const DFLASH_DEFAULTS: DFlashConfig = {
  model_type: "",
  hidden_size: 2560,
  intermediate_size: 9728,
  num_hidden_layers: 5,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  head_dim: 128,
  rms_norm_eps: 1e-6,
  vocab_size: 248320,
  max_position_embeddings: 262144,
  rope_theta: 10000000.0,
  rope_scaling: null,
  attention_bias: false,
  tie_word_embeddings: true,
  block_size: 16,
  mask_token_id: 248070,
  target_layer_ids: [1, 8, 15, 22, 29],
  num_target_layers: 32,
  layer_types: [],
  sliding_window: null,
  final_logit_softcapping: null,
  runtime_block_size: null,
  draft_window_size: null,
  is_causal: false,
  attention_sink_bias: false,
};

const isObj = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

/** DFlashConfig.from_dict. */
export function dflashConfigFromDict(params: Record<string, unknown>, file = "config.json"): DFlashConfig {
  const flat: Record<string, unknown> = { ...params };
  const dflashCfg = isObj(flat.dflash_config) ? flat.dflash_config : {};
  delete flat.dflash_config;
  if ("mask_token_id" in dflashCfg) flat.mask_token_id = dflashCfg.mask_token_id;
  if ("target_layer_ids" in dflashCfg) flat.target_layer_ids = Array.isArray(dflashCfg.target_layer_ids) ? [...dflashCfg.target_layer_ids] : dflashCfg.target_layer_ids;
  if ("num_target_layers" in dflashCfg) flat.num_target_layers = dflashCfg.num_target_layers;
  if ("runtime_block_size" in dflashCfg) flat.runtime_block_size = dflashCfg.runtime_block_size;
  if ("draft_window_size" in dflashCfg) flat.draft_window_size = dflashCfg.draft_window_size;
  if ("causal" in dflashCfg) flat.is_causal = Boolean(dflashCfg.causal);
  else if ("dflash_query_causal" in flat) {
    flat.is_causal = Boolean(flat.dflash_query_causal);
    delete flat.dflash_query_causal;
  }
  if ("attention_sink_bias" in dflashCfg) flat.attention_sink_bias = Boolean(dflashCfg.attention_sink_bias);
  if (!("num_target_layers" in flat) && Array.isArray(flat.target_layer_ids) && flat.target_layer_ids.length) {
    flat.num_target_layers = Math.max(...(flat.target_layer_ids as number[])) + 1;
  }
  const rope = flat.rope_parameters;
  delete flat.rope_parameters;
  if (isObj(rope)) {
    const r = { ...rope };
    if ("rope_theta" in r) {
      flat.rope_theta = r.rope_theta;
      delete r.rope_theta;
    }
    flat.rope_scaling = r;
  }
  const out: Record<string, unknown> = { ...DFLASH_DEFAULTS, target_layer_ids: [...DFLASH_DEFAULTS.target_layer_ids], layer_types: [] };
  for (const k of Object.keys(DFLASH_DEFAULTS)) if (k in flat && flat[k] !== undefined) out[k] = flat[k];
  return validate(out as unknown as DFlashConfig, file);
}

function validate(c: DFlashConfig, file: string): DFlashConfig {
  const posInt = (k: keyof DFlashConfig) => {
    const v = c[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1) throw new ConfigError(file, k, `must be a positive integer, got ${JSON.stringify(v)}`);
  };
  for (const k of ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "block_size"] as const) posInt(k);
  if (!Number.isInteger(c.mask_token_id) || c.mask_token_id < 0) throw new ConfigError(file, "mask_token_id", `must be a token id, got ${JSON.stringify(c.mask_token_id)}`);
  if (!Array.isArray(c.target_layer_ids) || !c.target_layer_ids.length || c.target_layer_ids.some((i) => !Number.isInteger(i) || i < 0)) {
    throw new ConfigError(file, "dflash_config.target_layer_ids", `must be a non-empty list of layer indices, got ${JSON.stringify(c.target_layer_ids)}`);
  }
  if (!Array.isArray(c.layer_types)) throw new ConfigError(file, "layer_types", "must be a list");
  if (c.layer_types.length && c.layer_types.length < c.num_hidden_layers) throw new ConfigError(file, "layer_types", `has ${c.layer_types.length} entries for ${c.num_hidden_layers} layers`);
  for (const t of c.layer_types) if (t !== "sliding_attention" && t !== "full_attention") throw new ConfigError(file, "layer_types", `unknown layer type ${JSON.stringify(t)}`);
  if (c.layer_types.includes("sliding_attention") && (!Number.isInteger(c.sliding_window) || (c.sliding_window as number) < 2)) {
    throw new ConfigError(file, "sliding_window", "DFlash draft config must define sliding_window (>= 2) for sliding layers.");
  }
  if (c.attention_bias) throw new ConfigError(file, "attention_bias", "true is not read by mlx-vlm's DFlashAttention (its projections have no bias); refused");
  if (c.rope_scaling !== null) {
    const t = (c.rope_scaling.type ?? c.rope_scaling.rope_type ?? "default") as string;
    if (t !== "default" && t !== "linear") throw new ConfigError(file, "rope_scaling", `rope type ${JSON.stringify(t)} is not ported (default and linear are)`);
  }
  if (c.draft_window_size !== null && !Number.isInteger(c.draft_window_size)) throw new ConfigError(file, "draft_window_size", "must be an integer or null");
  return c;
}
