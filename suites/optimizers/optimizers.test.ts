// @mlx-bun/mlx/optimizers against mlx.optimizers: SGD, Adam, AdamW with and without schedules
// on a mixed-dtype parameter tree, 6 steps of seeded gradients; after every step every parameter
// and every state array (step, learning_rate, m, v) is compared byte for byte.
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import type { Dtype, MlxArray } from "@mlx-bun/mlx";
import * as optim from "@mlx-bun/mlx/optimizers";
import { type Tree, treeFlatten, treeUnflatten } from "@mlx-bun/mlx/utils";
import { sharedOracle } from "../../oracle/client.ts";
import { compareGrads, formatGradComparison } from "../../oracle/grad_compare.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { inputBytes } from "../../oracle/ops/runner.ts";
import { limit } from "../../tests/time_limit.ts";

const STEPS = 6;
const PARAMS: [string, number[], Dtype][] = [
  ["layers.0.w", [4, 3], "float32"],
  ["layers.0.b", [3], "float32"],
  ["layers.1.w", [3, 5], "bfloat16"],
  ["embed.weight", [6, 2], "float16"],
  ["scale", [], "float32"],
];

type PySchedule = { name: string; args?: number[]; schedules?: PySchedule[]; boundaries?: number[] };
interface Case {
  name: string;
  python: { name: string; args: Record<string, unknown> };
  make: () => optim.Optimizer;
}

// mlx-lm's build_schedule with a warmup: join_schedules([linear_schedule(warmup_init, init, warmup), fn], [warmup + 1])
const warmupCosine: PySchedule = {
  name: "join_schedules",
  schedules: [{ name: "linear_schedule", args: [1e-4, 0.05, 2] }, { name: "cosine_decay", args: [0.05, 4, 1e-3] }],
  boundaries: [3],
};
const warmupCosineTs = () => optim.joinSchedules([optim.linearSchedule(1e-4, 0.05, 2), optim.cosineDecay(0.05, 4, 1e-3)], [3]);

const CASES: Case[] = [
  { name: "SGD", python: { name: "SGD", args: { learning_rate: 0.1 } }, make: () => new optim.SGD(0.1) },
  { name: "SGD momentum", python: { name: "SGD", args: { learning_rate: 0.05, momentum: 0.9 } }, make: () => new optim.SGD(0.05, { momentum: 0.9 }) },
  {
    name: "SGD momentum, dampening, weight decay",
    python: { name: "SGD", args: { learning_rate: 0.05, momentum: 0.8, dampening: 0.25, weight_decay: 0.01 } },
    make: () => new optim.SGD(0.05, { momentum: 0.8, dampening: 0.25, weightDecay: 0.01 }),
  },
  {
    name: "SGD nesterov, weight decay",
    python: { name: "SGD", args: { learning_rate: 0.03, momentum: 0.7, weight_decay: 0.1, nesterov: true } },
    make: () => new optim.SGD(0.03, { momentum: 0.7, weightDecay: 0.1, nesterov: true }),
  },
  { name: "Adam", python: { name: "Adam", args: { learning_rate: 0.01 } }, make: () => new optim.Adam(0.01) },
  {
    name: "Adam bias correction, betas, eps",
    python: { name: "Adam", args: { learning_rate: 0.02, betas: [0.8, 0.95], eps: 1e-6, bias_correction: true } },
    make: () => new optim.Adam(0.02, { betas: [0.8, 0.95], eps: 1e-6, biasCorrection: true }),
  },
  { name: "AdamW", python: { name: "AdamW", args: { learning_rate: 0.01 } }, make: () => new optim.AdamW(0.01) },
  {
    name: "AdamW bias correction, weight decay 0.1",
    python: { name: "AdamW", args: { learning_rate: 0.003, weight_decay: 0.1, bias_correction: true } },
    make: () => new optim.AdamW(0.003, { weightDecay: 0.1, biasCorrection: true }),
  },
  {
    name: "SGD + exponential_decay",
    python: { name: "SGD", args: { learning_rate: { name: "exponential_decay", args: [0.1, 0.9] }, momentum: 0.9 } },
    make: () => new optim.SGD(optim.exponentialDecay(0.1, 0.9), { momentum: 0.9 }),
  },
  {
    name: "SGD + step_decay",
    python: { name: "SGD", args: { learning_rate: { name: "step_decay", args: [0.1, 0.5, 2] } } },
    make: () => new optim.SGD(optim.stepDecay(0.1, 0.5, 2)),
  },
  {
    name: "Adam + cosine_decay",
    python: { name: "Adam", args: { learning_rate: { name: "cosine_decay", args: [0.01, 4] }, bias_correction: true } },
    make: () => new optim.Adam(optim.cosineDecay(0.01, 4), { biasCorrection: true }),
  },
  {
    name: "AdamW + linear_schedule",
    python: { name: "AdamW", args: { learning_rate: { name: "linear_schedule", args: [0.02, 0.002, 4] } } },
    make: () => new optim.AdamW(optim.linearSchedule(0.02, 0.002, 4)),
  },
  {
    name: "AdamW + warmup then cosine (join_schedules)",
    python: { name: "AdamW", args: { learning_rate: warmupCosine, weight_decay: 0.05 } },
    make: () => new optim.AdamW(warmupCosineTs(), { weightDecay: 0.05 }),
  },
];

function seeded(path: string, shape: number[], dtype: Dtype, seed: string): NpyRecord {
  return { dtype, shape, data: inputBytes({ shape, dtype, gen: "normal" }, `${seed}|${path}`) };
}

const toArray = (r: NpyRecord): MlxArray => mx.fromBytes(r.data, r.shape, r.dtype as Dtype);

describe("optimizers vs mlx.optimizers", () => {
  it.each(CASES.map((c) => [c.name, c] as const))("%s: parameters and state bit-exact over 6 steps", async (_, c) => {
    const oracle = await sharedOracle();
    const params0 = PARAMS.map(([p, shape, dt]) => [p, seeded(p, shape, dt, "param")] as const);
    const grads = Array.from({ length: STEPS }, (_, s) => PARAMS.map(([p, shape, dt]) => [p, seeded(p, shape, dt, `grad${s}`)] as const));
    const py = await oracle.optimizerSteps(c.python, params0, grads);
    expect(py).toHaveLength(STEPS);

    const opt = c.make();
    let params: Tree<MlxArray> = treeUnflatten(params0.map(([p, r]) => [p, toArray(r)] as const));
    try {
      for (let s = 0; s < STEPS; s++) {
        const g = treeUnflatten(grads[s]!.map(([p, r]) => [p, toArray(r)] as const));
        const next = opt.applyGradients(g, params);
        for (const [, a] of treeFlatten<MlxArray>(g)) a.dispose();
        for (const [, a] of treeFlatten<MlxArray>(params)) a.dispose();
        params = next;
        mx.evaluate(treeFlatten<MlxArray>(params).map(([, a]) => a), treeFlatten<MlxArray>(opt.state).map(([, a]) => a));
        for (const [what, mine, ref] of [
          ["parameters", params, py[s]!.params],
          ["state", opt.state, py[s]!.state],
        ] as const) {
          const cmp = compareGrads(mine, ref);
          expect(cmp.missing).toEqual([]);
          expect(cmp.extra).toEqual([]);
          if (cmp.equal !== cmp.diffs.length) throw new Error(`step ${s + 1}: ${formatGradComparison(cmp, what)}`);
        }
      }
    } finally {
      for (const [, a] of treeFlatten<MlxArray>(params)) a.dispose();
      opt.state = {};
    }
  }, limit(60_000));
});
