// Gradient trees compared tensor by tensor, llm.c style: every gradient of the TS tree against the
// reference's gradient of the same parameter path (Python's tree_flatten keys), byte for byte, so
// a failure names the parameter. Pure (no native code beyond reading the arrays).
import type { MlxArray } from "@mlx-bun/mlx";
import { type Tree, treeFlatten } from "@mlx-bun/mlx/utils";
import { rawOf } from "./compare.ts";
import { compareRaw, formatDiff, type RawTensor, type TensorDiff } from "./tensor_diff.ts";

export interface GradComparison {
  /** One entry per path present on both sides, in the reference's order. */
  diffs: TensorDiff[];
  equal: number;
  /** Paths with a reference gradient but none on the TS side, and the reverse. */
  missing: string[];
  extra: string[];
  /** The first divergent gradient in parameter (tree) order. */
  first: TensorDiff | null;
  /**
   * The divergent gradient the backward pass computes first: that of the parameter latest in
   * tree order (the forward's last use), where a divergence usually starts.
   */
  firstBackward: TensorDiff | null;
}

type Grads = Tree<MlxArray> | ReadonlyMap<string, MlxArray>;

function flat(g: Grads): Map<string, MlxArray> {
  return g instanceof Map ? new Map(g) : new Map(treeFlatten<MlxArray>(g as Tree<MlxArray>));
}

/** Compares TS gradients (a tree or a path → array map) with the reference's, path by path. */
export function compareGrads(ts: Grads, reference: Iterable<readonly [string, RawTensor]>): GradComparison {
  const mine = flat(ts);
  const ref = [...reference];
  const refPaths = new Set(ref.map(([p]) => p));
  const diffs: TensorDiff[] = [];
  const missing: string[] = [];
  for (const [path, want] of ref) {
    const got = mine.get(path);
    if (got === undefined) missing.push(path);
    else diffs.push(compareRaw(path, rawOf(got), want));
  }
  const divergent = diffs.filter((d) => !d.equal);
  return {
    diffs,
    equal: diffs.length - divergent.length,
    missing,
    extra: [...mine.keys()].filter((p) => !refPaths.has(p)),
    first: divergent[0] ?? null,
    firstBackward: divergent[divergent.length - 1] ?? null,
  };
}

/** A short report: counts, missing/extra paths, the first divergent tensors (`what`: gradients, parameters, ...). */
export function formatGradComparison(c: GradComparison, what = "gradients", limit = 5): string {
  const lines = [`${what}: ${c.equal}/${c.diffs.length} bit-exact`];
  if (c.missing.length) lines.push(`missing on the TS side: ${c.missing.join(", ")}`);
  if (c.extra.length) lines.push(`not in the reference: ${c.extra.join(", ")}`);
  if (c.firstBackward) lines.push(`first divergent in backward order: ${formatDiff(c.firstBackward)}`);
  for (const d of c.diffs.filter((x) => !x.equal).slice(0, limit)) lines.push(`  ${formatDiff(d)}`);
  return lines.join("\n");
}
