// mlx_lm/models/switch_layers.py: SwitchLinear / QuantizedSwitchLinear / SwitchGLU and the
// token sort used when B*L*K >= 64 (spec §6).

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { defaultsForMode, Module, placeholder, type QuantMode, type QuantParams, QuantizeError } from "./nn.ts";
import type { TapSink } from "./taps.ts";

/**
 * _gather_sort(x, indices): sort the (token, k) slots by expert.
 *   M = indices.shape[-1]; indices = indices.flatten(); order = argsort(indices);
 *   inv_order = argsort(order); return x.flatten(0, -3)[order // M], indices[order], inv_order
 */
export function _gather_sort(x: MlxArray, indices: MlxArray): [MlxArray, MlxArray, MlxArray] {
  const shape = indices.shape;
  const M = shape[shape.length - 1]!;
  using flat = mx.flatten(indices);
  using order = mx.argsort(flat);
  const inv_order = mx.argsort(order);
  using xf = mx.flatten(x, 0, -3);
  using rows = mx.floorDivide(order, M); // uint32 // Python int → weak int in uint32
  const xs = mx.take(xf, rows, 0); // a[idx] → take(a, idx, 0)
  const idx = mx.take(flat, order, 0);
  return [xs, idx, inv_order];
}

/** _scatter_unsort(x, inv_order, shape): x[inv_order], then unflatten axis 0 to `shape`. */
export function _scatter_unsort(x: MlxArray, inv_order: MlxArray, shape: readonly number[] | null): MlxArray {
  const y = mx.take(x, inv_order, 0);
  if (shape === null) return y;
  using yy = y;
  return mx.unflatten(yy, 0, shape);
}

/** mlx_vlm/models/linear.py DECODE_BLOCK_SIZE: mlx-vlm's SwitchGLU projects blocks of up to 8 tokens token by token. */
export const DECODE_BLOCK_SIZE = 8;

/** Anything SwitchGLU can call as a projection. */
export interface SwitchProj {
  call(x: MlxArray, indices: MlxArray, sorted_indices: boolean): MlxArray;
}

/** SwitchLinear: gather_mm(x, swapaxes(weight, -1, -2), rhs_indices=indices, sorted_indices). */
export class SwitchLinear extends Module implements SwitchProj {
  weight: MlxArray;
  bias?: MlxArray;
  constructor(
    readonly input_dims: number,
    readonly output_dims: number,
    readonly num_experts: number,
    bias = false,
  ) {
    super();
    this.weight = placeholder([num_experts, output_dims, input_dims]);
    if (bias) this.bias = placeholder([num_experts, output_dims]);
  }

  call(x: MlxArray, indices: MlxArray, sorted_indices = false): MlxArray {
    using wt = mx.swapaxes(this.weight, -1, -2);
    const y = mx.gatherMm(x, wt, { rhsIndices: indices, sortedIndices: sorted_indices });
    if (!this.bias) return y;
    using yy = y;
    using b = mx.take(this.bias, indices, 0);
    using be = mx.expandDims(b, -2);
    return mx.add(yy, be);
  }

  toQuantized(q: QuantParams, what: string): QuantizedSwitchLinear {
    return new QuantizedSwitchLinear(this.input_dims, this.output_dims, this.num_experts, this.bias !== undefined, q, what);
  }
}

/** QuantizedSwitchLinear: gather_qmm(x, w, scales, biases, rhs_indices, transpose=True, ...). */
export class QuantizedSwitchLinear extends Module implements SwitchProj {
  weight: MlxArray;
  scales: MlxArray;
  biases: MlxArray | null;
  bias?: MlxArray;
  readonly group_size: number;
  readonly bits: number;
  readonly mode: QuantMode;
  constructor(
    readonly input_dims: number,
    readonly output_dims: number,
    readonly num_experts: number,
    bias: boolean,
    q: QuantParams,
    what = "QuantizedSwitchLinear",
  ) {
    super();
    this.mode = q.mode ?? "affine";
    // QuantizedSwitchLinear's own defaults are group_size=64, bits=4 (switch_layers.py), and
    // to_quantized passes them through; the mode defaults agree for affine.
    [this.group_size, this.bits] = defaultsForMode(this.mode, q.group_size ?? 64, q.bits ?? 4);
    if (input_dims % this.group_size !== 0) {
      throw new QuantizeError(`${what}: the last dimension (${input_dims}) is not divisible by group_size ${this.group_size}`);
    }
    this.weight = placeholder([num_experts, output_dims, (input_dims * this.bits) / 32], "uint32");
    this.scales = placeholder([num_experts, output_dims, input_dims / this.group_size]);
    this.biases = this.mode === "affine" ? placeholder([num_experts, output_dims, input_dims / this.group_size]) : null;
    if (bias) this.bias = placeholder([num_experts, output_dims]);
    this.freeze(); // as Python's constructor: quantized parameters are not trainable
  }

  call(x: MlxArray, indices: MlxArray, sorted_indices = false): MlxArray {
    const y = mx.gatherQmm(x, this.weight, this.scales, this.biases, {
      rhsIndices: indices,
      transpose: true,
      groupSize: this.group_size,
      bits: this.bits,
      mode: this.mode,
      sortedIndices: sorted_indices,
    });
    if (!this.bias) return y;
    using yy = y;
    using b = mx.take(this.bias, indices, 0);
    using be = mx.expandDims(b, -2);
    return mx.add(yy, be);
  }
}

/** quantized_verifier.supports_quantization for a switch linear: one of MLX's native formats. */
function exactQuantized(m: SwitchProj): m is QuantizedSwitchLinear {
  if (!(m instanceof QuantizedSwitchLinear)) return false;
  if (m.mode === "affine") return [2, 3, 4, 5, 6, 8].includes(m.bits) && [32, 64, 128].includes(m.group_size);
  const fixed: Record<string, [number, number]> = { mxfp4: [4, 32], nvfp4: [4, 16], mxfp8: [8, 32] };
  const f = fixed[m.mode];
  return f !== undefined && m.bits === f[0] && m.group_size === f[1];
}

/** exact_quantized_switch_linear / exact_quantized_selected_linear: proj(expand_dims(contiguous(x), axes), idx).squeeze(-2). */
function projectExact(m: QuantizedSwitchLinear, x: MlxArray, axes: number[], indices: MlxArray): MlxArray {
  using c = mx.contiguous(x);
  using e = mx.expandDims(c, axes);
  using y = m.call(e, indices, false);
  return mx.squeeze(y, -2);
}

/** The activation SwitchGLU calls as activation(x_up, x_gate). */
export interface GluActivation {
  call(x: MlxArray, gate: MlxArray): MlxArray;
}

/**
 * SwitchGLU(input_dims, hidden_dims, num_experts, activation, bias=False).
 *   x = expand_dims(x, (-2, -3)); do_sort = indices.size >= 64; (sort); up, gate, down; (unsort);
 *   return x.squeeze(-2)
 */
export class SwitchGLU extends Module {
  gate_proj: SwitchLinear | QuantizedSwitchLinear;
  up_proj: SwitchLinear | QuantizedSwitchLinear;
  down_proj: SwitchLinear | QuantizedSwitchLinear;
  activation: GluActivation & Module;
  constructor(input_dims: number, hidden_dims: number, num_experts: number, activation: GluActivation & Module, bias = false) {
    super();
    this.gate_proj = new SwitchLinear(input_dims, hidden_dims, num_experts, bias);
    this.up_proj = new SwitchLinear(input_dims, hidden_dims, num_experts, bias);
    this.down_proj = new SwitchLinear(hidden_dims, input_dims, num_experts, bias);
    this.activation = activation;
  }

  /**
   * mlx-vlm's SwitchGLU (mlx_vlm/models/switch_layers.py) sets this to its DECODE_BLOCK_SIZE (8):
   * for 1 < L <= 8 it projects each token as a decode step would (decodeBlock). null: mlx-lm's.
   */
  decode_block_size: number | null = null;

  call(x0: MlxArray, indices0: MlxArray, taps?: TapSink, tp = ""): MlxArray {
    const L = x0.ndim === 3 ? x0.shape[1]! : 0;
    if (this.decode_block_size !== null && 1 < L && L <= this.decode_block_size) return this.decodeBlock(x0, indices0);
    using xe = mx.expandDims(x0, [-2, -3]);
    using indices = mx.stopGradient(indices0);
    const do_sort = indices.size >= 64;
    let x: MlxArray = xe;
    let idx: MlxArray = indices;
    let inv_order: MlxArray | null = null;
    const owned: MlxArray[] = [];
    try {
      if (do_sort) {
        const [xs, is, inv] = _gather_sort(xe, indices);
        owned.push(xs, is, inv);
        x = xs;
        idx = is;
        inv_order = inv;
        if (taps) {
          taps(`${tp}sort_x`, xs);
          taps(`${tp}sort_indices`, is);
          taps(`${tp}sort_inv_order`, inv);
        }
      }
      using x_up = this.up_proj.call(x, idx, do_sort);
      if (taps) taps(`${tp}up_proj`, x_up);
      using x_gate = this.gate_proj.call(x, idx, do_sort);
      if (taps) taps(`${tp}gate_proj`, x_gate);
      using act = this.activation.call(x_up, x_gate);
      if (taps) taps(`${tp}activation`, act);
      let y = this.down_proj.call(act, idx, do_sort);
      if (taps) taps(`${tp}down_proj`, y);
      if (do_sort) {
        using yd = y;
        y = _scatter_unsort(yd, inv_order!, indices.shape);
        if (taps) taps(`${tp}unsort`, y);
      }
      using yy = y;
      return mx.squeeze(yy, -2);
    } finally {
      for (const a of owned) a.dispose();
    }
  }

  /**
   * mlx-vlm SwitchGLU.__call__ for 1 < L <= DECODE_BLOCK_SIZE (no weights/shared/residual, as
   * Gemma 4's Experts calls it): with fewer than 64 routes per position and native-quantized
   * projections, every selected expert projects each hidden vector (exact_quantized_*); otherwise
   * linear.tokenwise: the batched path one token at a time, concatenated. The Metal-only fused
   * kernels (exact_affine_*) never run on this backend.
   */
  decodeBlock(x: MlxArray, indices: MlxArray): MlxArray {
    if (x.shape[0]! * indices.shape[indices.ndim - 1]! < 64 && exactQuantized(this.up_proj) && exactQuantized(this.gate_proj)) {
      using up = projectExact(this.up_proj, x, [-2, -3], indices);
      using gate = projectExact(this.gate_proj, x, [-2, -3], indices);
      using activated = this.activation.call(up, gate);
      if (exactQuantized(this.down_proj)) return projectExact(this.down_proj, activated, [-2], indices);
    }
    // linear.tokenwise(self, x, indices): position i as its own (B, 1) call, contiguous slices
    const outs: MlxArray[] = [];
    try {
      for (let i = 0; i < x.shape[1]!; i++) {
        using xs = mx.slice(x, [0, i, 0], [x.shape[0]!, i + 1, x.shape[2]!]);
        using xi = mx.contiguous(xs);
        const is = indices.shape;
        using ii0 = mx.slice(indices, [0, i, 0], [is[0]!, i + 1, is[2]!]);
        using ii = mx.contiguous(ii0);
        outs.push(this.call(xi, ii));
      }
      return mx.concatenate(outs, 1);
    } finally {
      for (const o of outs) o.dispose();
    }
  }
}
