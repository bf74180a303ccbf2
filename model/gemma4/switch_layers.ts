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

  call(x0: MlxArray, indices0: MlxArray, taps?: TapSink, tp = ""): MlxArray {
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
}
