// mlx_vlm/speculative/drafters/gemma4_dspark/config.py (mlx-vlm 0.7.10): Gemma4DsparkConfig, a
// DSpark drafter over a Gemma 4 draft backbone. Published checkpoints declare model_type
// gemma4_text with the Gemma4DSparkModel architecture and may publish the DSpark fields flat or
// under dflash_config; the checkpoint block_size is the proposal count (+ 1 here for the anchor).
import { ConfigError } from "../../../gemma4/config.ts";
import { DSPARK_DEFAULTS, type DSparkConfig, validateDSparkCommon } from "../dspark/config.ts";

export interface Gemma4DsparkConfig extends DSparkConfig {
  global_head_dim: number | null;
  num_global_key_value_heads: number | null;
  attention_k_eq_v: boolean;
  num_kv_shared_layers: number;
  use_double_wide_mlp: boolean;
  enable_moe_block: boolean;
  hidden_activation: string;
  hidden_size_per_layer_input: number;
  rope_parameters: Record<string, Record<string, unknown>>;
  rope_traditional: boolean;
  num_anchors: number;
}

export const GEMMA4_DSPARK_DEFAULTS: Gemma4DsparkConfig = {
  ...DSPARK_DEFAULTS,
  model_type: "gemma4_dspark",
  backbone_model_type: "gemma4",
  hidden_size: 3840,
  intermediate_size: 15360,
  num_hidden_layers: 5,
  num_attention_heads: 16,
  num_key_value_heads: 8,
  head_dim: 256,
  global_head_dim: 512,
  num_global_key_value_heads: 1,
  attention_k_eq_v: true,
  num_kv_shared_layers: 0,
  use_double_wide_mlp: false,
  enable_moe_block: false,
  hidden_activation: "gelu_pytorch_tanh",
  hidden_size_per_layer_input: 0,
  rms_norm_eps: 1e-6,
  vocab_size: 262144,
  final_logit_softcapping: 30.0,
  tie_word_embeddings: false,
  sliding_window: 1024,
  rope_parameters: {},
  rope_traditional: false,
  num_anchors: 512,
};

const isObj = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

/** Gemma4DsparkConfig.from_dict, then __post_init__ (layer_types default) and validate(). */
export function gemma4DsparkConfigFromDict(params: Record<string, unknown>, file = "config.json"): Gemma4DsparkConfig {
  const flat: Record<string, unknown> = { ...params };
  const nested = flat.dflash_config;
  delete flat.dflash_config;
  const source: Record<string, unknown> = isObj(nested) ? nested : flat;
  flat.backbone_model_type = String(flat.model_type ?? "gemma4");
  flat.model_type = "gemma4_dspark";
  for (const k of ["mask_token_id", "target_layer_ids", "num_target_layers", "runtime_block_size", "draft_window_size", "block_size_policy", "dflash_initial_block_size", "markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"]) {
    if (k in source) flat[k] = source[k];
  }
  const raw = source.block_size ?? flat.block_size;
  if (raw === undefined || raw === null) throw new ConfigError(file, "block_size", "DSpark requires a checkpoint block_size.");
  flat.proposal_length = Math.trunc(Number(raw));
  flat.block_size = Math.trunc(Number(raw)) + 1;
  if (!("runtime_block_size" in flat)) flat.runtime_block_size = Math.min(8, flat.block_size as number);
  if (!("block_size_policy" in flat)) flat.block_size_policy = "fixed";
  const out: Record<string, unknown> = { ...GEMMA4_DSPARK_DEFAULTS, target_layer_ids: [], layer_types: [] };
  for (const k of Object.keys(GEMMA4_DSPARK_DEFAULTS)) if (k in flat && flat[k] !== undefined) out[k] = flat[k];
  const c = out as unknown as Gemma4DsparkConfig;
  if (!c.layer_types.length) c.layer_types = Array(c.num_hidden_layers).fill("full_attention");
  validate(c, file);
  return c;
}

/** Gemma4DsparkConfig.validate, and what this port needs beyond it (said so in each message). */
function validate(c: Gemma4DsparkConfig, file: string): void {
  validateDSparkCommon(c, file);
  if (!isObj(c.rope_parameters)) throw new ConfigError(file, "rope_parameters", "must be an object");
  for (const t of c.layer_types) if (t !== "sliding_attention" && t !== "full_attention") throw new ConfigError(file, "layer_types", `unknown layer type ${JSON.stringify(t)}`);
  if (c.layer_types.includes("sliding_attention") && (!Number.isInteger(c.sliding_window) || (c.sliding_window as number) < 2)) {
    throw new ConfigError(file, "sliding_window", "DFlash draft config must define sliding_window (>= 2) for sliding layers.");
  }
  if (c.attention_k_eq_v && c.layer_types.includes("full_attention")) {
    // mlx-vlm 0.7.10: Gemma4DSparkAttention has no v_proj there, and DFlashDraftModel._project_context_kv
    // reads layer.self_attn.v_proj of every layer: AttributeError on the first draft (measured).
    throw new ConfigError(file, "attention_k_eq_v", "true with a full-attention layer fails in mlx-vlm 0.7.10 (DFlashDraftModel._project_context_kv reads the v_proj that Gemma4DSparkAttention leaves out: AttributeError), so this port refuses it");
  }
  if (c.hidden_activation !== "gelu_pytorch_tanh") throw new ConfigError(file, "hidden_activation", `only gelu_pytorch_tanh (Gemma 4's MLP) is ported, got ${JSON.stringify(c.hidden_activation)}`);
  if (c.draft_window_size !== null && c.draft_window_size !== undefined && !Number.isInteger(c.draft_window_size)) throw new ConfigError(file, "draft_window_size", "must be an integer or null");
}
