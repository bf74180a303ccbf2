// Tap-list comparison for the model suites, on top of oracle/compare.ts (bitwise tensor diff):
// walks the TS taps and the oracle's in execution order and names the FIRST divergent tap
// (a name out of order, a missing/extra tap, mask kind, dtype/shape, or bytes with max abs diff,
// max ULP, mismatch count and first differing index).

import * as mx from "@mlx-bun/mlx";
import type { TapMeta, TapSink, TapValue } from "../../model/gemma4/taps.ts";
import { compareRaw, formatDiff, type TensorDiff } from "../../oracle/compare.ts";

export type TapKind = "array" | "none" | "str";

/** One tap, either side; arrays as raw little-endian bytes (bf16/f16 as bit patterns). */
export interface TapData {
  name: string;
  kind: TapKind;
  dtype?: string;
  shape?: number[];
  data?: Uint8Array;
  value?: string;
  meta?: Record<string, unknown>;
}

/**
 * A TapSink copying every tap out at once (the model's arrays are borrowed). An offset given as
 * a JS number (the no-cache Python int 0) becomes an int32 scalar with meta.python_int, as the
 * oracle records it.
 */
export class TapCollector {
  readonly taps: TapData[] = [];
  readonly sink: TapSink;
  constructor(prefix = "") {
    this.sink = (name: string, value: TapValue, meta?: TapMeta) => {
      this.taps.push(toTapData(prefix + name, value, meta));
    };
  }
}

export function toTapData(name: string, value: TapValue, meta?: TapMeta): TapData {
  if (value === null) return { name, kind: "none", meta };
  if (value === "causal") return { name, kind: "str", value, meta };
  if (typeof value === "number") {
    const d = new Uint8Array(4);
    new DataView(d.buffer).setInt32(0, value, true);
    return { name, kind: "array", dtype: "int32", shape: [], data: d, meta: { ...meta, python_int: true } };
  }
  if (!(value instanceof mx.MlxArray)) throw new Error(`tap ${name}: unsupported value ${String(value)}`);
  const m = name.endsWith("/offset") ? { ...meta, python_int: false } : meta;
  return { name, kind: "array", dtype: value.dtype, shape: value.shape, data: value.toBytes(), meta: m };
}

export interface Divergence {
  /** Position in execution order (= number of identical taps before it). */
  index: number;
  name: string;
  /** "empty": the oracle's list holds no tap, so nothing was compared (refused, never a pass). */
  reason: "name" | "missing" | "extra" | "kind" | "dtype/shape" | "value" | "python_int" | "empty";
  detail: string;
  diff?: TensorDiff;
}

export interface Verdict {
  ok: boolean;
  /** Taps found identical (all of them when ok). */
  compared: number;
  /** Of those, taps whose bytes were compared (the rest are None/"causal" masks). */
  arrays: number;
  first?: Divergence;
}

function describe(t: TapData): string {
  if (t.kind === "none") return "None";
  if (t.kind === "str") return JSON.stringify(t.value);
  return `${t.dtype}[${(t.shape ?? []).join(",")}]`;
}

/** Compares one pair, bit for bit (there is no budget: oracle/golden.ts goldenRule); null when identical. */
export function compareTap(index: number, ours: TapData, theirs: TapData): Divergence | null {
  const name = theirs.name;
  if (ours.name !== theirs.name) return { index, name, reason: "name", detail: `TS emitted ${JSON.stringify(ours.name)} where the oracle has ${JSON.stringify(theirs.name)}` };
  if (ours.kind !== theirs.kind || (ours.kind === "str" && ours.value !== theirs.value)) {
    return { index, name, reason: "kind", detail: `TS ${describe(ours)} vs oracle ${describe(theirs)}` };
  }
  if (ours.kind !== "array") return null;
  if (!theirs.data) {
    // not stored by the oracle (logits mode): dtype and shape only
    if (ours.dtype !== theirs.dtype || (ours.shape ?? []).join() !== (theirs.shape ?? []).join()) {
      return { index, name, reason: "dtype/shape", detail: `TS ${describe(ours)} vs oracle ${describe(theirs)}` };
    }
    return null;
  }
  const d = compareRaw(name, { dtype: ours.dtype!, shape: ours.shape ?? [], data: ours.data ?? new Uint8Array(0) }, {
    dtype: theirs.dtype!,
    shape: theirs.shape ?? [],
    data: theirs.data,
  });
  if (!d.equal) {
    return { index, name, reason: d.note ? "dtype/shape" : "value", detail: formatDiff(d), diff: d };
  }
  const pa = ours.meta?.python_int;
  const pb = theirs.meta?.python_int;
  if (pa !== undefined && pb !== undefined && pa !== pb) {
    return { index, name, reason: "python_int", detail: `offset is ${pa ? "a Python int" : "an int32 array"} in TS but ${pb ? "a Python int" : "an int32 array"} in the oracle` };
  }
  return null;
}

/**
 * Walks both lists in execution order; stops at the first difference. An empty oracle list is
 * refused (ok false, reason "empty"): a comparison of nothing is not a pass, whatever filtered
 * the lists down to nothing.
 */
export function compareTapLists(ours: readonly TapData[], theirs: readonly TapData[]): Verdict {
  if (theirs.length === 0 && ours.length === 0) {
    return { ok: false, compared: 0, arrays: 0, first: { index: 0, name: "", reason: "empty", detail: "no taps on either side: nothing was compared" } };
  }
  const n = Math.min(ours.length, theirs.length);
  let arrays = 0;
  for (let i = 0; i < n; i++) {
    const d = compareTap(i, ours[i]!, theirs[i]!);
    if (d) {
      if (d.reason === "name") {
        const pos = ours.findIndex((t) => t.name === theirs[i]!.name);
        d.detail += pos < 0 ? " (TS never emits it)" : ` (TS emits it at position ${pos})`;
      }
      return { ok: false, compared: i, arrays, first: d };
    }
    if (theirs[i]!.kind === "array" && theirs[i]!.data) arrays++;
  }
  if (ours.length < theirs.length) {
    return { ok: false, compared: n, arrays, first: { index: n, name: theirs[n]!.name, reason: "missing", detail: `TS stopped after ${n} taps; the oracle has ${theirs.length}` } };
  }
  if (ours.length > theirs.length) {
    return { ok: false, compared: n, arrays, first: { index: n, name: ours[n]!.name, reason: "extra", detail: `TS emitted ${ours.length} taps; the oracle has ${theirs.length}` } };
  }
  return { ok: true, compared: n, arrays };
}

/** One-line failure message naming the first divergent tap. */
export function formatVerdict(label: string, v: Verdict): string {
  if (v.ok) return `${label}: ${v.compared} taps bit-identical`;
  const f = v.first!;
  return `${label}: first divergent tap #${f.index} "${f.name}" (${f.reason}): ${f.detail} [${f.index} taps identical before it]`;
}

/** An oracle TapRecord (live capture or golden index + npz) → TapData. */
export function fromOracle(t: {
  name: string;
  kind: string;
  dtype?: string;
  shape?: number[];
  value?: string;
  meta?: Record<string, unknown>;
  array?: { dtype: string; shape: number[]; data: Uint8Array };
}): TapData {
  return { name: t.name, kind: t.kind as TapKind, dtype: t.array?.dtype ?? t.dtype, shape: t.array?.shape ?? t.shape, data: t.array?.data, value: t.value, meta: t.meta };
}
