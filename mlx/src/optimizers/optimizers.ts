// mlx/optimizers/optimizers.py: Optimizer, SGD, Adam, AdamW, op for op as Python computes them
// (same operand order, same weak scalars: the documented float hyperparameters and the floats
// Python computes from them, such as 1 - b1, are Python floats; `1 - x` with an array is the
// Python int 1).
//
// Ownership: the optimizer owns its state tree (step, learning_rate, per-parameter m/v); every
// update replaces those arrays and disposes the replaced ones, so read them, keep none across
// updates (alias what must outlive one). applyGradients returns new parameter arrays the caller
// owns; update(model, grads) hands them to model.update. Gradients stay the caller's.
import { MlxArray, scalar } from "../array.ts";
import type { CompileState } from "../compile.ts";
import { MlxError } from "../mlx_error.ts";
import { add, alias, astype, divide, multiply, power, rsqrt, sqrt, square, subtract, zerosLike } from "../ops.ts";
import { pyFloat, type Scalar } from "../scalar.ts";
import { isDict, type Tree, treeArrays, treeFill, treeMap } from "../utils.ts";
import type { Schedule } from "./schedulers.ts";

/** What Optimizer.update needs of a model (nn.Module): its parameters and Module.update. */
export interface Updatable {
  parameterTree(): Tree<MlxArray>;
  update(parameters: Tree<MlxArray>): unknown;
}

export type StateTree = Record<string, Tree<MlxArray>>;
/** One parameter's state (m, v, ...). */
export type ParamState = Record<string, MlxArray>;

/** Replaces state[key], disposing the array it held. */
function put(state: Record<string, unknown>, key: string, value: MlxArray): void {
  const old = state[key];
  state[key] = value;
  if (old instanceof MlxArray && old !== value) old.dispose();
}

export abstract class Optimizer {
  #initialized = false;
  #state: StateTree;
  readonly #schedulers = new Map<string, Schedule>();

  constructor(schedulers: Record<string, Schedule> = {}) {
    this.#state = { step: scalar(0, "uint64") };
    for (const [k, v] of Object.entries(schedulers)) this.#schedulers.set(k, v);
  }

  /** update(model, gradients): model.update(applyGradients(gradients, model)). */
  update(model: Updatable, gradients: Tree<MlxArray>): void {
    model.update(this.applyGradients(gradients, model.parameterTree()));
  }

  /** init(parameters): per-parameter state for every leaf of the tree (optional: the first update does it). */
  init(parameters: Tree<MlxArray>): void {
    const updateState = (params: unknown, state: unknown): unknown => {
      if (Array.isArray(params)) {
        const s = [...(state as unknown[])];
        for (let i = 0; i < s.length; i++) s[i] = updateState(params[i], s[i]);
        if (s.length !== params.length) s.push(...params.slice(s.length).map((p) => treeMap(() => ({}), p as Tree)));
        return s;
      }
      if (isDict(params)) {
        const s = state as Record<string, unknown>;
        for (const [k, v] of Object.entries(params)) s[k] = k in s ? updateState(v, s[k]) : treeMap(() => ({}), v as Tree);
        return s;
      }
      return state;
    };
    updateState(parameters, this.#state);
    treeMap((p: MlxArray, s: ParamState) => (Object.keys(s).length > 0 ? s : this.initSingle(p, s)), parameters, this.#state);
    this.#initialized = true;
  }

  /** init_single(parameter, state): fills one parameter's state. */
  protected abstract initSingle(parameter: MlxArray, state: ParamState): ParamState;

  /**
   * apply_gradients(gradients, parameters): schedules evaluated at the current step, the step
   * incremented, then every parameter updated; returns the new parameters (gradients' structure).
   */
  applyGradients(gradients: Tree<MlxArray>, parameters: Tree<MlxArray>): Tree<MlxArray> {
    if (!this.#initialized) this.init(gradients);
    for (const [name, schedule] of this.#schedulers) put(this.#state, name, schedule(this.step));
    put(this.#state, "step", add(this.step, 1));
    return treeMap((g: MlxArray, p: MlxArray, s: ParamState) => this.applySingle(g, p, s), gradients, parameters, this.#state);
  }

  /** apply_single(gradient, parameter, state): the new parameter; replaces the state's arrays. */
  protected abstract applySingle(gradient: MlxArray, parameter: MlxArray, state: ParamState): MlxArray;

  /** The state tree (owned by the optimizer). */
  get state(): StateTree {
    return this.#state;
  }

  /** Replaces the state (taking ownership; the old arrays are disposed); the next update re-inits missing entries. */
  set state(state: StateTree) {
    const keep = new Set(treeArrays(state));
    for (const a of treeArrays(this.#state)) if (!keep.has(a)) a.dispose();
    this.#initialized = false;
    this.#state = state;
  }

  get step(): MlxArray {
    return this.#state.step as MlxArray;
  }

  get learningRate(): MlxArray {
    return this.#state.learning_rate as MlxArray;
  }

  /** learning_rate = value: mx.array(value) (a number is a Python float). */
  set learningRate(value: number | MlxArray) {
    put(this.#state, "learning_rate", value instanceof MlxArray ? alias(value) : scalar(pyFloat(value)));
  }

  /** _maybe_schedule(name, param): a schedule is registered and evaluated at the current step. */
  protected maybeSchedule(name: string, param: number | Scalar | Schedule): void {
    if (typeof param === "function") {
      this.#schedulers.set(name, param);
      put(this.#state, name, param(this.step));
    } else put(this.#state, name, scalar(typeof param === "number" ? pyFloat(param) : param));
  }

  /**
   * The state as compile state (Python's `mx.compile(step, inputs=optimizer.state,
   * outputs=optimizer.state)`): its arrays in tree order; set() writes them back in place.
   */
  compileState(): CompileState {
    return {
      get: () => treeArrays(this.#state).map(alias),
      set: (arrays) => {
        const old = treeArrays(this.#state);
        this.#state = treeFill(this.#state, arrays);
        const keep = new Set(arrays);
        for (const a of old) if (!keep.has(a)) a.dispose();
      },
    };
  }
}

export interface SGDOptions {
  momentum?: number;
  weightDecay?: number;
  dampening?: number;
  nesterov?: boolean;
}

/** SGD(learning_rate, momentum=0, weight_decay=0, dampening=0, nesterov=False). */
export class SGD extends Optimizer {
  readonly momentum: number;
  readonly weightDecay: number;
  readonly dampening: number;
  readonly nesterov: boolean;

  constructor(learningRate: number | Schedule, { momentum = 0.0, weightDecay = 0.0, dampening = 0.0, nesterov = false }: SGDOptions = {}) {
    if (nesterov && (momentum <= 0 || dampening !== 0)) throw new MlxError("SGD", "Nesterov momentum requires a momentum and zero dampening.");
    super();
    this.maybeSchedule("learning_rate", learningRate);
    this.momentum = momentum;
    this.weightDecay = weightDecay;
    this.dampening = dampening;
    this.nesterov = nesterov;
  }

  protected initSingle(parameter: MlxArray, state: ParamState): ParamState {
    state.v = zerosLike(parameter);
    return state;
  }

  protected applySingle(gradient: MlxArray, parameter: MlxArray, state: ParamState): MlxArray {
    using wd = this.weightDecay !== 0 ? multiply(parameter, pyFloat(this.weightDecay)) : null;
    using g = wd ? add(gradient, wd) : null; // gradient + weight_decay * parameter
    const grad = g ?? gradient;
    using lr = astype(this.learningRate, grad.dtype);
    if (this.momentum <= 0) {
      using step = multiply(lr, grad);
      return subtract(parameter, step);
    }
    using mv = multiply(state.v!, pyFloat(this.momentum)); // momentum * v
    using dg = this.dampening > 0 ? multiply(grad, pyFloat(1 - this.dampening)) : null;
    const v = add(mv, dg ?? grad); // v += (1 - dampening) * gradient, or v += gradient
    using nest = this.nesterov ? multiply(v, pyFloat(this.momentum)) : null;
    using upd = nest ? add(grad, nest) : null; // gradient + momentum * v
    put(state, "v", v);
    using step = multiply(lr, upd ?? v);
    return subtract(parameter, step);
  }
}

export interface AdamOptions {
  betas?: [number, number];
  eps?: number;
  biasCorrection?: boolean;
}

/** Adam(learning_rate, betas=(0.9, 0.999), eps=1e-8, bias_correction=False). */
export class Adam extends Optimizer {
  readonly betas: [number, number];
  readonly eps: number;
  readonly biasCorrection: boolean;

  constructor(learningRate: number | Schedule, { betas = [0.9, 0.999], eps = 1e-8, biasCorrection = false }: AdamOptions = {}) {
    super();
    betas.forEach((beta, i) => {
      if (!(beta >= 0.0 && beta < 1.0)) throw new MlxError("Adam", `Adam beta${i + 1} should be in [0, 1), ${beta} was provided instead`);
    });
    if (!(eps >= 0.0)) throw new MlxError("Adam", `Adam epsilon should be >=0, ${eps} was provided instead`);
    this.maybeSchedule("learning_rate", learningRate);
    this.betas = betas;
    this.eps = eps;
    this.biasCorrection = biasCorrection;
  }

  protected initSingle(parameter: MlxArray, state: ParamState): ParamState {
    state.m = zerosLike(parameter);
    state.v = zerosLike(parameter);
    return state;
  }

  protected applySingle(gradient: MlxArray, parameter: MlxArray, state: ParamState): MlxArray {
    using lr = astype(this.learningRate, gradient.dtype);
    const [b1, b2] = this.betas;
    const step = this.step;
    using m1 = multiply(state.m!, pyFloat(b1));
    using m2 = multiply(gradient, pyFloat(1 - b1));
    const m = add(m1, m2); // b1 * m + (1 - b1) * gradient
    using v1 = multiply(state.v!, pyFloat(b2));
    using g2 = square(gradient);
    using v2 = multiply(g2, pyFloat(1 - b2));
    const v = add(v1, v2); // b2 * v + (1 - b2) * mx.square(gradient)
    put(state, "m", m);
    put(state, "v", v);
    if (this.biasCorrection) {
      using p1 = power(pyFloat(b1), step); // b1**step
      using d1 = subtract(1, p1);
      using q1 = divide(lr, d1);
      using c1 = astype(q1, gradient.dtype); // (lr / (1 - b1**step)).astype(gradient.dtype)
      using p2 = power(pyFloat(b2), step);
      using d2 = subtract(1, p2);
      using r2 = rsqrt(d2);
      using c2 = astype(r2, gradient.dtype); // mx.rsqrt(1 - b2**step).astype(gradient.dtype)
      using numerator = multiply(c1, m);
      using sv = sqrt(v);
      using sc = multiply(sv, c2);
      using denominator = add(sc, pyFloat(this.eps)); // mx.sqrt(v) * c2 + eps
      using upd = divide(numerator, denominator);
      return subtract(parameter, upd);
    }
    using lm = multiply(lr, m);
    using sv = sqrt(v);
    using den = add(sv, pyFloat(this.eps));
    using upd = divide(lm, den); // lr * m / (mx.sqrt(v) + eps)
    return subtract(parameter, upd);
  }
}

export interface AdamWOptions extends AdamOptions {
  weightDecay?: number;
}

/** AdamW(learning_rate, betas, eps, weight_decay=0.01, bias_correction=False): Adam on parameter * (1 - lr * weight_decay). */
export class AdamW extends Adam {
  readonly weightDecay: number;

  constructor(learningRate: number | Schedule, { weightDecay = 0.01, ...adam }: AdamWOptions = {}) {
    super(learningRate, adam);
    this.weightDecay = weightDecay;
  }

  protected override applySingle(gradient: MlxArray, parameter: MlxArray, state: ParamState): MlxArray {
    using lr = astype(this.learningRate, gradient.dtype);
    using lw = multiply(lr, pyFloat(this.weightDecay));
    using f = subtract(1, lw);
    using decayed = multiply(parameter, f); // parameter * (1 - lr * weight_decay)
    return super.applySingle(gradient, decayed, state);
  }
}
