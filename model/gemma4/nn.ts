// The slice of mlx.nn this model needs (mlx/nn/layers/{base,linear,embedding,normalization,
// positional_encoding,quantized,activations}.py), with the exact call paths of the Python layers
// (mlx-binding.md §1.12, §2.4): every op, operand order and scalar is the one Python issues.
//
// Module mirrors mlx.nn.Module's dict-of-members: an MlxArray member whose name does not start
// with "_" is a parameter, a Module member (or a list of Modules) is a child. Parameter paths are
// the checkpoint keys ("model.layers.0.self_attn.q_proj.weight"). Members are visited in
// declaration order, which is the Python attribute order (named_modules, tree keys). The
// training API (trainableParameters, freeze, update, namedModules, valueAndGrad, checkpoint)
// follows mlx/nn/layers/base.py and mlx/nn/utils.py; its trees are Python's (mx.utils).
//
// Parameters start as lazy zero placeholders of the shape Python's constructor would create
// (never evaluated, so they cost no memory); load fills them with the checkpoint's arrays in the
// checkpoint's dtype (load_weights never casts, spec §0.5).

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { tunerMutated } from "../tuner/mutations.ts";
import { isDict, type Tree, treeArrays, treeFill, treeFlatten } from "@mlx-bun/mlx/utils";

export type QuantMode = "affine" | "mxfp4" | "nvfp4" | "mxfp8";

/** Arguments of to_quantized(group_size=, bits=, mode=). */
export interface QuantParams {
  group_size?: number | null;
  bits?: number | null;
  mode?: QuantMode;
}

/** A value of Python's Module dict: a parameter, a child module, or a list (of them, or of anything). */
export type MemberValue = MlxArray | Module | readonly unknown[];
/** filter_and_map's filter(module, key, value). */
export type MemberFilter = (m: Module, key: string, value: unknown) => boolean;
/** A tree of parameters (dicts keyed by member name, lists by index), as Module.parameters() in Python. */
export type ParamTree = Tree<MlxArray>;

export interface FreezeOptions {
  /** Also the submodules (default true). */
  recurse?: boolean;
  /** Only these member names (default: every parameter of each module). */
  keys?: string | string[];
  /** Check that the keys exist (default false). */
  strict?: boolean;
}

export abstract class Module {
  /** Python's _no_grad: member names excluded from trainable_parameters(). */
  private readonly _noGrad = new Set<string>();
  private _training = true;

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

  /** Frees every array of this module tree: the parameters and the private ones (`_freqs`, caches). */
  disposeArrays(seen = new Set<Module>()): void {
    if (seen.has(this)) return;
    seen.add(this);
    for (const v of Object.values(this)) {
      if (v instanceof mx.MlxArray) v.dispose();
      else if (v instanceof Module) v.disposeArrays(seen);
      else if (Array.isArray(v)) for (const m of v) if (m instanceof Module) m.disposeArrays(seen);
    }
  }

  /** Sets one parameter (load_weights); the previous placeholder is released. */
  setParameter(path: string, value: MlxArray): void {
    const [owner, key] = this.locate(path);
    const old = owner[key];
    owner[key] = value;
    if (old instanceof mx.MlxArray && old !== value) old.dispose();
  }

  // ---------------------------------------------------------------- training API (base.py)

  /**
   * The Module dict's items, in declaration order: arrays, child modules and lists (any JS array
   * member, as Python keeps every list attribute in the dict). Plain objects are configuration
   * records here (dataclasses in Python), not members; "_" members are private state.
   */
  *items(): Generator<[string, MemberValue]> {
    for (const [k, v] of Object.entries(this)) {
      if (k.startsWith("_")) continue;
      if (v instanceof mx.MlxArray || v instanceof Module || Array.isArray(v)) yield [k, v as MemberValue];
    }
  }

  has(key: string): boolean {
    for (const [k] of this.items()) if (k === key) return true;
    return false;
  }

  static isModule(value: unknown): value is Module {
    return value instanceof Module;
  }
  static validChildFilter: MemberFilter = (_m, _k, v) => v instanceof Module || Array.isArray(v) || isDict(v);
  static validParameterFilter: MemberFilter = (_m, k, v) =>
    (v instanceof Module || Array.isArray(v) || isDict(v) || v instanceof mx.MlxArray) && !k.startsWith("_");
  static trainableParameterFilter: MemberFilter = (m, k, v) => Module.validParameterFilter(m, k, v) && !m._noGrad.has(k);

  /** filter_and_map(filter_fn, map_fn, is_leaf_fn): the members kept by `filter`, recursively. */
  filterAndMap<L>(
    filter: MemberFilter,
    map: (v: any) => L = (v) => v as L,
    isLeaf: MemberFilter = (_m, _k, v) => !(v instanceof Module || Array.isArray(v) || isDict(v)),
  ): Record<string, Tree<L>> {
    const out: Record<string, Tree<L>> = {};
    for (const [k, v] of this.items()) if (filter(this, k, v)) out[k] = unwrap(this, k, v, filter, map, isLeaf);
    return out;
  }

  /** Python's parameters(): every array member as a tree (parameters() gives it flat). */
  parameterTree(): Record<string, ParamTree> {
    return this.filterAndMap<MlxArray>(Module.validParameterFilter);
  }

  /** trainable_parameters(): the parameters that are not frozen, as a tree. */
  trainableParameters(): Record<string, ParamTree> {
    return this.filterAndMap<MlxArray>(Module.trainableParameterFilter);
  }

  /** children(): the direct child modules (and lists of them). */
  children(): Record<string, Tree<Module>> {
    return this.filterAndMap<Module>(Module.validChildFilter, undefined, (_m, _k, v) => v instanceof Module);
  }

  /**
   * update(parameters, strict): replaces the parameters at the tree's paths. The module takes
   * ownership of the arrays it stores and disposes the arrays they replace (unless the same array
   * is stored again); `release = false` keeps them (a temporary swap the caller undoes).
   */
  update(parameters: Tree, strict = true, release = true): Module {
    walkMembers(this, parameters, strict, "parameter", (cur, value, put, descend) => {
      if (!(cur instanceof mx.MlxArray)) return descend();
      if (strict && !(value instanceof mx.MlxArray)) throw new Error(`Received invalid type: ${typeName(value)}.`);
      put();
      if (release && cur !== value) cur.dispose();
    });
    return this;
  }

  /** update_modules(modules, strict): replaces child modules at the tree's paths (nothing is disposed). */
  updateModules(modules: Tree<Module>, strict = true): Module {
    walkMembers(this, modules, strict, "sub-module", (cur, value, put, descend) => {
      if (cur instanceof Module && value instanceof Module) put();
      else if (cur instanceof Module || Array.isArray(cur) || isDict(cur)) descend(); // a Python Module is a dict
      else if (strict && !(isDict(value) && Object.keys(value).length === 0)) throw new Error(`Received invalid type: ${typeName(value)}.`);
    });
    return this;
  }

  /** apply_to_modules(fn): fn(path, module) for this module and every submodule, in Python's (stack) order. */
  applyToModules(fn: (path: string, m: Module) => void): Module {
    const stack: [string, Module][] = [["", this]];
    while (stack.length > 0) {
      const [prefix, mod] = stack.pop()!;
      fn(prefix, mod);
      stack.push(...treeFlatten<Module>(mod.children(), prefix ? `.${prefix}` : "", Module.isModule));
    }
    return this;
  }

  /** modules(): this module and every submodule. */
  modules(): Module[] {
    const out: Module[] = [];
    this.applyToModules((_, m) => out.push(m));
    return out;
  }

  /** named_modules(): [path, module] for this module ("") and every submodule. */
  namedModules(): [string, Module][] {
    const out: [string, Module][] = [];
    this.applyToModules((k, m) => out.push([k, m]));
    return out;
  }

  private validateKeys(keys: string | string[], strict: boolean): string[] {
    const list = typeof keys === "string" ? [keys] : keys;
    if (strict) for (const k of list) if (!this.has(k)) throw new Error(`Module doesn't contain member ${k}.`);
    return list;
  }

  private validateKeysRecursive(keys: string | string[]): void {
    const list = typeof keys === "string" ? [keys] : keys;
    const modules = this.modules();
    for (const k of list) if (!modules.some((m) => m.has(k))) throw new Error(`Module doesn't contain member ${k}.`);
  }

  /** freeze(recurse, keys, strict): excludes parameters from trainableParameters() (idempotent). */
  freeze({ recurse = true, keys, strict = false }: FreezeOptions = {}): Module {
    const impl = (strictKeys: boolean) => (_: string, m: Module) => {
      const local =
        keys ?? treeFlatten(m.filterAndMap((mm, k, v) => !(v instanceof Module) && Module.validParameterFilter(mm, k, v))).map(([k]) => k);
      for (const k of m.validateKeys(local, strictKeys)) m._noGrad.add(k);
    };
    if (recurse) {
      if (strict && keys !== undefined) this.validateKeysRecursive(keys);
      this.applyToModules(impl(strict && keys === undefined));
    } else impl(strict)("", this);
    return this;
  }

  /** unfreeze(recurse, keys, strict): makes parameters trainable again (idempotent). */
  unfreeze({ recurse = true, keys, strict = false }: FreezeOptions = {}): Module {
    const impl = (strictKeys: boolean) => (_: string, m: Module) => {
      if (keys === undefined) m._noGrad.clear();
      else for (const k of m.validateKeys(keys, strictKeys)) m._noGrad.delete(k);
    };
    if (recurse) {
      if (strict && keys !== undefined) this.validateKeysRecursive(keys);
      this.applyToModules(impl(strict && keys === undefined));
    } else impl(strict)("", this);
    return this;
  }

  /**
   * The parameters as compile state (Python's `mx.compile(step, inputs=model.state,
   * outputs=model.state)`): every parameter in tree order; set() stores the arrays through
   * update() (which disposes the ones they replace).
   */
  compileState(): mx.CompileState {
    return {
      get: () => treeArrays(this.parameterTree()).map(mx.alias),
      set: (arrays) => void this.update(treeFill(this.parameterTree(), arrays)),
    };
  }

  get training(): boolean {
    return this._training;
  }

  /** train(mode): sets training mode on this module and every submodule (Dropout reads it). */
  train(mode = true): Module {
    this.applyToModules((_, m) => (m._training = mode));
    return this;
  }

  /** eval(): train(false). */
  eval(): Module {
    return this.train(false);
  }
}

function typeName(v: unknown): string {
  if (v === null || v === undefined) return "NoneType";
  if (Array.isArray(v)) return "list";
  if (isDict(v)) return "dict";
  if (v instanceof mx.MlxArray) return "array";
  return typeof v === "object" ? (v as object).constructor.name : typeof v;
}

/**
 * The walk Module.update and update_modules share: `tree` over the members of `dst` (modules by
 * member name, lists by index); visit(current, new, put, descend) decides at each entry.
 */
function walkMembers(dst: Module, tree: unknown, strict: boolean, noun: string, visit: (cur: unknown, value: unknown, put: () => void, descend: () => void) => void): void {
  const step = (d: unknown, t: unknown) => {
    if (isDict(t)) {
      for (const [k, value] of Object.entries(t)) {
        if (!(d instanceof Module ? d.has(k) : isDict(d) && k in d)) {
          if (strict) throw new Error(`Module does not have ${noun} named "${k}".`);
          continue;
        }
        const rec = d as Record<string, unknown>;
        visit(rec[k], value, () => (rec[k] = value), () => step(rec[k], value));
      }
    } else if (Array.isArray(t)) {
      const list = d as unknown[];
      for (let i = 0; i < t.length; i++) {
        if (i >= list.length) {
          if (strict) throw new Error(`List index ${i} is out of bounds for destination of length ${list.length}.`);
          continue;
        }
        visit(list[i], t[i], () => (list[i] = t[i]), () => step(list[i], t[i]));
      }
    } else if (strict) throw new Error(`Received invalid type: ${typeName(t)}.`);
  };
  step(dst, tree);
}

/** base.py _unwrap. */
function unwrap<L>(model: Module, key: string, value: unknown, filter: MemberFilter, map: (v: any) => L, isLeaf: MemberFilter): Tree<L> {
  if (isLeaf(model, key, value)) return map(value);
  if (value instanceof Module) return value.filterAndMap(filter, map, isLeaf);
  if (isDict(value)) {
    const out: Record<string, Tree<L>> = {};
    for (const [k, v] of Object.entries(value)) {
      const tk = `${key}.${k}`;
      out[k] = filter(model, tk, v) ? unwrap(model, tk, v, filter, map, isLeaf) : {};
    }
    return out;
  }
  if (Array.isArray(value)) {
    return value.map((v, i) => {
      const tk = `${key}.${i}`;
      return filter(model, tk, v) ? unwrap(model, tk, v, filter, map, isLeaf) : {};
    });
  }
  throw new Error("Unexpected leaf found while traversing the module");
}

// ------------------------------------------------------------------ nn.value_and_grad, nn.checkpoint (utils.py)

/** Runs fn with `params` swapped into the module (Python's inner_fn: module.update(params)), then restores. */
function withParams<R>(module: Module, params: Tree, fn: () => R): R {
  const before = module.trainableParameters();
  module.update(params, true, false);
  try {
    return fn();
  } finally {
    module.update(before, false, false);
  }
}

/**
 * nn.value_and_grad(model, fn): a function returning [value, grads] where grads is keyed like
 * model.trainableParameters(). fn runs with the parameters replaced by the transform's tracers
 * (restored when it returns; Python leaves the tracers in, whose values are the same).
 */
export function valueAndGrad<A extends unknown[]>(model: Module, fn: (...args: A) => Tree): (...args: A) => [Tree<MlxArray>, Record<string, ParamTree>] {
  const vg = mx.valueAndGrad((params: Tree, ...args: A) => withParams(model, params, () => fn(...args)));
  return (...args: A) => {
    const [value, grads] = vg(model.trainableParameters(), ...args);
    return [value, grads as Record<string, ParamTree>];
  };
}

/**
 * nn.checkpoint(module, fn): fn (default: module.call) computed without keeping its intermediates
 * for the backward pass, which recomputes them; the module's trainable parameters are inputs.
 */
export function checkpoint<A extends unknown[]>(module: Module, fn?: (...args: A) => Tree): (...args: A) => Tree<MlxArray> {
  const body = fn ?? ((...args: A) => (module as unknown as { call: (...a: A) => Tree }).call(...args));
  const ck = mx.checkpoint((params: Tree, ...args: A) => withParams(module, params, () => body(...args)));
  return (...args: A) => ck(module.trainableParameters(), ...args);
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
    this.freeze(); // as Python's constructor: quantized parameters are not trainable
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
    this.freeze(); // as Python's constructor: quantized parameters are not trainable
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
