// mlx/nn/losses.py: cross_entropy (class-index targets, no weights, no label smoothing,
// reduction "none"), the one loss mlx-lm's default_loss calls, op for op.
//
// On the GPU, nn.losses takes mx.fast.cross_entropy (cast back to the logits dtype); elsewhere
// it subtracts the stop-gradient max, gathers the target logit and returns logsumexp - score.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";

export function cross_entropy(logits: MlxArray, targets: MlxArray, axis = -1): MlxArray {
  const lshape = logits.shape;
  const ax = axis < 0 ? axis + lshape.length : axis;
  const want = lshape.filter((_, i) => i !== ax);
  const tshape = targets.shape;
  if (tshape.length !== want.length || tshape.some((d, i) => d !== want[i])) {
    throw new RangeError(`Targets shape (${tshape.join(", ")}) does not match logits shape (${lshape.join(", ")}).`);
  }
  if (mx.defaultDevice() === "gpu" && ax === lshape.length - 1 && mx.isFloating(logits.dtype) && !mx.isFloating(targets.dtype) && targets.dtype !== "bool") {
    using l = mx.fast.crossEntropy(logits, targets);
    return mx.astype(l, logits.dtype);
  }
  using m = mx.max(logits, axis, true);
  using sm = mx.stopGradient(m);
  using shifted = mx.subtract(logits, sm);
  using t = mx.expandDims(targets, axis);
  using g = mx.takeAlongAxis(shifted, t, axis);
  using score = mx.squeeze(g, axis);
  using lse = mx.logsumexp(shifted, axis);
  return mx.subtract(lse, score);
}
