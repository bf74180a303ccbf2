// The slice of mlx.nn this model needs (mlx/nn/layers/{base,linear,embedding,normalization,
// positional_encoding,quantized,activations}.py), with the exact call paths of the Python layers
// (mlx-binding.md §1.12, §2.4): every op, operand order and scalar is the one Python issues.
//
// Module mirrors mlx.nn.Module's dict-of-members: an MlxArray member whose name does not start
// with "_" is a parameter, a Module member (or a list of Modules) is a child. Parameter paths are
// the checkpoint keys ("model.layers.0.self_attn.q_proj.weight").
//
// Parameters start as lazy zero placeholders of the shape Python's constructor would create
// (never evaluated, so they cost no memory); load fills them with the checkpoint's arrays in the
// checkpoint's dtype (load_weights never casts, spec §0.5).

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { tunerMutated } from "../tuner/mutations.ts";

export type QuantMode = "affine" | "mxfp4" | "nvfp4" | "mxfp8";

/** Arguments of to_quantized(group_size=, bits=, mode=). */
export interface QuantParams {
  group_size?: number | null;
  bits?: number | null;
  mode?: QuantMode;
}

export abstract class Module {
  /** Named parameters and children, in declaration order (Python's Module dict). */
  *members(): Generator<[string, MlxArray | Module]> {
    for (const [k, v] of Object.entries(this)) {
      if (k.startsWith("_")) continue;
      if (v instanceof mx.MlxArray) yield [k, v];
      else if (v instanceof Module) yield [k, v];
      else if (Array.isArray(v) && v.length > 0 && v.every((m) => m instanceof Module)) {
        for (let i = 0; i < v.length; i++) yield [`${k}.${i}`, v[i] as Module];
      }
    }
  }

  /** tree_flatten(self.parameters()): path → array. */
  parameters(prefix = "", out = new Map<string, MlxArray>()): Map<string, MlxArray> {
    for (const [k, v] of this.members()) {
      if (v instanceof Module) v.parameters(`${prefix}${k}.`, out);
      else out.set(prefix + k, v);
    }
    return out;
  }

  /** Module.leaf_modules(): path → module with no child modules. */
  leafModules(prefix = "", out = new Map<string, Module>()): Map<string, Module> {
    let hasChild = false;
    for (const [k, v] of this.members()) {
      if (v instanceof Module) {
        hasChild = true;
        v.leafModules(prefix + k + ".", out);
      }
    }
    if (!hasChild && prefix !== "") out.set(prefix.slice(0, -1), this);
    return out;
  }

  /** Resolves a dotted member path relative to this module: [owner, last key]. */
  private locate(path: string): [Record<string, unknown>, string] {
    const parts = path.split(".");
    let cur: unknown = this;
    for (let i = 0; i < parts.length - 1; i++) {
      const p = parts[i]!;
      const next: unknown = Array.isArray(cur) ? cur[Number(p)] : (cur as Record<string, unknown>)[p];
      if (next === undefined || next === null) throw new Error(`no member ${parts.slice(0, i + 1).join(".")}`);
      cur = next;
    }
    return [cur as Record<string, unknown>, parts[parts.length - 1]!];
  }

  /** Module.update_modules for one path. */
  replaceModule(path: string, m: Module): void {
    const [owner, key] = this.locate(path);
    if (Array.isArray(owner)) owner[Number(key)] = m;
    else owner[key] = m;
  }

  /** Sets one parameter (load_weights); the previous placeholder is released. */
  setParameter(path: string, value: MlxArray): void {
    const [owner, key] = this.locate(path);
    const old = owner[key];
    owner[key] = value;
    if (old instanceof mx.MlxArray && old !== value) old.dispose();
  }

  // ---------------------------------------------------------------- module walks, train/eval
  // (used by the tuner: linear_to_lora_layers converts in named_modules order, which decides the
  // order of its random draws)

  /** Python's Module._training: True for a new module (Dropout reads it). */
  _training = true;

  get training(): boolean {
    return this._training;
  }

  /** Module.children(): the direct child modules, as [relative path, module] in member order. */
  children(): [string, Module][] {
    const out: [string, Module][] = [];
    for (const [k, v] of this.members()) if (v instanceof Module) out.push([k, v]);
    return out;
  }

  /**
   * Module.apply_to_modules: Python's LIFO stack walk. A module is visited, then its children
   * are pushed in member order and popped in reverse, so siblings come last-declared first.
   */
  applyToModules(fn: (path: string, m: Module) => void): void {
    const stack: [string, Module][] = [["", this]];
    while (stack.length) {
      const [prefix, mod] = stack.pop()!;
      fn(prefix, mod);
      for (const [k, c] of mod.children()) stack.push([prefix ? `${prefix}.${k}` : k, c]);
    }
  }

  /** Module.named_modules(): every module with its dotted path ("" for this one), walk order. */
  namedModules(): [string, Module][] {
    const out: [string, Module][] = [];
    this.applyToModules((k, m) => out.push([k, m]));
    return out;
  }

  /** Module.train(mode): sets the training flag of every module. */
  train(mode = true): void {
    this.applyToModules((_, m) => {
      m._training = mode;
    });
  }

  /** Module.eval(). */
  eval(): void {
    this.train(false);
  }
}

/** A lazy placeholder of the shape the Python constructor creates (never evaluated). */
export function placeholder(shape: readonly number[], dtype: mx.Dtype = "float32"): MlxArray {
  return mx.zeros(shape, dtype);
}

/** Raised when a module cannot take the requested quantization (mirrors mx.quantize's checks). */
export class QuantizeError extends Error {
  override readonly name = "QuantizeError";
}

/** quantized._defaults_for_mode. */
export function defaultsForMode(mode: QuantMode, groupSize?: number | null, bits?: number | null): [number, number] {
  const d: Record<QuantMode, [number, number]> = { affine: [64, 4], mxfp4: [32, 4], nvfp4: [16, 4], mxfp8: [32, 8] };
  const def = d[mode];
  if (!def) throw new QuantizeError(`Invalid quantization mode '${String(mode)}'. Valid modes are: ${Object.keys(d).join(", ")}.`);
  return [groupSize || def[0], bits || def[1]];
}

/** Shapes mx.quantize(w (…, out, in), group_size, bits, mode) produces: [weight, scales, biases|null]. */
function quantizedShapes(lead: readonly number[], inDims: number, groupSize: number, bits: number, mode: QuantMode, what: string) {
  if (mode === "affine") {
    if (![32, 64, 128].includes(groupSize)) throw new QuantizeError(`${what}: affine group_size must be 32, 64 or 128, got ${groupSize}`);
    if (![2, 3, 4, 5, 6, 8].includes(bits)) throw new QuantizeError(`${what}: affine bits must be one of 2,3,4,5,6,8, got ${bits}`);
  }
  if (inDims % groupSize !== 0) {
    throw new QuantizeError(`${what}: the last dimension (${inDims}) is not divisible by group_size ${groupSize}`);
  }
  if ((inDims * bits) % 32 !== 0) throw new QuantizeError(`${what}: ${inDims} × ${bits} bits does not pack into uint32 words`);
  return {
    weight: [...lead, (inDims * bits) / 32],
    scales: [...lead, inDims / groupSize],
    biases: mode === "affine" ? [...lead, inDims / groupSize] : null,
  };
}

// ------------------------------------------------------------------ Linear

/** nn.Linear (bias=False everywhere in Gemma 4): `x @ W.T`. */
export class Linear extends Module {
  weight: MlxArray;
  bias?: MlxArray;
  constructor(
    readonly input_dims: number,
    readonly output_dims: number,
    bias = false,
  ) {
    super();
    this.weight = placeholder([output_dims, input_dims]);
    if (bias) this.bias = placeholder([output_dims]);
  }

  call(x: MlxArray): MlxArray {
    // matmul(x, transpose(W)): never pre-transpose, the GEMM flags follow the view (spec §0.4)
    using wt = mx.transpose(this.weight);
    if (this.bias) return mx.addmm(this.bias, x, wt);
    return mx.matmul(x, wt);
  }

  toQuantized(q: QuantParams, what: string): QuantizedLinear {
    return new QuantizedLinear(this.input_dims, this.output_dims, this.bias !== undefined, q, what);
  }
}

/** nn.QuantizedLinear: quantized_matmul(x, w, scales, biases, transpose=True, ...). */
export class QuantizedLinear extends Module {
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
    bias: boolean,
    q: QuantParams,
    what = "QuantizedLinear",
  ) {
    super();
    this.mode = q.mode ?? "affine";
    [this.group_size, this.bits] = defaultsForMode(this.mode, q.group_size, q.bits);
    const s = quantizedShapes([output_dims], input_dims, this.group_size, this.bits, this.mode, what);
    this.weight = placeholder(s.weight, "uint32");
    this.scales = placeholder(s.scales);
    this.biases = s.biases ? placeholder(s.biases) : null;
    if (bias) this.bias = placeholder([output_dims]);
  }

  call(x: MlxArray): MlxArray {
    const y = mx.quantizedMatmul(x, this.weight, this.scales, this.biases, {
      transpose: true,
      groupSize: this.group_size,
      bits: this.bits,
      mode: this.mode,
    });
    if (!this.bias) return y;
    using yy = y;
    return mx.add(yy, this.bias);
  }
}

// ------------------------------------------------------------------ Embedding

/** nn.Embedding: `weight[x]` = take(weight, x, 0); as_linear = `x @ weight.T`. */
export class Embedding extends Module {
  weight: MlxArray;
  constructor(
    readonly num_embeddings: number,
    readonly dims: number,
  ) {
    super();
    this.weight = placeholder([num_embeddings, dims]);
  }

  call(x: MlxArray): MlxArray {
    return mx.take(this.weight, x, 0);
  }

  asLinear(x: MlxArray): MlxArray {
    using wt = mx.transpose(this.weight);
    return mx.matmul(x, wt);
  }

  toQuantized(q: QuantParams, what: string): QuantizedEmbedding {
    return new QuantizedEmbedding(this.num_embeddings, this.dims, q, what);
  }
}

/** nn.QuantizedEmbedding: dequantize(w[x], scales[x], biases[x], ...); as_linear = quantized_matmul. */
export class QuantizedEmbedding extends Module {
  weight: MlxArray;
  scales: MlxArray;
  biases: MlxArray | null;
  readonly group_size: number;
  readonly bits: number;
  readonly mode: QuantMode;
  constructor(
    readonly num_embeddings: number,
    readonly dims: number,
    q: QuantParams,
    what = "QuantizedEmbedding",
  ) {
    super();
    this.mode = q.mode ?? "affine";
    [this.group_size, this.bits] = defaultsForMode(this.mode, q.group_size, q.bits);
    const s = quantizedShapes([num_embeddings], dims, this.group_size, this.bits, this.mode, what);
    this.weight = placeholder(s.weight, "uint32");
    this.scales = placeholder(s.scales);
    this.biases = s.biases ? placeholder(s.biases) : null;
  }

  call(x: MlxArray): MlxArray {
    using w = mx.take(this.weight, x, 0);
    using s = mx.take(this.scales, x, 0);
    using b = this.biases ? mx.take(this.biases, x, 0) : null;
    return mx.dequantize(w, s, b, { groupSize: this.group_size, bits: this.bits, mode: this.mode });
  }

  asLinear(x: MlxArray): MlxArray {
    return mx.quantizedMatmul(x, this.weight, this.scales, this.biases, {
      transpose: true,
      groupSize: this.group_size,
      bits: this.bits,
      mode: this.mode,
    });
  }
}

// ------------------------------------------------------------------ norms

/** nn.RMSNorm: mx.fast.rms_norm(x, weight, eps) — no `1 + weight` offset in Gemma 4. */
export class RMSNorm extends Module {
  weight: MlxArray;
  constructor(
    readonly dims: number,
    readonly eps = 1e-5,
  ) {
    super();
    this.weight = placeholder([dims]);
  }

  call(x: MlxArray): MlxArray {
    return mx.fast.rmsNorm(x, this.weight, this.eps);
  }
}

// ------------------------------------------------------------------ RoPE

/** Anything with nn.RoPE's call signature. */
export interface RopeLike {
  readonly dims: number;
  call(x: MlxArray, offset: number | MlxArray): MlxArray;
}

/** nn.RoPE: the base path of mx.fast.rope (inverse frequencies from `base`). */
export class RoPE extends Module implements RopeLike {
  constructor(
    readonly dims: number,
    readonly traditional = false,
    readonly base = 10000,
    readonly scale = 1.0,
  ) {
    super();
  }

  call(x: MlxArray, offset: number | MlxArray = 0): MlxArray {
    return mx.fast.rope(x, this.dims, { traditional: this.traditional, base: this.base, scale: this.scale, offset });
  }
}

// ------------------------------------------------------------------ Dropout

/** nn.Dropout(p): identity unless training with p > 0; else `(mask * x) * (1 / p_1)`. */
export class Dropout extends Module {
  readonly _p_1: number;
  constructor(p = 0.5) {
    super();
    if (p < 0 || p >= 1) throw new RangeError(`The dropout probability ${p} is not in [0, 1)`);
    this._p_1 = 1 - p; // Python float arithmetic (float64)
  }

  /** Returns an owned array: a second handle to x when inactive (Python returns x itself). */
  call(x: MlxArray): MlxArray {
    if (this._p_1 === 1 || (!this.training && !tunerMutated("dropout_at_eval"))) return mx.alias(x);
    using mask = mx.random.bernoulli(this._p_1, { shape: x.shape });
    using mx_ = mx.multiply(mask, x);
    return mx.multiply(mx_, mx.pyFloat(1 / this._p_1));
  }
}

// ------------------------------------------------------------------ activations

/**
 * nn.gelu_approx body: `0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))`.
 * Graph in operand order (mlx-binding.md §2.3); `x**3` is power(x, 3), never x*x*x; every
 * Python float is a weak scalar in x's dtype. Uncompiled body: traced by the compiled wrappers.
 */
export function geluApproxBody(x: MlxArray): MlxArray {
  using half = mx.multiply(x, 0.5); // 0.5 * x → __rmul__ → multiply(x, 0.5)
  using cube = mx.power(x, 3); // x**3 → power(x, array(3, x.dtype))
  using t2 = mx.multiply(cube, 0.044715);
  using t3 = mx.add(x, t2);
  using t4 = mx.multiply(t3, Math.sqrt(2 / Math.PI)); // math.sqrt(2 / math.pi), float64 then f32
  using t5 = mx.tanh(t4);
  using t6 = mx.add(t5, 1); // 1 + tanh(...) → __radd__ → add(t, 1)
  return mx.multiply(half, t6);
}

let geluApproxCompiled: ((x: MlxArray) => MlxArray) | null = null;

/** nn.gelu_approx: @partial(mx.compile, shapeless=True) — its own fused kernel when called eagerly. */
export function gelu_approx(x: MlxArray): MlxArray {
  geluApproxCompiled ??= mx.compile(geluApproxBody, { shapeless: true });
  return geluApproxCompiled(x);
}
