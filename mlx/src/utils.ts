// mlx.utils: Python trees. A tree is a list (JS array, visited by index), a dict (plain object,
// visited in insertion order) or a leaf (anything else: an MlxArray, a number, null, a Module).
// The order of visits is Python's, so flat positions and dotted keys match mlx.utils exactly
// (a JS object lists integer-like keys first: keep such keys out of dicts; treeUnflatten turns
// all-integer key sets into lists, as Python does).
import { MlxArray } from "./array.ts";
import { MlxError } from "./mlx_error.ts";

export type Tree<L = unknown> = L | readonly Tree<L>[] | { readonly [key: string]: Tree<L> };
export type IsLeaf = (node: unknown) => boolean;

export function isDict(x: unknown): x is Record<string, unknown> {
  if (x === null || typeof x !== "object" || Array.isArray(x)) return false;
  const proto = Object.getPrototypeOf(x);
  return proto === Object.prototype || proto === null;
}

/** tree_flatten(tree, prefix, is_leaf): [dotted key, leaf] pairs (the prefix's first character is dropped). */
export function treeFlatten<L = unknown>(tree: Tree<L>, prefix = "", isLeaf?: IsLeaf): [string, L][] {
  const out: [string, L][] = [];
  const visit = (t: unknown, p: string) => {
    if (isLeaf?.(t)) out.push([p.slice(1), t as L]);
    else if (Array.isArray(t)) t.forEach((v, i) => visit(v, `${p}.${i}`));
    else if (isDict(t)) for (const [k, v] of Object.entries(t)) visit(v, `${p}.${k}`);
    else out.push([p.slice(1), t as L]);
  };
  visit(tree, prefix);
  return out;
}

const INT_KEY = /^[+-]?\d+$/;

/** tree_unflatten: a tree from dotted-key pairs (all-integer keys make a list, gaps filled with {}). */
export function treeUnflatten<L = unknown>(items: Iterable<readonly [string, L]> | Record<string, L>): Tree<L> {
  const list: (readonly [string, L])[] = isDict(items) ? Object.entries(items as Record<string, L>) : [...(items as Iterable<readonly [string, L]>)];
  if (list.length === 1 && list[0]![0] === "") return list[0]![1];
  const children = new Map<string, [string, L][]>();
  for (const [key, value] of list) {
    const dot = key.indexOf(".");
    const head = dot < 0 ? key : key.slice(0, dot);
    const rest = dot < 0 ? "" : key.slice(dot + 1);
    let c = children.get(head);
    if (!c) children.set(head, (c = []));
    c.push([rest, value]);
  }
  const heads = [...children.keys()];
  const ints = new Map<number, string>();
  for (const h of heads) if (INT_KEY.test(h)) ints.set(Number.parseInt(h, 10), h);
  if (heads.length > 0 && ints.size === heads.length) {
    const out: Tree<L>[] = [];
    for (const [i, h] of [...ints].sort((a, b) => a[0] - b[0])) {
      while (out.length < i) out.push({});
      out.push(treeUnflatten(children.get(h)!));
    }
    return out;
  }
  const out: Record<string, Tree<L>> = {};
  for (const [h, c] of children) out[h] = treeUnflatten(c);
  return out;
}

function child(r: unknown, key: string | number, where: string | null): unknown {
  if (typeof key === "number" ? Array.isArray(r) && key < r.length : isDict(r) && key in r) return (r as Record<string | number, unknown>)[key];
  throw new MlxError("tree_map", `a tree in rest has no entry ${JSON.stringify(key)}${where ? ` under ${where}` : ""}`);
}

/** tree_map(fn, tree, *rest): `rest` trees are supersets of `tree`; their leaves come as extra arguments. */
export function treeMap<R>(fn: (leaf: any, ...rest: any[]) => R, tree: Tree, ...rest: Tree[]): Tree<R> {
  return treeMapWithPath((_, leaf, ...r) => fn(leaf, ...r), tree, ...rest);
}

/** tree_map_with_path(fn, tree, *rest): fn(path, leaf, ...rest leaves); paths are dotted keys (null for a bare leaf, as Python's None). */
export function treeMapWithPath<R>(fn: (path: string | null, leaf: any, ...rest: any[]) => R, tree: Tree, ...rest: Tree[]): Tree<R> {
  const visit = (t: unknown, rs: unknown[], path: string | null): Tree<R> => {
    const pre = path ? `${path}.` : "";
    if (Array.isArray(t)) return t.map((v, i) => visit(v, rs.map((r) => child(r, i, path)), `${pre}${i}`));
    if (isDict(t)) {
      const out: Record<string, Tree<R>> = {};
      for (const [k, v] of Object.entries(t)) out[k] = visit(v, rs.map((r) => child(r, k, path)), `${pre}${k}`);
      return out;
    }
    return fn(path, t, ...rs);
  };
  return visit(tree, rest, null);
}

/** tree_reduce(fn, tree, initializer): folds the leaves in visit order (no initializer: the first leaf). */
export function treeReduce<A>(fn: (acc: A, leaf: any) => A, tree: Tree, initializer?: A, isLeaf?: IsLeaf): A | undefined {
  let acc = initializer;
  let started = initializer !== undefined;
  for (const [, leaf] of treeFlatten(tree, "", isLeaf)) {
    if (!started) {
      acc = leaf as A;
      started = true;
    } else acc = fn(acc as A, leaf);
  }
  return acc;
}

// ---------------------------------------------------------------- arrays in a tree (transforms)

/**
 * The MlxArrays of a tree in visit order (Python's tree_visit). `strict`: every leaf must be an
 * array (the differentiated arguments of value_and_grad).
 */
export function treeArrays(tree: Tree, strict = false, op = "tree_flatten"): MlxArray[] {
  const out: MlxArray[] = [];
  for (const [, leaf] of treeFlatten(tree)) {
    if (leaf instanceof MlxArray) out.push(leaf);
    else if (strict) throw new MlxError(op, "The argument should contain only arrays");
  }
  return out;
}

/** The tree with its MlxArray leaves replaced, in visit order, by `arrays` (Python's tree_fill). */
export function treeFill<T extends Tree>(tree: T, arrays: readonly MlxArray[]): T {
  let i = 0;
  const out = treeMap((leaf: unknown) => {
    if (!(leaf instanceof MlxArray)) return leaf;
    if (i >= arrays.length) throw new MlxError("tree_fill", "more arrays in the tree than replacements");
    return arrays[i++];
  }, tree);
  if (i !== arrays.length) throw new MlxError("tree_fill", `${arrays.length} replacements for ${i} arrays`);
  return out as T;
}
