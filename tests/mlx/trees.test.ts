// mx.utils tree helpers against Python's mlx.utils on the same trees (numbers as leaves), run in
// the oracle's interpreter: tree_flatten keys and order, tree_unflatten (lists from integer keys,
// gap filling), tree_map with rest trees, tree_reduce.
import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { type Tree, treeFlatten, treeMap, treeMapWithPath, treeReduce, treeUnflatten } from "@mlx-bun/mlx/utils";

const PY = `
import json, sys
from mlx.utils import tree_flatten, tree_unflatten, tree_map, tree_map_with_path, tree_reduce
out = []
for t in json.load(sys.stdin):
    out.append({
        "flat": tree_flatten(t["tree"], prefix=t["prefix"]),
        "unflat": tree_unflatten([tuple(p) for p in t["pairs"]]),
        "map": tree_map(lambda x, y: x * 10 + y, t["tree"], tree_map(lambda x: x + 1, t["tree"])),
        "paths": tree_flatten(tree_map_with_path(lambda p, x: p, t["tree"])),
        "sum": tree_reduce(lambda a, x: a * 2 + x, t["tree"], 0),
    })
print(json.dumps(out))
`;

const TREES: { tree: Tree<number>; prefix: string; pairs: [string, number][] }[] = [
  { tree: { a: 1, b: [2, 3, { c: 4 }], d: { e: { f: 5 } } }, prefix: "", pairs: [["a.b", 1], ["a.c.0", 2], ["a.c.1", 3], ["d", 4]] },
  { tree: [[[0]], [1, 2]], prefix: ".hello", pairs: [["0.x", 1], ["2.y", 2]] },
  { tree: { layers: [{ w: 1, b: 2 }, {}, { w: 3 }], head: 4 }, prefix: "", pairs: [["layers.0.w", 1], ["layers.3.w", 2], ["head", 3]] },
  { tree: 7, prefix: "", pairs: [["", 7]] },
  { tree: { x: [] as number[], y: {} }, prefix: ".p", pairs: [["1", 1], ["10", 2], ["2", 3]] },
];

describe("mx.utils trees vs mlx.utils", () => {
  const r = spawnSync(DEFAULT_PYTHON, ["-c", PY], { input: JSON.stringify(TREES), encoding: "utf8", cwd: REPO_ROOT });
  it("Python ran", () => {
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
  });
  const py = r.status === 0 ? (JSON.parse(r.stdout) as Record<string, unknown>[]) : [];

  it.each(TREES.map((t, i) => [i, t] as const))("tree %i: flatten, unflatten, map, map_with_path, reduce", (i, t) => {
    const want = py[i]!;
    expect(treeFlatten(t.tree, t.prefix)).toEqual(want.flat);
    expect(treeUnflatten(t.pairs)).toEqual(want.unflat);
    expect(treeMap((x: number, y: number) => x * 10 + y, t.tree, treeMap((x: number) => x + 1, t.tree))).toEqual(want.map);
    expect(treeFlatten(treeMapWithPath((p: string | null) => p, t.tree))).toEqual(want.paths);
    expect(treeReduce((a: number, x: number) => a * 2 + x, t.tree, 0)).toEqual(want.sum);
  });

  it("tree_map needs the rest trees to hold the first tree's keys", () => {
    expect(() => treeMap((x: number, y: number) => x + y, { a: 1, b: 2 }, { a: 1 })).toThrow('a tree in rest has no entry "b"');
  });
});
