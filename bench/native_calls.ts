// Counts, per decode step of the TS model: native (FFI) calls, and the nodes of the step's graph
// (all of them, and the kernel-launching ones: views excluded), for the decode route in use and for
// the op-by-op route (mlx-lm's primitives one for one: suites/gemma4/graph_parity.test.ts). Run by
// bench/run.ts as a child process with MLX_BUN_COUNT_CALLS=1 (the counter is installed at load time):
//   MLX_BUN_COUNT_CALLS=1 bun bench/native_calls.ts <checkpoint> [steps]
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { nativeCallCount } from "../mlx/src/native.ts";
import { setDecodeCompile } from "../model/gemma4/gemma4_text.ts";
import { loadGenerationModel } from "../model/runtime.ts";

const [dir, stepsArg] = process.argv.slice(2);
if (!dir || process.env.MLX_BUN_COUNT_CALLS !== "1") {
  console.error("usage: MLX_BUN_COUNT_CALLS=1 bun bench/native_calls.ts <checkpoint> [steps]");
  process.exit(2);
}
const steps = Number(stepsArg ?? 8);

// Primitives that only make a view (no kernel on a GPU backend).
const VIEWS = new Set(["Broadcast", "Reshape", "ExpandDims", "Squeeze", "Slice", "Transpose", "Unflatten", "Flatten", "StopGradient", "AsStrided", "Depends"]);

function graphCounts(outs: MlxArray[]): { total: number; kernels: number; byPrimitive: Record<string, number> } {
  const byPrimitive = mx.graph.primitiveCounts(outs);
  const total = Object.values(byPrimitive).reduce((a, b) => a + b, 0);
  const kernels = Object.entries(byPrimitive).reduce((a, [op, n]) => a + (VIEWS.has(op) ? 0 : n), 0);
  return { total, kernels, byPrimitive };
}

/** Calls per step and the last step's graph, on the decode route that is on. */
function measure(): { calls: number[]; graph: ReturnType<typeof graphCounts> } {
  const { loaded, model } = loadGenerationModel(dir!);
  const cache = model.makeCache();
  let y = mx.array(Int32Array.from([1, 2, 3, 4, 5, 6, 7, 8]), [1, 8], "int32");
  const calls: number[] = [];
  let graph = { total: 0, kernels: 0, byPrimitive: {} as Record<string, number> };
  for (let i = 0; i <= steps; i++) {
    const before = nativeCallCount();
    const logits = model.forward(y, cache, { kind: "step", index: i });
    const after = nativeCallCount();
    if (i > 0) calls.push(after - before); // step 0 is the prefill of 8 tokens
    const last = mx.slice(logits, [0, logits.shape[1]! - 1, 0], [1, logits.shape[1]!, logits.shape[2]!]);
    const next = mx.argmax(last, -1);
    const states = cache.flatMap((c) => c.state);
    if (i === steps) graph = graphCounts([next, ...states]);
    mx.evaluate(next, states);
    for (const s of states) s.dispose();
    y.dispose();
    y = next;
    logits.dispose();
    last.dispose();
  }
  y.dispose();
  for (const c of cache) c.dispose();
  loaded.model.dispose();
  return { calls, graph };
}

const route = measure();
setDecodeCompile(false);
const opByOp = measure();
const median = route.calls.sort((a, b) => a - b)[route.calls.length >> 1];
console.log(
  JSON.stringify({
    perStep: route.calls,
    median,
    nodes: { total: route.graph.total, kernels: route.graph.kernels, opByOpKernels: opByOp.graph.kernels, byPrimitive: route.graph.byPrimitive, opByOpByPrimitive: opByOp.graph.byPrimitive },
  }),
);
