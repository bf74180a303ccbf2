// --bisect: after a run found its first divergent tap, re-run the TS model up to that tap and
// take the tap's op graph before it is evaluated. Every earlier tap was compared bit-exact, so
// the graph's evaluated leaves (the block's inputs) hold exactly the oracle's values; its other
// leaves are parameters. The graph is then replayed primitive by primitive with the parameters
// mlx-lm loaded (the oracle checkpoint's), and both are evaluated node by node: the first node
// whose bytes differ is the first MLX op that diverges, named with its input dtypes and shapes.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { generateStep } from "../model/generate.ts";
import { loadModel } from "../model/gemma4/index.ts";
import type { TapValue } from "../model/gemma4/taps.ts";
import { generationModel, stepTaps } from "../model/runtime.ts";
import { compareRaw, type RawTensor, rawOf } from "../oracle/compare.ts";
import type { Divergence } from "./schema.ts";

export type BisectResult = NonNullable<Divergence["bisect"]>;

class Found extends Error {}

// Primitives that only move or view data.
const DATA_MOVEMENT = new Set(["Transpose", "Reshape", "Broadcast", "Slice", "AsStrided", "Copy", "ExpandDims", "Squeeze", "Flatten", "Unflatten", "Contiguous", "Concatenate", "Split"]);

export interface BisectSpec {
  tsDir: string;
  oracleDir: string;
  prompt: number[];
  prefillStepSize: number;
  steps: number;
  /** Position of the divergent tap in execution order, and mlx-lm's bytes for it. */
  position: number;
  expected: RawTensor;
}

function paramsById(params: Map<string, MlxArray>): Map<number, string> {
  const m = new Map<number, string>();
  for (const [path, a] of params) m.set(mx.graph.arrayId(a), path);
  return m;
}

export async function bisect(spec: BisectSpec): Promise<BisectResult | null> {
  const loaded = loadModel(spec.tsDir);
  const reference = loadModel(spec.oracleDir);
  const tsParams = loaded.model.parameters();
  const refParams = reference.model.parameters();
  const byId = paramsById(tsParams);
  let result: BisectResult | null = null;
  let index = 0;

  const analyse = (out: MlxArray): BisectResult | null => {
    const nodes = mx.graph.graphNodes(out);
    const nodeIds = new Set(nodes.map((n) => mx.graph.arrayId(n.array)));
    const from: MlxArray[] = [];
    const to: MlxArray[] = [];
    const differing = new Set<string>();
    const seen = new Set<number>();
    for (const n of nodes) {
      for (const leaf of n.inputs) {
        const id = mx.graph.arrayId(leaf);
        if (nodeIds.has(id) || seen.has(id)) continue;
        seen.add(id);
        const path = byId.get(id);
        const ref = path === undefined ? undefined : refParams.get(path);
        if (path === undefined || ref === undefined) continue;
        from.push(leaf);
        to.push(ref);
        if (!compareRaw(path, rawOf(leaf), rawOf(ref)).equal) differing.add(path);
      }
    }
    const replay = mx.graph.replayGraph(out, from, to);
    try {
      // The first differing node that computes (a differing parameter shows first in the views
      // that feed it, e.g. Linear's transpose); a pure view is named only if nothing else differs.
      let firstView: number | null = null;
      let hit: number | null = null;
      const diffs = nodes.map((n, i) => compareRaw(n.op, rawOf(n.array), rawOf(replay[i]!)));
      for (let i = 0; i < nodes.length && hit === null; i++) {
        if (diffs[i]!.equal) continue;
        if (DATA_MOVEMENT.has(nodes[i]!.op)) firstView ??= i;
        else hit = i;
      }
      hit ??= firstView;
      if (hit === null) return null;
      const n = nodes[hit]!;
      const d = diffs[hit]!;
      const last = compareRaw("tap", rawOf(replay[replay.length - 1]!), spec.expected);
      return {
        op: n.op,
        inputs: n.inputs.map((x) => ({ dtype: x.dtype, shape: x.shape })),
        maxAbs: d.maxAbs,
        maxUlp: d.maxUlp,
        differingParameters: [...differing],
        reproducesOracle: last.equal,
      };
    } finally {
      for (const r of replay) r.dispose();
      for (const n of nodes) {
        n.array.dispose();
        for (const x of n.inputs) x.dispose();
      }
    }
  };

  const sink = (_name: string, value: TapValue) => {
    const i = index++;
    if (!(value instanceof mx.MlxArray)) return;
    if (i < spec.position) {
      mx.evaluate(value); // as in the comparing run: earlier taps become evaluated leaves
      return;
    }
    if (i === spec.position) {
      result = analyse(value);
      throw new Found();
    }
  };
  try {
    for await (const _ of generateStep(generationModel(loaded, sink), spec.prompt, { maxTokens: spec.steps, prefillStepSize: spec.prefillStepSize, onStep: stepTaps(sink) })) {
      // run until the divergent tap
    }
  } catch (e) {
    if (!(e instanceof Found)) throw e;
  } finally {
    for (const p of tsParams.values()) p.dispose();
    for (const p of refParams.values()) p.dispose();
  }
  return result;
}
