// Graph inspection: the unevaluated op graph behind an array, and a replay of that graph with
// some leaves substituted. Used by the parity command's --bisect to find the first op whose
// output differs.
import { handles, type MlxArray, own, ownVec } from "./array.ts";
import { checkStatus, MlxError } from "./errors.ts";
import { cstring, lib } from "./native.ts";

export interface GraphNode {
  /** An owned handle to the node's (unevaluated) array. */
  array: MlxArray;
  /** The MLX primitive that produces it, e.g. "Matmul", "QuantizedMatmul", "Add". */
  op: string;
  /** Its inputs, owned. */
  inputs: MlxArray[];
}

export function primitiveName(a: MlxArray): string {
  const p = lib.mlxb_primitive_name(a.handle);
  if (p === null) throw new MlxError("primitive_name", "invalid array");
  return cstring(p);
}

/** Identity of the underlying MLX array (equal for two handles to the same array). */
export function arrayId(a: MlxArray): number {
  return checkStatus(lib.mlxb_array_id(a.handle), "array_id");
}

export function isEvaluated(a: MlxArray): boolean {
  return checkStatus(lib.mlxb_is_evaluated(a.handle), "is_evaluated") === 1;
}

function inputsOf(a: MlxArray): MlxArray[] {
  const n = checkStatus(lib.mlxb_num_inputs(a.handle), "inputs");
  const out: MlxArray[] = [];
  for (let i = 0; i < n; i++) out.push(own(lib.mlxb_input(a.handle, i), "inputs"));
  return out;
}

/** The unevaluated nodes behind `out`, inputs first; evaluated arrays are leaves (not listed). */
export function graphNodes(out: MlxArray): GraphNode[] {
  return ownVec(lib.mlxb_graph_nodes(out.handle), "graph_nodes").map((array) => ({ array, op: primitiveName(array), inputs: inputsOf(array) }));
}

/** How many nodes of each primitive the unevaluated graph behind `roots` holds (each array once). */
export function primitiveCounts(roots: readonly MlxArray[]): Record<string, number> {
  const seen = new Set<number>();
  const out: Record<string, number> = {};
  for (const r of roots) {
    for (const n of graphNodes(r)) {
      const id = arrayId(n.array);
      n.array.dispose();
      for (const i of n.inputs) i.dispose();
      if (seen.has(id)) continue;
      seen.add(id);
      out[n.op] = (out[n.op] ?? 0) + 1;
    }
  }
  return out;
}

/** The same primitives applied again with leaf `from[i]` replaced by `to[i]`; aligned with graphNodes(out). */
export function replayGraph(out: MlxArray, from: readonly MlxArray[], to: readonly MlxArray[]): MlxArray[] {
  if (from.length !== to.length) throw new MlxError("graph_replay", "from and to must have the same length");
  const f = handles(from);
  const t = handles(to);
  const pad = (x: Float64Array) => (x.length ? x : new Float64Array(1));
  return ownVec(lib.mlxb_graph_replay(out.handle, pad(f), pad(t), from.length), "graph_replay");
}
