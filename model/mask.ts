// Attention masks, op for op as mlx_lm/models/base.py and mlx_lm/models/cache.py (mlx-lm 0.32.2).
//
// A mask is one of three kinds, exactly as in Python:
//   null      — no mask (Python None)
//   "causal"  — the string mode of fast.scaled_dot_product_attention
//   MlxArray  — a bool array, shape (N, offset + N) from createCausalMask, or (mask_size,) from
//               RotatingKVCache.makeMask(1, {windowSize < maxSize})
// An array mask is owned by the caller (dispose it after the forward).
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";

export type Mask = null | "causal" | MlxArray;

export interface MakeMaskOptions {
  /** Python `window_size` (None ⇔ undefined/null). */
  windowSize?: number | null;
  /** Python `return_array`. */
  returnArray?: boolean;
}

/** Anything with mlx-lm's `make_mask(N, window_size=, return_array=)`. */
export interface MaskMaker {
  makeMask(N: number, opts?: MakeMaskOptions): Mask;
}

function checkInt(v: number, what: string, min: number): void {
  if (!Number.isInteger(v) || v < min) throw new RangeError(`${what} must be an integer >= ${min}, got ${v}`);
}

/**
 * base.py create_causal_mask(N, offset=0, window_size=None) (no padding arguments):
 *   rinds = arange(offset + N); linds = arange(offset, offset + N) if offset else rinds
 *   mask = linds[:, None] >= rinds[None]; if window_size is not None: mask &= linds[:, None] < rinds[None] + window_size
 * Bool, shape (N, offset + N).
 */
export function createCausalMask(N: number, offset = 0, windowSize: number | null = null): MlxArray {
  checkInt(N, "createCausalMask: N", 0);
  checkInt(offset, "createCausalMask: offset", 0);
  if (windowSize !== null && windowSize !== undefined && !Number.isInteger(windowSize)) {
    throw new RangeError(`createCausalMask: windowSize must be an integer or null, got ${windowSize}`);
  }
  using rinds0 = mx.arange(offset + N);
  using lindsBase = offset ? mx.arange(offset, offset + N) : mx.alias(rinds0);
  using linds = mx.expandDims(lindsBase, 1);
  using rinds = mx.expandDims(rinds0, 0);
  const mask = mx.greaterEqual(linds, rinds);
  if (windowSize === null || windowSize === undefined) return mask;
  using m0 = mask;
  using shifted = mx.add(rinds, windowSize);
  using inWin = mx.less(linds, shifted);
  return mx.bitwiseAnd(m0, inWin);
}

/**
 * cache.py create_attention_mask(N, offset, return_array, window_size) — the version the
 * KVCache family's make_mask calls.
 */
export function cacheAttentionMask(N: number, offset: number, returnArray: boolean, windowSize: number | null | undefined): Mask {
  if (windowSize !== null && windowSize !== undefined) return createCausalMask(N, offset, windowSize);
  if (N === 1) return null;
  if (returnArray) return createCausalMask(N, offset, null);
  return "causal";
}

/**
 * base.py create_attention_mask(h, cache=None, window_size=None, return_array=False).
 * `h` is the hidden state (B, N, H) or just its shape; N = h.shape[1].
 */
export function createAttentionMask(
  h: MlxArray | readonly number[],
  cache?: MaskMaker | null,
  { windowSize = null, returnArray = false }: MakeMaskOptions = {},
): Mask {
  const shape = Array.isArray(h) ? (h as readonly number[]) : (h as MlxArray).shape;
  const N = shape[1];
  if (N === undefined) throw new RangeError(`createAttentionMask: h needs at least 2 dims, got shape [${shape}]`);
  if (cache && typeof cache.makeMask === "function") return cache.makeMask(N, { windowSize, returnArray });
  if (N === 1) return null;
  // Python: `return_array or (window_size and N > window_size)` — window_size 0/None is falsy.
  if (returnArray || (windowSize && N > windowSize)) return createCausalMask(N, 0, windowSize ?? null);
  return "causal";
}

/** Disposes an array mask; no-op for null / "causal". */
export function disposeMask(m: Mask): void {
  if (m !== null && m !== "causal") m.dispose();
}

/** A printable description of a mask's kind and shape (for failure messages). */
export function describeMask(m: Mask): string {
  if (m === null) return "None";
  if (m === "causal") return '"causal"';
  return `bool[${m.shape.join(",")}]`;
}
