// Test-only switch for the gemma4_unified port bugs (suites/unified/parity.test.ts and
// video.test.ts): each name re-introduces one plausible bug of the encoder-free embedder or the
// video path at the one place it lives. Stands on the shared switch (model/mutation_switch.ts);
// production code never switches anything on.
import { switchedOn, withSwitch, withSwitchAsync } from "../mutation_switch.ts";

export const UNIFIED_MUTATIONS = [
  "position_xy_swapped", // the 2-D position table's x column looked up with y and y with x
  "padding_not_masked", // padding positions (-1, clamped to 0) get the table's row 0 added
] as const;

/** The video path's bugs (suites/unified/video.test.ts). */
export const UNIFIED_VIDEO_MUTATIONS = [
  "unified_video_positions_xy_swapped", // the video processor writes each patch's position as [y, x]
  "unified_video_ple_ids_kept", // per-layer inputs looked up from the video placeholder ids instead of the pad id
] as const;

export type UnifiedMutation = (typeof UNIFIED_MUTATIONS)[number];
export type UnifiedVideoMutation = (typeof UNIFIED_VIDEO_MUTATIONS)[number];

/** True when the named unified bug is switched on (tests only). */
export const unifiedMutated = (name: UnifiedMutation | UnifiedVideoMutation): boolean => switchedOn(name);

/** Runs fn with exactly one unified bug switched on (tests only). */
export function withUnifiedMutation<T>(name: UnifiedMutation | UnifiedVideoMutation, fn: () => T): T {
  return withSwitch(name, fn);
}

/** withUnifiedMutation for an async fn. */
export function withUnifiedMutationAsync<T>(name: UnifiedMutation | UnifiedVideoMutation, fn: () => T | Promise<T>): Promise<T> {
  return withSwitchAsync(name, fn);
}
