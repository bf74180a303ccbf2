// mlx_lm/models/gemma4_text.py (mlx-lm 0.32.2), block for block and op for op.
//
// Each class below has the Python class's name, attributes (= checkpoint keys) and call order.
// Bit parity rules applied throughout (spec §0, §12):
// - Python scalars are weak: a JS number combined with an array becomes a scalar in the array's
//   dtype exactly as Python's (float → float32 → dtype; int → dtype), with the array kept first
//   for reflected ops (`c * x` → multiply(x, c)).
// - Linear is matmul(x, transpose(W)); norms run before the head transpose; every reshape and
//   transpose of the Python source is mirrored (GEMM flags and kernel choice follow the view).
// - geglu, gelu_approx, logit_softcap and _complete_square go through mx.compile(shapeless) with
//   the same graphs, so the fused kernels are the ones Python builds.
// - Parameter dtypes come from the checkpoint; MLX promotion decides every result dtype.
//
// Ownership: every intermediate is disposed when the block returns (`using` / DisposableStack);
// a block returns arrays the caller owns.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVCache, type KVCacheLike, RotatingKVCache } from "../cache/index.ts";
import type { BatchCacheLike } from "../cache/batch.ts";
import { createAttentionMask, disposeMask, type Mask } from "../mask.ts";
import { isQuantizedAttentionCache } from "../cache/turboquant.ts";
import type { LayerType, ModelArgs } from "./config.ts";
import { mutated } from "./mutations.ts";
import {
  Embedding,
  gelu_approx,
  geluApproxBody,
  Linear,
  Module,
  placeholder,
  type QuantizedEmbedding,
  type QuantizedLinear,
  RMSNorm,
  type RopeLike,
} from "./nn.ts";
import { pyPow } from "./pymath.ts";
import { initializeRope } from "./rope_utils.ts";
import { SwitchGLU } from "./switch_layers.ts";
import type { TapSink } from "./taps.ts";
import type { Tensor } from "./tensors.ts";

export type { ModelArgs } from "./config.ts";

/**
 * Decode steps (L = 1 with a cache, no taps) run through per-layer compiled closures
 * (DecoderLayer.decodeCompiled) where that route is proven bit-exact against mlx-lm's uncompiled
 * step: on the CPU device. On a GPU device it is off by default: on CUDA (H200, MLX 0.32.4) the
 * compiled route gave other bytes than the op-by-op route on 7 of 7 fixtures
 * (suites/gemma4/decode_compile.test.ts; bench/PARITY-cuda.md): MLX's CUDA backend compiles a
 * fused elementwise kernel with NVRTC's default --fmad=true, so a multiply feeding an add is
 * rounded once (bench/cuda/repro_compile.py: 9 of 12 chains differ there, 0 of 12 on the CPU).
 * Metal is not measured.
 * GEMMA4_DECODE_COMPILE=1 (or setDecodeCompile(true)) forces it on everywhere, =0 (false) off
 * everywhere: every call then builds Python's graph op by op.
 */
let decodeCompile: boolean | "auto" = process.env.GEMMA4_DECODE_COMPILE === "0" ? false : process.env.GEMMA4_DECODE_COMPILE === "1" ? true : "auto";
export function setDecodeCompile(on: boolean | "auto"): void {
  decodeCompile = on;
}
/** Whether one-token calls take the compiled decode route now (see decodeCompile). */
export function decodeCompileOn(): boolean {
  return decodeCompile === "auto" ? mx.defaultDevice() === "cpu" : decodeCompile;
}

/** The cache interface the model consumes (implemented by model/cache/). */
/** What a layer accepts: a single-sequence cache or a batch cache (per-sequence offsets, left padding). */
export type LayerCache = KVCacheLike | BatchCacheLike;

/** What make_cache builds per layer type; the default is model/cache's classes. */
export interface CacheFactory {
  kvCache(): KVCacheLike;
  rotatingKVCache(maxSize: number, keep: number): KVCacheLike;
}

export const defaultCacheFactory: CacheFactory = {
  kvCache: () => new KVCache(),
  rotatingKVCache: (maxSize, keep) => new RotatingKVCache(maxSize, keep),
};

/** A Linear or its quantized replacement (nn.quantize swaps the module in place). */
export type AnyLinear = Linear | QuantizedLinear;
export type AnyEmbedding = Embedding | QuantizedEmbedding;


// ------------------------------------------------------------------ RMSNormNoScale

/** RMSNormNoScale: mx.fast.rms_norm(x, None, eps); no parameters. */
export class RMSNormNoScale extends Module {
  constructor(
    readonly dims: number,
    readonly eps = 1e-6,
  ) {
    super();
  }

  call(x: MlxArray): MlxArray {
    return mx.fast.rmsNorm(x, null, this.eps);
  }
}

// ------------------------------------------------------------------ compiled helpers

const logitSoftcapCompiled = new Map<number, (x: MlxArray) => MlxArray>();

/**
 * @partial(mx.compile, shapeless=True) logit_softcap(softcap, x) = tanh(x / softcap) * softcap.
 * Python passes `softcap` as a compile-time constant; here each value gets its own closure.
 */
export function logit_softcap(softcap: number, x: MlxArray): MlxArray {
  let f = logitSoftcapCompiled.get(softcap);
  if (!f) {
    const c = mx.pyFloat(softcap); // a Python float from the config (30.0)
    f = mx.compile(
      (t: MlxArray) => {
        using d = mx.divide(t, c);
        using th = mx.tanh(d);
        return mx.multiply(th, c);
      },
      { shapeless: true },
    ) as (x: MlxArray) => MlxArray;
    logitSoftcapCompiled.set(softcap, f);
  }
  return f(x);
}

/**
 * The model tail after the head: the `lm_head` tap, logit_softcap (none when `softcap` is null),
 * the `logits` tap. Takes ownership of `logits0`.
 */
export function softcapLogits(logits0: MlxArray, softcap: number | null, taps?: TapSink): MlxArray {
  if (taps) taps("lm_head", logits0);
  if (softcap === null) {
    if (taps) taps("logits", logits0);
    return logits0;
  }
  using l0 = logits0;
  const logits = logit_softcap(softcap, l0);
  if (taps) taps("logits", logits);
  return logits;
}

let completeSquareCompiled: ((x2: MlxArray, y2: MlxArray, xy: MlxArray) => MlxArray) | null = null;

/** @partial(mx.compile, shapeless=True) _complete_square(x2, y2, xy) = x2 + expand_dims(y2, -1) - 2 * xy. */
export function _complete_square(x2: MlxArray, y2: MlxArray, xy: MlxArray): MlxArray {
  completeSquareCompiled ??= mx.compile(
    (a: MlxArray, b: MlxArray, c: MlxArray) => {
      using be = mx.expandDims(b, -1);
      using s = mx.add(a, be);
      using t = mx.multiply(c, 2); // 2 * xy → __rmul__ → multiply(xy, 2)
      return mx.subtract(s, t);
    },
    { shapeless: true },
  ) as (x2: MlxArray, y2: MlxArray, xy: MlxArray) => MlxArray;
  return completeSquareCompiled(x2, y2, xy);
}

type Geglu = (gate: MlxArray, x: MlxArray) => MlxArray;
let gegluCompiled: Geglu | null = null;
let gegluMutantCompiled: Geglu | null = null; // the gelu_cube_mul mutation traces its own graph

/**
 * @partial(mx.compile, shapeless=True) geglu(gate, x) = nn.gelu_approx(gate) * x.
 * Inside a trace the nested compiled gelu_approx sees tracers and is inlined by MLX
 * (compile.cpp), so tracing its body directly yields the identical graph: one fused kernel.
 */
export function geglu(gate: MlxArray, x: MlxArray): MlxArray {
  const body = (g: MlxArray, u: MlxArray) => {
    using a = geluBody(g);
    return mx.multiply(a, u);
  };
  if (mutated("gelu_cube_mul")) {
    gegluMutantCompiled ??= mx.compile(body, { shapeless: true }) as Geglu;
    return gegluMutantCompiled(gate, x);
  }
  gegluCompiled ??= mx.compile(body, { shapeless: true }) as Geglu;
  return gegluCompiled(gate, x);
}

/** gelu_approx body, or the `x*x*x` bug when that mutation is on (traced inside geglu). */
function geluBody(x: MlxArray): MlxArray {
  if (!mutated("gelu_cube_mul")) return geluApproxBody(x);
  using half = mx.multiply(x, 0.5);
  using x2 = mx.multiply(x, x);
  using cube = mx.multiply(x2, x);
  using t2 = mx.multiply(cube, 0.044715);
  using t3 = mx.add(x, t2);
  using t4 = mx.multiply(t3, Math.sqrt(2 / Math.PI));
  using t5 = mx.tanh(t4);
  using t6 = mx.add(t5, 1);
  return mx.multiply(half, t6);
}

/** Standalone nn.gelu_approx (own compiled kernel); the mutation switch reaches it too. */
function geluStandalone(x: MlxArray): MlxArray {
  if (mutated("gelu_cube_mul")) return geluBody(x);
  return gelu_approx(x);
}

// ------------------------------------------------------------------ MLP

export class MLP extends Module {
  gate_proj: AnyLinear;
  down_proj: AnyLinear;
  up_proj: AnyLinear;
  constructor(config: ModelArgs, layer_idx = 0) {
    super();
    const first_kv_shared_layer_idx = config.num_hidden_layers - config.num_kv_shared_layers;
    // Python's chained comparison: layer_idx >= first > 0
    const is_kv_shared_layer = layer_idx >= first_kv_shared_layer_idx && first_kv_shared_layer_idx > 0;
    const use_double_wide = config.use_double_wide_mlp && is_kv_shared_layer && !mutated("no_double_wide");
    const intermediate_size = config.intermediate_size * (use_double_wide ? 2 : 1);
    this.gate_proj = new Linear(config.hidden_size, intermediate_size);
    this.down_proj = new Linear(intermediate_size, config.hidden_size);
    this.up_proj = new Linear(config.hidden_size, intermediate_size);
  }

  /** down_proj(geglu(gate_proj(x), up_proj(x))) — gate_proj runs first (argument order). */
  call(x: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using gate = this.gate_proj.call(x);
    if (taps) taps(`${tp}gate_proj`, gate);
    using up = this.up_proj.call(x);
    if (taps) taps(`${tp}up_proj`, up);
    using g = geglu(gate, up);
    if (taps) taps(`${tp}geglu`, g);
    const out = this.down_proj.call(g);
    if (taps) taps(`${tp}down_proj`, out);
    return out;
  }
}

// ------------------------------------------------------------------ Router

/** Expert router: norm -> scale -> project -> top-k (argpartition) -> softmax over k -> per-expert scale. */
export class Router extends Module {
  proj: AnyLinear;
  scale: MlxArray;
  per_expert_scale: MlxArray;
  readonly eps: number;
  readonly _root_size: number;
  readonly top_k: number;
  constructor(config: ModelArgs) {
    super();
    this.eps = config.rms_norm_eps;
    this.proj = new Linear(config.hidden_size, config.num_experts!);
    this.scale = placeholder([config.hidden_size]);
    this.per_expert_scale = placeholder([config.num_experts!]);
    this._root_size = pyPow(config.hidden_size, -0.5);
    this.top_k = config.top_k_experts!;
  }

  private _w_eff?: MlxArray;

  /** self.scale * self._root_size, the same op as in call(), evaluated once (borrowed). */
  effectiveScale(): MlxArray {
    if (!this._w_eff || this._w_eff.disposed) {
      this._w_eff = mx.multiply(this.scale, this._root_size);
      mx.evaluate([this._w_eff]);
    }
    return this._w_eff;
  }

  disposeCached(): void {
    this._w_eff?.dispose();
    this._w_eff = undefined;
  }

  /** `w_eff_in` (decode compile only): self.scale * self._root_size from effectiveScale(). */
  call(x: MlxArray, taps?: TapSink, tp = "", w_eff_in?: MlxArray): [MlxArray, MlxArray] {
    using w_eff = w_eff_in ? mx.alias(w_eff_in) : mx.multiply(this.scale, this._root_size); // self.scale * self._root_size
    using xn = mx.fast.rmsNorm(x, w_eff, this.eps);
    if (taps) taps(`${tp}norm`, xn);
    using expert_scores = this.proj.call(xn);
    if (taps) taps(`${tp}proj`, expert_scores);
    const k = this.top_k;
    const E = expert_scores.shape[expert_scores.ndim - 1]!;
    if (mutated("router_softmax_all")) {
      // pre-#1114: softmax over all experts, gather the top-k, renormalise
      using probs = mx.softmax(expert_scores, -1);
      using part = mx.argpartition(probs, -k, -1);
      const s = part.shape;
      const top_k_indices = mx.slice(part, s.map((_, i) => (i === s.length - 1 ? E - k : 0)), s);
      if (taps) taps(`${tp}indices`, top_k_indices);
      using pk = mx.takeAlongAxis(probs, top_k_indices, -1);
      using denom = mx.sum(pk, -1, true);
      using wn = mx.divide(pk, denom);
      using pes = mx.take(this.per_expert_scale, top_k_indices, 0);
      const top_k_weights = mx.multiply(wn, pes);
      if (taps) taps(`${tp}weights`, top_k_weights);
      return [top_k_indices, top_k_weights];
    }
    using part = mx.argpartition(expert_scores, -k, -1);
    const s = part.shape;
    using sliced = mx.slice(part, s.map((_, i) => (i === s.length - 1 ? E - k : 0)), s); // [..., -k:]
    const top_k_indices = mx.stopGradient(sliced);
    if (taps) taps(`${tp}indices`, top_k_indices);
    using tk = mx.takeAlongAxis(expert_scores, top_k_indices, -1);
    using sm = mx.softmax(tk, -1); // precise=False
    using pes = mx.take(this.per_expert_scale, top_k_indices, 0); // per_expert_scale[top_k_indices]
    const top_k_weights = mx.multiply(sm, pes);
    if (taps) taps(`${tp}weights`, top_k_weights);
    return [top_k_indices, top_k_weights];
  }
}

// ------------------------------------------------------------------ GeGLU / Experts

/** GELU-gated linear unit activation for SwitchGLU: GeGLU()(x, gate) = geglu(gate, x). */
export class GeGLU extends Module {
  call(x: MlxArray, gate: MlxArray): MlxArray {
    return geglu(gate, x);
  }
}

/** Sparse MoE using SwitchGLU with gather_mm / gather_qmm. */
export class Experts extends Module {
  switch_glu: SwitchGLU;
  constructor(config: ModelArgs) {
    super();
    this.switch_glu = new SwitchGLU(config.hidden_size, config.moe_intermediate_size!, config.num_experts!, new GeGLU(), false);
  }

  /** (expand_dims(top_k_weights, -1) * switch_glu(x, top_k_indices)).sum(-2) */
  call(x: MlxArray, top_k_indices: MlxArray, top_k_weights: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using w = mx.expandDims(top_k_weights, -1);
    using y = this.switch_glu.call(x, top_k_indices, taps, `${tp}switch_glu/`);
    if (taps) taps(`${tp}switch_glu`, y);
    using wy = mx.multiply(w, y);
    return mx.sum(wy, -2);
  }
}

// ------------------------------------------------------------------ Attention

/** RoPE offset: a Python int (no cache) or the int32 0-d array mx.array(cache.offset). */
export type Offset = number | MlxArray;

/** (keys, values) as the attention layer returns them (post-cache when a cache is used). */
export type KV = [MlxArray, MlxArray];

export class Attention extends Module {
  readonly layer_idx: number;
  readonly layer_type: LayerType;
  readonly is_sliding: boolean;
  readonly has_kv: boolean;
  readonly head_dim: number;
  readonly n_heads: number;
  readonly use_k_eq_v: boolean;
  readonly n_kv_heads: number;
  readonly scale = 1.0;
  q_proj: AnyLinear;
  k_proj?: AnyLinear;
  v_proj?: AnyLinear;
  o_proj: AnyLinear;
  q_norm: RMSNorm;
  k_norm?: RMSNorm;
  v_norm?: RMSNormNoScale;
  rope: RopeLike & Module;

  constructor(config: ModelArgs, layer_idx: number) {
    super();
    this.layer_idx = layer_idx;
    this.layer_type = config.layer_types[layer_idx]!;
    this.is_sliding = this.layer_type === "sliding_attention";
    this.has_kv = layer_idx < config.num_hidden_layers - config.num_kv_shared_layers;
    this.head_dim = this.layer_type === "full_attention" && config.global_head_dim ? config.global_head_dim : config.head_dim;
    const dim = config.hidden_size;
    this.n_heads = config.num_attention_heads;
    // K-eq-V for full attention layers (26B/31B models)
    this.use_k_eq_v = config.attention_k_eq_v && !this.is_sliding;
    this.n_kv_heads =
      this.use_k_eq_v && config.num_global_key_value_heads !== null ? config.num_global_key_value_heads : config.num_key_value_heads;

    this.q_proj = new Linear(dim, this.n_heads * this.head_dim);
    if (this.has_kv) {
      this.k_proj = new Linear(dim, this.n_kv_heads * this.head_dim);
      if (!this.use_k_eq_v) this.v_proj = new Linear(dim, this.n_kv_heads * this.head_dim);
    }
    this.o_proj = new Linear(this.n_heads * this.head_dim, dim);
    this.q_norm = new RMSNorm(this.head_dim, config.rms_norm_eps);
    if (this.has_kv) {
      this.k_norm = new RMSNorm(this.head_dim, config.rms_norm_eps);
      this.v_norm = new RMSNormNoScale(this.head_dim, config.rms_norm_eps);
    }
    // RoPE (with partial rotation support)
    const layer_key = this.is_sliding ? "sliding_attention" : "full_attention";
    const rope_params = config.rope_parameters[layer_key] ?? {};
    const rope_theta = rope_params.rope_theta ?? 10000.0;
    if (mutated("rope_contiguous_partial") && !this.is_sliding) {
      // pre-merge bug: nn.RoPE over a contiguous prefix of int(head_dim * prf) dims
      const prf = rope_params.partial_rotary_factor ?? 1.0;
      this.rope = initializeRope(Math.trunc(this.head_dim * prf), rope_theta, config.rope_traditional, { rope_type: "default" }) as RopeLike & Module;
    } else {
      this.rope = initializeRope(this.head_dim, rope_theta, config.rope_traditional, rope_params) as RopeLike & Module;
    }
  }

  /**
   * Returns [o_proj(output), (keys, values), offset]. The returned keys/values/offset are owned
   * by the caller (the model keeps them for the KV-shared layers). `shared_kv`/`offset` are
   * borrowed: the layer returns fresh aliases of them.
   *
   * Python's __call__ body in three parts, so that a decode step can compile the first and the
   * last (fixed shapes) around the cache update and SDPA (whose shapes grow with the cache):
   * project → attend → output, in Python's op and tap order.
   */
  call(
    x: MlxArray,
    mask: Mask,
    cache: LayerCache | null,
    shared_kv: KV | null,
    offset: Offset | null,
    taps?: TapSink,
    tp = "",
  ): [MlxArray, KV, Offset] {
    const off = this.ropeOffset(cache, shared_kv, offset, x.shape[1]!);
    try {
      const [queries, own] = this.project(x, off, shared_kv === null, taps, tp);
      using _q = queries;
      const [out, kv] = this.attend(queries, own, shared_kv, cache, mask, taps, tp);
      try {
        using _o = out;
        return [this.output(out, taps, tp), kv, off];
      } catch (e) {
        disposeKV(kv);
        throw e;
      }
    } catch (e) {
      if (off instanceof mx.MlxArray) off.dispose();
      throw e;
    }
  }

  /**
   * The RoPE offset: for a layer with its own K/V, mx.array(cache.offset), a copy taken BEFORE
   * the cache update (absolute position); for a KV-shared layer, its source layer's offset.
   */
  ropeOffset(cache: LayerCache | null, shared_kv: KV | null, offset: Offset | null, L: number): Offset {
    if (shared_kv !== null) return offset instanceof mx.MlxArray ? mx.alias(offset) : (offset ?? 0);
    if (!this.has_kv) throw new Error(`Layer ${this.layer_idx} is a KV-shared layer but received no shared_kv`);
    if (cache === null) return 0;
    // a batch cache's offset is already an int32 (B,) array: mx.array(x) of an array is x
    if (cache.offset instanceof mx.MlxArray) return mx.alias(cache.offset);
    return mx.array(mutated("rope_offset_after_update") ? cache.offset + L : cache.offset);
  }

  /**
   * q_proj … rope(queries), and with `ownKV` k_proj … v_norm: the roped queries (B, n_heads, L, D)
   * and, with `ownKV`, the new (keys, values) (B, n_kv_heads, L, D), all owned by the caller.
   */
  project(x: MlxArray, off: Offset, ownKV: boolean, taps?: TapSink, tp = ""): [MlxArray, KV | null] {
    const [B, L] = x.shape as [number, number];
    using stack = new DisposableStack();
    const q = stack.use(this.q_proj.call(x));
    if (taps) taps(`${tp}q_proj`, q);
    const qr = stack.use(mx.reshape(q, [B, L, this.n_heads, this.head_dim]));
    const qn = stack.use(this.q_norm.call(qr)); // norm over head_dim, before the transpose
    if (taps) taps(`${tp}q_norm`, qn);
    if (!ownKV && taps) taps(`${tp}offset`, off);
    const kv = ownKV ? this.projectKV(x, off, taps, tp) : null;
    try {
      const queries = stack.use(mx.transpose(qn, [0, 2, 1, 3]));
      const rq = this.rope.call(queries, off);
      try {
        if (taps) taps(`${tp}rope_q`, rq);
      } catch (e) {
        rq.dispose();
        throw e;
      }
      return [rq, kv];
    } catch (e) {
      if (kv) disposeKV(kv);
      throw e;
    }
  }

  /** k_proj, v_proj, k_norm, rope(keys), v_norm of a layer with its own K/V (k_eq_v: values from k_proj). */
  private projectKV(x: MlxArray, off: Offset, taps?: TapSink, tp = ""): KV {
    const [B, L] = x.shape as [number, number];
    using stack = new DisposableStack();
    const kp = stack.use(this.k_proj!.call(x));
    if (taps) taps(`${tp}k_proj`, kp);
    const k = stack.use(mx.reshape(kp, [B, L, this.n_kv_heads, this.head_dim]));
    let v = k;
    if (!this.use_k_eq_v) {
      const vp = stack.use(this.v_proj!.call(x));
      if (taps) taps(`${tp}v_proj`, vp);
      v = stack.use(mx.reshape(vp, [B, L, this.n_kv_heads, this.head_dim]));
    }
    if (taps) taps(`${tp}offset`, off);

    const kn = stack.use(this.k_norm!.call(k));
    if (taps) taps(`${tp}k_norm`, kn);
    const kt = stack.use(mx.transpose(kn, [0, 2, 1, 3]));
    const keys = this.rope.call(kt, off);
    try {
      if (taps) taps(`${tp}rope_k`, keys);
      if (mutated("keqv_values_after_norm") && this.use_k_eq_v) v = kn;
      const vn = stack.use(mutated("v_norm_missing") ? mx.alias(v) : this.v_norm!.call(v));
      if (taps) taps(`${tp}v_norm`, vn);
      return [keys, mx.transpose(vn, [0, 2, 1, 3])];
    } catch (e) {
      keys.dispose();
      throw e;
    }
  }

  /**
   * The cache update (keys, values = cache.update_and_fetch(keys, values)) and SDPA. Takes
   * ownership of `own` (the new keys/values); `shared_kv` is borrowed. Returns the SDPA output
   * (B, n_heads, L, D) and the (keys, values) attended over, owned by the caller.
   */
  attend(queries: MlxArray, own: KV | null, shared_kv: KV | null, cache: LayerCache | null, mask: Mask, taps?: TapSink, tp = ""): [MlxArray, KV] {
    let [keys, values] = own ?? [mx.alias(shared_kv![0]), mx.alias(shared_kv![1])];
    if (cache !== null) {
      try {
        const [ck, cv] = cache.updateAndFetch(keys, values);
        keys.dispose();
        values.dispose();
        keys = ck;
        values = cv;
      } catch (e) {
        keys.dispose();
        values.dispose();
        throw e;
      }
      if (taps) {
        taps(`${tp}cache_keys`, keys);
        taps(`${tp}cache_values`, values);
      }
    }
    try {
      const scale = mutated("sdpa_scale_rsqrt") ? 1 / Math.sqrt(this.head_dim) : this.scale;
      // a quantized cache (cache/turboquant.ts) attends over its own state (mlx-vlm's base.scaled_dot_product_attention)
      const out = isQuantizedAttentionCache(cache) ? cache.quantizedAttention(queries, scale, mask) : mx.fast.scaledDotProductAttention(queries, keys, values, { scale, mask });
      if (taps) taps(`${tp}sdpa`, out);
      return [out, [keys, values]];
    } catch (e) {
      keys.dispose();
      values.dispose();
      throw e;
    }
  }

  /** o_proj(output.transpose(0, 2, 1, 3).reshape(B, L, -1)). */
  output(out: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    const [B, , L] = out.shape as [number, number, number];
    using ot = mx.transpose(out, [0, 2, 1, 3]);
    using or = mx.reshape(ot, [B, L, -1]);
    const o = this.o_proj.call(or);
    if (taps) taps(`${tp}o_proj`, o);
    return o;
  }
}

function disposeKV(kv: KV): void {
  kv[0].dispose();
  kv[1].dispose();
}

// ------------------------------------------------------------------ DecoderLayer

export class DecoderLayer extends Module {
  readonly layer_idx: number;
  readonly layer_type: LayerType;
  readonly enable_moe: boolean;
  readonly hidden_size_per_layer_input: number | null;
  self_attn: Attention;
  mlp: MLP;
  input_layernorm: RMSNorm;
  post_attention_layernorm: RMSNorm;
  pre_feedforward_layernorm: RMSNorm;
  post_feedforward_layernorm: RMSNorm;
  router?: Router;
  experts?: Experts;
  post_feedforward_layernorm_1?: RMSNorm;
  post_feedforward_layernorm_2?: RMSNorm;
  pre_feedforward_layernorm_2?: RMSNorm;
  per_layer_input_gate: AnyLinear | null = null;
  per_layer_projection: AnyLinear | null = null;
  post_per_layer_input_norm: RMSNorm | null = null;
  layer_scalar: MlxArray;
  // the decode-step closures (decodeCompiled), traced on first use
  private _pre?: mx.CompiledFunction<(x: MlxArray, off: MlxArray) => MlxArray[]>;
  private _post?: mx.CompiledFunction<(...inputs: MlxArray[]) => MlxArray>;

  constructor(config: ModelArgs, layer_idx: number) {
    super();
    const H = config.hidden_size;
    const eps = config.rms_norm_eps;
    this.layer_idx = layer_idx;
    this.layer_type = config.layer_types[layer_idx]!;
    this.self_attn = new Attention(config, layer_idx);
    this.mlp = new MLP(config, layer_idx);
    this.input_layernorm = new RMSNorm(H, eps);
    this.post_attention_layernorm = new RMSNorm(H, eps);
    this.pre_feedforward_layernorm = new RMSNorm(H, eps);
    this.post_feedforward_layernorm = new RMSNorm(H, eps);
    // MoE (26B model)
    this.enable_moe = config.enable_moe_block;
    if (this.enable_moe) {
      this.router = new Router(config);
      this.experts = new Experts(config);
      this.post_feedforward_layernorm_1 = new RMSNorm(H, eps);
      this.post_feedforward_layernorm_2 = new RMSNorm(H, eps);
      this.pre_feedforward_layernorm_2 = new RMSNorm(H, eps);
    }
    // Per-layer input gating (2B/4B models)
    this.hidden_size_per_layer_input = config.hidden_size_per_layer_input;
    if (this.hidden_size_per_layer_input) {
      this.per_layer_input_gate = new Linear(H, this.hidden_size_per_layer_input);
      this.per_layer_projection = new Linear(this.hidden_size_per_layer_input, H);
      this.post_per_layer_input_norm = new RMSNorm(H, eps);
    }
    this.layer_scalar = placeholder([1]);
  }

  call(
    x: MlxArray,
    mask: Mask,
    cache: LayerCache | null,
    per_layer_input: MlxArray | null,
    shared_kv: KV | null,
    offset: Offset | null,
    taps?: TapSink,
    tp = "",
  ): [MlxArray, KV, Offset] {
    if (taps && per_layer_input !== null && this.per_layer_input_gate !== null) taps(`${tp}per_layer_input`, per_layer_input);
    // the decode route needs the RoPE offset as an array: a cache, or a source layer that had one
    const offsetIsArray = shared_kv === null ? cache !== null : offset instanceof mx.MlxArray;
    if (!taps && offsetIsArray && x.shape[1] === 1 && decodeCompileOn()) {
      return this.decodeCompiled(x, mask, cache, per_layer_input, shared_kv, offset);
    }
    const residual0 = x;
    const [attn, kv, off] = (() => {
      using hn = this.input_layernorm.call(x);
      if (taps) taps(`${tp}input_layernorm`, hn);
      return this.self_attn.call(hn, mask, cache, shared_kv, offset, taps, taps ? `${tp}self_attn/` : "");
    })();
    try {
      using _a = attn;
      return [this.feedForward(residual0, attn, per_layer_input, this.layer_scalar, taps, tp), kv, off];
    } catch (e) {
      disposeKV(kv);
      if (off instanceof mx.MlxArray) off.dispose();
      throw e;
    }
  }

  /**
   * One decode token (L = 1, with a cache) through two compiled closures around the cache update
   * and SDPA: input_layernorm → self_attn.project, and self_attn.output → feedForward. Their
   * shapes are fixed from step to step, so each is traced once and replayed; the graph is the
   * uncompiled path's op for op, with elementwise chains fused. Fused kernels compute each op in
   * its own dtype with the unfused functors (docs: mlx-binding §2.6), and the generation parity
   * suites hold this path bit-exact against mlx-lm's uncompiled step. The router's
   * scale * _root_size, a constant of the weights, is computed once (Router.effectiveScale).
   * layer_scalar enters as an input: captured, a 1-element array is inlined into the fused kernel
   * as a literal, so every layer would get its own kernel (one g++ run each on first use).
   */
  private decodeCompiled(x: MlxArray, mask: Mask, cache: LayerCache | null, per_layer_input: MlxArray | null, shared_kv: KV | null, offset: Offset | null): [MlxArray, KV, Offset] {
    const attn = this.self_attn;
    const ownKV = shared_kv === null;
    const off = attn.ropeOffset(cache, shared_kv, offset, 1) as MlxArray;
    try {
      this._pre ??= mx.compile((xi: MlxArray, o: MlxArray) => {
        using hn = this.input_layernorm.call(xi);
        const [q, kv] = attn.project(hn, o, ownKV);
        return kv ? [q, kv[0], kv[1]] : [q];
      });
      const [queries, ...own] = this._pre(x, off) as MlxArray[];
      using _q = queries!;
      const [out, kv] = attn.attend(queries!, ownKV ? (own as KV) : null, shared_kv, cache, mask);
      try {
        using _o = out;
        // inputs: x, out, layer_scalar, [router scale (MoE)], [per_layer_input (PLE)]
        this._post ??= mx.compile((xi: MlxArray, o: MlxArray, ls: MlxArray, ...extra: MlxArray[]) => {
          const routerScale = this.router ? extra.shift() : undefined;
          using a = attn.output(o);
          return this.feedForward(xi, a, extra[0] ?? null, ls, undefined, "", routerScale);
        });
        const inputs = [x, out, this.layer_scalar];
        if (this.router) inputs.push(this.router.effectiveScale());
        if (per_layer_input !== null) inputs.push(per_layer_input);
        return [this._post(...inputs) as MlxArray, kv, off];
      } catch (e) {
        disposeKV(kv);
        throw e;
      }
    } catch (e) {
      off.dispose();
      throw e;
    }
  }

  /** Whether decodeCompiled has built this layer's closures. */
  get decodeTraced(): boolean {
    return this._pre !== undefined && this._post !== undefined;
  }

  /** Releases the compiled decode closures (their traces hold the layer's weights). */
  disposeCompiled(): void {
    this._pre?.dispose();
    this._post?.dispose();
    this._pre = this._post = undefined;
    this.router?.disposeCached();
  }

  /**
   * Python's __call__ after self_attn: post_attention_layernorm, the residual, the MLP (or
   * MLP + experts), the per-layer input gate and layer_scalar. `routerScale` (decode compile
   * only) is the router's scale * root_size, computed outside the trace.
   */
  feedForward(residual0: MlxArray, attn: MlxArray, per_layer_input: MlxArray | null, layer_scalar: MlxArray, taps?: TapSink, tp = "", routerScale?: MlxArray): MlxArray {
    using stack = new DisposableStack();
    const pa = stack.use(this.post_attention_layernorm.call(attn));
    if (taps) taps(`${tp}post_attention_layernorm`, pa);
    let h = stack.use(mx.add(residual0, pa));
    if (taps) taps(`${tp}attn_residual`, h);

    const residual = h;
    let ff: MlxArray;
    if (this.enable_moe) {
      let h1 = stack.use(this.pre_feedforward_layernorm.call(h));
      if (taps) taps(`${tp}pre_feedforward_layernorm`, h1);
      h1 = stack.use(this.mlp.call(h1, taps, taps ? `${tp}mlp/` : ""));
      h1 = stack.use(this.post_feedforward_layernorm_1!.call(h1));
      if (taps) taps(`${tp}post_feedforward_layernorm_1`, h1);

      const routerIn = mutated("router_normed_input") ? stack.use(this.pre_feedforward_layernorm.call(h)) : h;
      const [top_k_indices, top_k_weights] = this.router!.call(routerIn, taps, taps ? `${tp}router/` : "", routerScale);
      stack.use(top_k_indices);
      stack.use(top_k_weights);
      let h2 = stack.use(this.pre_feedforward_layernorm_2!.call(h));
      if (taps) taps(`${tp}pre_feedforward_layernorm_2`, h2);
      h2 = stack.use(this.experts!.call(h2, top_k_indices, top_k_weights, taps, taps ? `${tp}experts/` : ""));
      if (taps) taps(`${tp}experts`, h2);
      h2 = stack.use(this.post_feedforward_layernorm_2!.call(h2));
      if (taps) taps(`${tp}post_feedforward_layernorm_2`, h2);
      ff = stack.use(mx.add(h1, h2));
      if (taps) taps(`${tp}ffw_sum`, ff);
    } else {
      const pre = stack.use(this.pre_feedforward_layernorm.call(h));
      if (taps) taps(`${tp}pre_feedforward_layernorm`, pre);
      ff = stack.use(this.mlp.call(pre, taps, taps ? `${tp}mlp/` : ""));
    }
    const pf = stack.use(this.post_feedforward_layernorm.call(ff));
    if (taps) taps(`${tp}post_feedforward_layernorm`, pf);
    h = stack.use(mx.add(residual, pf));

    // Per-layer input gating
    if (this.per_layer_input_gate !== null && this.per_layer_projection !== null && this.post_per_layer_input_norm !== null && per_layer_input !== null) {
      if (taps) taps(`${tp}ffw_residual`, h);
      const residual2 = h;
      let gate = stack.use(this.per_layer_input_gate.call(h));
      if (taps) taps(`${tp}per_layer_input_gate`, gate);
      gate = stack.use(geluStandalone(gate));
      if (taps) taps(`${tp}per_layer_gelu`, gate);
      gate = stack.use(mx.multiply(gate, per_layer_input));
      if (taps) taps(`${tp}per_layer_gated`, gate);
      gate = stack.use(this.per_layer_projection.call(gate));
      if (taps) taps(`${tp}per_layer_projection`, gate);
      gate = stack.use(this.post_per_layer_input_norm.call(gate));
      if (taps) taps(`${tp}post_per_layer_input_norm`, gate);
      h = stack.use(mx.add(residual2, gate));
    }

    const out = mutated("no_layer_scalar") ? mx.alias(h) : mx.multiply(h, layer_scalar);
    if (taps) taps(`${tp}output`, out);
    return out;
  }
}

/**
 * Mutation only (pre-#1112): the PLE projection as a custom Linear-like module WITHOUT
 * to_quantized, so nn.quantize cannot replace it and quantized checkpoints fail to load
 * ("Unable to quantize model of type ScaledLinear" upstream). Same ops as Linear for floats.
 */
class ScaledLinear extends Module {
  weight: MlxArray;
  constructor(input_dims: number, output_dims: number) {
    super();
    this.weight = placeholder([output_dims, input_dims]);
  }
  call(x: MlxArray): MlxArray {
    using wt = mx.transpose(this.weight);
    return mx.matmul(x, wt);
  }
}

// ------------------------------------------------------------------ Gemma4TextModel

export interface TextModelCallOptions {
  cache?: (LayerCache | null)[] | null;
  input_embeddings?: MlxArray | null;
  per_layer_inputs?: MlxArray | null;
  taps?: TapSink;
  /**
   * mlx-vlm's `shared_kv_sink` (speculative decoding hook): filled after the layers with the
   * (keys, values) each layer attended over, the last layer of each type winning, as
   * caller-owned handles.
   */
  shared_kv_sink?: Map<LayerType, KV>;
  /** mlx-vlm's `skip_final_norm`: return the last layer's output before the final norm. */
  skip_final_norm?: boolean;
}

export class Gemma4TextModel extends Module {
  readonly config: ModelArgs;
  readonly vocab_size: number;
  readonly window_size: number;
  readonly num_hidden_layers: number;
  readonly embed_scale: number;
  readonly hidden_size_per_layer_input: number | null;
  readonly embed_tokens_per_layer_scale: number | null = null;
  readonly per_layer_input_scale: number | null = null;
  readonly per_layer_projection_scale: number | null = null;
  readonly previous_kvs: number[];
  embed_tokens: AnyEmbedding;
  layers: DecoderLayer[];
  private _embed?: mx.CompiledFunction<(ids: MlxArray) => MlxArray[]>; // embedCompiled, traced on first use
  norm: RMSNorm;
  embed_tokens_per_layer: AnyEmbedding | null = null;
  per_layer_model_projection: AnyLinear | null = null;
  per_layer_projection_norm: RMSNorm | null = null;

  constructor(config: ModelArgs) {
    super();
    this.config = config;
    this.vocab_size = config.vocab_size;
    this.window_size = config.sliding_window;
    this.num_hidden_layers = config.num_hidden_layers;
    this.embed_tokens = new Embedding(config.vocab_size, config.hidden_size);
    this.embed_scale = pyPow(config.hidden_size, 0.5);
    this.layers = Array.from({ length: config.num_hidden_layers }, (_, i) => new DecoderLayer(config, i));
    this.norm = new RMSNorm(config.hidden_size, config.rms_norm_eps);

    // Per-layer input embeddings (2B/4B models)
    this.hidden_size_per_layer_input = config.hidden_size_per_layer_input;
    if (this.hidden_size_per_layer_input) {
      const P = this.hidden_size_per_layer_input;
      this.embed_tokens_per_layer = new Embedding(config.vocab_size_per_layer_input, config.num_hidden_layers * P);
      this.embed_tokens_per_layer_scale = pyPow(P, 0.5);
      this.per_layer_input_scale = pyPow(2.0, -0.5);
      this.per_layer_projection_scale = pyPow(config.hidden_size, -0.5);
      this.per_layer_model_projection = mutated("ple_projection_scaled_linear")
        ? (new ScaledLinear(config.hidden_size, config.num_hidden_layers * P) as unknown as Linear)
        : new Linear(config.hidden_size, config.num_hidden_layers * P);
      this.per_layer_projection_norm = new RMSNorm(P, config.rms_norm_eps);
    }

    // Arrange for shared KVs: the LAST non-shared layer of each type is the source
    this.previous_kvs = Array.from({ length: this.layers.length }, (_, i) => i);
    if (config.num_kv_shared_layers > 0) {
      const N = this.layers.length;
      const M = N - config.num_kv_shared_layers;
      const kvs_by_type = new Map<LayerType, number>();
      for (let i = 0; i < M; i++) {
        const t = this.layers[i]!.layer_type;
        if (mutated("shared_kv_first_source") && kvs_by_type.has(t)) continue;
        kvs_by_type.set(t, i);
      }
      for (let j = M; j < N; j++) {
        const src = kvs_by_type.get(this.layers[j]!.layer_type);
        if (src === undefined) throw new Error(`KV-shared layer ${j} (${this.layers[j]!.layer_type}) has no source layer`);
        this.previous_kvs[j] = src;
      }
    }
  }

  /** _get_per_layer_inputs(input_ids, input_embeddings) → (B, L, nL, P). */
  _get_per_layer_inputs(input_ids: MlxArray | null, input_embeddings: MlxArray | null, taps?: TapSink): MlxArray {
    using stack = new DisposableStack();
    let ids = input_ids;
    if (ids === null) {
      if (input_embeddings === null) throw new Error("input_embeddings must be provided when input_ids are omitted.");
      // Reverse lookup of the token ids by nearest embedding row (as mlx-lm; for a quantized
      // embedding `.weight` is the packed uint32 matrix there too).
      const w = this.embed_tokens.weight;
      const sq = stack.use(mx.square(w));
      const norms_embedding = stack.use(mx.sum(sq, -1));
      const sqi = stack.use(mx.square(input_embeddings));
      const norms_input = stack.use(mx.sum(sqi, -1));
      const xy = stack.use(this.embed_tokens.asLinear(input_embeddings));
      const distance = stack.use(_complete_square(norms_embedding, norms_input, xy));
      const am = stack.use(mx.argmin(distance, -1));
      ids = stack.use(mx.stopGradient(am));
    }
    const result = stack.use(this.embed_tokens_per_layer!.call(ids));
    if (taps) taps("embed_tokens_per_layer", result);
    const scaled = stack.use(mx.multiply(result, this.embed_tokens_per_layer_scale!));
    return mx.unflatten(scaled, -1, [this.config.num_hidden_layers, this.hidden_size_per_layer_input!]);
  }

  /** _project_per_layer_inputs(h_scaled, per_layer_inputs) → (B, L, nL, P). */
  _project_per_layer_inputs(input_embeddings: MlxArray, per_layer_inputs: MlxArray | null, taps?: TapSink): MlxArray {
    using stack = new DisposableStack();
    let p = stack.use(this.per_layer_model_projection!.call(input_embeddings));
    if (taps) taps("per_layer_model_projection", p);
    p = stack.use(mx.multiply(p, this.per_layer_projection_scale!));
    p = stack.use(mx.unflatten(p, -1, [this.config.num_hidden_layers, this.hidden_size_per_layer_input!]));
    if (taps) taps("per_layer_projection_scaled", p);
    p = stack.use(this.per_layer_projection_norm!.call(p));
    if (taps) taps("per_layer_projection_norm", p);
    if (per_layer_inputs === null) return mx.alias(p);
    const s = stack.use(mx.add(p, per_layer_inputs));
    if (mutated("per_layer_input_scale_missing")) return mx.alias(s);
    return mx.multiply(s, this.per_layer_input_scale!);
  }

  /** _make_masks(h, cache): one mask per layer type, from the cache of the FIRST layer of that type. */
  _make_masks(h: MlxArray, cache: (LayerCache | null)[], taps?: TapSink): Mask[] {
    const mask = new Map<LayerType, Mask>();
    const masks: Mask[] = [];
    for (let i = 0; i < this.layers.length; i++) {
      const l = this.layers[i]!;
      const c = cache[i] ?? null;
      if (!mask.has(l.layer_type)) {
        let m: Mask;
        if (l.layer_type === "full_attention") m = createAttentionMask(h, c);
        else m = createAttentionMask(h, c, { windowSize: this.window_size });
        mask.set(l.layer_type, m);
        if (taps) taps(`mask/${l.layer_type}`, m);
      }
      masks.push(mask.get(l.layer_type)!);
    }
    if (mutated("mask_wrong_type") && mask.size === 2) {
      const s = mask.get("sliding_attention")!;
      const f = mask.get("full_attention")!;
      return this.layers.map((l) => (l.layer_type === "full_attention" ? s : f));
    }
    return masks;
  }

  /**
   * Python's __call__ up to the layer loop: the scaled embeddings h and, with per-layer inputs,
   * per_layer_inputs[:, :, i, :] for each layer i (null without). All owned by the caller.
   */
  embed(inputs: MlxArray | null, input_embeddings: MlxArray | null, per_layer_inputs: MlxArray | null, taps?: TapSink): [MlxArray, (MlxArray | null)[]] {
    using stack = new DisposableStack();
    // Make the initial hidden state
    let emb = input_embeddings;
    if (emb === null) {
      if (inputs === null) throw new Error("Gemma4TextModel: give input ids or input_embeddings");
      emb = stack.use(this.embed_tokens.call(inputs));
      if (taps) taps("embed_tokens", emb);
    }
    let h: MlxArray;
    if (mutated("embed_scale_f32")) {
      using s = mx.array(new Float32Array([this.embed_scale]), []);
      h = stack.use(mx.multiply(emb, s));
    } else {
      h = stack.use(mx.multiply(emb, this.embed_scale)); // h * self.embed_scale (weak Python float)
    }
    if (taps) taps("embed_scaled", h);

    // Get the extra inputs per layer if we have per layer embeddings
    let pli: MlxArray | null = per_layer_inputs;
    if (this.hidden_size_per_layer_input) {
      if (pli === null) {
        pli = stack.use(this._get_per_layer_inputs(inputs, emb, taps));
        if (taps) taps("per_layer_token_inputs", pli);
      }
      const projIn = mutated("ple_unscaled_embeddings") ? emb : h;
      pli = stack.use(this._project_per_layer_inputs(projIn, pli, taps));
      if (taps) taps("per_layer_inputs", pli);
    }
    const perLayer: (MlxArray | null)[] = [];
    try {
      if (pli !== null) {
        // per_layer_inputs[:, :, i, :] — a slice plus a squeeze of the layer axis
        const s = pli.shape;
        for (let i = 0; i < this.layers.length; i++) {
          using sl = mx.slice(pli, [0, 0, i, 0], [s[0]!, s[1]!, i + 1, s[3]!]);
          perLayer.push(mx.squeeze(sl, 2));
        }
      } else {
        for (let i = 0; i < this.layers.length; i++) perLayer.push(null);
      }
      return [mx.alias(h), perLayer];
    } catch (e) {
      for (const p of perLayer) p?.dispose();
      throw e;
    }
  }

  /**
   * embed() of one token as a compiled closure (traced once, then replayed; see
   * DecoderLayer.decodeCompiled): outputs h and the per-layer inputs.
   */
  private embedCompiled(ids: MlxArray): [MlxArray, (MlxArray | null)[]] {
    this._embed ??= mx.compile((x: MlxArray) => {
      const [h, perLayer] = this.embed(x, null, null);
      return [h, ...perLayer.filter((p): p is MlxArray => p !== null)];
    });
    const [h, ...perLayer] = this._embed(ids) as MlxArray[];
    return [h!, perLayer.length ? perLayer : this.layers.map(() => null)];
  }

  /** Releases the compiled closures of the decode route (they hold the weights). */
  disposeCompiled(): void {
    this._embed?.dispose();
    this._embed = undefined;
    for (const l of this.layers) l.disposeCompiled();
  }

  call(inputs: MlxArray | null, opts: TextModelCallOptions = {}): MlxArray {
    const { cache = null, input_embeddings = null, per_layer_inputs = null, taps } = opts;
    using stack = new DisposableStack();
    if (taps && inputs !== null) taps("inputs", inputs);
    const oneToken = inputs !== null && input_embeddings === null && per_layer_inputs === null && inputs.shape[1] === 1;
    const [h0, perLayer] = !taps && oneToken && decodeCompileOn() ? this.embedCompiled(inputs!) : this.embed(inputs, input_embeddings, per_layer_inputs, taps);
    let h = stack.use(h0);
    for (const p of perLayer) if (p) stack.use(p);

    // The kv cache list, with None for all the shared kv layers
    const caches: (LayerCache | null)[] = [];
    for (let i = 0; i < this.layers.length; i++) caches.push(cache?.[i] ?? null);

    // Apply each layer, keeping every layer's (kvs, offset) for the shared-KV layers
    const masks = this._make_masks(h, caches, taps);
    stack.defer(() => {
      for (const m of new Set(masks)) disposeMask(m);
    });
    h = stack.use(this.runLayers(h, masks, caches, perLayer, taps, { shared_kv_sink: opts.shared_kv_sink }));
    if (opts.skip_final_norm) return mx.alias(h);
    const out = this.norm.call(h);
    if (taps) taps("norm", out);
    return out;
  }

  /**
   * The layer loop of __call__: each layer on the previous one's output, every layer's
   * (kvs, offset) kept for the KV-shared layers. `trim` is mlx-vlm's logits_to_keep: before layer
   * `trim.before`, h (and from there each layer's per-layer input and array mask) keeps its last
   * `trim.keep` rows, and the shared layers' RoPE offsets move by the rows dropped. With
   * `shared_kv_sink`, each layer type's last (keys, values) go there (see TextModelCallOptions).
   * With `capture`, the outputs of the listed layers go to `capture.sink` (DFlash's hidden states).
   * Returns the last layer's output (caller-owned); the inputs stay the caller's.
   */
  runLayers(
    h0: MlxArray,
    masks: readonly Mask[],
    caches: readonly (LayerCache | null)[],
    perLayer: readonly (MlxArray | null)[],
    taps?: TapSink,
    opts: { trim?: { keep: number; before: number }; shared_kv_sink?: Map<LayerType, KV>; capture?: { layers: ReadonlySet<number>; sink: MlxArray[] } } = {},
  ): MlxArray {
    const { trim } = opts;
    using stack = new DisposableStack();
    const intermediates: [KV | null, Offset | null][] = this.layers.map(() => [null, null]);
    stack.defer(() => {
      for (const [kv, off] of intermediates) {
        if (kv) {
          kv[0].dispose();
          kv[1].dispose();
        }
        if (off instanceof mx.MlxArray) off.dispose();
      }
    });
    let h = h0;
    let trimmed_prefix = 0;
    // a[..., -n:, ...] on `axis`
    const lastRows = (a: MlxArray, axis: number, n: number): MlxArray => {
      const s = a.shape;
      const ax = axis < 0 ? s.length + axis : axis;
      return stack.use(mx.slice(a, s.map((v, i) => (i === ax ? v - n : 0)), s));
    };
    for (let idx = 0; idx < this.layers.length; idx++) {
      const layer = this.layers[idx]!;
      if (trim && 0 < trim.keep && trim.keep < h.shape[1]! && idx === trim.before) {
        trimmed_prefix = h.shape[1]! - trim.keep;
        h = lastRows(h, 1, trim.keep);
      }
      const L = h.shape[1]!;
      let pli = perLayer[idx]!;
      if (pli !== null && pli.shape[1] !== L) pli = lastRows(pli, 1, L);
      let m = masks[idx]!;
      if (m instanceof mx.MlxArray && m.ndim >= 2 && m.shape[m.ndim - 2] !== L) m = lastRows(m, -2, L);
      const prev = this.previous_kvs[idx]!;
      let [kvs, offset] = intermediates[prev]!;
      if (trimmed_prefix) offset = offset instanceof mx.MlxArray ? stack.use(mx.add(offset, trimmed_prefix)) : (offset ?? 0) + trimmed_prefix;
      const [hn, kv, off] = layer.call(h, m, caches[idx]!, pli, kvs, offset, taps, taps ? `layers.${idx}/` : "");
      h = stack.use(hn);
      intermediates[idx] = [kv, off];
      // mlx-vlm's capture_layer_ids / hidden_sink: the output of each listed layer, in layer order (caller-owned)
      if (opts.capture?.layers.has(idx)) opts.capture.sink.push(mx.alias(h));
    }
    const sink = opts.shared_kv_sink;
    if (sink) {
      this.layers.forEach((l, idx) => {
        const kv = intermediates[idx]![0];
        if (!kv) return;
        const old = sink.get(l.layer_type);
        if (old) disposeKV(old);
        sink.set(l.layer_type, [mx.alias(kv[0]), mx.alias(kv[1])]);
      });
    }
    return mx.alias(h);
  }
}

// ------------------------------------------------------------------ Model

export interface ModelCallOptions extends TextModelCallOptions {}

export class Model extends Module {
  readonly args: ModelArgs;
  readonly model_type: string;
  readonly final_logit_softcapping: number | null;
  readonly tie_word_embeddings: boolean;
  model: Gemma4TextModel;
  lm_head?: AnyLinear;

  constructor(args: ModelArgs) {
    super();
    this.args = args;
    this.model_type = args.model_type;
    this.model = new Gemma4TextModel(args);
    this.final_logit_softcapping = args.final_logit_softcapping;
    this.tie_word_embeddings = args.tie_word_embeddings;
    if (!this.tie_word_embeddings) this.lm_head = new Linear(args.hidden_size, args.vocab_size);
  }

  /** Logits (B, L, V). `opts.cache` is the list make_cache() returns (shared layers get none). */
  call(inputs: MlxArray | null, opts: ModelCallOptions = {}): MlxArray {
    const taps = opts.taps;
    using out = this.model.call(inputs, opts);
    const logits0 = this.tie_word_embeddings ? this.model.embed_tokens.asLinear(out) : this.lm_head!.call(out);
    return softcapLogits(logits0, mutated("no_softcap") ? null : this.final_logit_softcapping, taps);
  }

  /** Releases the weights, the private arrays (RoPE frequencies) and the compiled decode closures. */
  dispose(): void {
    this.model.disposeCompiled();
    this.disposeArrays();
  }

  /** Model.sanitize: drops / renames checkpoint keys, in Python's rule order. */
  sanitize(weights: Map<string, Tensor>): Map<string, Tensor> {
    const sanitized = new Map<string, Tensor>();
    const first_kv_shared = this.args.num_hidden_layers - this.args.num_kv_shared_layers;
    for (const [k, v] of weights) {
      if (["self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"].some((s) => k.includes(s))) {
        v.array.dispose();
        continue;
      }

      // KV-shared layers reuse K/V from earlier layers — drop their projections
      if ([".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"].some((s) => k.includes(s)) && !mutated("no_sanitize_shared_kv")) {
        const idx = layerIndexOf(k);
        if (idx !== null && idx >= first_kv_shared) {
          v.array.dispose();
          continue;
        }
      }

      if (k.endsWith(".experts.gate_up_proj")) {
        const base = k.slice(0, -".gate_up_proj".length);
        const parts = mx.split(v.array, 2, -2);
        const [gate, up] = parts.map((p) => {
          const c = mx.contiguous(p);
          p.dispose();
          return c;
        }) as [MlxArray, MlxArray];
        sanitized.set(`${base}.switch_glu.gate_proj.weight`, { ...v, array: gate });
        sanitized.set(`${base}.switch_glu.up_proj.weight`, { ...v, array: up });
        v.array.dispose();
        continue;
      }
      if (k.endsWith(".experts.down_proj")) {
        sanitized.set(`${k.slice(0, -".down_proj".length)}.switch_glu.down_proj.weight`, v);
        continue;
      }
      sanitized.set(k, v);
    }
    return sanitized;
  }

  /** quant_predicate (used by convert only): router.proj stays 8-bit g64. */
  get quant_predicate(): (path: string) => boolean | { group_size: number; bits: number } {
    return (path) => (path.endsWith("router.proj") ? { group_size: 64, bits: 8 } : true);
  }

  get layers(): DecoderLayer[] {
    return this.model.layers;
  }

  get head_dim(): number {
    return this.args.head_dim;
  }

  get n_kv_heads(): number {
    return this.args.num_key_value_heads;
  }

  /**
   * make_cache(): one cache per NON-shared layer: full → KVCache(), sliding →
   * RotatingKVCache(max_size=sliding_window, keep=0). The factories come from model/cache/.
   */
  makeCache(factory: CacheFactory = defaultCacheFactory): KVCacheLike[] {
    const first_kv_shared = this.args.num_hidden_layers - this.args.num_kv_shared_layers;
    const caches: KVCacheLike[] = [];
    for (let i = 0; i < first_kv_shared; i++) {
      if (this.args.layer_types[i] === "full_attention") caches.push(factory.kvCache());
      else caches.push(factory.rotatingKVCache(this.args.sliding_window, 0));
    }
    return caches;
  }
}

/** `int(k.split("layers.")[1].split(".")[0])`, or null where Python's try/except passes. */
function layerIndexOf(k: string): number | null {
  const parts = k.split("layers.");
  if (parts.length < 2) return null;
  const s = parts[1]!.split(".")[0]!;
  if (!/^\s*[+-]?\d+\s*$/.test(s)) return null;
  return Number.parseInt(s, 10);
}
