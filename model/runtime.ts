// The loaded Gemma 4 model as generation drives it: loadModel + the model's makeCache with
// model/cache's classes + a forward that optionally emits taps under the oracle's call prefixes
// ("prefill{k}/", "step{n}/"). Used by the parity command, `npm run generate` and the benchmarks.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVCache, type KVCacheLike, RotatingKVCache } from "./cache/index.ts";
import type { CallInfo, GenerateModel, StepInfo } from "./generate.ts";
import { type LoadedModel, loadModel, prefixed, type TapSink } from "./gemma4/index.ts";

export const cacheFactory = {
  kvCache: (): KVCacheLike => new KVCache(),
  rotatingKVCache: (maxSize: number, keep: number): KVCacheLike => new RotatingKVCache(maxSize, keep),
};

/** The oracle's tap prefix of one generate_step model call. */
export function callPrefix(call: CallInfo): string {
  return `${call.kind}${call.index}/`;
}

/** Wraps a loaded model for generateStep; `taps` (optional) receives every tap, prefixed per call. */
export function generationModel(loaded: LoadedModel, taps?: TapSink): GenerateModel {
  const { model } = loaded;
  return {
    makeCache: () => model.makeCache(cacheFactory) as KVCacheLike[],
    forward: (inputs: MlxArray, cache: KVCacheLike[], call: CallInfo): MlxArray =>
      model.call(inputs, { cache, taps: taps ? prefixed(taps, callPrefix(call)) : undefined }),
  };
}

export function loadGenerationModel(dir: string, taps?: TapSink): { loaded: LoadedModel; model: GenerateModel } {
  const loaded = loadModel(dir);
  return { loaded, model: generationModel(loaded, taps) };
}

/**
 * generate_step's own taps of each _step call, as the oracle records them: the sampler's input
 * `logprobs` (B, V) and its output `token`. Pass the result as generateStep's onStep.
 */
export function stepTaps(taps: TapSink): (info: StepInfo) => void {
  return (info) => {
    if (info.call.kind !== "step" || !info.logprobs || !info.sampled) return;
    const prefix = callPrefix(info.call);
    using lp = mx.expandDims(info.logprobs, 0);
    taps(`${prefix}logprobs`, lp);
    taps(`${prefix}token`, info.sampled);
  };
}
