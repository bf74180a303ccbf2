// Autodiff in the binding: vjp, jvp, valueAndGrad (argument trees, argnums), grad, checkpoint.
// Bits come from MLX's own transforms (op-level parity with Python's mx.vjp: suites/ops/vjp.test.ts);
// here: the tree and argnums semantics of Python's value_and_grad, the one error path, ownership.
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { limit } from "../time_limit.ts";

const f32 = (v: number[], shape = [v.length]) => mx.array(v, shape, "float32");
const bytes = (a: MlxArray) => Buffer.from(a.toBytes()).toString("hex");

async function settle(): Promise<void> {
  for (let i = 0; i < 3; i++) {
    Bun.gc(true);
    await Bun.sleep(0);
  }
}

describe("value_and_grad", () => {
  it("differentiates a dict and a list argument; the gradients have their structure", () => {
    using w = f32([1, -2, 3]);
    using b = f32([0.5]);
    using x = f32([2, 1, -1]);
    const loss = (p: { w: MlxArray; b: [MlxArray] }, y: MlxArray) => mx.sum(mx.add(mx.multiply(p.w, y), p.b[0]));
    const [v, g] = mx.valueAndGrad(loss)({ w, b: [b] }, x);
    const gt = g as { w: MlxArray; b: MlxArray[] };
    expect((v as MlxArray).toNumbers()).toEqual([2 - 2 - 3 + 1.5]);
    expect(Object.keys(gt)).toEqual(["w", "b"]);
    expect(gt.w.toNumbers()).toEqual([2, 1, -1]);
    expect(gt.b).toHaveLength(1);
    expect(gt.b[0]!.toNumbers()).toEqual([3]);
    for (const a of [v as MlxArray, gt.w, gt.b[0]!]) a.dispose();
  });

  it("argnums: one index gives that argument's tree, several a list of trees; same bits as vjp", () => {
    using a = f32([0.3, -1.7, 2.2]);
    using c = f32([1.1, 0.4, -0.9]);
    const fn = (x: MlxArray, y: MlxArray) => mx.sum(mx.multiply(mx.sin(x), mx.exp(y)));
    const [v1, g1] = mx.valueAndGrad(fn, 1)(a, c);
    const [v2, g2] = mx.valueAndGrad(fn, [1, 0])(a, c);
    using one = mx.scalar(mx.pyFloat(1), "float32");
    const [outs, vjps] = mx.vjp(fn, [a, c], [one]);
    const [gx, gy] = g2 as MlxArray[];
    expect(bytes(g1 as MlxArray)).toBe(bytes(vjps[1]!));
    expect(bytes(gx!)).toBe(bytes(vjps[0]!));
    expect(bytes(gy!)).toBe(bytes(vjps[1]!));
    expect(bytes(v1 as MlxArray)).toBe(bytes(outs[0]!));
    for (const t of [v1, g1, v2, gx, gy, ...outs, ...vjps]) (t as MlxArray).dispose();
  });

  it("returns auxiliary outputs (any tree) after the loss, without gradient flowing through them", () => {
    using x = f32([1, 2]);
    const [v, g] = mx.valueAndGrad((p: MlxArray) => {
      const y = mx.multiply(p, p);
      return [mx.sum(y), { sq: y, n: 2 }];
    })(x);
    const [loss, aux] = v as [MlxArray, { sq: MlxArray; n: number }];
    expect(loss.toNumbers()).toEqual([5]);
    expect(aux.sq.toNumbers()).toEqual([1, 4]);
    expect(aux.n).toBe(2);
    expect((g as MlxArray).toNumbers()).toEqual([2, 4]);
    for (const a of [loss, aux.sq, g as MlxArray]) a.dispose();
  });

  it("non-differentiated arguments may hold non-array leaves; differentiated ones may not", () => {
    using x = f32([3]);
    const fn = (p: MlxArray, opts: { scale: number; tag: string }) => mx.sum(mx.multiply(p, opts.scale));
    const [v, g] = mx.valueAndGrad(fn)(x, { scale: 2, tag: "t" });
    expect((g as MlxArray).toNumbers()).toEqual([2]);
    (v as MlxArray).dispose();
    (g as MlxArray).dispose();
    expect(() => mx.valueAndGrad(fn, 1)(x, { scale: 2, tag: "t" })).toThrow("The argument should contain only arrays");
  });

  it("rejects what Python rejects, with Python's messages", () => {
    using x = f32([1, 2]);
    expect(() => mx.valueAndGrad((a: MlxArray) => a, -1)).toThrow("Can't compute the gradient of negative argument index -1");
    expect(() => mx.valueAndGrad((a: MlxArray) => a, [0, 0])).toThrow("Duplicate argument index 0 is not allowed.");
    expect(() => mx.valueAndGrad((a: MlxArray) => mx.sum(a), 1)(x)).toThrow("because the function is called with only 1 positional arguments");
    expect(() => mx.valueAndGrad(() => 3)(x)).toThrow("should be either a scalar array or a tuple");
    expect(() => mx.grad((a: MlxArray) => [mx.sum(a)])(x)).toThrow("should be a scalar array; but list was returned");
    expect(() => mx.valueAndGrad((a: MlxArray) => mx.multiply(a, 2))(x)).toThrow("[vjp] Output shape (2) does not match cotangent shape ()");
  });
});

describe("vjp, jvp, grad, checkpoint", () => {
  it("jvp of sin is cos times the tangent; vjp of a two-output function takes two cotangents", () => {
    using x = f32([0.1, 1.3, -2.5]);
    using t = f32([1, 2, 3]);
    const [o, j] = mx.jvp((a) => mx.sin(a), [x], [t]);
    using cos = mx.cos(x);
    using want = mx.multiply(cos, t);
    expect(bytes(j[0]!)).toBe(bytes(want));
    const [outs, vjps] = mx.vjp((a) => [mx.exp(a), mx.negative(a)], [x], [t, t]);
    expect(outs).toHaveLength(2);
    using e = mx.exp(x);
    using et = mx.multiply(t, e);
    using expected = mx.add(et, mx.negative(t));
    expect(vjps[0]!.toNumbers()).toEqual(expected.toNumbers());
    for (const a of [...o, ...j, ...outs, ...vjps]) a.dispose();
  });

  it("checkpoint keeps the argument/output trees and gives the plain gradient bits, calling fn again for the backward pass", () => {
    using x = f32([0.3, -0.8, 1.9, 0.05]);
    using w = f32([1.5, -0.5, 0.25, 2]);
    let calls = 0;
    const body = (p: { w: MlxArray }, h: MlxArray, k: number) => {
      calls++;
      const y = mx.tanh(mx.multiply(mx.sin(mx.multiply(h, p.w)), k));
      return [y, { k }];
    };
    const ck = mx.checkpoint(body);
    const lossCk = (p: { w: MlxArray }) => mx.sum((ck(p, x, 3) as [MlxArray])[0]);
    const lossPlain = (p: { w: MlxArray }) => mx.sum((body(p, x, 3) as [MlxArray])[0]);
    const gc = mx.grad(lossCk)({ w }) as { w: MlxArray };
    expect(calls).toBe(2); // forward, then the recompute inside the backward pass
    const gp = mx.grad(lossPlain)({ w }) as { w: MlxArray };
    expect(bytes(gc.w)).toBe(bytes(gp.w));
    const out = ck({ w }, x, 3) as [MlxArray, { k: number }];
    expect(out[1]).toEqual({ k: 3 });
    for (const a of [gc.w, gp.w, out[0]]) a.dispose();
  });

  it("stopGradient cuts the tape", () => {
    using x = f32([2]);
    const g = mx.grad((a: MlxArray) => mx.sum(mx.multiply(a, mx.stopGradient(a))))(x) as MlxArray;
    expect(g.toNumbers()).toEqual([2]);
    g.dispose();
  });
});

describe("one error path", () => {
  const x = f32([1, 2, 3]); // lives for the whole file (tests run after this callback returns)
  const boom = (..._args: unknown[]): never => {
    throw new RangeError("boom inside the traced function");
  };

  it.each([
    ["vjp", () => mx.vjp(boom, [x], [x])],
    ["jvp", () => mx.jvp(boom, [x], [x])],
    ["valueAndGrad", () => mx.valueAndGrad(boom)(x)],
    ["grad", () => mx.grad(boom)(x)],
    ["checkpoint", () => mx.checkpoint(boom)(x)],
    ["nested", () => mx.grad((a: MlxArray) => mx.sum(mx.checkpoint(boom)(a) as MlxArray))(x)],
    [
      "compiled",
      () => {
        using f = mx.compile((a: MlxArray) => mx.grad(boom)(a) as MlxArray);
        f(x);
      },
    ],
  ])("a JS exception inside %s comes back as itself", (_, run) => {
    let caught: unknown;
    try {
      run();
    } catch (e) {
      caught = e;
    }
    expect(caught).toBeInstanceOf(RangeError);
    expect((caught as Error).message).toBe("boom inside the traced function");
  });

  it("an exception in the checkpoint's recompute surfaces from the outer transform", () => {
    let calls = 0;
    const ck = mx.checkpoint((a: MlxArray) => {
      if (++calls > 1) throw new Error("recompute failed");
      return mx.exp(a);
    });
    expect(() => mx.grad((a: MlxArray) => mx.sum(ck(a) as MlxArray))(x)).toThrow("recompute failed");
    expect(calls).toBe(2);
  });

  it("an MLX error inside the traced function is one MlxError naming the op", () => {
    let caught: unknown;
    try {
      mx.valueAndGrad((a: MlxArray) => mx.sum(mx.add(a, mx.zeros([4]))))(x);
    } catch (e) {
      caught = e;
    }
    expect(caught).toBeInstanceOf(mx.MlxError);
    expect((caught as mx.MlxError).op).toBe("add");
    expect((caught as Error).message).toContain("cannot be broadcast");
  });

  it("a disposed primal is rejected before anything is traced", () => {
    const d = f32([1]);
    d.dispose();
    expect(() => mx.vjp((a) => a, [d], [x])).toThrow("array used after dispose()");
  });
});

describe("ownership", () => {
  it("2,000 transform calls (tree arguments, checkpoints, errors): handle count and traced functions back to baseline", async () => {
    await settle();
    const handles0 = mx.liveHandles();
    using w = f32([0.5, -1, 2]);
    using b = f32([0.1]);
    using x = f32([1, 2, 3]);
    const ck = mx.checkpoint((p: { w: MlxArray }, h: MlxArray) => {
      using t = mx.multiply(p.w, h);
      return mx.sin(t);
    });
    const loss = (p: { w: MlxArray; b: MlxArray }, h: MlxArray) => {
      using c = ck({ w: p.w }, h) as MlxArray;
      using s = mx.add(c, p.b);
      return mx.sum(s);
    };
    const vg = mx.valueAndGrad(loss);
    let check = 0;
    for (let i = 0; i < 500; i++) {
      const [v, g] = vg({ w, b }, x);
      const gt = g as { w: MlxArray; b: MlxArray };
      if (i % 50 === 0) check += (v as MlxArray).item() as number;
      for (const a of [v as MlxArray, gt.w, gt.b]) a.dispose();
      const [o, j] = mx.jvp((a) => mx.exp(a), [x], [x]);
      for (const a of [...o, ...j]) a.dispose();
      const [o2, v2] = mx.vjp((a, c) => mx.multiply(a, c), [x, w], [x]);
      for (const a of [...o2, ...v2]) a.dispose();
      try {
        mx.valueAndGrad(() => {
          throw new Error("x");
        })(x);
      } catch {
        check += 0;
      }
    }
    expect(Number.isFinite(check) && check !== 0).toBe(true);
    // every array was disposed explicitly: no garbage collection needed to get back to baseline
    expect(mx.liveTracedFunctions()).toBe(0);
    expect(mx.liveHandles()).toBe(handles0 + 3);
  }, limit(60_000));
});
