// Gradient parity of the ops: every forward case of the op table (cases.ts) becomes an mx.vjp
// case with the same inputs: its floating inputs are the primals (the others stay constants), and
// one seeded cotangent per output (same shape and dtype) is appended as extra inputs. Both sides
// return the op's outputs, then one vjp per primal; the forward runner (runner.ts) runs and
// compares them, in worker processes (isolated.ts, table "vjp"), so the results have its shape
// and its backend-aware treatment. Python side: the `_vjp` parameter of ops_table.py run_op.
import * as mx from "@mlx-bun/mlx";
import type { Dtype, MlxArray } from "@mlx-bun/mlx";
import type { Operand } from "@mlx-bun/mlx/ops";
import { type ArraySpec, CASES, type InputSpec, type OpCase, type Params } from "./cases.ts";
import { type IsolatedRun, runCasesIsolated, WORKER_SCRIPT } from "./isolated.ts";
import { applyView, type CaseResult, coverage, type Coverage } from "./runner.ts";

const FLOAT: ReadonlySet<Dtype> = new Set(["float32", "float16", "bfloat16", "float64"]);

/** Exposed ops without a gradient case, with the reason. */
export const NOT_DIFFERENTIABLE: Record<string, string> = {
  ...Object.fromEntries(["equal", "notEqual", "greater", "greaterEqual", "less", "lessEqual"].map((o) => [o, "comparison: bool output"])),
  ...Object.fromEntries(["isnan", "isinf", "isfinite", "isposinf", "isneginf"].map((o) => [o, "predicate: bool output"])),
  ...Object.fromEntries(["logicalNot", "logicalAnd", "logicalOr", "logicalXor"].map((o) => [o, "logical: bool output"])),
  ...Object.fromEntries(["bitwiseAnd", "bitwiseOr", "bitwiseXor", "bitwiseInvert", "leftShift", "rightShift"].map((o) => [o, "bitwise: integer inputs and output"])),
  ...Object.fromEntries(["argmax", "argmin", "argsort", "argpartition"].map((o) => [o, "index output (uint32)"])),
  ...Object.fromEntries(["zeros", "ones", "eye", "tri", "arange", "linspace"].map((o) => [o, "creation: no array input"])),
  ...Object.fromEntries(["random.key", "random.seed", "random.split", "random.uniform", "random.normal"].map((o) => [o, "random: no floating input (a seed or a uint32 key)"])),
  ...Object.fromEntries(["all", "any"].map((o) => [o, "reduction to bool"])),
  "random.categorical": "random: integer samples",
  "random.bernoulli": "random: bool samples",
  view: "reinterprets the bits; MLX has no vjp for View ('[Primitive::vjp] Not implemented for View')",
};

/** Inputs that are floating but not differentiable (MLX raises for a gradient w.r.t. them). */
const CONSTANT_INPUTS: Record<string, (i: number, c: OpCase) => boolean> = {
  // Pad::vjp returns the padded array's cotangent only; with the pad value as a primal MLX reads
  // past its result (a segfault in Python as in TS)
  pad: (i) => i === 1,
  // the vjp w.r.t. scales and biases flattens x's leading axes, which fails for a 1-D x (both sides)
  quantizedMatmul: (i, c) => i > 0 && (c.inputs[0] as ArraySpec).shape.length === 1,
};

/** Cases libmlx's CPU backend cannot differentiate (both sides raise), with the reason. */
const UNSUPPORTED_ON_CPU: [(c: OpCase) => boolean, string][] = [
  [(c) => c.op === "gatherQmm" && (c.inputs[0] as ArraySpec).dtype !== "float32", "gather_qmm's vjp w.r.t. x is a gather_mm, float32 only on the CPU"],
];

export interface VjpCase extends OpCase {
  /** The forward case it derives from. */
  forward: string;
  diff: number[];
}

function isFloatSpec(s: InputSpec): s is ArraySpec {
  return !("scalar" in s) && FLOAT.has(s.dtype);
}

/**
 * Shapes and dtypes of the case's outputs, from a lazy run on zeros (nothing is evaluated), on the
 * CPU device: a GPU refuses some graphs as they are built (float64 on CUDA), and such a case must
 * still reach the workers, whose two sides report it unsupported there.
 */
function outputSpecs(c: OpCase): { shape: number[]; dtype: Dtype }[] {
  const owned: MlxArray[] = [];
  const device = mx.defaultDevice();
  mx.setDefaultDevice("cpu");
  try {
    const xs: Operand[] = c.inputs.map((s) => {
      if ("scalar" in s) return s.kind === "bool" ? s.scalar !== 0 : s.kind === "int" ? mx.pyInt(s.scalar) : mx.pyFloat(s.scalar);
      const base = mx.zeros(s.shape, s.dtype);
      owned.push(base);
      const v = applyView(base, s.view);
      if (v !== base) owned.push(v);
      return v;
    });
    const r = c.run(xs, c.params);
    const outs = Array.isArray(r) ? r : [r];
    const specs = outs.map((o) => ({ shape: o.shape, dtype: o.dtype }));
    for (const o of outs) if (!owned.includes(o)) o.dispose();
    return specs;
  } finally {
    for (const a of owned) a.dispose();
    mx.setDefaultDevice(device);
  }
}

function vjpCase(c: OpCase, cpu: boolean): VjpCase | null {
  if (c.op in NOT_DIFFERENTIABLE) return null;
  if (cpu && UNSUPPORTED_ON_CPU.some(([skip]) => skip(c))) return null;
  const constant = CONSTANT_INPUTS[c.op];
  const diff = c.inputs.flatMap((s, i) => (isFloatSpec(s) && !constant?.(i, c) ? [i] : []));
  if (diff.length === 0) return null;
  const outs = outputSpecs(c);
  if (!outs.some((o) => FLOAT.has(o.dtype))) return null;
  const k = c.inputs.length;
  const params: Params = { ...c.params, _vjp: { inputs: k, diff } };
  const run = (xs: Operand[], p: Params): MlxArray[] => {
    const primals = diff.map((i) => xs[i] as MlxArray);
    const [o, v] = mx.vjp(
      (...ps) => {
        const full = xs.slice(0, k);
        diff.forEach((i, j) => (full[i] = ps[j]!));
        return c.run(full, p);
      },
      primals,
      xs.slice(k) as MlxArray[],
    );
    return [...o, ...v];
  };
  // integer outputs (quantize's packed weights) get zero cotangents
  const cotangents: ArraySpec[] = outs.map((o) => ({ shape: o.shape, dtype: o.dtype, gen: FLOAT.has(o.dtype) ? "normal" : { values: [0] } }));
  // the same id as the forward case: the runner seeds inputs by id and position, so the primals
  // get the forward case's bytes and the cotangents (later positions) their own
  return { id: c.id, op: c.op, oracle: c.oracle, inputs: [...c.inputs, ...cotangents], params, run, forward: c.id, diff };
}

let cached: VjpCase[] | null = null;

/** The gradient cases, derived once from the forward table. */
export function vjpCases(): readonly VjpCase[] {
  const cpu = mx.defaultDevice() === "cpu";
  cached ??= CASES.flatMap((c) => vjpCase(c, cpu) ?? []);
  return cached;
}

/** Runs gradient cases in worker processes (isolated.ts), as the forward table runs. */
export function runVjpCasesIsolated(cases: readonly VjpCase[], onResult?: (r: CaseResult, done: number) => void): Promise<IsolatedRun> {
  return runCasesIsolated(cases, onResult, WORKER_SCRIPT, "vjp");
}

/** Coverage over the differentiable exposed ops (exposed minus NOT_DIFFERENTIABLE). */
export function vjpCoverage(exposed: string[], cases: readonly VjpCase[], results: CaseResult[]): Coverage {
  return coverage(exposed.filter((o) => !(o in NOT_DIFFERENTIABLE)), cases, results);
}
