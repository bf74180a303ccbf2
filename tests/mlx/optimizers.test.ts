// Optimizers without the oracle (their bits: suites/optimizers): Python's argument checks and
// messages, lazy state initialisation, schedules evaluated before the step increment, ownership.
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import * as optim from "@mlx-bun/mlx/optimizers";
import { type Tree, treeFlatten } from "@mlx-bun/mlx/utils";

const leaves = (t: Tree<MlxArray>) => treeFlatten<MlxArray>(t).map(([, a]) => a);

describe("optimizers", () => {
  it("reject what mlx.optimizers rejects", () => {
    expect(() => new optim.SGD(0.1, { nesterov: true })).toThrow("Nesterov momentum requires a momentum and zero dampening.");
    expect(() => new optim.SGD(0.1, { nesterov: true, momentum: 0.9, dampening: 0.1 })).toThrow("Nesterov momentum requires");
    expect(() => new optim.Adam(0.1, { betas: [0.9, 1.0] })).toThrow("Adam beta2 should be in [0, 1), 1 was provided instead");
    expect(() => new optim.AdamW(0.1, { eps: -1 })).toThrow("Adam epsilon should be >=0, -1 was provided instead");
    expect(() => optim.cosineDecay(0.1, 0)).toThrow("decay_steps must be greater than 0, but got 0.");
    expect(() => optim.stepDecay(0.1, 0.9, 0)).toThrow("step_size must be greater than 0, but got 0.");
    expect(() => optim.linearSchedule(0, 0.1, 0)).toThrow("steps must be greater than 0, but got 0.");
    expect(() => optim.joinSchedules([], [])).toThrow("Must provide at least 1 schedule to join.");
    expect(() => optim.joinSchedules([optim.linearSchedule(0, 1, 2)], [3])).toThrow("Received 1 boundaries but expected 0.");
  });

  it("state: uint64 step and float32 learning rate; per-parameter state appears with the first update; schedules see the step before it is incremented", () => {
    const opt = new optim.Adam(optim.linearSchedule(0, 1, 4));
    expect(opt.step.dtype).toBe("uint64");
    expect(opt.learningRate.dtype).toBe("float32");
    expect(Object.keys(opt.state)).toEqual(["step", "learning_rate"]);
    using w = mx.array([1, 2], [2], "bfloat16");
    using g = mx.array([0.5, -0.5], [2], "bfloat16");
    const lrs: number[] = [];
    let p: MlxArray = mx.alias(w);
    for (let i = 0; i < 3; i++) {
      const next = opt.applyGradients({ w: g }, { w: p }) as { w: MlxArray };
      p.dispose();
      p = next.w;
      lrs.push(opt.learningRate.item() as number);
    }
    expect(lrs).toEqual([0, 0.25, 0.5]);
    expect(opt.step.item()).toBe(3);
    const st = opt.state.w as Record<string, MlxArray>;
    expect(Object.keys(st)).toEqual(["m", "v"]);
    expect(st.m!.dtype).toBe("bfloat16");
    expect(p.dtype).toBe("bfloat16");
    p.dispose();
    opt.state = {};
  });

  it("500 updates on a tree: the live handle count stays flat", () => {
    const params = { a: [mx.zeros([3], "float32"), mx.ones([2, 2], "float16")], b: { c: mx.ones([4], "float32") } };
    const grads = { a: [mx.ones([3], "float32"), mx.ones([2, 2], "float16")], b: { c: mx.ones([4], "float32") } };
    for (const make of [() => new optim.SGD(0.1, { momentum: 0.9, weightDecay: 0.01 }), () => new optim.AdamW(optim.cosineDecay(0.1, 50), { biasCorrection: true })]) {
      const opt = make();
      let p: Tree<MlxArray> = params;
      const step = (i: number) => {
        const next = opt.applyGradients(grads, p);
        if (p !== params) for (const a of leaves(p)) a.dispose();
        p = next;
        if (i % 10 === 0) mx.evaluate(leaves(p), leaves(opt.state));
      };
      step(0);
      const h0 = mx.liveHandles();
      for (let i = 1; i <= 500; i++) step(i);
      expect(mx.liveHandles()).toBe(h0);
      for (const a of leaves(p)) a.dispose();
      opt.state = {};
    }
    for (const a of [...leaves(params), ...leaves(grads)]) a.dispose();
  });
});
