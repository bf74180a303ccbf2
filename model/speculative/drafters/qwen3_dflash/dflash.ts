// mlx_vlm/speculative/drafters/qwen3_dflash/dflash.py (mlx-vlm 0.7.10): the DFlash block-diffusion
// drafter. One draft: the block [bonus, mask x (bs - 1)] is embedded with the TARGET's embedding
// (scaled by its embed_scale) and runs through a few Qwen3-style layers whose attention reads
//
//   keys/values = [drafter cache (projected target context so far) + this round's context,
//                  the block's own keys/values]
//
// where the context is hidden_norm(fc(concat of the target's captured layer outputs)) at the
// positions the target verified last round (the whole prompt in the first round). Only the context
// enters the drafter's cache; the block's K/V never do, so the drafter never rolls back. The drafts
// are argmax of lm_head(norm(h))[:, 1:] (the target's tied embedding when the drafter has none).
// All K/V projections of the context are one fused matmul (_project_context_kv) when every
// projection is a plain Linear, as in Python.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type KVCacheLike, KVCache, RotatingKVCache } from "../../../cache/index.ts";
import { BufferedRotatingKVCache } from "../../../cache/buffered_rotating.ts";
import { type AnyEmbedding, type AnyLinear, logit_softcap, type Model as TargetModel } from "../../../gemma4/gemma4_text.ts";
import { Embedding, Linear, Module, RMSNorm, RoPE, type RopeLike } from "../../../gemma4/nn.ts";
import { createCausalMask } from "../../../mask.ts";
import { pyPow } from "../../../gemma4/pymath.ts";
import type { Sampler } from "../../../sample.ts";
import type { DFlashConfig } from "./config.ts";

let swigluC: ((g: MlxArray, x: MlxArray) => MlxArray) | undefined;
/** mlx_vlm.models.activations.swiglu: mx.compile(shapeless) of nn.silu(gate) * x. */
export function swiglu(gate: MlxArray, x: MlxArray): MlxArray {
  swigluC ??= mx.compile(
    (g: MlxArray, v: MlxArray) => {
      using s = mx.sigmoid(g);
      using silu = mx.multiply(g, s);
      return mx.multiply(silu, v);
    },
    { shapeless: true },
  ) as (g: MlxArray, x: MlxArray) => MlxArray;
  return swigluC(gate, x);
}

/** _build_rope: nn.RoPE (default or linear scaling), NeoX pairing unless rope_is_neox_style is false. */
function buildRope(config: DFlashConfig): RoPE {
  const traditional = !((config as unknown as { rope_is_neox_style?: boolean }).rope_is_neox_style ?? true);
  const s = config.rope_scaling;
  const type = s === null ? "default" : ((s.type ?? s.rope_type ?? "default") as string);
  const scale = type === "linear" ? 1 / (s!.factor as number) : 1.0;
  return new RoPE(config.head_dim, traditional, config.rope_theta, scale);
}

export type KV = [MlxArray, MlxArray];

/** What DFlashDraftModel needs of a layer class (DFlashDecoderLayer, Gemma4DSparkDecoderLayer). */
export interface DFlashLayer extends Module {
  self_attn: DFlashAttention;
  call(x: MlxArray, xCtx: MlxArray, rope: RopeLike, cache: KVCacheLike, projectedContext: KV | null): MlxArray;
}

const reshape4 = (x: MlxArray, B: number, L: number, H: number): MlxArray => mx.reshape(x, [B, L, H, -1]);
const sliceFrom = (x: MlxArray, skip: number): MlxArray => {
  const s = x.shape;
  return mx.slice(x, [0, skip, 0], [s[0]!, s[1]!, s[2]!]);
};

export class DFlashAttention extends Module {
  n_heads!: number;
  n_kv_heads!: number;
  head_dim!: number;
  scale!: number;
  is_sliding!: boolean;
  sliding_window!: number | null;
  is_causal!: boolean;
  attention_sink_bias?: MlxArray;
  q_proj!: AnyLinear;
  k_proj!: AnyLinear;
  /** Absent where a subclass shares one projection for keys and values. */
  v_proj?: AnyLinear;
  o_proj!: AnyLinear;
  q_norm!: RMSNorm;
  k_norm!: RMSNorm;

  constructor(config: DFlashConfig, layerIdx: number) {
    super();
    this.init(config, layerIdx);
  }

  /** Python's __init__ body (a subclass replaces it, as Gemma4DSparkAttention skips DFlashAttention.__init__). */
  protected init(config: DFlashConfig, layerIdx: number): void {
    const dim = config.hidden_size;
    this.n_heads = config.num_attention_heads;
    this.n_kv_heads = config.num_key_value_heads;
    this.head_dim = config.head_dim;
    this.scale = pyPow(this.head_dim, -0.5); // self.head_dim**-0.5
    const layerTypes = config.layer_types.length ? config.layer_types : Array(config.num_hidden_layers).fill("full_attention");
    this.is_sliding = layerTypes[layerIdx] === "sliding_attention";
    this.sliding_window = this.is_sliding ? config.sliding_window : null;
    this.is_causal = config.is_causal;
    if (config.attention_sink_bias) this.attention_sink_bias = mx.zeros([this.n_heads], "float32");
    this.q_proj = new Linear(dim, this.n_heads * this.head_dim);
    this.k_proj = new Linear(dim, this.n_kv_heads * this.head_dim);
    this.v_proj = new Linear(dim, this.n_kv_heads * this.head_dim);
    this.o_proj = new Linear(this.n_heads * this.head_dim, dim);
    this.q_norm = new RMSNorm(this.head_dim, config.rms_norm_eps);
    this.k_norm = new RMSNorm(this.head_dim, config.rms_norm_eps);
  }

  /** Project keys and values. Subclasses may share one projection. */
  _project_kv(x: MlxArray): KV {
    return [this.k_proj.call(x), this.v_proj!.call(x)];
  }

  call(x: MlxArray, xCtx0: MlxArray, rope: RopeLike, cache: KVCacheLike, projectedContext: KV | null): MlxArray {
    using stack = new DisposableStack();
    const [B, L] = x.shape as [number, number, number];
    let xCtx = xCtx0;
    let S = xCtx.shape[1]!;
    let projected = projectedContext;
    if (this.is_sliding) {
      if (this.sliding_window === null) throw new Error("DFlash draft config must define sliding_window for sliding layers.");
      const keepCtx = this.sliding_window - 1;
      if (S > keepCtx) {
        const skip = S - keepCtx;
        xCtx = stack.use(sliceFrom(xCtx, skip));
        if (projected !== null) projected = [stack.use(sliceFrom(projected[0], skip)), stack.use(sliceFrom(projected[1], skip))];
        S = xCtx.shape[1]!;
        (cache as { offset: number }).offset += skip; // Python moves the cache cursor past the skipped context
      }
    }
    // Project context and proposal separately so only context KV is cached
    const q0 = stack.use(this.q_proj.call(x));
    const [ck0, cv0] = projected ?? this._project_kv(xCtx).map((a) => stack.use(a));
    const [pk0, pv0] = this._project_kv(x).map((a) => stack.use(a));
    const tr = (a: MlxArray) => stack.use(mx.transpose(a, [0, 2, 1, 3]));
    const queries0 = tr(stack.use(this.q_norm.call(stack.use(reshape4(q0, B, L, this.n_heads)))));
    const ctxKeys0 = tr(stack.use(this.k_norm.call(stack.use(reshape4(ck0!, B, S, this.n_kv_heads)))));
    const ctxValues = tr(stack.use(reshape4(cv0!, B, S, this.n_kv_heads)));
    const propKeys0 = tr(stack.use(this.k_norm.call(stack.use(reshape4(pk0!, B, L, this.n_kv_heads)))));
    const propValues = tr(stack.use(reshape4(pv0!, B, L, this.n_kv_heads)));
    const queries = stack.use(rope.call(queries0, cache.offset + S));
    const ctxKeys = stack.use(rope.call(ctxKeys0, cache.offset));
    const propKeys = stack.use(rope.call(propKeys0, cache.offset + S));
    const [k0, v0] = cache.updateAndFetch(ctxKeys, ctxValues);
    stack.use(k0);
    stack.use(v0);
    const keys = stack.use(mx.concatenate([k0, propKeys], 2));
    const values = stack.use(mx.concatenate([v0, propValues], 2));
    const mask = this.is_causal ? stack.use(createCausalMask(L, keys.shape[2]! - L, this.sliding_window)) : null;
    const o = stack.use(mx.fast.scaledDotProductAttention(queries, keys, values, { scale: this.scale, mask, sinks: this.attention_sink_bias ?? null }));
    const ot = stack.use(mx.transpose(o, [0, 2, 1, 3]));
    const flat = stack.use(mx.reshape(ot, [B, L, -1]));
    return this.o_proj.call(flat);
  }
}

/** Qwen3-style gated MLP (mlx_lm.models.qwen3.MLP weights). */
export class Qwen3MLP extends Module {
  gate_proj: AnyLinear;
  down_proj: AnyLinear;
  up_proj: AnyLinear;
  constructor(dim: number, hiddenDim: number) {
    super();
    this.gate_proj = new Linear(dim, hiddenDim);
    this.down_proj = new Linear(hiddenDim, dim);
    this.up_proj = new Linear(dim, hiddenDim);
  }
  call(x: MlxArray): MlxArray {
    using g = this.gate_proj.call(x);
    using u = this.up_proj.call(x);
    using s = swiglu(g, u);
    return this.down_proj.call(s);
  }
}

export class DFlashDecoderLayer extends Module {
  self_attn: DFlashAttention;
  mlp: Qwen3MLP;
  input_layernorm: RMSNorm;
  post_attention_layernorm: RMSNorm;
  constructor(config: DFlashConfig, layerIdx: number) {
    super();
    this.self_attn = new DFlashAttention(config, layerIdx);
    this.mlp = new Qwen3MLP(config.hidden_size, config.intermediate_size);
    this.input_layernorm = new RMSNorm(config.hidden_size, config.rms_norm_eps);
    this.post_attention_layernorm = new RMSNorm(config.hidden_size, config.rms_norm_eps);
  }
  call(x: MlxArray, xCtx: MlxArray, rope: RopeLike, cache: KVCacheLike, projectedContext: KV | null): MlxArray {
    using n = this.input_layernorm.call(x);
    using a = this.self_attn.call(n, xCtx, rope, cache, projectedContext);
    using h = mx.add(x, a);
    using n2 = this.post_attention_layernorm.call(h);
    using m = this.mlp.call(n2);
    return mx.add(h, m);
  }
}

export class DFlashDraftModel extends Module {
  /** Python's class attribute layer_class. */
  static layerClass: new (config: DFlashConfig, layerIdx: number) => DFlashLayer = DFlashDecoderLayer;
  readonly config: DFlashConfig;
  fc: AnyLinear;
  hidden_norm: RMSNorm;
  layers: DFlashLayer[];
  norm: RMSNorm;
  /** The drafter's own embedding, only when its checkpoint has embed_tokens.weight (sanitize). */
  embed_tokens?: AnyEmbedding;
  // Bound state (underscore: not parameters)
  protected _rope: RopeLike;
  protected _embed: AnyEmbedding | null = null;
  protected _embedScale = 1.0;
  /** The bound lm_head: the target's, else the (own or bound) embedding as a linear map. */
  protected _lmHead: ((h: MlxArray) => MlxArray) | null = null;
  private _fusedContextKvWeight: MlxArray | null = null;
  /** Round-loop hooks (DSpark sets them): a fixed block size, an initial size, ceilings by context length. */
  prefer_requested_block_size = false;
  dflash_initial_block_size: number | null = null;
  dflash_min_block_size = 4;
  chooseInitialBlockSize?(contextLength: number, requested: number): number | null;
  chooseBlockCeiling?(contextLength: number, requested: number): number;
  /** validate_target_compatibility (DSpark); an Error naming the mismatch. */
  validateTargetCompatibility?(target: TargetModel): void;
  /** Accepted drafts per round and drafts per round (_record_speculative_round). */
  accept_lens: number[] = [];
  draft_lens: number[] = [];

  constructor(config: DFlashConfig) {
    super();
    this.config = config;
    if (!config.layer_types.length) config.layer_types = Array(config.num_hidden_layers).fill("full_attention");
    const concatDim = config.target_layer_ids.length * config.hidden_size;
    this.fc = new Linear(concatDim, config.hidden_size);
    this.hidden_norm = new RMSNorm(config.hidden_size, config.rms_norm_eps);
    const layerClass = (this.constructor as typeof DFlashDraftModel).layerClass;
    this.layers = Array.from({ length: config.num_hidden_layers }, (_, i) => new layerClass(config, i));
    this.norm = new RMSNorm(config.hidden_size, config.rms_norm_eps);
    this._rope = buildRope(config);
  }

  /** bind(target): the target's embedding and embed_scale unless the drafter has its own embedding. */
  bind(target: TargetModel): this {
    if (this.embed_tokens) {
      this._embed = this.embed_tokens;
      this._embedScale = 1.0; // Python leaves embed_scale at 1.0 for a drafter's own embedding
    } else {
      this._embed = target.model.embed_tokens;
      this._embedScale = target.model.embed_scale;
    }
    // mlx-vlm's Gemma 4 model has no lm_head: the embedding as a linear map
    const embed = this._embed;
    this._lmHead = (h) => embed.asLinear(h);
    return this;
  }

  /** make_cache: a BufferedRotatingKVCache per layer with draft_window_size, else RotatingKVCache(sliding_window - 1) / KVCache by layer type. */
  makeCache(): KVCacheLike[] {
    const window = this.config.draft_window_size;
    if (window !== null && window > 0) return this.layers.map(() => new BufferedRotatingKVCache(window, 64));
    return this.config.layer_types.slice(0, this.layers.length).map((t) => {
      if (t === "sliding_attention") {
        if (this.config.sliding_window === null) throw new Error("DFlash draft config must define sliding_window for sliding layers.");
        return new RotatingKVCache(this.config.sliding_window - 1, 0);
      }
      return new KVCache();
    });
  }

  reset(target: TargetModel): KVCacheLike[] {
    this.bind(target);
    this.accept_lens = [];
    this.draft_lens = [];
    return this.makeCache();
  }

  /**
   * draft_block (draft_block_greedy falls back to it: a Gemma 4 target has no
   * speculative_argmax_from_hidden): the bs - 1 drafted tokens (1, bs - 1). `onLogits` sees the
   * drafter's logits (borrowed).
   */
  draftBlock(lastBonus: number, hidden: MlxArray, cache: KVCacheLike[], blockSize: number, sampler: Sampler, onLogits?: (logits: MlxArray) => void): MlxArray {
    const maskId = this.config.mask_token_id;
    const ids = Int32Array.from([lastBonus, ...Array(blockSize - 1).fill(maskId)]);
    using block = mx.array(ids, [1, blockSize], "int32");
    using draftHidden = this._hidden(block, hidden, cache);
    const s = draftHidden.shape;
    using tail = mx.slice(draftHidden, [0, 1, 0], [s[0]!, s[1]!, s[2]!]);
    using logits = this._logits(tail);
    onLogits?.(logits);
    return sampler(logits);
  }

  _hidden(inputs: MlxArray, targetHidden: MlxArray, cache: KVCacheLike[]): MlxArray {
    using stack = new DisposableStack();
    let h = stack.use(this._embed_input_tokens(inputs));
    using fc = this.fc.call(targetHidden);
    const hCtx = stack.use(this.hidden_norm.call(fc));
    const projected = this._project_context_kv(hCtx);
    if (projected) for (const [k, v] of projected) stack.use(k), stack.use(v);
    this.layers.forEach((layer, i) => {
      h = stack.use(layer.call(h, hCtx, this._rope, cache[i]!, projected ? projected[i]! : null));
    });
    return this.norm.call(h);
  }

  /** _project_context_kv: every layer's k_proj / v_proj on the context as one fused matmul (null unless all are plain Linear). */
  _project_context_kv(hidden: MlxArray): KV[] | null {
    const projections = this.layers.flatMap((l) => {
      // Python reads layer.self_attn.v_proj unconditionally: an AttributeError without one
      if (!l.self_attn.v_proj) throw new Error(`'${l.self_attn.constructor.name}' object has no attribute 'v_proj'`);
      return [l.self_attn.k_proj, l.self_attn.v_proj];
    });
    if (!projections.every((p) => p instanceof Linear)) return null;
    this._fusedContextKvWeight ??= mx.concatenate(projections.map((p) => p.weight), 0);
    using wt = mx.transpose(this._fusedContextKvWeight);
    using projected = mx.matmul(hidden, wt);
    const chunks = mx.split(projected, projections.length, -1);
    const out: KV[] = [];
    for (let i = 0; i < chunks.length; i += 2) out.push([chunks[i]!, chunks[i + 1]!]);
    return out;
  }

  _embed_input_tokens(inputs: MlxArray): MlxArray {
    if (this._embed === null) throw new Error("DFlashDraftModel: bind(target) first");
    using e = this._embed.call(inputs);
    return mx.multiply(e, this._embedScale);
  }

  /** _logits: lm_head (the embedding as a linear map), then the drafter's final_logit_softcapping if set. */
  _logits(hidden: MlxArray): MlxArray {
    if (this._lmHead === null) throw new Error("DFlashDraftModel: bind(target) first");
    const logits = this._lmHead(hidden);
    const cap = this.config.final_logit_softcapping;
    if (cap === null) return logits;
    using l = logits;
    return logit_softcap(cap, l);
  }

  /** sanitize: a leading "model." is dropped; an embed_tokens.weight gives the drafter its own embedding. */
  sanitize<T extends { array: MlxArray }>(weights: Map<string, T>): Map<string, T> {
    const out = new Map<string, T>();
    for (const [k0, v] of weights) out.set(k0.startsWith("model.") ? k0.slice("model.".length) : k0, v);
    if (out.has("embed_tokens.weight") && !this.embed_tokens) this.embed_tokens = new Embedding(this.config.vocab_size, this.config.hidden_size);
    return out;
  }

  dispose(): void {
    this._fusedContextKvWeight?.dispose();
    this._fusedContextKvWeight = null;
    this._embed = null;
    this._lmHead = null;
    this.disposeArrays();
  }
}

/** DFlashKVCache = KVCache. */
export const DFlashKVCache = KVCache;
