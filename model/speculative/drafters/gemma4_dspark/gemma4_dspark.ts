// mlx_vlm/speculative/drafters/gemma4_dspark/gemma4_dspark.py (mlx-vlm 0.7.10): the DSpark drafter
// for Gemma 4 targets. Gemma 4 geometry in the DFlash context/proposal attention (global_head_dim
// on full-attention layers, a unit softmax scale, keys shared with values under attention_k_eq_v),
// Gemma 4's sandwich-norm block with its GeGLU MLP and layer_scalar, one RoPE built from the first
// layer type's rope_parameters, and untied embed_tokens / lm_head of its own (bind keeps them; the
// embedding is scaled by sqrt(hidden_size)).
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../../../cache/index.ts";
import type { ModelArgs } from "../../../gemma4/config.ts";
import { type AnyLinear, MLP, type Model as TargetModel } from "../../../gemma4/gemma4_text.ts";
import { Embedding, Linear, Module, RMSNorm, RoPE, type RopeLike } from "../../../gemma4/nn.ts";
import { pyPow } from "../../../gemma4/pymath.ts";
import { ProportionalRoPE } from "../../../gemma4/rope_utils.ts";
import { DSparkDraftModel } from "../dspark/dspark.ts";
import type { DFlashConfig } from "../qwen3_dflash/config.ts";
import { DFlashAttention, type DFlashLayer, type KV } from "../qwen3_dflash/dflash.ts";
import type { Gemma4DsparkConfig } from "./config.ts";

/** mlx-vlm's ProportionalRoPE returns x unchanged when it rotates no angle pair. */
class IdentityRope implements RopeLike {
  constructor(readonly dims: number) {}
  call(x: MlxArray): MlxArray {
    return mx.alias(x);
  }
}

/**
 * _build_gemma4_rope: the rope_parameters of the first layer's type; global_head_dim dims for full
 * attention; mlx-vlm's initialize_rope (default / linear: nn.RoPE; proportional: ProportionalRoPE
 * rotating 2 * int(partial_rotary_factor * dims // 2) dims).
 */
export function buildGemma4Rope(config: Gemma4DsparkConfig): RopeLike {
  const layerTypes = config.layer_types.length ? config.layer_types : Array(config.num_hidden_layers).fill("full_attention");
  const key = layerTypes[0] === "sliding_attention" ? "sliding_attention" : "full_attention";
  const params = { ...(config.rope_parameters[key] ?? {}) } as Record<string, unknown>;
  const dims = key === "full_attention" && config.global_head_dim ? config.global_head_dim : config.head_dim;
  const base = (params.rope_theta as number | undefined) ?? 10000.0;
  const type = ((params.type as string | undefined) || (params.rope_type as string | undefined) || "default") as string;
  if (type === "default" || type === "linear") return new RoPE(dims, config.rope_traditional, base, type === "linear" ? 1 / (params.factor as number) : 1.0);
  if (type === "proportional") {
    const prf = (params.partial_rotary_factor as number | undefined) ?? 1.0;
    const rotated = 2 * Math.trunc(Math.floor((prf * dims) / 2));
    if (rotated > dims) throw new Error("rotated_dims should be smaller than dims");
    if (rotated / 2 <= 0) return new IdentityRope(dims);
    return new ProportionalRoPE(dims, rotated, config.rope_traditional, base, (params.factor as number | undefined) ?? 1.0);
  }
  throw new Error(`Unsupported RoPE type ${type}`);
}

/** DFlash context/proposal attention with Gemma 4 projection geometry. */
export class Gemma4DSparkAttention extends DFlashAttention {
  declare use_k_eq_v: boolean; // `declare`: no field initializer may reset what init() set

  protected override init(config0: DFlashConfig, layerIdx: number): void {
    const config = config0 as Gemma4DsparkConfig;
    const layerTypes = config.layer_types.length ? config.layer_types : Array(config.num_hidden_layers).fill("full_attention");
    this.is_sliding = layerTypes[layerIdx] === "sliding_attention";
    this.sliding_window = this.is_sliding ? config.sliding_window : null;
    this.head_dim = !this.is_sliding && config.global_head_dim ? config.global_head_dim : config.head_dim;
    this.use_k_eq_v = Boolean(config.attention_k_eq_v) && !this.is_sliding;
    this.n_heads = config.num_attention_heads;
    this.n_kv_heads = this.use_k_eq_v && config.num_global_key_value_heads !== null ? config.num_global_key_value_heads : config.num_key_value_heads;
    this.scale = 1.0;
    this.is_causal = config.is_causal;
    if (config.attention_sink_bias) this.attention_sink_bias = mx.zeros([this.n_heads], "float32");
    const dim = config.hidden_size;
    this.q_proj = new Linear(dim, this.n_heads * this.head_dim);
    this.k_proj = new Linear(dim, this.n_kv_heads * this.head_dim);
    if (!this.use_k_eq_v) this.v_proj = new Linear(dim, this.n_kv_heads * this.head_dim);
    this.o_proj = new Linear(this.n_heads * this.head_dim, dim);
    this.q_norm = new RMSNorm(this.head_dim, config.rms_norm_eps);
    this.k_norm = new RMSNorm(this.head_dim, config.rms_norm_eps);
  }

  override _project_kv(x: MlxArray): KV {
    const keys = this.k_proj.call(x);
    return this.use_k_eq_v ? [keys, mx.alias(keys)] : [keys, this.v_proj!.call(x)];
  }
}

/** Gemma 4 sandwich-norm block driven by the DFlash context split. */
export class Gemma4DSparkDecoderLayer extends Module implements DFlashLayer {
  self_attn: Gemma4DSparkAttention;
  mlp: MLP;
  input_layernorm: RMSNorm;
  post_attention_layernorm: RMSNorm;
  pre_feedforward_layernorm: RMSNorm;
  post_feedforward_layernorm: RMSNorm;
  layer_scalar: MlxArray;

  constructor(config0: DFlashConfig, layerIdx: number) {
    super();
    const config = config0 as Gemma4DsparkConfig;
    const eps = config.rms_norm_eps;
    this.self_attn = new Gemma4DSparkAttention(config, layerIdx);
    // models.gemma4.language.MLP(config, layer_idx): the fields it reads
    const mlpArgs = { hidden_size: config.hidden_size, intermediate_size: config.intermediate_size, num_hidden_layers: config.num_hidden_layers, num_kv_shared_layers: config.num_kv_shared_layers, use_double_wide_mlp: config.use_double_wide_mlp } as unknown as ModelArgs;
    this.mlp = new MLP(mlpArgs, layerIdx);
    this.input_layernorm = new RMSNorm(config.hidden_size, eps);
    this.post_attention_layernorm = new RMSNorm(config.hidden_size, eps);
    this.pre_feedforward_layernorm = new RMSNorm(config.hidden_size, eps);
    this.post_feedforward_layernorm = new RMSNorm(config.hidden_size, eps);
    this.layer_scalar = mx.ones([1], "float32");
  }

  call(x: MlxArray, xCtx: MlxArray, rope: RopeLike, cache: KVCacheLike, projectedContext: KV | null): MlxArray {
    using stack = new DisposableStack();
    const n = stack.use(this.input_layernorm.call(x));
    const a = stack.use(this.self_attn.call(n, xCtx, rope, cache, projectedContext));
    const pa = stack.use(this.post_attention_layernorm.call(a));
    const h = stack.use(mx.add(x, pa));
    const pf = stack.use(this.pre_feedforward_layernorm.call(h));
    const m = stack.use(this.mlp.call(pf));
    const qf = stack.use(this.post_feedforward_layernorm.call(m));
    const h2 = stack.use(mx.add(h, qf));
    return mx.multiply(h2, this.layer_scalar);
  }
}

/** DSpark drafter for Gemma 4 targets: its own untied embed_tokens and lm_head survive bind. */
export class Gemma4DSparkDraftModel extends DSparkDraftModel {
  static override layerClass = Gemma4DSparkDecoderLayer;
  declare readonly config: Gemma4DsparkConfig;
  lm_head: AnyLinear;

  constructor(config: Gemma4DsparkConfig) {
    super(config);
    this.embed_tokens = new Embedding(config.vocab_size, config.hidden_size);
    this.lm_head = new Linear(config.hidden_size, config.vocab_size);
    this._rope = buildGemma4Rope(config);
  }

  override bind(target: TargetModel): this {
    super.bind(target);
    this._embed = this.embed_tokens!;
    this._embedScale = pyPow(this.config.hidden_size, 0.5); // config.hidden_size**0.5
    const head = this.lm_head;
    this._lmHead = (h) => head.call(h);
    return this;
  }
}
