// Counts native (FFI) calls per decode step of the TS model. Run by bench/run.ts as a child
// process with MLX_BUN_COUNT_CALLS=1 (the counter is installed at load time):
//   MLX_BUN_COUNT_CALLS=1 bun bench/native_calls.ts <checkpoint> [steps]
import * as mx from "@mlx-bun/mlx";
import { nativeCallCount } from "../mlx/src/native.ts";
import { loadGenerationModel } from "../model/runtime.ts";

const [dir, stepsArg] = process.argv.slice(2);
if (!dir || process.env.MLX_BUN_COUNT_CALLS !== "1") {
  console.error("usage: MLX_BUN_COUNT_CALLS=1 bun bench/native_calls.ts <checkpoint> [steps]");
  process.exit(2);
}
const steps = Number(stepsArg ?? 8);
const { model } = loadGenerationModel(dir);
const cache = model.makeCache();
let y = mx.array(Int32Array.from([1, 2, 3, 4, 5, 6, 7, 8]), [1, 8], "int32");
const counts: number[] = [];
for (let i = 0; i <= steps; i++) {
  const before = nativeCallCount();
  const logits = model.forward(y, cache, { kind: "step", index: i });
  const after = nativeCallCount();
  if (i > 0) counts.push(after - before); // step 0 is the prefill of 8 tokens
  const last = mx.slice(logits, [0, logits.shape[1]! - 1, 0], [1, logits.shape[1]!, logits.shape[2]!]);
  const next = mx.argmax(last, -1);
  mx.evaluate(next, cache.flatMap((c) => c.state));
  y.dispose();
  y = next;
  logits.dispose();
  last.dispose();
}
console.log(JSON.stringify({ perStep: counts, median: counts.sort((a, b) => a - b)[counts.length >> 1] }));
