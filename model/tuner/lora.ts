// mlx_lm/tuner/lora.py (mlx-lm 0.32.2): LoRALinear, LoRASwitchLinear, LoRAEmbedding, op for op.
//
// Bit parity (mlxlm-extras §2.1–2.3):
// - every constructor makes Python's random draws in Python's order: first the wrapped layer's
//   own init (nn.Linear / SwitchLinear uniform, nn.Embedding normal), which from_base then
//   discards, then lora_a; lora_b starts at zero. linear_to_lora_layers (utils.ts) calls them
//   in named_modules order, so the key sequence matches mlx-lm's draw for draw;
// - the bounds are Python's expressions: sqrt(1 / in) for the wrapped layer, 1 / sqrt(in) for
//   lora_a (float64, then a float32 array);
// - `y + (scale * z).astype(x.dtype)` keeps y first: the backward tape follows operand order,
//   so the swapped sum gives the same loss but different gradient bits (§3.7).
// - attribute order (linear, dropout, scale, lora_a, lora_b) is Python's, so parameter trees
//   and adapter files list the same keys in the same order.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { Dropout, Embedding, Linear, Module, QuantizedEmbedding, QuantizedLinear } from "../gemma4/nn.ts";
import { QuantizedSwitchLinear, SwitchLinear } from "../gemma4/switch_layers.ts";
import { tunerMutated } from "./mutations.ts";

// ------------------------------------------------------------------ Python's layer init draws

/** nn.Linear(in, out, bias).__init__: weight (and bias) ~ U(-sqrt(1/in), sqrt(1/in)). */
export function initLinear(input_dims: number, output_dims: number, bias = false): Linear {
  const l = new Linear(input_dims, output_dims, bias);
  const scale = Math.sqrt(1.0 / input_dims);
  l.setParameter("weight", mx.random.uniform({ low: -scale, high: scale, shape: [output_dims, input_dims] }));
  if (bias) l.setParameter("bias", mx.random.uniform({ low: -scale, high: scale, shape: [output_dims] }));
  return l;
}

/** SwitchLinear(in, out, E, bias).__init__: weight ~ U(-sqrt(1/in), sqrt(1/in)), bias zeros. */
export function initSwitchLinear(input_dims: number, output_dims: number, num_experts: number, bias = false): SwitchLinear {
  const l = new SwitchLinear(input_dims, output_dims, num_experts, bias);
  const scale = Math.sqrt(1 / input_dims);
  l.setParameter("weight", mx.random.uniform({ low: -scale, high: scale, shape: [num_experts, output_dims, input_dims] }));
  return l;
}

/** nn.Embedding(N, dims).__init__: weight ~ normal(scale=sqrt(1/dims)). */
export function initEmbedding(num_embeddings: number, dims: number): Embedding {
  const e = new Embedding(num_embeddings, dims);
  e.setParameter("weight", mx.random.normal({ shape: [num_embeddings, dims], scale: Math.sqrt(1 / dims) }));
  return e;
}

/** lora_a ~ U(-1/sqrt(n), 1/sqrt(n)) (float32, the default dtype). */
export function loraUniform(n: number, shape: number[]): MlxArray {
  const scale = 1 / Math.sqrt(n);
  return mx.random.uniform({ low: -scale, high: scale, shape });
}

/**
 * `y + (self.scale * z).astype(dtype)`, the residual sum of every LoRA layer. Takes ownership
 * of y and z. `scale * z` is z.__rmul__(scale): multiply(z, scale) with a weak Python float.
 */
export function addScaled(y: MlxArray, z: MlxArray, scale: number, dtype: mx.Dtype): MlxArray {
  using _y = y;
  using _z = z;
  using s0 = mx.multiply(z, mx.pyFloat(scale));
  using s = tunerMutated("lora_scale_twice") ? mx.multiply(s0, mx.pyFloat(scale)) : mx.alias(s0);
  using c = mx.astype(s, dtype);
  return tunerMutated("lora_add_swapped") ? mx.add(c, y) : mx.add(y, c);
}

/**
 * `y + (scale * z).astype(dtype)` with z built by `lora()`; y (the base layer's output, taken over)
 * is released if building z fails.
 */
function plusLora(y: MlxArray, lora: () => MlxArray, scale: number, dtype: mx.Dtype): MlxArray {
  let z: MlxArray;
  try {
    z = lora();
  } catch (e) {
    y.dispose();
    throw e;
  }
  return addScaled(y, z, scale, dtype);
}

/** `self.linear.weight.shape` of a Linear or QuantizedLinear, with from_base's input-dims rule. */
function linearDims(linear: Linear | QuantizedLinear, packedInDims: (inDims: number, bits: number) => number): [number, number] {
  const [output_dims, input_dims] = linear.weight.shape as [number, number];
  return [output_dims, linear instanceof QuantizedLinear ? packedInDims(input_dims, linear.bits) : input_dims];
}

/** LoRALinear.from_base's `input_dims * 32 // linear.bits`. */
export const loraInDims = (inDims: number, bits: number) => Math.floor((inDims * 32) / bits);

// ------------------------------------------------------------------ LoRALinear

export class LoRALinear extends Module {
  linear: Linear | QuantizedLinear;
  dropout: Dropout;
  readonly scale: number;
  lora_a: MlxArray;
  lora_b: MlxArray;

  static fromBase(linear: Linear | QuantizedLinear, r = 8, dropout = 0.0, scale = 20.0): LoRALinear {
    const [output_dims, input_dims] = linearDims(linear, loraInDims);
    const lora = new LoRALinear(input_dims, output_dims, r, dropout, scale);
    lora.replaceLinear(linear);
    return lora;
  }

  constructor(input_dims: number, output_dims: number, r = 8, dropout = 0.0, scale = 20.0, bias = false) {
    super();
    // Regular linear layer weights (one uniform draw, discarded by from_base)
    this.linear = initLinear(input_dims, output_dims, bias);
    this.dropout = new Dropout(dropout);
    // Scale for low-rank update
    this.scale = scale;
    // Low rank lora weights
    this.lora_a = loraUniform(input_dims, [input_dims, r]);
    this.lora_b = mx.zeros([r, output_dims]);
  }

  /** from_base's `lora_lin.linear = linear`: the constructor's own Linear is released. */
  replaceLinear(linear: Linear | QuantizedLinear): void {
    const own = this.linear;
    this.linear = linear;
    for (const p of own.parameters().values()) p.dispose();
  }

  call(x: MlxArray): MlxArray {
    return plusLora(
      this.linear.call(x),
      () => {
        using dx = this.dropout.call(x);
        using xa = mx.matmul(dx, this.lora_a);
        return mx.matmul(xa, this.lora_b);
      },
      this.scale,
      x.dtype,
    );
  }

  /** LoRALinear.fuse: W + ((scale * B.T) @ A.T).astype(W.dtype), re-quantized unless `dequantize`. */
  fuse(dequantize = false): Module {
    const linear = this.linear;
    const bias = linear.bias;
    using weight = linear instanceof QuantizedLinear ? dequantizeLinear(linear) : mx.alias(linear.weight);
    const [output_dims, input_dims] = weight.shape as [number, number];
    const fused = initLinear(input_dims, output_dims, bias !== undefined);
    using bt = mx.transpose(this.lora_b);
    using sb = mx.multiply(bt, mx.pyFloat(this.scale));
    using at = mx.transpose(this.lora_a);
    using d0 = mx.matmul(sb, at);
    using delta = mx.astype(d0, weight.dtype);
    fused.setParameter("weight", mx.add(weight, delta));
    if (bias) fused.setParameter("bias", mx.alias(bias));
    if (linear instanceof QuantizedLinear && !dequantize) {
      return quantizeFused(fused, linear);
    }
    return fused;
  }
}

/** mx.dequantize(w, scales, biases, group_size, bits, mode) of a quantized layer. */
export function dequantizeLinear(m: { weight: MlxArray; scales: MlxArray; biases: MlxArray | null; group_size: number; bits: number; mode: mx.QuantMode }): MlxArray {
  return mx.dequantize(m.weight, m.scales, m.biases, { groupSize: m.group_size, bits: m.bits, mode: m.mode });
}

interface QuantizableLayer extends Module {
  weight: MlxArray;
  bias?: MlxArray;
  toQuantized(q: { group_size: number; bits: number; mode: mx.QuantMode }, what: string): Module;
}

/**
 * nn.QuantizedLinear.from_linear / QuantizedEmbedding.from_embedding / SwitchLinear.to_quantized
 * with the original layer's group_size, bits and mode: mx.quantize(weight), bias carried over.
 * The fused layer's arrays move into the quantized one.
 */
export function quantizeFused<T extends QuantizableLayer>(fused: T, like: { group_size: number; bits: number; mode: mx.QuantMode }): Module {
  quantizedInitDraw(fused, fused.weight.shape);
  const q = fused.toQuantized({ group_size: like.group_size, bits: like.bits, mode: like.mode }, fused.constructor.name);
  const [w, s, b] = mx.quantize(fused.weight, { groupSize: like.group_size, bits: like.bits, mode: like.mode });
  q.setParameter("weight", w!);
  q.setParameter("scales", s!);
  if (b) q.setParameter("biases", b);
  if (fused.bias) q.setParameter("bias", mx.alias(fused.bias));
  for (const p of fused.parameters().values()) p.dispose();
  return q;
}

/**
 * The random weight the quantized class's constructor draws (and from_linear / from_embedding /
 * to_quantized overwrite): U(±sqrt(1/in)) for (Switch)Linear, normal(sqrt(1/dims)) for an
 * Embedding. Only the key sequence after a fuse depends on it.
 */
function quantizedInitDraw(fused: Module, shape: number[]): void {
  const scale = Math.sqrt(1 / shape[shape.length - 1]!);
  if (fused instanceof Embedding) mx.random.normal({ shape, scale }).dispose();
  else mx.random.uniform({ low: -scale, high: scale, shape }).dispose();
}

// ------------------------------------------------------------------ LoRASwitchLinear

export class LoRASwitchLinear extends Module {
  linear: SwitchLinear | QuantizedSwitchLinear;
  dropout: Dropout;
  readonly scale: number;
  lora_a: MlxArray;
  lora_b: MlxArray;
  readonly num_experts: number;

  static fromBase(linear: SwitchLinear | QuantizedSwitchLinear, r = 8, dropout = 0.0, scale = 20.0): LoRASwitchLinear {
    // QuantizedSwitchLinear.input_dims is scales.shape[2] * group_size (a property in Python)
    const input_dims = linear instanceof QuantizedSwitchLinear ? linear.scales.shape[2]! * linear.group_size : linear.weight.shape[2]!;
    const [num_experts, output_dims] = linear.weight.shape as [number, number];
    const lora = new LoRASwitchLinear(input_dims, output_dims, num_experts, r, dropout, scale);
    const own = lora.linear;
    lora.linear = linear;
    for (const p of own.parameters().values()) p.dispose();
    return lora;
  }

  constructor(input_dims: number, output_dims: number, num_experts: number, r = 8, dropout = 0.0, scale = 20.0, bias = false) {
    super();
    this.linear = initSwitchLinear(input_dims, output_dims, num_experts, bias);
    this.dropout = new Dropout(dropout);
    this.scale = scale;
    this.lora_a = loraUniform(input_dims, [num_experts, r, input_dims]);
    this.lora_b = mx.zeros([num_experts, output_dims, r]);
    this.num_experts = num_experts;
  }

  call(x: MlxArray, indices: MlxArray, sorted_indices = false): MlxArray {
    return plusLora(
      this.linear.call(x, indices, sorted_indices),
      () => {
        using dx = this.dropout.call(x);
        using at = mx.swapaxes(this.lora_a, -1, -2);
        using z0 = mx.gatherMm(dx, at, { rhsIndices: indices, sortedIndices: sorted_indices });
        using bt = mx.swapaxes(this.lora_b, -1, -2);
        return mx.gatherMm(z0, bt, { rhsIndices: indices, sortedIndices: sorted_indices });
      },
      this.scale,
      x.dtype,
    );
  }

  /** LoRASwitchLinear.fuse: W + ((scale * B) @ A.reshape(E, -1, in)).astype(W.dtype). */
  fuse(dequantize = false): Module {
    const linear = this.linear;
    const bias = linear.bias;
    using weight = linear instanceof QuantizedSwitchLinear ? dequantizeLinear(linear) : mx.alias(linear.weight);
    const [num_experts, output_dims, input_dims] = weight.shape as [number, number, number];
    const fused = initSwitchLinear(input_dims, output_dims, num_experts, bias !== undefined);
    using lora_b = mx.multiply(this.lora_b, mx.pyFloat(this.scale));
    using lora_a = mx.reshape(this.lora_a, [num_experts, -1, input_dims]);
    using d0 = mx.matmul(lora_b, lora_a);
    using delta = mx.astype(d0, weight.dtype);
    fused.setParameter("weight", mx.add(weight, delta));
    if (bias) fused.setParameter("bias", mx.alias(bias));
    if (linear instanceof QuantizedSwitchLinear && !dequantize) return quantizeFused(fused, linear);
    return fused;
  }
}

// ------------------------------------------------------------------ LoRAEmbedding

export class LoRAEmbedding extends Module {
  embedding: Embedding | QuantizedEmbedding;
  dropout: Dropout;
  readonly scale: number;
  lora_a: MlxArray;
  lora_b: MlxArray;

  static fromBase(embedding: Embedding | QuantizedEmbedding, r = 8, dropout = 0.0, scale = 20.0): LoRAEmbedding {
    const [num_embeddings, d] = embedding.weight.shape as [number, number];
    const dims = embedding instanceof QuantizedEmbedding ? Math.floor((d * 32) / embedding.bits) : d;
    const lora = new LoRAEmbedding(num_embeddings, dims, r, dropout, scale);
    const own = lora.embedding;
    lora.embedding = embedding;
    for (const p of own.parameters().values()) p.dispose();
    return lora;
  }

  constructor(num_embeddings: number, dims: number, r = 8, dropout = 0.0, scale = 20.0) {
    super();
    this.embedding = initEmbedding(num_embeddings, dims);
    this.dropout = new Dropout(dropout);
    this.scale = scale;
    this.lora_a = loraUniform(num_embeddings, [num_embeddings, r]);
    this.lora_b = mx.zeros([r, dims]);
  }

  /** y = emb(x); z = dropout(lora_a[x] @ lora_b); y + (scale * z).astype(y.dtype). */
  call(x: MlxArray): MlxArray {
    const y = this.embedding.call(x);
    return plusLora(
      y,
      () => {
        using ax = mx.take(this.lora_a, x, 0);
        using z0 = mx.matmul(ax, this.lora_b);
        return this.dropout.call(z0);
      },
      this.scale,
      y.dtype,
    );
  }

  /** Tied logits: emb.as_linear(x) + (scale * ((dropout(x) @ lora_b.T) @ lora_a.T)).astype(x.dtype). */
  asLinear(x: MlxArray): MlxArray {
    return plusLora(
      this.embedding.asLinear(x),
      () => {
        using dx = this.dropout.call(x);
        using bt = mx.transpose(this.lora_b);
        using xb = mx.matmul(dx, bt);
        using at = mx.transpose(this.lora_a);
        return mx.matmul(xb, at);
      },
      this.scale,
      x.dtype,
    );
  }

  /** LoRAEmbedding.fuse: W + ((scale * lora_a) @ lora_b).astype(W.dtype). */
  fuse(dequantize = false): Module {
    const embedding = this.embedding;
    using weight = embedding instanceof QuantizedEmbedding ? dequantizeLinear(embedding) : mx.alias(embedding.weight);
    const [num_embeddings, dims] = weight.shape as [number, number];
    const fused = initEmbedding(num_embeddings, dims);
    using lora_a = mx.multiply(this.lora_a, mx.pyFloat(this.scale));
    using d0 = mx.matmul(lora_a, this.lora_b);
    using delta = mx.astype(d0, weight.dtype);
    fused.setParameter("weight", mx.add(weight, delta));
    if (embedding instanceof QuantizedEmbedding && !dequantize) return quantizeFused(fused, embedding);
    return fused;
  }
}
