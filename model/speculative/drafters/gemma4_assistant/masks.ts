// mlx_vlm/speculative/drafters/gemma4_assistant/masks.py (mlx-vlm 0.7.10), the unbatched path
// (integer offsets; B = 1, no padding): bidirectional masks for the drafter's queries over the
// target's K/V, as additive 0 / -inf biases, or null where nothing needs masking.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KV } from "../../../gemma4/gemma4_text.ts";
import type { LayerType } from "../../../gemma4/config.ts";

/** where(inside, 0.0, -inf) in `dtype`. */
function bias(inside: MlxArray, dtype: mx.Dtype): MlxArray {
  using zero = mx.array(0.0, [], dtype);
  using ninf = mx.array(-Infinity, [], dtype);
  return mx.where(inside, zero, ninf);
}

/** bidirectional_full_mask(query_len, kv_len, kv_valid_len, key_offset, dtype): (1, 1, 1, kv_len) or null. */
export function bidirectionalFullMask(kvLen: number, kvValidLen: number | null, keyOffset: number, dtype: mx.Dtype): MlxArray | null {
  if (kvValidLen === null) return null;
  if (keyOffset + kvLen <= kvValidLen) return null;
  using kIdx = mx.arange(keyOffset, keyOffset + kvLen);
  using inside = mx.less(kIdx, kvValidLen);
  using b = bias(inside, dtype);
  return mx.reshape(b, [1, 1, 1, kvLen]); // bias[None, None, None, :]
}

/** bidirectional_swa_mask(query_len, query_offset, kv_len, window, kv_valid_len, key_offset, dtype): (1, 1, L, kv_len) or null. */
export function bidirectionalSwaMask(queryLen: number, queryOffset: number, kvLen: number, window: number, kvValidLen: number | null, keyOffset: number, dtype: mx.Dtype): MlxArray | null {
  if (kvLen <= window && queryOffset - keyOffset < window && keyOffset + kvLen - (queryOffset + queryLen) < window) return null;
  using q0 = mx.arange(queryOffset, queryOffset + queryLen);
  using qIdx = mx.expandDims(q0, 1);
  using k0 = mx.arange(keyOffset, keyOffset + kvLen);
  using kIdx = mx.expandDims(k0, 0);
  using dist = mx.subtract(qIdx, kIdx);
  using gt = mx.greater(dist, -window);
  using lt = mx.less(dist, window);
  let inside = mx.bitwiseAnd(gt, lt);
  if (kvValidLen !== null) {
    using kv = mx.less(kIdx, Math.trunc(kvValidLen));
    const both = mx.bitwiseAnd(inside, kv);
    inside.dispose();
    inside = both;
  }
  using _i = inside;
  using b = bias(inside, dtype);
  return mx.expandDims(b, [0, 1]); // bias[None, None, :, :]
}

/** make_drafter_masks: one mask per layer type present in the shared K/V. */
export function makeDrafterMasks(sharedKv: Map<LayerType, KV>, queryLen: number, queryOffset: number, slidingWindow: number, dtype: mx.Dtype, kvValidLen: number | null = null): Map<LayerType, MlxArray | null> {
  const valid = kvValidLen ?? queryOffset;
  const masks = new Map<LayerType, MlxArray | null>();
  for (const [type, [K]] of sharedKv) {
    const kvLen = K.shape[K.ndim - 2]!;
    if (type === "sliding_attention") {
      // _local_window_offset: absolute positions onto the local rotating-cache window
      masks.set(type, bidirectionalSwaMask(queryLen, Math.min(queryOffset, kvLen), kvLen, slidingWindow, Math.min(valid, kvLen), 0, dtype));
    } else {
      masks.set(type, bidirectionalFullMask(kvLen, valid, Math.max(valid - kvLen, 0), dtype));
    }
  }
  return masks;
}
