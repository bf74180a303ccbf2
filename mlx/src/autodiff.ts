// Automatic differentiation, as mlx.core exposes it: vjp, jvp, value_and_grad, grad, checkpoint.
//
// Each transform runs MLX's own C++ transform over the JS function (shim `autodiff` section), so
// the tape, the cotangent accumulation order and therefore every gradient bit are MLX's. JS
// functions are reached through one trampoline: the function is registered under an id for as
// long as MLX holds the closure (the call, or a checkpoint's graph node), then released.
//
// Ownership: the arrays a traced function receives are tracers owned by the transform and freed
// when the function returns (keep none of them: copy with `alias` what must outlive the call);
// the arrays it returns pass to the transform. Results are new arrays owned by the caller.
// Errors: a JS exception inside the traced function is rethrown as is once the native call has
// unwound; an MLX error becomes one MlxError. Nothing aborts.
import { FFIType, JSCallback } from "bun:ffi";
import { handles, MlxArray, own, ownVec } from "./array.ts";
import { checkPtr, checkStatus, MlxError } from "./errors.ts";
import { lib } from "./native.ts";
import { isDict, type Tree, treeArrays, treeFill } from "./utils.ts";

type FlatFn = (inputs: MlxArray[]) => MlxArray[];

const registry = new Map<number, FlatFn>();
let nextId = 1;
// The exception of the traced function that made the running native call fail.
let failure: { error: unknown } | null = null;

const trampoline = new JSCallback(
  (id: number, vec: number): number | null => {
    const inputs: MlxArray[] = [];
    let outputs: MlxArray[] = [];
    try {
      const fn = registry.get(id);
      if (fn === undefined) throw new MlxError("autodiff", `traced function ${id} was already released`);
      const n = checkStatus(lib.mlxb_vec_size(vec), "autodiff");
      for (let i = 0; i < n; i++) inputs.push(own(lib.mlxb_vec_get(vec, i), "autodiff"));
      outputs = fn(inputs);
      const hs = handles(outputs);
      return checkPtr(lib.mlxb_vec_new(hs.length ? hs : new Float64Array(1), hs.length), "autodiff");
    } catch (error) {
      failure = { error };
      return null;
    } finally {
      for (const a of outputs) if (!inputs.includes(a)) a.dispose();
      for (const a of inputs) a.dispose();
    }
  },
  { args: [FFIType.f64, FFIType.ptr], returns: FFIType.ptr },
);
checkStatus(lib.mlxb_set_trampoline(trampoline.ptr), "autodiff");

function drainReleased(): void {
  for (let id = lib.mlxb_next_released(); id >= 0; id = lib.mlxb_next_released()) registry.delete(id);
}

/** JS functions currently held by MLX closures (leak tests): 0 once their graphs are freed. */
export function liveTracedFunctions(): number {
  drainReleased();
  return registry.size;
}

const pad = (x: Float64Array) => (x.length ? x : new Float64Array(1));

/** Registers `fn`, runs the native transform with its id, returns the owned result vector. */
function invoke(op: string, fn: FlatFn, native: (id: number) => number | null): MlxArray[] {
  const id = nextId++;
  registry.set(id, fn);
  failure = null;
  let p: number | null;
  try {
    p = native(id);
  } finally {
    drainReleased();
  }
  if (p === null || p === 0) {
    const f = failure as { error: unknown } | null;
    failure = null;
    if (f !== null) throw f.error;
  }
  return ownVec(p, op);
}

const asList = (out: MlxArray | readonly MlxArray[], op: string): MlxArray[] => {
  const list = out instanceof MlxArray ? [out] : Array.isArray(out) ? [...out] : null;
  if (list === null || !list.every((a) => a instanceof MlxArray)) throw new MlxError(op, "the function must return an array or a list of arrays");
  return list;
};

export type ArrayFunction = (...inputs: MlxArray[]) => MlxArray | readonly MlxArray[];

/**
 * mx.vjp(fun, primals, cotangents) → [outputs, vjps]: the outputs of fun(...primals) and the
 * product of the cotangents with its Jacobian, one vjp per primal.
 */
export function vjp(fn: ArrayFunction, primals: readonly MlxArray[], cotangents: readonly MlxArray[]): [MlxArray[], MlxArray[]] {
  const p = handles(primals);
  const c = handles(cotangents);
  const res = invoke("vjp", (xs) => asList(fn(...xs), "vjp"), (id) => lib.mlxb_vjp(id, pad(p), p.length, pad(c), c.length));
  return [res.slice(0, res.length - primals.length), res.slice(res.length - primals.length)];
}

/** mx.jvp(fun, primals, tangents) → [outputs, jvps]: one jvp per output. */
export function jvp(fn: ArrayFunction, primals: readonly MlxArray[], tangents: readonly MlxArray[]): [MlxArray[], MlxArray[]] {
  const p = handles(primals);
  const t = handles(tangents);
  const res = invoke("jvp", (xs) => asList(fn(...xs), "jvp"), (id) => lib.mlxb_jvp(id, pad(p), p.length, pad(t), t.length));
  return [res.slice(0, res.length / 2), res.slice(res.length / 2)];
}

function typeName(x: unknown): string {
  if (x === null) return "None";
  if (Array.isArray(x)) return "list";
  if (isDict(x)) return "dict";
  return typeof x === "object" ? ((x as object).constructor?.name ?? "object") : typeof x;
}

function sortedArgnums(argnums: number | readonly number[], tag: string): number[] {
  const nums = (typeof argnums === "number" ? [argnums] : [...argnums]).sort((a, b) => a - b);
  if (nums.length === 0) throw new MlxError(tag, `${tag} Gradient wrt no argument requested`);
  if (!nums.every(Number.isInteger)) throw new MlxError(tag, `${tag} argument indices must be integers`);
  if (nums[0]! < 0) throw new MlxError(tag, `${tag} Can't compute the gradient of negative argument index ${nums[0]}`);
  for (let i = 1; i < nums.length; i++) {
    if (nums[i] === nums[i - 1]) throw new MlxError(tag, `${tag} Duplicate argument index ${nums[i]} is not allowed.`);
  }
  return nums;
}

/** (value, gradients): the value is fn's return tree, the gradients shaped like the differentiated argument(s). */
export type ValueAndGradFunction = (...args: any[]) => [Tree<MlxArray>, Tree<MlxArray>];

function valueAndGradImpl(fn: (...args: any[]) => Tree, argnums: number | readonly number[], tag: string, scalarOnly: boolean): ValueAndGradFunction {
  const nums = sortedArgnums(argnums, tag);
  return (...args: any[]) => {
    if (nums[nums.length - 1]! >= args.length) {
      throw new MlxError(
        tag,
        `${tag} Can't compute the gradient of argument index ${nums[nums.length - 1]} because the function is called with only ${args.length} positional arguments.`,
      );
    }
    // every array of every argument is an input; the differentiated arguments' arrays are the argnums
    const arrays: MlxArray[] = [];
    const gradIndices: number[] = [];
    for (let i = 0; i < args.length; i++) {
      const strict = nums.includes(i);
      const found = treeArrays(args[i] as Tree, strict, tag);
      if (strict) for (let k = 0; k < found.length; k++) gradIndices.push(arrays.length + k);
      arrays.push(...found);
    }
    let structure: Tree = null;
    const traced: FlatFn = (tracers) => {
      const out = fn(...treeFill(args, tracers));
      if (!(out instanceof MlxArray)) {
        if (scalarOnly) {
          throw new MlxError(tag, `${tag} The return value of the function whose gradient we want to compute should be a scalar array; but ${typeName(out)} was returned.`);
        }
        if (!Array.isArray(out) || out.length === 0 || !(out[0] instanceof MlxArray)) {
          throw new MlxError(
            tag,
            `${tag} The return value of the function whose gradient we want to compute should be either a scalar array or a tuple with the first value being a scalar array (Union[array, tuple[array, Any, ...]]); but ${typeName(out)} was returned.`,
          );
        }
      }
      structure = out;
      return treeArrays(out);
    };
    const argv = new Int32Array(gradIndices);
    const hs = handles(arrays);
    const res = invoke("value_and_grad", traced, (id) => lib.mlxb_value_and_grad(id, argv.length ? argv : new Int32Array(1), argv.length, pad(hs), hs.length));
    const grads = res.splice(res.length - gradIndices.length, gradIndices.length);
    const value = treeFill(structure, res) as Tree<MlxArray>;
    let at = 0;
    const gradTree = (arg: unknown) => {
      const n = treeArrays(arg as Tree).length;
      const t = treeFill(arg as Tree, grads.slice(at, at + n));
      at += n;
      return t as Tree<MlxArray>;
    };
    const g = nums.length === 1 ? gradTree(args[nums[0]!]) : nums.map((i) => gradTree(args[i]));
    return [value, g];
  };
}

/**
 * mx.value_and_grad(fun, argnums=0): a function returning [value, grads]. Arguments are trees
 * (lists, dicts, arrays; the non-differentiated ones may hold other leaves too); fun returns a
 * scalar array, or a list whose first element is one (the rest is returned, without gradient).
 * grads has the structure of argument `argnums` (a list of such trees for several argnums).
 */
export function valueAndGrad(fn: (...args: any[]) => Tree, argnums: number | readonly number[] = 0): ValueAndGradFunction {
  return valueAndGradImpl(fn, argnums, "[value_and_grad]", false);
}

/** mx.grad(fun, argnums=0): the gradients of a function returning one scalar array. */
export function grad(fn: (...args: any[]) => Tree, argnums: number | readonly number[] = 0): (...args: any[]) => Tree<MlxArray> {
  const vg = valueAndGradImpl(fn, argnums, "[grad]", true);
  return (...args: any[]) => {
    const [value, g] = vg(...args);
    (value as MlxArray).dispose();
    return g;
  };
}

/**
 * mx.checkpoint(fun): a function computing fun(...args) whose intermediates are not kept for the
 * backward pass: a vjp through it calls fun again (on the same thread, while the tape runs).
 * Every array in the argument trees is an input; the result has fun's return structure.
 */
export function checkpoint<F extends (...args: any[]) => Tree>(fn: F): (...args: Parameters<F>) => Tree<MlxArray> {
  return (...args: Parameters<F>) => {
    const arrays = treeArrays(args);
    let structure: Tree = null;
    let first = true;
    const traced: FlatFn = (tracers) => {
      const out = fn(...treeFill(args, tracers));
      // the forward call fixes the output structure; the recompute only supplies arrays
      if (first) structure = out;
      first = false;
      return treeArrays(out);
    };
    const hs = handles(arrays);
    const res = invoke("checkpoint", traced, (id) => lib.mlxb_checkpoint(id, pad(hs), hs.length));
    return treeFill(structure, res) as Tree<MlxArray>;
  };
}
