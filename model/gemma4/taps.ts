// Tap sink: how the model exposes its intermediates to the parity suites, with the names of the
// oracle's scheme (oracle/TAPS.md, oracle/taps.json), in execution order.
//
// Contract: the model calls `taps(name, value, meta?)` synchronously; `value` is BORROWED: the
// model may dispose the array right after the call. A sink that needs the data later must copy
// it now (toBytes()) or take its own reference (e.g. mx.stopGradient(value)). Without a sink the
// model never builds a tap name or touches an array for it: `if (taps)` guards every call.

import type { MlxArray } from "@mlx-bun/mlx";

/** An array, a mask string / null (masks), or a plain JS number (the no-cache Python int offset). */
export type TapValue = MlxArray | "causal" | null | number;

export type TapMeta = Record<string, unknown>;

export type TapSink = (name: string, value: TapValue, meta?: TapMeta) => void;

/** Prefixes every tap name (e.g. "prefill0/", "step3/" for generate calls). */
export function prefixed(sink: TapSink, prefix: string): TapSink {
  return (name, value, meta) => sink(prefix + name, value, meta);
}
