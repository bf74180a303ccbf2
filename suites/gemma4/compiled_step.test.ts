// A training step under mx.compile, as mlx-lm's trainer compiles it (inputs = outputs = model
// state, optimizer state, random state): nn.valueAndGrad + optimizer.update, 3 steps. The
// compiled TS step gives the eager TS step's bits, and both give mlx-lm's (eager and compiled):
// every loss, every trainable parameter and the whole optimizer state, byte for byte.
// compiled = eager holds on MLX's CPU backend only: on CUDA the fused elementwise kernels contract
// a multiply feeding an add (bench/cuda/repro_compile.py). There the relation is printed, not
// asserted: each TS run is bit-exact against the same mlx-lm run, so TS's verdict is mlx-lm's.
import { join } from "node:path";
import { describe, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import * as optim from "@mlx-bun/mlx/optimizers";
import { treeFlatten } from "@mlx-bun/mlx/utils";
import { sharedOracle } from "../../oracle/client.ts";
import { rawOf } from "../../oracle/compare.ts";
import { compareGrads, formatGradComparison } from "../../oracle/grad_compare.ts";
import { inputBytes } from "../../oracle/ops/runner.ts";
import type { RawTensor } from "../../oracle/tensor_diff.ts";
import { loadConfig } from "../../model/gemma4/config.ts";
import { valueAndGrad } from "../../model/gemma4/nn.ts";
import { loadModel } from "../../model/gemma4/weights.ts";
import { applySteps, type ModuleStep } from "./module_steps.ts";
import { CKPT_ROOT } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

const N = 3;
const TOKENS = [
  [1, 5, 9, 3, 7, 2, 11],
  [4, 4, 8, 1, 0, 6, 10],
];

interface Run {
  losses: RawTensor[];
  params: [string, RawTensor][];
  state: [string, RawTensor][];
}

const SCENARIOS: [string, string, ModuleStep[], { name: string; args: Record<string, unknown> }, () => optim.Optimizer][] = [
  [
    "c1_dense/f32",
    "last two layers' attention, AdamW",
    [{ op: "freeze" }, { op: "unfreeze", path: "model.layers.4.self_attn" }, { op: "unfreeze", path: "model.layers.5.self_attn" }],
    { name: "AdamW", args: { learning_rate: 0.01 } },
    () => new optim.AdamW(0.01),
  ],
  [
    "c3_e2b/bf16",
    "every parameter, SGD with momentum and a cosine schedule",
    [],
    { name: "SGD", args: { learning_rate: { name: "cosine_decay", args: [0.05, 2] }, momentum: 0.9 } },
    () => new optim.SGD(optim.cosineDecay(0.05, 2), { momentum: 0.9 }),
  ],
];

describe("compiled training step", () => {
  it.each(SCENARIOS)("%s, %s: compiled = eager = mlx-lm (eager and compiled)", async (ckpt, _what, steps, pyOpt, makeOpt) => {
    const oracle = await sharedOracle();
    const shape = [TOKENS.length, TOKENS[0]!.length, loadConfig(join(CKPT_ROOT, ckpt)).args.vocab_size];
    const run = (compiled: boolean): Run => {
      const { model } = loadModel(join(CKPT_ROOT, ckpt));
      const opt = makeOpt();
      using x = mx.array(TOKENS.flat(), [TOKENS.length, TOKENS[0]!.length], "int32");
      using w = mx.fromBytes(inputBytes({ shape, dtype: "float32", gen: "normal" }, `train|${ckpt}`), shape, "float32");
      applySteps(model, steps);
      const lvg = valueAndGrad(model, (t: MlxArray) => {
        using logits = model.call(t);
        using p = mx.multiply(logits, w);
        return mx.sum(p);
      });
      const body = (t: MlxArray): MlxArray => {
        const [loss, grads] = lvg(t);
        opt.update(model, grads);
        for (const [, g] of treeFlatten<MlxArray>(grads)) g.dispose();
        return loss as MlxArray;
      };
      mx.random.seed(0);
      const state = mx.combineStates(model.compileState(), opt.compileState(), mx.random.state);
      const step = compiled ? mx.compile(body, { inputs: state, outputs: state }) : null;
      try {
        const losses: RawTensor[] = [];
        for (let i = 0; i < N; i++) {
          using loss = step ? (step(x) as MlxArray) : body(x);
          mx.evaluate(loss, [...model.parameters().values()], treeFlatten<MlxArray>(opt.state).map(([, a]) => a));
          losses.push(rawOf(loss));
        }
        return {
          losses,
          params: treeFlatten<MlxArray>(model.trainableParameters()).map(([k, a]) => [k, rawOf(a)]),
          state: treeFlatten<MlxArray>(opt.state).map(([k, a]) => [k, rawOf(a)]),
        };
      } finally {
        step?.dispose();
        opt.state = {};
        model.dispose();
      }
    };
    const weights = { dtype: "float32" as const, shape, data: inputBytes({ shape, dtype: "float32", gen: "normal" }, `train|${ckpt}`) };
    const pyRun = async (compiled: boolean): Promise<Run> => {
      const r = await oracle.trainSteps({ checkpoint: ckpt, tokens: TOKENS, weights, optimizer: pyOpt, n: N, compiled, steps });
      return { losses: r.losses, params: r.params, state: r.state };
    };
    // The first difference between two runs (losses, then each tree named), or null.
    const difference = (a: Run, b: Run): string | null => {
      const [la, lb] = [a, b].map((r) => r.losses.map((l) => Buffer.from(l.data).toString("hex")));
      const step = la!.findIndex((h, i) => h !== lb![i]);
      if (step >= 0 || la!.length !== lb!.length) return `losses differ (first at step ${step + 1})`;
      for (const what of ["params", "state"] as const) {
        const mine = new Map(a[what].map(([k, t]) => [k, mx.fromBytes(t.data, t.shape, t.dtype as mx.Dtype)] as const));
        try {
          const cmp = compareGrads(mine, b[what]);
          if (cmp.missing.length || cmp.extra.length) return `${what}: missing ${cmp.missing.join(", ")}; extra ${cmp.extra.join(", ")}`;
          if (cmp.equal !== cmp.diffs.length) return formatGradComparison(cmp, what);
        } finally {
          for (const t of mine.values()) t.dispose();
        }
      }
      return null;
    };
    const same = (a: Run, b: Run, label: string) => {
      const d = difference(a, b);
      if (d !== null) throw new Error(`${label}: ${d}`);
    };
    const pyEager = await pyRun(false);
    const pyCompiled = await pyRun(true);
    const tsEager = run(false);
    const tsCompiled = run(true);
    same(tsEager, pyEager, "TS eager vs mlx-lm eager");
    same(tsCompiled, pyCompiled, "TS compiled vs mlx-lm compiled");
    if (mx.defaultDevice() === "cpu") same(tsCompiled, tsEager, "TS compiled vs TS eager");
    else console.log(`[compiled step] ${mx.backend()}: ${ckpt} compiled vs eager (TS = mlx-lm): ${difference(tsCompiled, tsEager) ?? "equal"}`);
  }, limit(300_000));
});
