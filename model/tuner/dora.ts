// mlx_lm/tuner/dora.py (mlx-lm 0.32.2): DoRALinear and DoRAEmbedding, op for op.
//
// `m` is a trainable magnitude: linalg.norm(W.astype(float32), axis=1), float32 even for a bf16
// base, so a DoRA fuse of a bf16 base writes float32 weights (mlx-lm's outcome, kept).
// mx.linalg.norm(a, axis) with no ord is sqrt(sum(square(a), axis)) (mlx linalg.cpp l2_norm).

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { Dropout, type Embedding, Linear, Module, QuantizedLinear } from "../gemma4/nn.ts";
import { addScaled, dequantizeLinear, initEmbedding, initLinear, loraUniform, quantizeFused } from "./lora.ts";

/** mx.linalg.norm(a, axis=axis): the 2-norm over one axis. */
export function norm(a: MlxArray, axis: number): MlxArray {
  using sq = mx.square(a);
  using s = mx.sum(sq, axis);
  return mx.sqrt(s);
}

// ------------------------------------------------------------------ DoRALinear

export class DoRALinear extends Module {
  linear!: Linear | QuantizedLinear;
  m!: MlxArray;
  dropout: Dropout;
  readonly scale: number;
  lora_a: MlxArray;
  lora_b: MlxArray;

  static fromBase(linear: Linear | QuantizedLinear, r = 8, dropout = 0.0, scale = 20.0): DoRALinear {
    let [output_dims, input_dims] = linear.weight.shape as [number, number];
    if (linear instanceof QuantizedLinear) input_dims *= Math.floor(32 / linear.bits); // `input_dims *= 32 // bits`
    const dora = new DoRALinear(input_dims, output_dims, r, dropout, scale);
    dora.setLinear(linear);
    return dora;
  }

  constructor(input_dims: number, output_dims: number, r = 8, dropout = 0.0, scale = 20.0, bias = false) {
    super();
    // Regular linear layer weights
    this.setLinear(initLinear(input_dims, output_dims, bias));
    this.dropout = new Dropout(dropout);
    this.scale = scale;
    this.lora_a = loraUniform(input_dims, [input_dims, r]);
    this.lora_b = mx.zeros([r, output_dims]);
  }

  /** set_linear: self.linear = linear; self.m = norm(dequantized W as float32, axis=1). */
  setLinear(linear: Linear | QuantizedLinear): void {
    const prev = this.linear;
    this.linear = linear;
    this.m?.dispose();
    using w = this._dequantized_weight();
    using w32 = mx.astype(w, "float32");
    this.m = norm(w32, 1);
    if (prev && prev !== linear) for (const p of prev.parameters().values()) p.dispose();
  }

  /** The weight of the linear layer, dequantized if it is quantized (an owned array). */
  _dequantized_weight(): MlxArray {
    return this.linear instanceof QuantizedLinear ? dequantizeLinear(this.linear) : mx.alias(this.linear.weight);
  }

  call(x: MlxArray): MlxArray {
    using stack = new DisposableStack();
    // Regular LoRA (without a bias)
    const w = stack.use(this._dequantized_weight());
    const wt = stack.use(mx.transpose(w));
    const y = mx.matmul(x, wt);
    const dx = stack.use(this.dropout.call(x));
    const xa = stack.use(mx.matmul(dx, this.lora_a));
    let out = stack.use(addScaled(y, mx.matmul(xa, this.lora_b), this.scale, x.dtype));

    // Compute the norm of the adapted weights
    const bt = stack.use(mx.transpose(this.lora_b));
    const sb = stack.use(mx.multiply(bt, mx.pyFloat(this.scale)));
    const at = stack.use(mx.transpose(this.lora_a));
    const ba = stack.use(mx.matmul(sb, at));
    const adapted = stack.use(mx.add(w, ba));
    const n = stack.use(norm(adapted, 1));
    const denom = stack.use(mx.stopGradient(n));

    // Remove the norm and scale by the learned magnitude
    const r = stack.use(mx.divide(this.m, denom));
    const rc = stack.use(mx.astype(r, x.dtype));
    out = stack.use(mx.multiply(rc, out));
    if (this.linear.bias) return mx.add(out, this.linear.bias);
    return mx.alias(out);
  }

  /** DoRALinear.fuse: W' = W + ((scale * B.T) @ A.T).astype(W.dtype); (m / norm(W'))[:, None] * W'. */
  fuse(dequantize = false): Module {
    const linear = this.linear;
    using stack = new DisposableStack();
    const weight = stack.use(this._dequantized_weight());
    const [output_dims, input_dims] = weight.shape as [number, number];
    const fused = initLinear(input_dims, output_dims, false);
    const bt = stack.use(mx.transpose(this.lora_b));
    const lora_b = stack.use(mx.multiply(bt, mx.pyFloat(this.scale)));
    const lora_a = stack.use(mx.transpose(this.lora_a));
    const d0 = stack.use(mx.matmul(lora_b, lora_a));
    const delta = stack.use(mx.astype(d0, weight.dtype));
    const w2 = stack.use(mx.add(weight, delta));
    const nw = stack.use(norm(w2, 1));
    const norm_scale = stack.use(mx.divide(this.m, nw));
    const ns = stack.use(mx.expandDims(norm_scale, 1)); // norm_scale[:, None]
    fused.setParameter("weight", mx.multiply(ns, w2));
    if (linear.bias) fused.setParameter("bias", mx.alias(linear.bias));
    if (linear instanceof QuantizedLinear && !dequantize) return quantizeFused(fused, linear);
    return fused;
  }
}

// ------------------------------------------------------------------ DoRAEmbedding

export class DoRAEmbedding extends Module {
  embedding!: Embedding;
  m!: MlxArray;
  dropout: Dropout;
  readonly scale: number;
  lora_a: MlxArray;
  lora_b: MlxArray;

  /**
   * DoRAEmbedding.from_base. mlx-lm meant to reject a quantized embedding but tests for
   * nn.QuantizedLinear; linear_to_lora_layers only hands it embeddings, so nothing is rejected.
   */
  static fromBase(embedding: Embedding, r = 8, dropout = 0.0, scale = 20.0): DoRAEmbedding {
    const [num_embeddings, dims] = embedding.weight.shape as [number, number];
    const dora = new DoRAEmbedding(num_embeddings, dims, r, dropout, scale);
    dora.setEmbedding(embedding);
    return dora;
  }

  constructor(num_embeddings: number, dims: number, r = 8, dropout = 0.0, scale = 20.0) {
    super();
    this.setEmbedding(initEmbedding(num_embeddings, dims));
    this.dropout = new Dropout(dropout);
    this.scale = scale;
    this.lora_a = loraUniform(num_embeddings, [num_embeddings, r]);
    this.lora_b = mx.zeros([r, dims]);
  }

  /** set_embedding: self.embedding = embedding; self.m = norm(embedding.weight, axis=1). */
  setEmbedding(embedding: Embedding): void {
    const prev = this.embedding;
    this.embedding = embedding;
    this.m?.dispose();
    this.m = norm(embedding.weight, 1);
    if (prev && prev !== embedding) for (const p of prev.parameters().values()) p.dispose();
  }

  call(x: MlxArray): MlxArray {
    using stack = new DisposableStack();
    const y = stack.use(this.embedding.call(x));
    const ax = stack.use(mx.take(this.lora_a, x, 0));
    const sa = stack.use(mx.multiply(ax, mx.pyFloat(this.scale))); // self.scale * self.lora_a[x]
    const z = stack.use(mx.matmul(sa, this.lora_b));
    const dz = stack.use(this.dropout.call(z));
    const dzc = stack.use(mx.astype(dz, y.dtype));
    let out = stack.use(mx.add(y, dzc));

    // Compute the norm of the adapted weights for the individual embeddings
    const adapted = stack.use(mx.add(y, z));
    const n = stack.use(norm(adapted, -1));
    const denom = stack.use(mx.stopGradient(n));

    // Remove the norm and scale by the learned magnitude
    const mx_ = stack.use(mx.take(this.m, x, 0));
    const r = stack.use(mx.divide(mx_, denom));
    const re = stack.use(mx.expandDims(r, -1)); // (...)[..., None]
    out = mx.multiply(re, out);
    return out;
  }

  asLinear(x: MlxArray): MlxArray {
    using stack = new DisposableStack();
    const y = this.embedding.asLinear(x);
    const dx = stack.use(this.dropout.call(x));
    const bt = stack.use(mx.transpose(this.lora_b));
    const xb = stack.use(mx.matmul(dx, bt));
    const at = stack.use(mx.transpose(this.lora_a));
    const out = stack.use(addScaled(y, mx.matmul(xb, at), this.scale, x.dtype));

    // Compute the norm of the adapted weights
    const sa = stack.use(mx.multiply(this.lora_a, mx.pyFloat(this.scale)));
    const ab = stack.use(mx.matmul(sa, this.lora_b));
    const adapted = stack.use(mx.add(this.embedding.weight, ab));
    const n = stack.use(norm(adapted, 1));
    const denom = stack.use(mx.stopGradient(n));

    // Remove the norm and scale by the learned magnitude
    const r = stack.use(mx.divide(this.m, denom));
    return mx.multiply(r, out);
  }

  fuse(_dequantize = false): Embedding {
    using stack = new DisposableStack();
    const weight = this.embedding.weight;
    const [num_embeddings, dims] = weight.shape as [number, number];
    const fused = initEmbedding(num_embeddings, dims);
    const lora_a = stack.use(mx.multiply(this.lora_a, mx.pyFloat(this.scale)));
    const d0 = stack.use(mx.matmul(lora_a, this.lora_b));
    const delta = stack.use(mx.astype(d0, weight.dtype));
    const w2 = stack.use(mx.add(weight, delta));
    const nw = stack.use(norm(w2, 1));
    const norm_scale = stack.use(mx.divide(this.m, nw));
    const ns = stack.use(mx.expandDims(norm_scale, 1));
    fused.setParameter("weight", mx.multiply(ns, w2));
    return fused;
  }
}
