// Drives the TS caches with keys/values that encode absolute positions, and records what came
// back, so that properties can reason on positions instead of floats.
//
// keys   (1, 1, S, 2): [pos + 1, 0.5]          values (1, 1, S, 3): [-(pos + 1), 0.25, 2]
// A zero-filled buffer row decodes as position -1.
import fc from "fast-check";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVCache, RotatingKVCache, type KVCacheLike } from "../../model/cache/index.ts";
import type { Mask } from "../../model/mask.ts";
import type { MaskModel } from "./reference.ts";

export const DK = 2;
export const DV = 3;

export function keysFor(start: number, S: number, dtype: mx.Dtype = "float32", B = 1, H = 1): MlxArray {
  const a = new Float32Array(B * H * S * DK);
  for (let b = 0; b < B * H; b++)
    for (let i = 0; i < S; i++) {
      a[(b * S + i) * DK] = start + i + 1;
      a[(b * S + i) * DK + 1] = 0.5 + b;
    }
  using f = mx.array(a, [B, H, S, DK]);
  return mx.astype(f, dtype);
}

export function valuesFor(start: number, S: number, dtype: mx.Dtype = "float32", B = 1, H = 1): MlxArray {
  const a = new Float32Array(B * H * S * DV);
  for (let b = 0; b < B * H; b++)
    for (let i = 0; i < S; i++) {
      a[(b * S + i) * DV] = -(start + i + 1);
      a[(b * S + i) * DV + 1] = 0.25;
      a[(b * S + i) * DV + 2] = 2 + b;
    }
  using f = mx.array(a, [B, H, S, DV]);
  return mx.astype(f, dtype);
}

/** Positions along axis 2 of a (1,1,L,D) array whose channel 0 holds ±(pos+1). */
export function decodePositions(x: MlxArray, sign = 1): number[] {
  const [, , L, D] = x.shape as [number, number, number, number];
  const n = x.toNumbers();
  const out: number[] = [];
  for (let i = 0; i < L; i++) out.push(sign * n[i * D]! - 1);
  return out;
}

export function maskModel(m: Mask): MaskModel {
  if (m === null) return { kind: "none" };
  if (m === "causal") return { kind: "causal" };
  const sh = m.shape;
  if (sh.length !== 2) throw new Error(`unexpected mask shape [${sh}]`);
  const n = m.toNumbers();
  const rows: boolean[][] = [];
  for (let i = 0; i < sh[0]!; i++) rows.push(n.slice(i * sh[1]!, (i + 1) * sh[1]!).map((v) => v !== 0));
  return { kind: "array", rows };
}

export type Op = { kind: "chunk"; S: number } | { kind: "trim"; n: number };

export interface StepRecord {
  op: Op;
  offsetBefore: number;
  offsetAfter: number;
  mask?: MaskModel;
  maskShape?: number[];
  returnedK?: number[];
  returnedV?: number[];
  kDtype?: string;
  vDtype?: string;
  bufLen: number;
  meta: string[];
  trimmed?: number;
  trimmableBefore?: boolean;
}

/** Applies a trim op as trim_prompt_cache would: only when the cache is trimmable; n is taken mod offset+1. */
export function effectiveTrim(c: KVCacheLike, n: number): number | null {
  if (!c.isTrimmable()) return null;
  return n % (c.offset + 1);
}

export function drive(c: KVCacheLike, ops: readonly Op[], windowSize: number | null, dtype: mx.Dtype = "float32"): StepRecord[] {
  const out: StepRecord[] = [];
  for (const op of ops) {
    const offsetBefore = c.offset;
    if (op.kind === "trim") {
      const trimmableBefore = c.isTrimmable();
      const n = effectiveTrim(c, op.n);
      const trimmed = n === null ? undefined : c.trim(n);
      out.push({ op, offsetBefore, offsetAfter: c.offset, bufLen: bufLen(c), meta: c.metaState, trimmed, trimmableBefore });
      continue;
    }
    const mask = c.makeMask(op.S, { windowSize });
    let mm: MaskModel;
    let maskShape: number[] | undefined;
    try {
      mm = maskModel(mask);
      if (mask !== null && mask !== "causal") maskShape = mask.shape;
    } finally {
      if (mask !== null && mask !== "causal") mask.dispose();
    }
    using k = keysFor(offsetBefore, op.S, dtype);
    using v = valuesFor(offsetBefore, op.S, dtype);
    const [rk, rv] = c.updateAndFetch(k, v);
    try {
      out.push({
        op,
        offsetBefore,
        offsetAfter: c.offset,
        mask: mm,
        maskShape,
        returnedK: decodePositions(rk),
        returnedV: decodePositions(rv, -1),
        kDtype: rk.dtype,
        vDtype: rv.dtype,
        bufLen: bufLen(c),
        meta: c.metaState,
      });
    } finally {
      rk.dispose();
      rv.dispose();
    }
  }
  return out;
}

export function bufLen(c: KVCacheLike): number {
  const k = (c as KVCache | RotatingKVCache).keys;
  return k ? k.shape[2]! : 0;
}

/** Buffer slots (position+1, 0 = zero row) of the cache's key buffer. */
export function bufferSlots(c: KVCacheLike): number[] {
  const k = (c as KVCache | RotatingKVCache).keys;
  if (!k) return [];
  return decodePositions(k).map((p) => p + 1);
}

// ------------------------------------------------------------------------------ arbitraries

export const arbWindow = fc.oneof({ arbitrary: fc.integer({ min: 1, max: 12 }), weight: 6 }, { arbitrary: fc.integer({ min: 13, max: 40 }), weight: 1 });

/** Chunk sizes S ∈ 1..3W (S = 1 weighted up: it is the decode path), and trims. */
export function arbOps(W: number, { trims = true, maxLen = 14 } = {}): fc.Arbitrary<Op[]> {
  const chunk = fc.oneof(
    { arbitrary: fc.constant(1), weight: 3 },
    { arbitrary: fc.integer({ min: 2, max: Math.max(2, 3 * W) }), weight: 3 },
  ).map((S): Op => ({ kind: "chunk", S }));
  const trim = fc.integer({ min: 0, max: 3 * W }).map((n): Op => ({ kind: "trim", n }));
  const op = trims ? fc.oneof({ arbitrary: chunk, weight: 5 }, { arbitrary: trim, weight: 1 }) : chunk;
  return fc.array(op, { minLength: 1, maxLength: maxLen });
}

export const arbRotatingScenario = (opts?: { trims?: boolean; maxLen?: number }) =>
  arbWindow.chain((W) => arbOps(W, opts).map((ops) => ({ W, ops })));
