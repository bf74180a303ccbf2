// Test-only switch for the gemma4_unified port bugs (suites/unified/parity.test.ts): each name
// re-introduces one plausible bug of the encoder-free embedder at the one place it lives. Stands on
// the shared switch (model/mutation_switch.ts); production code never switches anything on.
import { switchedOn, withSwitch } from "../mutation_switch.ts";

export const UNIFIED_MUTATIONS = [
  "position_xy_swapped", // the 2-D position table's x column looked up with y and y with x
  "padding_not_masked", // padding positions (-1, clamped to 0) get the table's row 0 added
] as const;

export type UnifiedMutation = (typeof UNIFIED_MUTATIONS)[number];

/** True when the named unified bug is switched on (tests only). */
export const unifiedMutated = (name: UnifiedMutation): boolean => switchedOn(name);

/** Runs fn with exactly one unified bug switched on (tests only). */
export function withUnifiedMutation<T>(name: UnifiedMutation, fn: () => T): T {
  return withSwitch(name, fn);
}
