// mlx_vlm/models/gemma4/audio.py (mlx-vlm 0.7.10): the Gemma 4 Conformer audio encoder (USM):
// a 2-conv subsampling projection, Conformer blocks (macaron feed-forwards, chunked local
// attention with relative positions and a logit softcap, a causal depthwise light conv) and an
// output projection. Op for op as Python issues them (numerics rules: gemma4_text.ts, vision.ts).
// The attention runs in float32 whatever the weights (the log-mel input is float32 and promotes
// every projection), except q_scale * softplus(per_dim_scale), computed in the parameter dtype.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { AudioConfig } from "./config.ts";
import type { AnyLinear } from "./gemma4_text.ts";
import { mediaMutated } from "./mutations.ts";
import { Linear, Module, placeholder, RMSNorm } from "./nn.ts";
import { pyPow } from "./pymath.ts";
import type { TapSink } from "./taps.ts";
import { ClippableLinear, padZeros } from "./vision.ts";

/** AudioRMSNorm: mx.fast.rms_norm(x, weight, eps), the weight used directly. */
export class AudioRMSNorm extends RMSNorm {}

// nn.relu, nn.silu, nn.softplus are @partial(mx.compile, shapeless=True) in mlx.nn
let reluC: ((x: MlxArray) => MlxArray) | null = null;
let siluC: ((x: MlxArray) => MlxArray) | null = null;
let softplusC: ((x: MlxArray) => MlxArray) | null = null;

/** nn.relu: mx.maximum(x, 0). */
export function relu(x: MlxArray): MlxArray {
  reluC ??= mx.compile((t: MlxArray) => mx.maximum(t, 0), { shapeless: true }) as (x: MlxArray) => MlxArray;
  return reluC(x);
}

/** nn.silu: x * mx.sigmoid(x). */
export function silu(x: MlxArray): MlxArray {
  siluC ??= mx.compile(
    (t: MlxArray) => {
      using s = mx.sigmoid(t);
      return mx.multiply(t, s);
    },
    { shapeless: true },
  ) as (x: MlxArray) => MlxArray;
  return siluC(x);
}

/** nn.softplus: mx.logaddexp(x, 0). */
export function softplus(x: MlxArray): MlxArray {
  softplusC ??= mx.compile((t: MlxArray) => mx.logaddexp(t, 0), { shapeless: true }) as (x: MlxArray) => MlxArray;
  return softplusC(x);
}

/** nn.LayerNorm(dims, eps, affine=True, bias=False): mx.fast.layer_norm(x, weight, None, eps). */
export class LayerNorm extends Module {
  weight: MlxArray;
  constructor(
    dims: number,
    readonly eps = 1e-5,
  ) {
    super();
    this.weight = placeholder([dims]);
  }
  call(x: MlxArray): MlxArray {
    return mx.fast.layerNorm(x, this.weight, null, this.eps);
  }
}

/** nn.Conv2d(bias=False): mx.conv2d(x, weight, stride, padding, dilation, groups), NHWC, weight [O, kH, kW, I]. */
export class Conv2d extends Module {
  weight: MlxArray;
  constructor(
    in_channels: number,
    out_channels: number,
    kernel_size: [number, number],
    readonly stride: [number, number],
    readonly padding: number,
  ) {
    super();
    this.weight = placeholder([out_channels, kernel_size[0], kernel_size[1], in_channels]);
  }
  call(x: MlxArray): MlxArray {
    return mx.conv2d(x, this.weight, { stride: this.stride, padding: this.padding, dilation: 1, groups: 1 });
  }
}

/** nn.Conv1d's parameter holder: the light conv calls mx.conv_general on its weight [O, K, I]. */
export class Conv1d extends Module {
  weight: MlxArray;
  constructor(in_channels: number, out_channels: number, kernel_size: number) {
    super();
    this.weight = placeholder([out_channels, kernel_size, in_channels]);
  }
}

/** `a[:, b:e]` on axis 1. */
function sliceDim1(a: MlxArray, b: number, e: number, step = 1): MlxArray {
  const s = a.shape;
  return mx.slice(
    a,
    s.map((_, i) => (i === 1 ? b : 0)),
    s.map((v, i) => (i === 1 ? e : v)),
    s.map((_, i) => (i === 1 ? step : 1)),
  );
}

// ------------------------------------------------------------------ subsampling

/** Conv2d → LayerNorm(channels) → ReLU, after zeroing invalid frames and a symmetric pad of 1. */
export class SSCPConvBlock extends Module {
  readonly time_stride = 2;
  conv: Conv2d;
  norm: LayerNorm;
  constructor(config: AudioConfig, idx: number) {
    super();
    const in_channels = idx === 0 ? 1 : config.subsampling_conv_channels[idx - 1]!;
    const out_channels = config.subsampling_conv_channels[idx]!;
    this.conv = new Conv2d(in_channels, out_channels, [3, 3], [2, 2], 0);
    this.norm = new LayerNorm(out_channels, config.rms_norm_eps);
  }

  /** x [B, T, F, C], mask [B, T] (True = invalid) → ([B, T', F', C'], mask [B, T']). */
  call(x0: MlxArray, mask: MlxArray, taps?: TapSink, tp = ""): [MlxArray, MlxArray] {
    using stack = new DisposableStack();
    const m4 = stack.use(mx.expandDims(mask, [2, 3]));
    const x1 = stack.use(mx.where(m4, mx.pyFloat(0.0), x0));
    const xp = stack.use(padZeros(x1, [[0, 0], [1, 1], [1, 1], [0, 0]]));
    const xc = stack.use(this.conv.call(xp));
    if (taps) taps(`${tp}conv`, xc);
    const t_out = xc.shape[1]!;
    const strided = stack.use(sliceDim1(mask, 0, mask.shape[1]!, this.time_stride));
    const output_mask = sliceDim1(strided, 0, Math.min(t_out, strided.shape[1]!));
    try {
      const xn = stack.use(this.norm.call(xc));
      if (taps) taps(`${tp}norm`, xn);
      const out = relu(xn);
      if (taps) {
        taps(tp.slice(0, -1), out);
        taps(`${tp}mask`, output_mask);
      }
      return [out, output_mask];
    } catch (e) {
      output_mask.dispose();
      throw e;
    }
  }
}

export class SubSampleConvProjection extends Module {
  static readonly INPUT_FEAT_SIZE = 128;
  layer0: SSCPConvBlock;
  layer1: SSCPConvBlock;
  input_proj_linear: AnyLinear;
  constructor(config: AudioConfig) {
    super();
    this.layer0 = new SSCPConvBlock(config, 0);
    this.layer1 = new SSCPConvBlock(config, 1);
    let freq = SubSampleConvProjection.INPUT_FEAT_SIZE;
    for (let i = 0; i < 2; i++) freq = Math.floor((freq + 2 - 3) / 2) + 1;
    this.input_proj_linear = new Linear(freq * config.subsampling_conv_channels[1]!, config.hidden_size);
  }

  call(audio_mel: MlxArray, mask0: MlxArray, taps?: TapSink, tp = ""): [MlxArray, MlxArray] {
    using x0 = mx.expandDims(audio_mel, -1);
    const [x1, m1] = this.layer0.call(x0, mask0, taps, `${tp}layer0/`);
    using _x1 = x1;
    using _m1 = m1;
    const [x2, mask] = this.layer1.call(x1, m1, taps, `${tp}layer1/`);
    using _x2 = x2;
    try {
      const [B, T, F, C] = x2.shape as [number, number, number, number];
      using xr = mx.reshape(x2, [B, T, F * C]);
      const out = this.input_proj_linear.call(xr);
      if (taps) taps(`${tp}input_proj_linear`, out);
      return [out, mask];
    } catch (e) {
      mask.dispose();
      throw e;
    }
  }
}

// ------------------------------------------------------------------ feed-forward

/** Macaron feed-forward: residual + residual_weight * post_norm(clip(ffw2(silu(ffw1(pre_norm(clip(x))))))). */
export class ConformerFeedForward extends Module {
  readonly gradient_clipping: number;
  readonly residual_weight: number;
  pre_layer_norm: AudioRMSNorm;
  ffw_layer_1: ClippableLinear;
  ffw_layer_2: ClippableLinear;
  post_layer_norm: AudioRMSNorm;
  constructor(config: AudioConfig) {
    super();
    this.gradient_clipping = config.gradient_clipping;
    this.residual_weight = config.residual_weight;
    this.pre_layer_norm = new AudioRMSNorm(config.hidden_size, 1e-6);
    this.ffw_layer_1 = new ClippableLinear(config.hidden_size, config.hidden_size * 4, false, config.use_clipped_linears);
    this.ffw_layer_2 = new ClippableLinear(config.hidden_size * 4, config.hidden_size, false, config.use_clipped_linears);
    this.post_layer_norm = new AudioRMSNorm(config.hidden_size, 1e-6);
  }

  call(x: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using stack = new DisposableStack();
    const gc = this.gradient_clipping;
    const c = stack.use(gradClip(x, gc));
    const n = stack.use(this.pre_layer_norm.call(c));
    if (taps) taps(`${tp}pre_layer_norm`, n);
    const f1 = stack.use(this.ffw_layer_1.call(n, taps, `${tp}ffw_layer_1`));
    if (taps) taps(`${tp}ffw_layer_1`, f1);
    const s = stack.use(silu(f1));
    if (taps) taps(`${tp}silu`, s);
    const f2 = stack.use(this.ffw_layer_2.call(s, taps, `${tp}ffw_layer_2`));
    if (taps) taps(`${tp}ffw_layer_2`, f2);
    const c2 = stack.use(gradClip(f2, gc));
    const pn = stack.use(this.post_layer_norm.call(c2));
    if (taps) taps(`${tp}post_layer_norm`, pn);
    const w = stack.use(mx.multiply(pn, mx.pyFloat(this.residual_weight)));
    const out = mx.add(x, w);
    if (taps) taps(tp.slice(0, -1), out);
    return out;
  }
}

/** mx.clip(x, -gradient_clipping, gradient_clipping): two weak Python floats. */
function gradClip(x: MlxArray, gc: number): MlxArray {
  return mx.clip(x, mx.pyFloat(-gc), mx.pyFloat(gc));
}

// ------------------------------------------------------------------ relative positions

/**
 * AudioRelativePositionEmbedding: sinusoidal relative positions for the chunked attention.
 * AudioAttention builds it with __new__ (no parameters of its own; pos_proj is the attention's
 * relative_k_proj), so it is a private member here too.
 */
export class AudioRelativePositionEmbedding extends Module {
  readonly num_heads: number;
  readonly channels: number;
  readonly head_dim: number;
  readonly max_backward: number;
  readonly max_forward: number;
  readonly _inv_timescales: MlxArray;

  /** `pos_proj` is read through its owner: AudioAttention's relative_k_proj, whatever replaced it. */
  constructor(
    config: AudioConfig,
    private readonly _owner: { relative_k_proj: AnyLinear },
  ) {
    super();
    this.num_heads = config.num_attention_heads;
    this.channels = config.hidden_size;
    this.head_dim = Math.floor(this.channels / this.num_heads);
    this.max_backward = Math.max(0, config.attention_context_left - 1);
    this.max_forward = config.attention_context_right;
    // min_timescale * mx.exp(mx.arange(num_timescales) * -log_timescale_increment)
    const num_timescales = Math.floor(this.channels / 2);
    const log_timescale_increment = Math.log(10000.0 / 1.0) / Math.max(num_timescales - 1, 1);
    using ar = mx.arange(num_timescales);
    using sc = mx.multiply(ar, mx.pyFloat(-log_timescale_increment));
    using ex = mx.exp(sc);
    using inv = mx.multiply(ex, mx.pyFloat(1.0));
    this._inv_timescales = mx.reshape(inv, [1, 1, num_timescales]);
    mx.evaluate([this._inv_timescales]);
  }

  /** relative_k_proj (Python: `self._rel_pos.pos_proj = self.relative_k_proj`). */
  get pos_proj(): AnyLinear {
    return this._owner.relative_k_proj;
  }

  _get_timing_signal(position: MlxArray, dtype: mx.Dtype): MlxArray {
    using pf = mx.astype(position, "float32");
    using p = mx.expandDims(pf, -1);
    using scaled_time = mx.multiply(p, this._inv_timescales);
    using s = mx.sin(scaled_time);
    using c = mx.cos(scaled_time);
    using signal = mx.concatenate([s, c], -1);
    return mx.astype(signal, dtype);
  }

  _relative_shift(term_bd: MlxArray, batch_size: number, num_heads: number, num_blocks: number, block_size: number, context_size: number, max_span_plus_1: number): MlxArray {
    const pad_amount = context_size + 1 - max_span_plus_1;
    using p = padZeros(term_bd, [[0, 0], [0, 0], [0, 0], [0, 0], [0, pad_amount]]);
    using r = mx.reshape(p, [batch_size, num_heads, num_blocks, block_size * (context_size + 1)]);
    using s = mx.slice(r, [0, 0, 0, 0], [batch_size, num_heads, num_blocks, block_size * context_size]);
    return mx.reshape(s, [batch_size, num_heads, num_blocks, block_size, context_size]);
  }

  call(queries: MlxArray, keys: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    const [B, U, W, N, H] = queries.shape as [number, number, number, number, number];
    const C = keys.shape[2]!;
    using stack = new DisposableStack();
    const ar = stack.use(mx.arange(this.max_backward, -this.max_forward - 1, -1));
    const pos_indices = stack.use(mx.expandDims(ar, 0));
    const max_span_plus_1 = pos_indices.shape[1]!;
    let sin_emb = stack.use(this._get_timing_signal(pos_indices, queries.dtype));
    const sw = stack.use(mx.astype(sin_emb, this.pos_proj.weight.dtype));
    sin_emb = stack.use(this.pos_proj.call(sw));
    if (taps) taps(`${tp}relative_k_proj`, sin_emb);
    sin_emb = stack.use(mx.reshape(sin_emb, [max_span_plus_1, this.num_heads, this.head_dim]));
    sin_emb = stack.use(mx.astype(sin_emb, queries.dtype));
    const queries_p = stack.use(mx.transpose(queries, [0, 3, 1, 2, 4]));
    const keys_p = stack.use(mx.transpose(keys, [0, 3, 1, 4, 2]));
    const term_ac = stack.use(mx.matmul(queries_p, keys_p));
    const sin_emb_t = stack.use(mx.transpose(sin_emb, [1, 2, 0]));
    const q_reshaped = stack.use(mx.reshape(queries_p, [B, N, U * W, H]));
    const bd = stack.use(mx.matmul(q_reshaped, sin_emb_t));
    const term_bd0 = stack.use(mx.reshape(bd, [B, N, U, W, max_span_plus_1]));
    const term_bd = stack.use(this._relative_shift(term_bd0, B, N, U, W, C, max_span_plus_1));
    const out = mx.add(term_ac, term_bd);
    if (taps) taps(tp.slice(0, -1) + "/_rel_pos", out);
    return out;
  }
}

// ------------------------------------------------------------------ attention

/** Chunked local attention with relative positions and a logit softcap (attributes = checkpoint keys). */
export class AudioAttention extends Module {
  readonly num_heads: number;
  readonly hidden_size: number;
  readonly head_dim: number;
  readonly chunk_size: number;
  readonly max_future_horizon: number;
  readonly max_past_horizon: number;
  readonly context_size: number;
  readonly invalid_logits_value: number;
  readonly softcap: number;
  readonly q_scale: number;
  readonly k_scale: number;
  relative_k_proj: AnyLinear;
  per_dim_scale: MlxArray;
  q_proj: ClippableLinear;
  k_proj: ClippableLinear;
  v_proj: ClippableLinear;
  post: ClippableLinear;
  _rel_pos: AudioRelativePositionEmbedding;

  constructor(config: AudioConfig) {
    super();
    this.num_heads = config.num_attention_heads;
    this.hidden_size = config.hidden_size;
    this.head_dim = Math.floor(this.hidden_size / this.num_heads);
    this.chunk_size = config.attention_chunk_size;
    this.max_future_horizon = config.attention_context_right;
    this.max_past_horizon = Math.max(0, config.attention_context_left - 1);
    this.context_size = this.chunk_size + this.max_past_horizon + this.max_future_horizon;
    this.invalid_logits_value = config.attention_invalid_logits_value;
    this.softcap = config.attention_logit_cap;
    this.relative_k_proj = new Linear(this.hidden_size, this.num_heads * this.head_dim);
    this.per_dim_scale = placeholder([this.head_dim]);
    const clip = config.use_clipped_linears;
    this.q_proj = new ClippableLinear(this.hidden_size, this.num_heads * this.head_dim, false, clip);
    this.k_proj = new ClippableLinear(this.hidden_size, this.num_heads * this.head_dim, false, clip);
    this.v_proj = new ClippableLinear(this.hidden_size, this.num_heads * this.head_dim, false, clip);
    this.post = new ClippableLinear(this.hidden_size, this.hidden_size, false, clip);
    this.q_scale = pyPow(this.head_dim, -0.5) / Math.log(2);
    this.k_scale = Math.log(1 + Math.E) / Math.log(2);
    this._rel_pos = new AudioRelativePositionEmbedding(config, this);
  }

  _pad_dim1(x: MlxArray, pad_left: number, pad_right: number): MlxArray {
    const pads = x.shape.map((_, i) => (i === 1 ? ([pad_left, pad_right] as const) : ([0, 0] as const)));
    return padZeros(x, pads);
  }

  /** [B, T, ...] → [B, num_blocks, chunk_size, ...] (zero-padded). */
  _convert_to_block(x: MlxArray): MlxArray {
    const [B, T] = x.shape as [number, number];
    const rest = x.shape.slice(2);
    const num_blocks = Math.floor((T + this.chunk_size - 1) / this.chunk_size);
    const pad_len = num_blocks * this.chunk_size - T;
    using xp = pad_len > 0 ? this._pad_dim1(x, 0, pad_len) : mx.alias(x);
    return mx.reshape(xp, [B, num_blocks, this.chunk_size, ...rest]);
  }

  /** [B, T, ...] → [B, num_blocks, context_size, ...]: each block with its left context (a gather). */
  _extract_block_context(x: MlxArray): MlxArray {
    const pad_left = this.max_past_horizon;
    const pad_right = this.max_future_horizon + this.chunk_size - 1;
    using xp = this._pad_dim1(x, pad_left, pad_right);
    const T_padded = xp.shape[1]!;
    const num_blocks = Math.floor((T_padded - this.context_size) / this.chunk_size) + 1;
    using ar = mx.arange(num_blocks);
    using starts = mx.multiply(ar, this.chunk_size);
    using offsets = mx.arange(this.context_size);
    using s2 = mx.expandDims(starts, 1);
    using o2 = mx.expandDims(offsets, 0);
    using indices = mx.add(s2, o2);
    return mx.take(xp, indices, 1); // x[:, indices]
  }

  call(hidden_states: MlxArray, mask: MlxArray, causal_valid_mask: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    const [B, T] = hidden_states.shape as [number, number];
    const qkv_shape = [B, T, this.num_heads, this.head_dim];
    using stack = new DisposableStack();
    const proj = (m: ClippableLinear, name: string) => {
      const y = stack.use(m.call(hidden_states, taps, `${tp}${name}`));
      if (taps) taps(`${tp}${name}`, y);
      const f = stack.use(mx.astype(y, "float32"));
      return stack.use(mx.reshape(f, qkv_shape));
    };
    let q = proj(this.q_proj, "q_proj");
    let k = proj(this.k_proj, "k_proj");
    const v = proj(this.v_proj, "v_proj");

    const pds = mediaMutated("audio_q_scale_f32") ? stack.use(mx.astype(this.per_dim_scale, "float32")) : this.per_dim_scale;
    const per_dim_scale = stack.use(softplus(pds));
    const qs = stack.use(mx.multiply(per_dim_scale, mx.pyFloat(this.q_scale))); // self.q_scale * per_dim_scale: __rmul__, param dtype
    q = stack.use(mx.multiply(q, qs));
    k = stack.use(mx.multiply(k, mx.pyFloat(this.k_scale)));

    const query_blocks = stack.use(this._convert_to_block(q));
    const key_blocks = stack.use(this._extract_block_context(k));
    const value_blocks = stack.use(this._extract_block_context(v));
    const U = query_blocks.shape[1]!;

    const valid_mask = stack.use(mx.logicalNot(mask));
    const extracted_valid = stack.use(this._extract_block_context(valid_mask));
    const ev = stack.use(mx.expandDims(extracted_valid, [1, 3])); // [:, None, :, None, :]
    const cvm = stack.use(mx.expandDims(causal_valid_mask, [0, 1, 2])); // [None, None, None, :, :]
    const condition = stack.use(mx.bitwiseAnd(ev, cvm));

    let logits = stack.use(this._rel_pos.call(query_blocks, key_blocks, taps, tp));
    const ld = stack.use(mx.divide(logits, mx.pyFloat(this.softcap)));
    const lt = stack.use(mx.tanh(ld));
    logits = stack.use(mx.multiply(lt, mx.pyFloat(this.softcap)));
    logits = stack.use(mx.where(condition, logits, mx.pyFloat(this.invalid_logits_value)));

    const probs = stack.use(mx.softmax(logits, -1));
    let context = stack.use(mx.einsum("bnuwc,bucnh->buwnh", probs, value_blocks));
    context = stack.use(mx.reshape(context, [B, U * this.chunk_size, this.num_heads, this.head_dim]));
    context = stack.use(sliceDim1(context, 0, T));
    const [Bo, To, N, H] = context.shape as [number, number, number, number];
    context = stack.use(mx.reshape(context, [Bo, To, N * H]));
    if (taps) taps(`${tp}context`, context);
    const out = this.post.call(context, taps, `${tp}post`);
    if (taps) taps(`${tp}post`, out);
    return out;
  }
}

// ------------------------------------------------------------------ light conv, block

/** pre_norm → linear(2x) → GLU → causal depthwise conv → clip → norm → SiLU → linear, + residual. */
export class ConformerLightConv1d extends Module {
  readonly gradient_clipping: number;
  readonly causal_padding: number;
  pre_layer_norm: AudioRMSNorm;
  linear_start: ClippableLinear;
  depthwise_conv1d: Conv1d;
  conv_norm: AudioRMSNorm;
  linear_end: ClippableLinear;
  constructor(config: AudioConfig) {
    super();
    this.gradient_clipping = config.gradient_clipping;
    this.causal_padding = config.conv_kernel_size - 1;
    this.pre_layer_norm = new AudioRMSNorm(config.hidden_size, config.rms_norm_eps);
    this.linear_start = new ClippableLinear(config.hidden_size, config.hidden_size * 2, false, config.use_clipped_linears);
    this.depthwise_conv1d = new Conv1d(config.hidden_size, config.hidden_size, config.conv_kernel_size);
    // mlx-vlm re-creates the weight as zeros((hidden, K, 1)): depthwise, one input channel
    this.depthwise_conv1d.setParameter("weight", placeholder([config.hidden_size, config.conv_kernel_size, 1]));
    this.conv_norm = new AudioRMSNorm(config.hidden_size, config.rms_norm_eps);
    this.linear_end = new ClippableLinear(config.hidden_size, config.hidden_size, false, config.use_clipped_linears);
  }

  call(x0: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using stack = new DisposableStack();
    let x = stack.use(this.pre_layer_norm.call(x0));
    if (taps) taps(`${tp}pre_layer_norm`, x);
    x = stack.use(this.linear_start.call(x, taps, `${tp}linear_start`));
    if (taps) taps(`${tp}linear_start`, x);
    const [x1, x2] = mx.split(x, 2, -1) as [MlxArray, MlxArray];
    stack.use(x1);
    stack.use(x2);
    const sg = stack.use(mx.sigmoid(x2));
    x = stack.use(mx.multiply(x1, sg));
    x = stack.use(padZeros(x, [[0, 0], [this.causal_padding, 0], [0, 0]]));
    x = stack.use(mx.convGeneral(x, this.depthwise_conv1d.weight, { stride: 1, padding: 0, groups: x.shape[x.ndim - 1]! }));
    x = stack.use(gradClip(x, this.gradient_clipping));
    if (taps) taps(`${tp}depthwise_conv1d`, x);
    x = stack.use(this.conv_norm.call(x));
    if (taps) taps(`${tp}conv_norm`, x);
    x = stack.use(silu(x));
    if (taps) taps(`${tp}silu`, x);
    x = stack.use(this.linear_end.call(x, taps, `${tp}linear_end`));
    if (taps) taps(`${tp}linear_end`, x);
    const out = mx.add(x, x0);
    if (taps) taps(tp.slice(0, -1), out);
    return out;
  }
}

/** Macaron Conformer block: FFW → attention → light conv → FFW → clip → norm. */
export class ConformerBlock extends Module {
  readonly gradient_clipping: number;
  feed_forward1: ConformerFeedForward;
  self_attn: AudioAttention;
  lconv1d: ConformerLightConv1d;
  feed_forward2: ConformerFeedForward;
  norm_pre_attn: AudioRMSNorm;
  norm_post_attn: AudioRMSNorm;
  norm_out: AudioRMSNorm;
  constructor(config: AudioConfig) {
    super();
    this.gradient_clipping = config.gradient_clipping;
    this.feed_forward1 = new ConformerFeedForward(config);
    this.self_attn = new AudioAttention(config);
    this.lconv1d = new ConformerLightConv1d(config);
    this.feed_forward2 = new ConformerFeedForward(config);
    this.norm_pre_attn = new AudioRMSNorm(config.hidden_size, 1e-6);
    this.norm_post_attn = new AudioRMSNorm(config.hidden_size, 1e-6);
    this.norm_out = new AudioRMSNorm(config.hidden_size, 1e-6);
  }

  call(x0: MlxArray, mask: MlxArray, causal_valid_mask: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using stack = new DisposableStack();
    const gc = this.gradient_clipping;
    let x = stack.use(this.feed_forward1.call(x0, taps, `${tp}feed_forward1/`));
    const residual = x;
    x = stack.use(gradClip(x, gc));
    x = stack.use(this.norm_pre_attn.call(x));
    if (taps) taps(`${tp}norm_pre_attn`, x);
    x = stack.use(this.self_attn.call(x, mask, causal_valid_mask, taps, `${tp}self_attn/`));
    x = stack.use(gradClip(x, gc));
    const npa = stack.use(this.norm_post_attn.call(x));
    if (taps) taps(`${tp}norm_post_attn`, npa);
    x = stack.use(mx.add(residual, npa));
    // zero the invalid frames before the light conv
    const nm = stack.use(mx.logicalNot(mask));
    const nm3 = stack.use(mx.expandDims(nm, -1));
    const validity_mask = stack.use(mx.astype(nm3, x.dtype));
    x = stack.use(mx.multiply(x, validity_mask));
    if (taps) taps(`${tp}attn_residual`, x);
    x = stack.use(this.lconv1d.call(x, taps, `${tp}lconv1d/`));
    x = stack.use(this.feed_forward2.call(x, taps, `${tp}feed_forward2/`));
    x = stack.use(gradClip(x, gc));
    const out = this.norm_out.call(x);
    if (taps) taps(`${tp}norm_out`, out);
    return out;
  }
}

// ------------------------------------------------------------------ AudioEncoder

/** The Gemma 4 audio encoder (Universal Speech Model architecture). */
export class AudioEncoder extends Module {
  readonly config: AudioConfig;
  subsample_conv_projection: SubSampleConvProjection;
  layers: ConformerBlock[];
  output_proj: AnyLinear | null;

  constructor(config: AudioConfig) {
    super();
    this.config = config;
    this.subsample_conv_projection = new SubSampleConvProjection(config);
    this.layers = Array.from({ length: config.num_hidden_layers }, () => new ConformerBlock(config));
    this.output_proj = config.output_proj_dims !== null ? new Linear(config.hidden_size, config.output_proj_dims, true) : null;
  }

  /** The local causal + validity mask of the chunked attention: [chunk, context] bool. */
  _build_causal_valid_mask(): MlxArray {
    const chunk_size = this.config.attention_chunk_size;
    const max_future_horizon = this.config.attention_context_right;
    const max_past_horizon = Math.max(0, this.config.attention_context_left - 1);
    const context_size = chunk_size + max_past_horizon + max_future_horizon;
    using stack = new DisposableStack();
    const q0 = stack.use(mx.arange(chunk_size));
    const query = stack.use(mx.expandDims(q0, 1));
    const c0 = stack.use(mx.arange(context_size));
    const context = stack.use(mx.expandDims(c0, 0));
    const qp = stack.use(mx.add(query, max_past_horizon + (mediaMutated("audio_chunk_mask_shifted") ? 1 : 0)));
    const dist = stack.use(mx.subtract(qp, context));
    const ge = stack.use(mx.greaterEqual(dist, 0));
    const lt = stack.use(mx.less(dist, max_past_horizon));
    const past_valid = stack.use(mx.bitwiseAnd(ge, lt));
    const neg = stack.use(mx.less(dist, 0));
    const nd = stack.use(mx.negative(dist));
    const fl = stack.use(mx.less(nd, max_future_horizon));
    const future_valid = stack.use(mx.bitwiseAnd(neg, fl));
    const either = stack.use(mx.bitwiseOr(past_valid, future_valid));
    return mx.astype(either, "bool");
  }

  /** audio_mel [B, T, 128] float32, audio_mel_mask [B, T] (True = invalid) → ([B, T/4, D], mask). */
  call(audio_mel: MlxArray, audio_mel_mask: MlxArray, taps?: TapSink, tp = "audio_tower/"): [MlxArray, MlxArray] {
    if (taps) {
      taps(`${tp}input_features`, audio_mel);
      taps(`${tp}input_mask`, audio_mel_mask);
    }
    using stack = new DisposableStack();
    const [enc0, mask0] = this.subsample_conv_projection.call(audio_mel, audio_mel_mask, taps, `${tp}subsample_conv_projection/`);
    let audio_encodings = stack.use(enc0);
    let current_mask = stack.use(mask0);
    const causal_valid_mask = stack.use(this._build_causal_valid_mask());
    if (taps) taps(`${tp}causal_valid_mask`, causal_valid_mask);
    for (let i = 0; i < this.layers.length; i++) {
      audio_encodings = stack.use(this.layers[i]!.call(audio_encodings, current_mask, causal_valid_mask, taps, `${tp}layers.${i}/`));
    }
    if (this.output_proj !== null) {
      audio_encodings = stack.use(this.output_proj.call(audio_encodings));
      if (taps) taps(`${tp}output_proj`, audio_encodings);
    }
    if (current_mask.shape[1] !== audio_encodings.shape[1]) current_mask = stack.use(sliceDim1(current_mask, 0, audio_encodings.shape[1]!));
    const m3 = stack.use(mx.expandDims(current_mask, -1));
    const out = mx.where(m3, mx.pyFloat(0.0), audio_encodings);
    if (taps) {
      taps(tp.slice(0, -1), out);
      taps(`${tp}mask`, current_mask);
    }
    return [out, mx.alias(current_mask)];
  }
}
