// mlx_vlm/models/gemma4/vision.py (mlx-vlm 0.7.10): the Gemma 4 vision encoder, block for block
// and op for op (patch embedding, a 2-D RoPE ViT, the position pooler).
//
// Same numerics rules as gemma4_text.ts: every Python scalar is a weak scalar, reflected ops
// keep the array first, every reshape/transpose of the Python source is mirrored, and Python's
// compiled helpers (nn.gelu_approx, base.ensure_fused_sdpa) go through mx.compile with the same
// graphs. The host-side parts Python computes in numpy (the patch grid, the padding mask, the
// valid-row counts) are computed in JS and enter as int32 / bool arrays, as Python's do.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { VisionConfig } from "./config.ts";
import type { AnyLinear } from "./gemma4_text.ts";
import { mediaMutated, videoMutated } from "./mutations.ts";
import { gelu_approx, Linear, Module, placeholder, RMSNorm } from "./nn.ts";
import { pyPow } from "./pymath.ts";
import type { TapSink } from "./taps.ts";

export { RMSNorm } from "./nn.ts";

/** mx.pad(x, widths) with Python's default constant_values=0 (an array of x's dtype). */
export function padZeros(x: MlxArray, widths: readonly (readonly [number, number])[]): MlxArray {
  using zero = mx.scalar(0, x.dtype);
  return mx.pad(x, widths, zero);
}

// ------------------------------------------------------------------ ClippableLinear

/**
 * Linear with optional input/output clamping (PyTorch's Gemma4ClippableLinear): the bounds are
 * 0-d parameters (±inf until loaded); with use_clipping the clips always run.
 */
export class ClippableLinear extends Module {
  linear: AnyLinear;
  readonly use_clipping: boolean;
  input_min?: MlxArray;
  input_max?: MlxArray;
  output_min?: MlxArray;
  output_max?: MlxArray;

  constructor(in_features: number, out_features: number, bias = false, use_clipping = true) {
    super();
    this.linear = new Linear(in_features, out_features, bias);
    this.use_clipping = use_clipping;
    if (use_clipping) {
      this.input_min = mx.scalar(-Infinity);
      this.input_max = mx.scalar(Infinity);
      this.output_min = mx.scalar(-Infinity);
      this.output_max = mx.scalar(Infinity);
    }
  }

  /** `tp` names this module's tap; the inner Linear's output is `${tp}/linear` when clipping. */
  call(x: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    if (!this.use_clipping) return this.linear.call(x);
    using xc = mx.clip(x, this.input_min!, this.input_max!);
    using y = this.linear.call(xc);
    if (taps) taps(`${tp}/linear`, y);
    return mx.clip(y, this.output_min!, this.output_max!);
  }
}

/** one_hot(indices, num_classes): (expand_dims(indices, -1) == arange(num_classes)).astype(float32). */
export function one_hot(indices: MlxArray, num_classes: number): MlxArray {
  using e = mx.expandDims(indices, -1);
  using r = mx.arange(num_classes);
  using eq = mx.equal(e, r);
  return mx.astype(eq, "float32");
}

// ------------------------------------------------------------------ norms

/** RMS normalisation with a learned scale, all in float32 (x**2 is a Power op), cast back. */
export class VisionRMSNorm extends Module {
  weight: MlxArray;
  constructor(
    dim: number,
    readonly eps = 1e-6,
  ) {
    super();
    this.weight = placeholder([dim]);
  }

  call(x: MlxArray): MlxArray {
    using x_float = mx.astype(x, "float32");
    using normed = rmsFloat32(x_float, this.eps);
    using w = mx.astype(this.weight, "float32");
    using result = mx.multiply(normed, w);
    return mx.astype(result, x.dtype);
  }
}

/** The parameter-free variant (with_scale=False). */
export class VisionRMSNormNoScale extends Module {
  constructor(readonly eps = 1e-6) {
    super();
  }

  call(x: MlxArray): MlxArray {
    using x_float = mx.astype(x, "float32");
    using normed = rmsFloat32(x_float, this.eps);
    return mx.astype(normed, x.dtype);
  }
}

/** x_float * rsqrt(mean(x_float**2, -1, keepdims) + eps). */
function rmsFloat32(x_float: MlxArray, eps: number): MlxArray {
  using sq = mx.power(x_float, 2);
  using v = mx.mean(sq, -1, true);
  using ve = mx.add(v, eps);
  using r = mx.rsqrt(ve);
  return mx.multiply(x_float, r);
}

// ------------------------------------------------------------------ 2-D RoPE

/** rope_utils.rotate_half: concatenate([-x2, x1], -1) over the last axis halves. */
function rotate_half(x: MlxArray): MlxArray {
  const s = x.shape;
  const d = s[s.length - 1]!;
  const lo = s.map(() => 0);
  using x1 = mx.slice(x, lo, s.map((v, i) => (i === s.length - 1 ? Math.floor(d / 2) : v)));
  using x2 = mx.slice(x, s.map((_, i) => (i === s.length - 1 ? Math.floor(d / 2) : 0)), s);
  using n2 = mx.negative(x2);
  return mx.concatenate([n2, x1], -1);
}

/**
 * apply_multidimensional_rope(inputs (B, L, N, H), positions (B, L, ndim), base_frequency): the
 * head dim is split into ndim parts, each rotated (rotate_half inside the part only) by its own
 * coordinate: part d uses positions[..., d] and inverse timescales base**((2/c) * arange(c/2)).
 */
export function apply_multidimensional_rope(inputs: MlxArray, positions: MlxArray, base_frequency: number): MlxArray {
  if (positions.ndim === 2) throw new Error("apply_multidimensional_rope: 1-D positions are not used by the vision tower");
  const head_dim = inputs.shape[inputs.ndim - 1]!;
  const ndim = positions.shape[positions.ndim - 1]!;
  const channels_per_dim = 2 * Math.floor(head_dim / (2 * ndim));
  const half_per_dim = Math.floor(channels_per_dim / 2);
  const parts: MlxArray[] = [];
  try {
    const swap = mediaMutated("rope_axes_swapped");
    for (let d = 0; d < ndim; d++) {
      using stack = new DisposableStack();
      const s = inputs.shape;
      const last = s.length - 1;
      const x_part = stack.use(mx.slice(inputs, s.map((_, i) => (i === last ? d * channels_per_dim : 0)), s.map((v, i) => (i === last ? (d + 1) * channels_per_dim : v))));
      const ar = stack.use(mx.arange(0, half_per_dim));
      const arf = stack.use(mx.astype(ar, "float32"));
      const freq_exponents = stack.use(mx.multiply(arf, mx.pyFloat(2.0 / channels_per_dim)));
      const timescale = stack.use(mx.power(mx.pyFloat(base_frequency), freq_exponents));
      const ps = positions.shape;
      const pd = swap ? ndim - 1 - d : d;
      const pos_d = stack.use(mx.slice(positions, ps.map((_, i) => (i === ps.length - 1 ? pd : 0)), ps.map((v, i) => (i === ps.length - 1 ? pd + 1 : v))));
      const posf = stack.use(mx.astype(pos_d, "float32"));
      const sinusoid_inp = stack.use(mx.divide(posf, timescale));
      const c = stack.use(mx.cos(sinusoid_inp));
      const sn = stack.use(mx.sin(sinusoid_inp));
      const cc = stack.use(mx.concatenate([c, c], -1));
      const ss = stack.use(mx.concatenate([sn, sn], -1));
      const cos_t = stack.use(mx.astype(cc, inputs.dtype));
      const sin_t = stack.use(mx.astype(ss, inputs.dtype));
      const cos_d = stack.use(mx.expandDims(cos_t, 2));
      const sin_d = stack.use(mx.expandDims(sin_t, 2));
      const a = stack.use(mx.multiply(x_part, cos_d));
      const rh = stack.use(rotate_half(x_part));
      const b = stack.use(mx.multiply(rh, sin_d));
      parts.push(mx.add(a, b));
    }
    return mx.concatenate(parts, -1);
  } finally {
    for (const p of parts) p.dispose();
  }
}

// ------------------------------------------------------------------ base.ensure_fused_sdpa

const FUSED_DIMS = [64, 80, 128];
const fusedSdpa = new Map<number, mx.CompiledFunction<(q: MlxArray, k: MlxArray, v: MlxArray, mask: MlxArray) => MlxArray>>();

/**
 * mlx_vlm.models.base.ensure_fused_sdpa (@mx.compile): the head dim padded with zeros to the
 * next of 64/80/128, fast.scaled_dot_product_attention, then [..., :d]. One compiled closure
 * per scale (Python's compile keys on the float constant); shapes retrace as in Python.
 */
export function ensure_fused_sdpa(q: MlxArray, k: MlxArray, v: MlxArray, scale: number, mask: MlxArray): MlxArray {
  let f = fusedSdpa.get(scale);
  if (!f) {
    f = mx.compile((qi: MlxArray, ki: MlxArray, vi: MlxArray, m: MlxArray) => {
      const d = qi.shape[qi.ndim - 1]!;
      const target = FUSED_DIMS.find((t) => d <= t) ?? d;
      using stack = new DisposableStack();
      let [qq, kk, vv] = [qi, ki, vi];
      if (target !== d) {
        const pad = [...qi.shape.slice(0, -1).map(() => [0, 0] as const), [0, target - d] as const];
        qq = stack.use(padZeros(qi, pad));
        kk = stack.use(padZeros(ki, pad));
        vv = stack.use(padZeros(vi, pad));
      }
      const o = stack.use(mx.fast.scaledDotProductAttention(qq, kk, vv, { scale, mask: m }));
      const os = o.shape;
      return mx.slice(o, os.map(() => 0), os.map((x, i) => (i === os.length - 1 ? d : x)));
    });
    fusedSdpa.set(scale, f);
  }
  return f(q, k, v, mask) as MlxArray;
}

// ------------------------------------------------------------------ attention, MLP, block

export class VisionAttention extends Module {
  readonly num_heads: number;
  readonly num_kv_heads: number;
  readonly head_dim: number;
  readonly hidden_size: number;
  readonly rope_base_frequency: number;
  q_proj: ClippableLinear;
  k_proj: ClippableLinear;
  v_proj: ClippableLinear;
  o_proj: ClippableLinear;
  q_norm: VisionRMSNorm;
  k_norm: VisionRMSNorm;
  _v_norm: VisionRMSNormNoScale;

  constructor(config: VisionConfig) {
    super();
    this.num_heads = config.num_attention_heads;
    this.num_kv_heads = config.num_key_value_heads;
    this.head_dim = config.head_dim;
    this.hidden_size = config.hidden_size;
    this.rope_base_frequency = config.rope_parameters.rope_theta;
    const clip = config.use_clipped_linears;
    this.q_proj = new ClippableLinear(this.hidden_size, this.num_heads * this.head_dim, false, clip);
    this.k_proj = new ClippableLinear(this.hidden_size, this.num_kv_heads * this.head_dim, false, clip);
    this.v_proj = new ClippableLinear(this.hidden_size, this.num_kv_heads * this.head_dim, false, clip);
    this.o_proj = new ClippableLinear(this.num_heads * this.head_dim, this.hidden_size, false, clip);
    this.q_norm = new VisionRMSNorm(this.head_dim);
    this.k_norm = new VisionRMSNorm(this.head_dim);
    this._v_norm = new VisionRMSNormNoScale();
  }

  call(x: MlxArray, positions: MlxArray, mask: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    const [B, L] = x.shape as [number, number];
    using stack = new DisposableStack();
    const proj = (m: ClippableLinear, name: string, heads: number) => {
      const y = stack.use(m.call(x, taps, `${tp}${name}`));
      if (taps) taps(`${tp}${name}`, y);
      return stack.use(mx.reshape(y, [B, L, heads, this.head_dim]));
    };
    let q = proj(this.q_proj, "q_proj", this.num_heads);
    let k = proj(this.k_proj, "k_proj", this.num_kv_heads);
    let v = proj(this.v_proj, "v_proj", this.num_kv_heads);
    q = stack.use(this.q_norm.call(q));
    if (taps) taps(`${tp}q_norm`, q);
    k = stack.use(this.k_norm.call(k));
    if (taps) taps(`${tp}k_norm`, k);
    v = stack.use(this._v_norm.call(v));
    if (taps) taps(`${tp}_v_norm`, v);
    q = stack.use(apply_multidimensional_rope(q, positions, this.rope_base_frequency));
    if (taps) taps(`${tp}rope_q`, q);
    k = stack.use(apply_multidimensional_rope(k, positions, this.rope_base_frequency));
    if (taps) taps(`${tp}rope_k`, k);
    const qt = stack.use(mx.transpose(q, [0, 2, 1, 3]));
    const kt = stack.use(mx.transpose(k, [0, 2, 1, 3]));
    const vt = stack.use(mx.transpose(v, [0, 2, 1, 3]));
    const attn = stack.use(ensure_fused_sdpa(qt, kt, vt, 1.0, mask));
    if (taps) taps(`${tp}sdpa`, attn);
    const at = stack.use(mx.transpose(attn, [0, 2, 1, 3]));
    const ar = stack.use(mx.reshape(at, [B, L, -1]));
    const o = this.o_proj.call(ar, taps, `${tp}o_proj`);
    if (taps) taps(`${tp}o_proj`, o);
    return o;
  }
}

export class VisionMLP extends Module {
  gate_proj: ClippableLinear;
  up_proj: ClippableLinear;
  down_proj: ClippableLinear;
  constructor(config: VisionConfig) {
    super();
    const clip = config.use_clipped_linears;
    this.gate_proj = new ClippableLinear(config.hidden_size, config.intermediate_size, false, clip);
    this.up_proj = new ClippableLinear(config.hidden_size, config.intermediate_size, false, clip);
    this.down_proj = new ClippableLinear(config.intermediate_size, config.hidden_size, false, clip);
  }

  /** down_proj(nn.gelu_approx(gate_proj(x)) * up_proj(x)): gate_proj and the gelu run first. */
  call(x: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using gate = this.gate_proj.call(x, taps, `${tp}gate_proj`);
    if (taps) taps(`${tp}gate_proj`, gate);
    using g = gelu_approx(gate);
    if (taps) taps(`${tp}gelu`, g);
    using up = this.up_proj.call(x, taps, `${tp}up_proj`);
    if (taps) taps(`${tp}up_proj`, up);
    using gated = mx.multiply(g, up);
    if (taps) taps(`${tp}gated`, gated);
    const out = this.down_proj.call(gated, taps, `${tp}down_proj`);
    if (taps) taps(`${tp}down_proj`, out);
    return out;
  }
}

export class VisionTransformerBlock extends Module {
  self_attn: VisionAttention;
  mlp: VisionMLP;
  input_layernorm: RMSNorm;
  post_attention_layernorm: RMSNorm;
  pre_feedforward_layernorm: RMSNorm;
  post_feedforward_layernorm: RMSNorm;
  constructor(config: VisionConfig) {
    super();
    this.self_attn = new VisionAttention(config);
    this.mlp = new VisionMLP(config);
    this.input_layernorm = new RMSNorm(config.hidden_size, config.rms_norm_eps);
    this.post_attention_layernorm = new RMSNorm(config.hidden_size, config.rms_norm_eps);
    this.pre_feedforward_layernorm = new RMSNorm(config.hidden_size, config.rms_norm_eps);
    this.post_feedforward_layernorm = new RMSNorm(config.hidden_size, config.rms_norm_eps);
  }

  call(x: MlxArray, positions: MlxArray, mask: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using stack = new DisposableStack();
    const normed = stack.use(this.input_layernorm.call(x));
    if (taps) taps(`${tp}input_layernorm`, normed);
    let attn_out = stack.use(this.self_attn.call(normed, positions, mask, taps, `${tp}self_attn/`));
    attn_out = stack.use(this.post_attention_layernorm.call(attn_out));
    if (taps) taps(`${tp}post_attention_layernorm`, attn_out);
    const h = stack.use(mx.add(x, attn_out));
    if (taps) taps(`${tp}attn_residual`, h);
    const normed_h = stack.use(this.pre_feedforward_layernorm.call(h));
    if (taps) taps(`${tp}pre_feedforward_layernorm`, normed_h);
    let ffw_out = stack.use(this.mlp.call(normed_h, taps, `${tp}mlp/`));
    ffw_out = stack.use(this.post_feedforward_layernorm.call(ffw_out));
    if (taps) taps(`${tp}post_feedforward_layernorm`, ffw_out);
    const out = mx.add(h, ffw_out);
    if (taps) taps(`${tp}output`, out);
    return out;
  }
}

// ------------------------------------------------------------------ patch embedder, pooler

export class VisionPatchEmbedder extends Module {
  readonly hidden_size: number;
  readonly patch_size: number;
  readonly position_embedding_size: number;
  input_proj: AnyLinear;
  position_embedding_table: MlxArray;

  constructor(config: VisionConfig) {
    super();
    this.hidden_size = config.hidden_size;
    this.patch_size = config.patch_size;
    this.position_embedding_size = config.position_embedding_size;
    this.input_proj = new Linear(3 * this.patch_size ** 2, this.hidden_size);
    this.position_embedding_table = placeholder([2, this.position_embedding_size, this.hidden_size]);
  }

  /** (one_hot(pos).transpose(0, 2, 1, 3).astype(table) @ table).sum(1), zero where padding. */
  _position_embeddings(patch_positions: MlxArray, padding_positions: MlxArray): MlxArray {
    using stack = new DisposableStack();
    const oh0 = stack.use(one_hot(patch_positions, this.position_embedding_size));
    const oht = stack.use(mx.transpose(oh0, [0, 2, 1, 3]));
    const oh = stack.use(mx.astype(oht, this.position_embedding_table.dtype));
    const pe = stack.use(mx.matmul(oh, this.position_embedding_table));
    const ps = stack.use(mx.sum(pe, 1));
    const pad = stack.use(mx.expandDims(padding_positions, -1));
    return mx.where(pad, mx.pyFloat(0.0), ps);
  }

  /** [B, C, H, W] → [B, pH*pW, p*p*C] (row-in-patch, col-in-patch, channel), 2*(x-0.5), input_proj. */
  _patchify(pixel_values: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    const [B, C, H, W] = pixel_values.shape as [number, number, number, number];
    const p = this.patch_size;
    const pH = Math.floor(H / p);
    const pW = Math.floor(W / p);
    using stack = new DisposableStack();
    const r = stack.use(mx.reshape(pixel_values, [B, C, pH, p, pW, p]));
    const t = stack.use(mx.transpose(r, mediaMutated("patchify_channel_major") ? [0, 2, 4, 1, 3, 5] : [0, 2, 4, 3, 5, 1]));
    const patches = stack.use(mx.reshape(t, [B, pH * pW, C * p * p]));
    const c = stack.use(mx.subtract(patches, mx.pyFloat(0.5)));
    const s = stack.use(mx.multiply(c, 2));
    const x = stack.use(mx.astype(s, this.input_proj.weight.dtype));
    if (taps) taps(`${tp}patches`, x);
    const y = this.input_proj.call(x);
    if (taps) taps(`${tp}input_proj`, y);
    return y;
  }

  /** embed_patches: already-patchified pixels (video frames, [N, L, p*p*C]): 2*(x-0.5), input_proj, + positions. */
  embed_patches(pixel_values: MlxArray, patch_positions: MlxArray, padding_positions: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using stack = new DisposableStack();
    const c = stack.use(mx.subtract(pixel_values, mx.pyFloat(0.5)));
    const s = stack.use(mx.multiply(c, 2));
    const x = stack.use(mx.astype(s, this.input_proj.weight.dtype));
    if (taps) taps(`${tp}patches`, x);
    const hidden_states = stack.use(this.input_proj.call(x));
    if (taps) taps(`${tp}input_proj`, hidden_states);
    const position_embeddings = stack.use(this._position_embeddings(patch_positions, padding_positions));
    if (taps) taps(`${tp}position_embeddings`, position_embeddings);
    return mx.add(hidden_states, position_embeddings);
  }

  call(pixel_values: MlxArray, patch_positions: MlxArray, padding_positions: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    using hidden_states = this._patchify(pixel_values, taps, tp);
    using position_embeddings = this._position_embeddings(patch_positions, padding_positions);
    if (taps) taps(`${tp}position_embeddings`, position_embeddings);
    return mx.add(hidden_states, position_embeddings);
  }
}

export class VisionPooler extends Module {
  readonly hidden_size: number;
  readonly default_output_length: number;
  readonly root_hidden_size: number;
  constructor(config: VisionConfig) {
    super();
    this.hidden_size = config.hidden_size;
    this.default_output_length = config.default_output_length;
    this.root_hidden_size = pyPow(this.hidden_size, 0.5);
  }

  /** Average over the k x k bins of the patch grid (row-major bins), via a float32 one-hot einsum. */
  _avg_pool_by_positions(x: MlxArray, patch_positions: MlxArray, length: number): [MlxArray, MlxArray] {
    const input_seq_len = x.shape[1]!;
    let k = Math.trunc(Math.sqrt(Math.floor(input_seq_len / length)));
    if (mediaMutated("pool_window_off_by_one")) k += 1;
    const k_squared = k ** 2;
    using stack = new DisposableStack();
    const clamped = stack.use(mx.clip(patch_positions, 0, null));
    const ps = clamped.shape;
    const col = (j: number) => {
      const sl = stack.use(mx.slice(clamped, ps.map((_, i) => (i === ps.length - 1 ? j : 0)), ps.map((v, i) => (i === ps.length - 1 ? j + 1 : v))));
      return stack.use(mx.squeeze(sl, -1));
    };
    const mx0 = stack.use(mx.max(col(0), -1, true));
    const max_x = stack.use(mx.add(mx0, 1));
    const cf = stack.use(mx.astype(clamped, "float32"));
    const cd = stack.use(mx.divide(cf, k));
    const fl = stack.use(mx.floor(cd));
    const ki = stack.use(mx.astype(fl, "int32"));
    const kis = ki.shape;
    const kcol = (j: number) => {
      const sl = stack.use(mx.slice(ki, kis.map((_, i) => (i === kis.length - 1 ? j : 0)), kis.map((v, i) => (i === kis.length - 1 ? j + 1 : v))));
      return stack.use(mx.squeeze(sl, -1));
    };
    const row = stack.use(mx.floorDivide(max_x, k));
    const off = stack.use(mx.multiply(row, kcol(1)));
    const kernel_idxs = stack.use(mx.add(kcol(0), off));
    const oh = stack.use(one_hot(kernel_idxs, length));
    const ohf = stack.use(mx.astype(oh, "float32"));
    const weights = stack.use(mx.divide(ohf, k_squared));
    const e = stack.use(mx.einsum("bLl,bLd->bld", weights, x));
    const output = mx.astype(e, x.dtype);
    try {
      const z = stack.use(mx.equal(weights, 0));
      const all = stack.use(mx.all(z, 1));
      return [output, mx.logicalNot(all)];
    } catch (err) {
      output.dispose();
      throw err;
    }
  }

  call(hidden_states0: MlxArray, patch_positions: MlxArray, padding_positions: MlxArray, output_length: number | null, taps?: TapSink, tp = ""): [MlxArray, MlxArray] {
    using stack = new DisposableStack();
    const pad = stack.use(mx.expandDims(padding_positions, -1));
    let hidden_states = stack.use(mx.where(pad, mx.pyFloat(0.0), hidden_states0));
    const length = output_length || this.default_output_length;
    let mask: MlxArray;
    if (hidden_states.shape[1] === length) {
      mask = stack.use(mx.alias(padding_positions));
    } else {
      const [pooled, m] = this._avg_pool_by_positions(hidden_states, patch_positions, length);
      hidden_states = stack.use(pooled);
      mask = stack.use(m);
      if (taps) {
        taps(`${tp}pooled`, pooled);
        taps(`${tp}mask`, m);
      }
    }
    const scaled = mediaMutated("no_pooler_scale") ? mx.alias(hidden_states) : mx.multiply(hidden_states, this.root_hidden_size);
    if (taps) taps(tp.slice(0, -1), scaled);
    return [scaled, mx.alias(mask)];
  }
}

export class VisionTransformerModel extends Module {
  layers: VisionTransformerBlock[];
  constructor(config: VisionConfig) {
    super();
    this.layers = Array.from({ length: config.num_hidden_layers }, () => new VisionTransformerBlock(config));
  }

  call(hidden_states: MlxArray, positions: MlxArray, mask: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    let h = mx.alias(hidden_states);
    for (let i = 0; i < this.layers.length; i++) {
      using prev = h;
      h = this.layers[i]!.call(prev, positions, mask, taps, `${tp}layers.${i}/`);
    }
    return h;
  }
}

// ------------------------------------------------------------------ VisionModel

/**
 * Patch positions of one image, as numpy builds them in _patch_positions_single: [x = col,
 * y = row] in row-major patch order (int32), and its padding mask (all false without padding).
 */
export function patch_positions_single(H: number, W: number, patch_size: number, max_patches: number): { positions: Int32Array; padding: Uint8Array; num_patches: number } {
  const pH = Math.floor(H / patch_size);
  const pW = Math.floor(W / patch_size);
  const num_patches = pH * pW;
  const positions = new Int32Array(max_patches * 2).fill(-1);
  const padding = new Uint8Array(max_patches);
  for (let n = 0; n < max_patches; n++) {
    if (n < num_patches) {
      positions[2 * n] = n % pW;
      positions[2 * n + 1] = Math.floor(n / pW);
    } else padding[n] = 1;
  }
  return { positions, padding, num_patches };
}

export class VisionModel extends Module {
  readonly config: VisionConfig;
  readonly patch_size: number;
  readonly pooling_kernel_size: number;
  readonly default_output_length: number;
  patch_embedder: VisionPatchEmbedder;
  encoder: VisionTransformerModel;
  pooler: VisionPooler;
  std_bias?: MlxArray;
  std_scale?: MlxArray;

  constructor(config: VisionConfig) {
    super();
    this.config = config;
    this.patch_size = config.patch_size;
    this.pooling_kernel_size = config.pooling_kernel_size;
    this.default_output_length = config.default_output_length;
    this.patch_embedder = new VisionPatchEmbedder(config);
    this.encoder = new VisionTransformerModel(config);
    this.pooler = new VisionPooler(config);
    if (config.standardize) {
      this.std_bias = placeholder([config.hidden_size]);
      this.std_scale = placeholder([config.hidden_size]);
    }
  }

  /**
   * The image path of VisionModel.__call__: `pixel_values` (B, 3, H, W) float32 channel-first,
   * or a list of differently sized images (each encoded alone, the rows concatenated; then
   * only the output is a tap, as the capture records it). Returns
   * (1, sum of valid pooled rows, hidden). Caller-supplied patch positions (video) are not ported.
   */
  call(pixel_values: MlxArray | readonly MlxArray[], taps?: TapSink, tp = "vision_tower/"): MlxArray {
    return this.callWithPositions(pixel_values, null, taps, tp);
  }

  /**
   * VisionModel.__call__(pixel_values, pixel_position_ids): with positions (video), the pixels
   * are patches [B, frames, L, p*p*C] or [frames, L, p*p*C] with [.., L, 2] positions (-1 =
   * padding), every frame one row of the tower (output_length = L // pool²); a list: one call
   * per video. Without positions: the image path.
   */
  callWithPositions(
    pixel_values: MlxArray | readonly MlxArray[],
    pixel_position_ids: MlxArray | readonly MlxArray[] | null,
    taps?: TapSink,
    tp = "vision_tower/",
  ): MlxArray {
    if (Array.isArray(pixel_values)) {
      // one image at a time (the taps inside are not the batch's: only the output is one)
      const rows: MlxArray[] = [];
      try {
        const pos = Array.isArray(pixel_position_ids) ? (pixel_position_ids as readonly MlxArray[]) : null;
        for (const [i, img] of (pixel_values as readonly MlxArray[]).entries()) {
          const p = pos ? pos[i]! : null;
          using one = p === null && img.ndim === 3 ? mx.expandDims(img, 0) : mx.alias(img);
          using r = this.callWithPositions(one, p, undefined, tp);
          rows.push(mx.squeeze(r, 0));
        }
        using cat = mx.concatenate(rows, 0);
        const out = mx.expandDims(cat, 0);
        if (taps) taps(tp.slice(0, -1), out);
        return out;
      } finally {
        for (const r of rows) r.dispose();
      }
    }
    let pv = pixel_values as MlxArray;
    if (taps) taps(`${tp}pixel_values`, pv);
    const pool_sq = this.pooling_kernel_size ** 2;
    using stack = new DisposableStack();
    if (pixel_position_ids !== null) {
      let pp = pixel_position_ids as MlxArray;
      if (pv.ndim === 2) pv = stack.use(mx.expandDims(pv, 0));
      if (pp.ndim === 2) pp = stack.use(mx.expandDims(pp, 0));
      if (pv.ndim === 4) {
        const [bsz, frames, seq_len, patch_dim] = pv.shape as [number, number, number, number];
        pv = stack.use(mx.reshape(pv, [bsz * frames, seq_len, patch_dim]));
        pp = stack.use(mx.reshape(pp, [bsz * frames, seq_len, 2]));
      }
      const patch_positions = pp;
      const neg = stack.use(mx.equal(patch_positions, -1));
      const padding_positions = stack.use(videoMutated("video_padding_not_masked") ? mx.zerosLike(stack.use(mx.all(neg, -1))) : mx.all(neg, -1));
      if (taps) taps(`${tp}patch_positions`, patch_positions);
      const output_length = Math.floor(pv.shape[1]! / pool_sq);
      const inputs_embeds = stack.use(this.patch_embedder.embed_patches(pv, patch_positions, padding_positions, taps, `${tp}patch_embedder/`));
      if (taps) taps(`${tp}patch_embedder`, inputs_embeds);
      return this._encode(inputs_embeds, patch_positions, padding_positions, output_length, pv.shape[0]!, taps, tp);
    }
    const [B, , H, W] = pv.shape as [number, number, number, number];
    const num_real = Math.floor(H / this.patch_size) * Math.floor(W / this.patch_size);
    const output_length = Math.floor(num_real / pool_sq);
    const one = patch_positions_single(H, W, this.patch_size, num_real);
    const tile = <T extends Int32Array | Uint8Array>(src: T, make: (n: number) => T): T => {
      const out = make(src.length * B);
      for (let b = 0; b < B; b++) out.set(src, b * src.length);
      return out;
    };
    const patch_positions = stack.use(mx.array(tile(one.positions, (n) => new Int32Array(n)), [B, num_real, 2], "int32"));
    const padding_positions = stack.use(mx.array(tile(one.padding, (n) => new Uint8Array(n)), [B, num_real], "bool"));
    if (taps) taps(`${tp}patch_positions`, patch_positions);
    const inputs_embeds = stack.use(this.patch_embedder.call(pv, patch_positions, padding_positions, taps, `${tp}patch_embedder/`));
    if (taps) taps(`${tp}patch_embedder`, inputs_embeds);
    return this._encode(inputs_embeds, patch_positions, padding_positions, output_length, B, taps, tp);
  }

  /** The rest of __call__ after the patch embedder: encoder, pooler, valid rows, standardize. */
  _encode(inputs_embeds: MlxArray, patch_positions: MlxArray, padding_positions: MlxArray, output_length: number, B: number, taps?: TapSink, tp = "vision_tower/"): MlxArray {
    using stack = new DisposableStack();
    // Bidirectional additive mask [B, 1, L, L] (-1e4 on padded keys; none on the image path)
    const valid_mask = stack.use(mx.logicalNot(padding_positions));
    const v1 = stack.use(mx.expandDims(valid_mask, 1));
    const v2 = stack.use(mx.expandDims(valid_mask, 2));
    const m = stack.use(mx.multiply(v1, v2));
    const mask_fill = stack.use(mx.array(mx.pyFloat(-1e4), undefined, inputs_embeds.dtype));
    const zero = stack.use(mx.array(mx.pyFloat(0.0), undefined, inputs_embeds.dtype));
    const am = stack.use(mx.where(m, zero, mask_fill));
    const attn_mask = stack.use(mx.expandDims(am, 1));
    if (taps) taps(`${tp}attn_mask`, attn_mask);

    const hidden_states = stack.use(this.encoder.call(inputs_embeds, patch_positions, attn_mask, taps, `${tp}encoder/`));
    const [pooled, pool_mask] = this.pooler.call(hidden_states, patch_positions, padding_positions, output_length, taps, `${tp}pooler/`);
    stack.use(pooled);
    stack.use(pool_mask);
    const valid = pool_mask.shape[1] === output_length ? pool_mask : stack.use(mx.logicalNot(pool_mask));
    const rows: MlxArray[] = [];
    for (let i = 0; i < B; i++) {
      // int(valid_mask[i].astype(int32).sum().item()): a host sync, as in Python
      using vi = mx.slice(valid, [i, 0], [i + 1, valid.shape[1]!]);
      using vint = mx.astype(vi, "int32");
      using n = mx.sum(vint);
      const n_valid = n.item() as number;
      using pi = mx.slice(pooled, [i, 0, 0], [i + 1, n_valid, pooled.shape[2]!]);
      rows.push(stack.use(mx.squeeze(pi, 0)));
    }
    const cat = stack.use(mx.concatenate(rows, 0));
    let out = mx.expandDims(cat, 0);
    if (this.config.standardize) {
      using o = out;
      using c = mx.subtract(o, this.std_bias!);
      out = mx.multiply(c, this.std_scale!);
    }
    if (taps) taps(tp.slice(0, -1), out);
    return out;
  }
}
