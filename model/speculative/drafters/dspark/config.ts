// mlx_vlm/speculative/drafters/dspark/config.py (mlx-vlm 0.7.10): DSparkConfig, a DFlash config
// with DSpark's fields (markov head, confidence head, block-size policy). mlx-vlm's verification
// width block_size includes the anchor token: block_size = proposal_length + 1. This port runs the
// Gemma 4 DSpark drafter (gemma4_dspark/config.ts builds its config); the fields and the
// model-agnostic checks live here.
import { ConfigError } from "../../../gemma4/config.ts";
import { DFLASH_DEFAULTS, type DFlashConfig } from "../qwen3_dflash/config.ts";

export interface DSparkConfig extends DFlashConfig {
  backbone_model_type: string;
  architectures: string[];
  hidden_act: string;
  rope_is_neox_style: boolean;
  sample_from_anchor: boolean;
  /** Checkpoint proposal count (gamma upstream); block_size - 1. */
  proposal_length: number;
  block_size_policy: "fixed" | "adaptive";
  dflash_initial_block_size: number | null;
  markov_rank: number;
  markov_head_type: string;
  enable_confidence_head: boolean;
  confidence_head_with_markov: boolean;
}

export const DSPARK_DEFAULTS: DSparkConfig = {
  ...DFLASH_DEFAULTS,
  model_type: "dspark",
  backbone_model_type: "qwen3",
  architectures: [],
  hidden_size: 2048,
  intermediate_size: 6144,
  num_hidden_layers: 5,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  head_dim: 64,
  hidden_act: "silu",
  rms_norm_eps: 1e-5,
  vocab_size: 128000,
  max_position_embeddings: 128000,
  rope_theta: 10000000.0,
  rope_scaling: null,
  rope_is_neox_style: true,
  tie_word_embeddings: true,
  sample_from_anchor: true,
  block_size: 0,
  proposal_length: 0,
  mask_token_id: -1,
  target_layer_ids: [],
  num_target_layers: 0,
  block_size_policy: "fixed",
  dflash_initial_block_size: null,
  markov_rank: 256,
  markov_head_type: "vanilla",
  enable_confidence_head: false,
  confidence_head_with_markov: true,
};

export function isStrictlyIncreasingInts(values: readonly unknown[]): boolean {
  return values.every((v, i) => Number.isInteger(v) && (i === 0 || (values[i - 1] as number) < (v as number)));
}

/** The checks DSparkConfig.validate and Gemma4DsparkConfig.validate share, with Python's messages. */
export function validateDSparkCommon(c: DSparkConfig, file: string): void {
  for (const k of ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "block_size", "proposal_length", "num_target_layers", "markov_rank"] as const) {
    const v = c[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) throw new ConfigError(file, k, `DSpark requires a positive integer ${k}.`);
  }
  if (c.block_size !== c.proposal_length + 1) throw new ConfigError(file, "block_size", "DSpark verification block_size must equal proposal_length + 1.");
  if (c.markov_head_type !== "vanilla") throw new ConfigError(file, "markov_head_type", "DSpark currently supports only markov_head_type='vanilla'.");
  if (!(Number.isInteger(c.mask_token_id) && c.mask_token_id >= 0 && c.mask_token_id < c.vocab_size)) throw new ConfigError(file, "mask_token_id", "DSpark mask_token_id must be inside the vocabulary.");
  if (c.layer_types.length !== c.num_hidden_layers) throw new ConfigError(file, "layer_types", "DSpark requires one layer type per draft layer.");
  if (!c.target_layer_ids.length || !isStrictlyIncreasingInts(c.target_layer_ids) || c.target_layer_ids.some((i) => i < 0 || i >= c.num_target_layers)) {
    throw new ConfigError(file, "target_layer_ids", "DSpark target_layer_ids must be unique, increasing indices inside the target layer range.");
  }
}
