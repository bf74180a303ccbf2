// The nn.Module training API on the ported model against mlx.nn.Module on mlx-lm's model, after
// the same freeze/unfreeze/train steps: named_modules (order, classes, training flags),
// parameters / trainable_parameters / children trees, leaf_modules.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { isDict, treeFlatten } from "@mlx-bun/mlx/utils";
import { sharedOracle } from "../../oracle/client.ts";
import { Linear, Module } from "../../model/gemma4/nn.ts";
import { loadModel } from "../../model/gemma4/weights.ts";
import { applySteps, type ModuleStep } from "./module_steps.ts";
import { CKPT_ROOT } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

function show(t: unknown): unknown {
  if (t instanceof mx.MlxArray) return `${t.dtype}[${t.shape.join(", ")}]`;
  if (t instanceof Module) return t.constructor.name;
  if (Array.isArray(t)) return t.map(show);
  if (isDict(t)) return Object.fromEntries(Object.entries(t).map(([k, v]) => [k, show(v)]));
  return typeof t;
}

interface Structure {
  named_modules: [string, string, boolean][];
  parameters: unknown;
  trainable_parameters: unknown;
  children: unknown;
  leaf_modules: string[];
}

function structure(model: Module): Structure {
  return {
    named_modules: model.namedModules().map(([k, m]) => [k, m.constructor.name, m.training]),
    parameters: show(model.parameterTree()),
    trainable_parameters: show(model.trainableParameters()),
    children: show(model.children()),
    leaf_modules: [...model.leafModules().keys()],
  };
}

const SCENARIOS: [string, string, ModuleStep[]][] = [
  ["c1_dense/f32", "as loaded", []],
  ["c1_dense/f32", "freeze all, unfreeze two layers' attention", [
    { op: "freeze" },
    { op: "unfreeze", path: "model.layers.4.self_attn" },
    { op: "unfreeze", path: "model.layers.5.self_attn", keys: ["weight"], recurse: true },
  ]],
  ["c1_dense/f32", "freeze by key, not recursive, eval/train", [
    { op: "freeze", keys: "weight" },
    { op: "unfreeze", path: "model.norm" },
    { op: "freeze", path: "model.layers.0", recurse: false },
    { op: "eval" },
    { op: "train", path: "model.layers.2" },
  ]],
  ["c3_e2b/f32", "per-layer inputs, KV sharing; freeze layer_scalar everywhere", [{ op: "freeze", keys: ["layer_scalar"], strict: true }]],
  ["c5_moe/f32", "experts: freeze the router", [{ op: "freeze", path: "model.layers.1.router" }]],
  ["c1_dense/q4g32", "quantized layers freeze themselves", []],
  ["c5_moe/q4g32", "quantized experts", [{ op: "unfreeze", path: "model.layers.0.experts.switch_glu" }]],
];

describe("nn.Module training API vs mlx.nn.Module", () => {
  it.each(SCENARIOS)("%s, %s: same structure as mlx-lm's model", async (ckpt, _what, steps) => {
    const oracle = await sharedOracle();
    const py = await oracle.request<Structure>("module_api", { checkpoint: ckpt, steps });
    const { model } = loadModel(join(CKPT_ROOT, ckpt), { lazy: true });
    try {
      applySteps(model, steps);
      const ts = structure(model);
      expect(ts.named_modules).toEqual(py.named_modules);
      expect(ts.parameters).toEqual(py.parameters);
      expect(ts.trainable_parameters).toEqual(py.trainable_parameters);
      expect(ts.children).toEqual(py.children);
      expect(ts.leaf_modules).toEqual(py.leaf_modules);
      // the flat forms agree with the trees
      expect([...model.parameters().keys()]).toEqual(treeFlatten(model.parameterTree()).map(([k]) => k));
    } finally {
      model.dispose();
    }
  }, limit(60_000));

  it("strict keys that no module has raise in both", async () => {
    const oracle = await sharedOracle();
    const steps: ModuleStep[] = [{ op: "freeze", keys: ["no_such_key"], strict: true }];
    await expect(oracle.request("module_api", { checkpoint: "c1_dense/f32", steps })).rejects.toThrow("Module doesn't contain member no_such_key.");
    const { model } = loadModel(join(CKPT_ROOT, "c1_dense/f32"), { lazy: true });
    try {
      expect(() => applySteps(model, steps)).toThrow("Module doesn't contain member no_such_key.");
    } finally {
      model.dispose();
    }
  });
});

describe("update and update_modules", () => {
  it("update replaces parameters at the tree's paths, disposing the replaced arrays; strict mode checks paths and types", () => {
    const { model, text } = loadModel(join(CKPT_ROOT, "c1_dense/f32"), { lazy: true });
    try {
      const old = text.model.norm.weight;
      const fresh = mx.onesLike(old);
      model.update({ model: { norm: { weight: fresh } } });
      expect(text.model.norm.weight).toBe(fresh);
      expect(old.disposed).toBe(true);
      expect(() => model.update({ model: { norm: { bias: fresh } } })).toThrow('Module does not have parameter named "bias".');
      expect(() => model.update({ model: { norm: { weight: 3 } } })).toThrow("Received invalid type: number.");
      expect(() => model.update({ model: { layers: new Array(7).fill({}) } })).toThrow("List index 6 is out of bounds for destination of length 6.");
      model.update({ model: { norm: { bias: fresh } } }, false); // not strict: unknown paths are skipped
      // release = false keeps the replaced array (a swap the caller undoes)
      const swapped = mx.zerosLike(fresh);
      model.update({ model: { norm: { weight: swapped } } }, true, false);
      expect(fresh.disposed).toBe(false);
      model.update({ model: { norm: { weight: fresh } } });
      expect(swapped.disposed).toBe(true);
    } finally {
      model.dispose();
    }
  });

  it("update_modules swaps modules (nothing disposed) and named_modules sees the new ones", () => {
    const { model, text } = loadModel(join(CKPT_ROOT, "c1_dense/f32"), { lazy: true });
    try {
      const old = text.model.layers[2]!.mlp.up_proj;
      const lin = new Linear(old.input_dims, old.output_dims);
      model.updateModules({ model: { layers: [{}, {}, { mlp: { up_proj: lin } }] } });
      expect(text.model.layers[2]!.mlp.up_proj).toBe(lin);
      expect(old.weight.disposed).toBe(false);
      expect(new Map(model.namedModules()).get("model.layers.2.mlp.up_proj")).toBe(lin);
      expect(() => model.updateModules({ model: { nope: lin } })).toThrow('Module does not have sub-module named "nope".');
      expect(() => model.updateModules({ model: { norm: { weight: lin } } })).toThrow("Received invalid type: Linear.");
      old.weight.dispose();
    } finally {
      model.dispose();
    }
  });
});
