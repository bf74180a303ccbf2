// Running the TS model the way the oracle ran mlx-lm, collecting taps (shared by the parity,
// cache-path and mutation suites).

import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { type CallRecord, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { type GoldenRule, goldenRule, loadGolden, readManifest } from "../../oracle/golden.ts";
import { KVCache, type KVCacheLike, RotatingKVCache } from "../../model/cache/index.ts";
import { type AnyModel, prefixed } from "../../model/gemma4/index.ts";
import { fromOracle, TapCollector, type TapData } from "./tap_compare.ts";

export const CKPT_ROOT = join(REPO_ROOT, ".cache", "checkpoints");

export const cacheFactory = {
  kvCache: (): KVCacheLike => new KVCache(),
  rotatingKVCache: (maxSize: number, keep: number): KVCacheLike => new RotatingKVCache(maxSize, keep),
};

/** One forward without cache on `tokens` (int32 ids), every tap collected. */
export function forwardTaps(model: AnyModel, tokens: number[][]): TapData[] {
  const col = new TapCollector();
  using x = mx.array(tokens.flat(), [tokens.length, tokens[0]!.length], "int32");
  using logits = model.call(x, { taps: col.sink });
  return col.taps;
}

/**
 * Replays the model calls of a recorded generate_step (prefill chunks, then steps) with fresh
 * caches from make_cache, each call fed the recorded ids in the recorded dtype.
 */
export function replayTaps(model: AnyModel, calls: readonly CallRecord[], theirs: readonly TapData[]): TapData[] {
  const caches = model.makeCache(cacheFactory);
  const col = new TapCollector();
  try {
    for (const call of calls) {
      const inTap = theirs.find((t) => t.name === `${call.prefix}inputs`);
      const dtype = (inTap?.dtype ?? "int32") as mx.Dtype;
      using x = mx.array(call.tokens.flat(), [call.batch, call.length], dtype);
      using logits = model.call(x, { cache: caches, taps: prefixed(col.sink, call.prefix) });
      const st = caches.flatMap((c) => c.state); // caller-owned handles
      mx.evaluate(logits, ...st);
      for (const a of st) a.dispose();
    }
  } finally {
    for (const c of caches) c.dispose();
  }
  return col.taps;
}

/** The sampler taps of generate_step (compared by the generation suites, not here). */
export function modelTapsOnly(taps: readonly TapData[]): TapData[] {
  return taps.filter((t) => !/(^|\/)(logprobs|token)$/.test(t.name));
}

export interface Reference {
  calls: CallRecord[];
  taps: TapData[];
  source: "golden" | "live";
}

let platformCheck: Promise<GoldenRule | undefined> | undefined;

/** The manifest's rule for goldens here (oracle/golden.ts goldenRule); undefined without goldens. */
export function goldenRuleHere(): Promise<GoldenRule | undefined> {
  platformCheck ??= (async () => {
    if (!manifest) return undefined;
    const rule = goldenRule(manifest, await (await sharedOracle()).fingerprint());
    if (rule.mode !== "exact") console.log(`[goldens] ${rule.what}`);
    return rule;
  })();
  return platformCheck;
}

const manifest = readManifest();

const memo = new Map<string, Promise<Reference>>();

/**
 * The oracle's full record of a scenario, to compare bytes against: the golden full dump when
 * there is one recorded on this platform (goldenRule exact), else a live capture (goldens of
 * another platform are never compared). Memoised for the test process: the cache-path and
 * mutation suites share them.
 */
export function reference(ckpt: string, scn: string): Promise<Reference> {
  const key = `${ckpt}/${scn}`;
  let p = memo.get(key);
  if (!p) {
    p = fetchReference(ckpt, scn);
    memo.set(key, p);
    p.catch(() => memo.delete(key));
  }
  return p;
}

async function fetchReference(ckpt: string, scn: string): Promise<Reference> {
  const gid = `${ckpt}/${scn}`;
  const rule = await goldenRuleHere();
  if (manifest?.entries[gid] && rule?.mode === "exact") {
    const g = loadGolden(gid);
    if (g.scenario.mode === "full" && g.scenario.calls) {
      return {
        calls: g.scenario.calls as unknown as CallRecord[],
        taps: g.taps.map((t) => fromOracle({ ...t, kind: t.kind ?? "array", array: g.arrays.get(t.name) })),
        source: "golden",
      };
    }
  }
  const cap = await (await sharedOracle()).capture(ckpt, scn, { mode: "full" });
  return { calls: cap.calls, taps: cap.taps.map(fromOracle), source: "live" };
}
