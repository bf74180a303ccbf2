// Test-only switch for the mutation suite (suites/mutations/): each name re-introduces one known
// Gemma 4 port bug (../shared/docs/gemma4-port-bugs.md, spec §10/§12) at the one place it lives.
// The switch itself is model/mutation_switch.ts, shared with the tuner's list
// (model/tuner/mutations.ts); production code never switches anything on.
import { switchedOn, withSwitch, withSwitchAsync } from "../mutation_switch.ts";

export const MUTATIONS = [
  "rope_full_factor_1", // RoPE partial factor 1.0 on full layers (mlx-lm #1114)
  "router_softmax_all", // softmax over all experts before top-k, then renormalise (pre-#1114)
  "keqv_values_after_norm", // k_eq_v: V taken from the normed K instead of the raw projection
  "no_layer_scalar", // layer_scalar multiply missing
  "no_double_wide", // double-wide MLP off on KV-shared layers
  "embed_scale_f32", // embed scale applied as a float32 array (promotes bf16 to f32)
  "gelu_cube_mul", // x*x*x in place of power(x, 3) in gelu_approx
  "rope_offset_after_update", // RoPE offset read after the cache update
  "mask_wrong_type", // sliding layers get the full-attention mask and vice versa
  "no_sanitize_shared_kv", // sanitize keeps shared-layer K/V (strict load fails)
  "ple_unscaled_embeddings", // per-layer projection fed the unscaled embeddings
  "no_softcap", // final logit softcap missing
  "shared_kv_first_source", // KV-shared layers take K/V from the FIRST non-shared layer of their type
  "rope_contiguous_partial", // proportional RoPE as nn.RoPE(int(hd*prf)) (contiguous prefix)
  "router_normed_input", // router fed the pre-FFN-normed h instead of the residual
  "v_norm_missing", // values not passed through the no-scale RMSNorm
  "sdpa_scale_rsqrt", // attention scale 1/sqrt(head_dim) instead of Gemma 4's 1.0
  "per_layer_input_scale_missing", // (p + r) not multiplied by 2**-0.5
  "ple_projection_scaled_linear", // PLE projection not quantizable (ScaledLinear, mlx-lm #1112)
] as const;

export type Mutation = (typeof MUTATIONS)[number];

/** Multimodal port bugs (vision/audio towers, merge, media masks): suites/mutations/multimodal.test.ts. */
export const MEDIA_MUTATIONS = [
  "rope_axes_swapped", // 2-D RoPE: the first head-dim half rotated by y and the second by x
  "patchify_channel_major", // patch vectors in (channel, row, col) order instead of (row, col, channel)
  "pool_window_off_by_one", // position pooler bins of (k+1) x (k+1) patches
  "no_pooler_scale", // the pooler's final * sqrt(hidden_size) missing
  "image_block_causal", // causal attention inside image blocks (no bidirectional overlay)
  "merge_order_reversed", // placeholders filled with the features in reverse order
  "ple_media_ids_kept", // per-layer inputs looked up from the media placeholder ids instead of the pad id
  "audio_mask_not_inverted", // the processor's valid-frame mask passed to the tower as its invalid mask
  "audio_chunk_mask_shifted", // the chunked attention's causal window shifted by one frame
  "audio_q_scale_f32", // q_scale * softplus(per_dim_scale) in float32 instead of the parameter dtype
] as const;

export type MediaMutation = (typeof MEDIA_MUTATIONS)[number];

/** Video port bugs (processor, tower positions, per-layer inputs): caught in suites/multimodal/video.test.ts. */
export const VIDEO_MUTATIONS = [
  "video_ple_ids_kept", // video placeholder ids left in the per-layer input lookup (only image/audio excluded)
  "video_timestamp_off_by_one", // frame j labelled (j + 1) / fps
  "video_positions_xy_swapped", // patch positions written [row, col] instead of [x = col, y = row]
  "video_padding_not_masked", // padding patches (position -1) treated as real in the tower
] as const;

export type VideoMutation = (typeof VIDEO_MUTATIONS)[number];

/** True when the named video bug is switched on (tests only). */
export const videoMutated = (name: VideoMutation): boolean => switchedOn(name);

/** A model or media port bug of these lists. */
export type ModelMutation = Mutation | MediaMutation | VideoMutation;

/** True when the named bug is switched on (tests only). */
export const mutated = (name: Mutation): boolean => switchedOn(name);

/** True when the named multimodal bug is switched on (tests only). */
export const mediaMutated = (name: MediaMutation): boolean => switchedOn(name);

/** Runs fn with exactly one mutation active (tests only). */
export function withMutation<T>(name: ModelMutation, fn: () => T): T {
  return withSwitch(name, fn);
}

/** Runs an async fn with exactly one mutation active (tests only). */
export function withMutationAsync<T>(name: ModelMutation, fn: () => T | Promise<T>): Promise<T> {
  return withSwitchAsync(name, fn);
}
