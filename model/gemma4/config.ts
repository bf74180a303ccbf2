// Model configuration: mlx_lm/models/gemma4_text.py `ModelArgs` (+ `__post_init__`) and
// mlx_lm/models/gemma4.py `ModelArgs` (the multimodal wrapper), read the way
// mlx_lm.utils.load_config / _get_classes / BaseModelArgs.from_dict read them.
//
// Defaults are mlx-lm's (E2B-shaped), NOT Hugging Face's: a config that omits
// num_kv_shared_layers gets 20, hidden_size_per_layer_input 256, use_double_wide_mlp true,
// final_logit_softcapping 30.0 (spec §1.1). Field names are the JSON keys (snake_case), so a
// reader holding config.json or gemma4_text.py finds each one by name.

import { readFileSync } from "node:fs";
import { join } from "node:path";

/** A configuration problem, naming the file and the key at fault. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
  constructor(
    readonly file: string,
    readonly key: string,
    readonly detail: string,
  ) {
    super(`${file}: ${key}: ${detail}`);
  }
}

export type LayerType = "sliding_attention" | "full_attention";
export const LAYER_TYPES: readonly LayerType[] = ["sliding_attention", "full_attention"];

/** One entry of rope_parameters (mlx-lm reads it as `scaling_config`). */
export interface RopeParams {
  rope_type?: string;
  type?: string;
  rope_theta?: number;
  partial_rotary_factor?: number;
  factor?: number;
  [k: string]: unknown;
}

/** gemma4_text.ModelArgs, after __post_init__. */
export interface ModelArgs {
  model_type: string;
  hidden_size: number;
  num_hidden_layers: number;
  intermediate_size: number;
  num_attention_heads: number;
  head_dim: number;
  global_head_dim: number;
  global_partial_rotary_factor: number; // unused by mlx-lm
  rms_norm_eps: number;
  vocab_size: number;
  vocab_size_per_layer_input: number;
  num_key_value_heads: number;
  num_global_key_value_heads: number | null;
  num_kv_shared_layers: number;
  pad_token_id: number; // unused
  hidden_size_per_layer_input: number | null; // 0 / null disables per-layer inputs
  rope_traditional: boolean;
  partial_rotary_factor: number; // unused
  rope_parameters: Record<string, RopeParams>;
  sliding_window: number;
  sliding_window_pattern: number;
  max_position_embeddings: number;
  attention_k_eq_v: boolean;
  final_logit_softcapping: number | null;
  use_double_wide_mlp: boolean;
  enable_moe_block: boolean;
  num_experts: number | null;
  top_k_experts: number | null;
  moe_intermediate_size: number | null;
  layer_types: LayerType[];
  tie_word_embeddings: boolean;
}

/** The dataclass defaults of gemma4_text.ModelArgs (gemma4_text.py:16-48). */
export const MODEL_ARGS_DEFAULTS: Readonly<Omit<ModelArgs, "rope_parameters" | "layer_types">> & {
  rope_parameters: null;
  layer_types: null;
} = Object.freeze({
  model_type: "gemma4_text",
  hidden_size: 1536,
  num_hidden_layers: 35,
  intermediate_size: 6144,
  num_attention_heads: 8,
  head_dim: 256,
  global_head_dim: 512,
  global_partial_rotary_factor: 0.25,
  rms_norm_eps: 1e-6,
  vocab_size: 262144,
  vocab_size_per_layer_input: 262144,
  num_key_value_heads: 1,
  num_global_key_value_heads: null,
  num_kv_shared_layers: 20,
  pad_token_id: 0,
  hidden_size_per_layer_input: 256,
  rope_traditional: false,
  partial_rotary_factor: 1.0,
  rope_parameters: null,
  sliding_window: 512,
  sliding_window_pattern: 5,
  max_position_embeddings: 131072,
  attention_k_eq_v: false,
  final_logit_softcapping: 30.0,
  use_double_wide_mlp: true,
  enable_moe_block: false,
  num_experts: null,
  top_k_experts: null,
  moe_intermediate_size: null,
  layer_types: null,
  tie_word_embeddings: true,
});

const FIELDS = new Set(Object.keys(MODEL_ARGS_DEFAULTS));

/** rope_parameters when the config has none (__post_init__, gemma4_text.py:51-63). */
export function defaultRopeParameters(): Record<string, RopeParams> {
  return {
    full_attention: { partial_rotary_factor: 0.25, rope_theta: 1000000.0, rope_type: "proportional" },
    sliding_attention: { partial_rotary_factor: 1.0, rope_theta: 10000.0, rope_type: "default" },
  };
}

/**
 * gemma4_text.ModelArgs.from_dict(params): keeps only dataclass fields (extra JSON keys such as
 * hidden_activation or quantization are ignored, as BaseModelArgs.from_dict does), fills the
 * defaults, runs __post_init__, then validates. `file` only labels errors.
 */
export function modelArgsFromDict(params: Record<string, unknown>, file = "config.json", keyPrefix = ""): ModelArgs {
  const a: Record<string, unknown> = { ...MODEL_ARGS_DEFAULTS };
  for (const [k, v] of Object.entries(params)) if (FIELDS.has(k)) a[k] = v;
  // __post_init__
  if (a.rope_parameters === null || a.rope_parameters === undefined) a.rope_parameters = defaultRopeParameters();
  if (a.layer_types === null || a.layer_types === undefined) {
    const p = a.sliding_window_pattern;
    const n = a.num_hidden_layers;
    // (pattern * (n // p + 1))[:n] with pattern = [sliding] * (p - 1) + [full]: entry i is pattern[i % p]
    if (isPosInt(p) && isPosInt(n) && n <= MAX_LAYERS) {
      a.layer_types = Array.from({ length: n }, (_, i): LayerType => (i % p === p - 1 ? "full_attention" : "sliding_attention"));
    }
  }
  const args = a as unknown as ModelArgs;
  validateModelArgs(args, file, keyPrefix);
  return args;
}

/** MLX shape entries are int32: no dimension (nor product of dimensions forming one) may exceed this. */
export const MAX_DIM = 2 ** 31 - 1;
/** A sanity bound (Gemma 4 models have up to 60 layers): the model builds one module per layer. */
export const MAX_LAYERS = 4096;

function isPosInt(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v) && v > 0 && v <= MAX_DIM;
}

function isNonNegInt(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v) && v >= 0;
}

/**
 * Rejects configs mlx-lm would either crash on deep inside the model or silently mis-compute:
 * each error names the file and the key (spec §11 "Dimension constraints").
 */
export function validateModelArgs(a: ModelArgs, file = "config.json", keyPrefix = ""): void {
  const err = (key: string, detail: string) => new ConfigError(file, keyPrefix + key, detail);
  const posInt = (key: keyof ModelArgs) => {
    const v = a[key];
    if (v === undefined || v === null) throw err(key, "is required (a positive integer)");
    if (!isPosInt(v)) throw err(key, `must be a positive integer${typeof v === "number" && v > MAX_DIM ? ` of at most ${MAX_DIM}` : ""}, got ${JSON.stringify(v)}`);
  };
  /** A dimension the model builds as a product of config values must fit an MLX shape entry. */
  const fits = (key: string, what: string, n: number) => {
    if (n > MAX_DIM) throw err(key, `${what} = ${n} exceeds the largest MLX dimension (${MAX_DIM})`);
  };
  for (const k of [
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "head_dim",
    "vocab_size",
    "num_key_value_heads",
    "sliding_window",
    "sliding_window_pattern",
    "max_position_embeddings",
  ] as const) {
    posInt(k);
  }
  if (a.num_hidden_layers > MAX_LAYERS) throw err("num_hidden_layers", `must be at most ${MAX_LAYERS} (a sanity bound), got ${a.num_hidden_layers}`);
  fits("intermediate_size", "2 * intermediate_size (double-wide MLP)", 2 * a.intermediate_size);
  if (typeof a.model_type !== "string") throw err("model_type", `must be a string, got ${JSON.stringify(a.model_type)}`);
  if (a.global_head_dim !== null && a.global_head_dim !== 0 && !isPosInt(a.global_head_dim)) {
    throw err("global_head_dim", `must be a positive integer (or 0/null to use head_dim), got ${JSON.stringify(a.global_head_dim)}`);
  }
  if (typeof a.rms_norm_eps !== "number" || !(a.rms_norm_eps > 0)) throw err("rms_norm_eps", `must be a positive number, got ${JSON.stringify(a.rms_norm_eps)}`);
  if (!isNonNegInt(a.num_kv_shared_layers)) throw err("num_kv_shared_layers", `must be a non-negative integer, got ${JSON.stringify(a.num_kv_shared_layers)}`);
  if (a.num_kv_shared_layers >= a.num_hidden_layers) {
    throw err("num_kv_shared_layers", `must be smaller than num_hidden_layers (${a.num_hidden_layers}), got ${a.num_kv_shared_layers}`);
  }
  for (const k of ["rope_traditional", "attention_k_eq_v", "use_double_wide_mlp", "enable_moe_block", "tie_word_embeddings"] as const) {
    if (typeof a[k] !== "boolean") throw err(k, `must be true or false, got ${JSON.stringify(a[k])}`);
  }
  if (a.final_logit_softcapping !== null && (typeof a.final_logit_softcapping !== "number" || !(a.final_logit_softcapping > 0))) {
    throw err("final_logit_softcapping", `must be a positive number or null, got ${JSON.stringify(a.final_logit_softcapping)}`);
  }
  const ple = a.hidden_size_per_layer_input;
  if (ple !== null && ple !== 0 && !isPosInt(ple)) {
    throw err("hidden_size_per_layer_input", `must be a positive integer, or 0/null to disable per-layer inputs; got ${JSON.stringify(ple)}`);
  }
  if (ple) {
    posInt("vocab_size_per_layer_input");
    fits("hidden_size_per_layer_input", "num_hidden_layers * hidden_size_per_layer_input", a.num_hidden_layers * ple);
  }

  // layer types
  if (!Array.isArray(a.layer_types)) throw err("layer_types", "must be a list of layer types");
  if (a.layer_types.length !== a.num_hidden_layers) {
    throw err("layer_types", `has ${a.layer_types.length} entries but num_hidden_layers is ${a.num_hidden_layers}`);
  }
  a.layer_types.forEach((t, i) => {
    if (!LAYER_TYPES.includes(t)) throw err(`layer_types[${i}]`, `unknown layer type ${JSON.stringify(t)} (expected one of ${LAYER_TYPES.join(", ")})`);
  });
  // Gemma4TextModel.previous_kvs: a layer type that only appears in the KV-shared tail has no source
  // layer (mlx-lm raises a bare KeyError there).
  const m = a.num_hidden_layers - a.num_kv_shared_layers;
  if (a.num_kv_shared_layers > 0) {
    const prefix = new Set(a.layer_types.slice(0, m));
    for (let j = m; j < a.num_hidden_layers; j++) {
      const t = a.layer_types[j]!;
      if (!prefix.has(t)) {
        throw err(`layer_types[${j}]`, `KV-shared layer ${j} is ${t}, but no non-shared layer (0..${m - 1}) of that type exists to share K/V from`);
      }
    }
  }

  // heads
  const globalHd = a.global_head_dim ? a.global_head_dim : a.head_dim;
  for (const t of new Set(a.layer_types)) {
    const isSliding = t === "sliding_attention";
    const useKeqV = a.attention_k_eq_v && !isSliding;
    const nKv = useKeqV && a.num_global_key_value_heads !== null ? a.num_global_key_value_heads : a.num_key_value_heads;
    const key = useKeqV && a.num_global_key_value_heads !== null ? "num_global_key_value_heads" : "num_key_value_heads";
    if (!isPosInt(nKv)) throw err(key, `must be a positive integer, got ${JSON.stringify(nKv)}`);
    if (a.num_attention_heads % nKv !== 0) {
      throw err(key, `num_attention_heads (${a.num_attention_heads}) is not divisible by ${key} (${nKv}) for ${t} layers`);
    }
    const hd = t === "full_attention" ? globalHd : a.head_dim;
    const hdKey = t === "full_attention" && a.global_head_dim ? "global_head_dim" : "head_dim";
    if (hd % 2 !== 0) throw err(hdKey, `RoPE needs an even head dimension, got ${hd}`);
    fits("num_attention_heads", `num_attention_heads * ${hdKey} (${t} query rows)`, a.num_attention_heads * hd);
    fits(key, `${key} * ${hdKey} (${t} key rows)`, nKv * hd);
    // rope entry for this layer type (rope_utils.initialize_rope)
    if (typeof a.rope_parameters !== "object" || a.rope_parameters === null) throw err("rope_parameters", "must be an object");
    const rp = a.rope_parameters[t] ?? {};
    const rkey = `rope_parameters.${t}`;
    if (typeof rp !== "object" || rp === null) throw err(rkey, "must be an object");
    const ropeType = ropeTypeOf(rp);
    if (!["default", "linear", "proportional"].includes(ropeType)) {
      throw err(`${rkey}.rope_type`, `unsupported RoPE type ${JSON.stringify(ropeType)} (gemma4 uses default, linear or proportional)`);
    }
    const theta = rp.rope_theta ?? 10000.0;
    if (typeof theta !== "number" || !(theta > 0)) throw err(`${rkey}.rope_theta`, `must be a positive number, got ${JSON.stringify(theta)}`);
    if (ropeType === "linear" && (typeof rp.factor !== "number" || rp.factor === 0)) throw err(`${rkey}.factor`, "linear RoPE needs a non-zero factor");
    if (ropeType === "proportional") {
      const prf = rp.partial_rotary_factor ?? 1.0;
      if (typeof prf !== "number" || !(prf > 0)) throw err(`${rkey}.partial_rotary_factor`, `must be a positive number, got ${JSON.stringify(prf)}`);
      const rotated = Math.trunc(hd * prf);
      if (rotated > hd) throw err(`${rkey}.partial_rotary_factor`, `rotates ${rotated} dims, more than the head dim ${hd}`);
      if (rotated % 2 !== 0) throw err(`${rkey}.partial_rotary_factor`, `int(${hd} * ${prf}) = ${rotated} rotated dims must be even`);
    }
  }

  // MoE
  if (a.enable_moe_block) {
    for (const k of ["num_experts", "top_k_experts", "moe_intermediate_size"] as const) {
      if (!isPosInt(a[k])) throw err(k, `enable_moe_block needs a positive integer ${k}, got ${JSON.stringify(a[k])}`);
    }
    if (a.top_k_experts! > a.num_experts!) throw err("top_k_experts", `top_k_experts (${a.top_k_experts}) exceeds num_experts (${a.num_experts})`);
    fits("moe_intermediate_size", "2 * moe_intermediate_size (fused gate/up projection)", 2 * a.moe_intermediate_size!);
  }
}

/** rope_utils.initialize_rope: `scaling_config.get("type") or scaling_config.get("rope_type", "default")`. */
export function ropeTypeOf(rp: RopeParams): string {
  const t = rp.type;
  if (t) return String(t);
  return String(rp.rope_type ?? "default");
}

// ------------------------------------------------------------------ gemma4 wrapper + dispatch

/** mlx_lm.utils.MODEL_REMAPPING for this family: gemma4_unified loads as gemma4. */
export const MODEL_REMAPPING: Readonly<Record<string, string>> = { gemma4_unified: "gemma4" };

export type Layout = "gemma4_text" | "gemma4";

export interface LoadedConfig {
  /** "gemma4_text" (flat, model.* keys) or "gemma4" (wrapper, language_model.model.* keys). */
  layout: Layout;
  /** The text model's args (text_config for the wrapper). */
  args: ModelArgs;
  /** The whole config.json as read (tagged floats decoded), with quantization lifted as mlx-lm does. */
  raw: Record<string, unknown>;
  file: string;
}

/** mlx_lm.utils._decode_tagged_floats: {"__float__": "Infinity"} → Infinity. */
export function decodeTaggedFloats(obj: unknown): unknown {
  if (Array.isArray(obj)) return obj.map(decodeTaggedFloats);
  if (obj !== null && typeof obj === "object") {
    const o = obj as Record<string, unknown>;
    const keys = Object.keys(o);
    if (keys.length === 1 && keys[0] === "__float__") {
      const tag = o.__float__;
      if (tag === "Infinity") return Infinity;
      if (tag === "-Infinity") return -Infinity;
      if (tag === "NaN") return NaN;
    }
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(o)) out[k] = decodeTaggedFloats(v);
    return out;
  }
  return obj;
}

/**
 * The config dict → (layout, text ModelArgs), as mlx_lm.utils.load_model + gemma4.ModelArgs do:
 * gemma4_unified → gemma4; for gemma4 the top-level vocab_size (default 262144) always
 * overwrites text_config's, and num_attention_heads / num_key_value_heads default to 8 / 1.
 */
export function configFromDict(config: Record<string, unknown>, file = "config.json"): LoadedConfig {
  const raw = { ...config };
  const mt = raw.model_type;
  if (mt === undefined) throw new ConfigError(file, "model_type", "is missing (expected gemma4_text, gemma4 or gemma4_unified)");
  if (typeof mt !== "string") throw new ConfigError(file, "model_type", `must be a string, got ${JSON.stringify(mt)}`);
  const remapped = MODEL_REMAPPING[mt] ?? mt;
  // utils.load_model: lift text_config.quantization_config when the top level has none.
  if (!("quantization_config" in raw)) {
    const tc = raw.text_config;
    if (tc && typeof tc === "object" && "quantization_config" in (tc as object)) {
      raw.quantization_config = (tc as Record<string, unknown>).quantization_config;
    }
  }
  if (remapped === "gemma4_text") {
    return { layout: "gemma4_text", args: modelArgsFromDict(raw, file), raw, file };
  }
  if (remapped === "gemma4") {
    // gemma4.ModelArgs(model_type, text_config, vocab_size).__post_init__
    let tc = raw.text_config;
    if (tc === undefined || tc === null) tc = {};
    if (typeof tc !== "object" || Array.isArray(tc)) throw new ConfigError(file, "text_config", "must be an object");
    const text: Record<string, unknown> = { ...(tc as Record<string, unknown>) };
    const vocab = raw.vocab_size ?? 262144;
    text.vocab_size = vocab;
    if (!("num_attention_heads" in text)) text.num_attention_heads = 8;
    if (!("num_key_value_heads" in text)) text.num_key_value_heads = 1;
    if (!isPosInt(vocab)) throw new ConfigError(file, "vocab_size", `must be a positive integer, got ${JSON.stringify(vocab)}`);
    return { layout: "gemma4", args: modelArgsFromDict(text, file, "text_config."), raw, file };
  }
  throw new ConfigError(file, "model_type", `unknown model_type ${JSON.stringify(mt)} (this port loads gemma4_text, gemma4 and gemma4_unified)`);
}

/** mlx_lm.utils.load_config(model_path) + configFromDict. */
export function loadConfig(dir: string): LoadedConfig {
  const file = join(dir, "config.json");
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new ConfigError(file, "(file)", `cannot read config: ${(e as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(file, "(file)", `invalid JSON: ${(e as Error).message}`);
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new ConfigError(file, "(file)", "must hold a JSON object");
  return configFromDict(decodeTaggedFloats(parsed) as Record<string, unknown>, file);
}
