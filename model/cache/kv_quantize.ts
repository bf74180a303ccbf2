// mlx_vlm/generate/common.py maybe_quantize_kv_cache (mlx-vlm 0.7.10): which caches are converted
// and when. generate_step calls it after every model call (each prefill chunk, each _step).
//
// - TurboQuant (fractional bits or scheme "turboquant"): every entry but the last one (when there
//   are more than two) that is a KVCache becomes a TurboQuantKVCache: an empty one (offset 0) at
//   once, a filled one once its offset reaches quantized_kv_start (from_cache); RotatingKVCache
//   (sliding layers) and caches already converted stay as they are.
// - Uniform: every cache with to_quantized and offset >= quantized_kv_start, in layer order, the
//   last one included. RotatingKVCache.to_quantized raises NotImplementedError("RotatingKVCache
//   Quantization NYI"), and every Gemma 4 shape starts with a sliding layer, so mlx-vlm stops
//   there (after the tokens generated before); the port raises the same error at the same call.
//   A KVCache becomes a QuantizedKVCache (to_quantized, kv_quantize_uniform.ts): only an
//   all-full-attention shape gets that far.
// - Mixed key/value schemes: HybridQuantKVCache (turboquant_hybrid.ts), converted as mlx-vlm's
//   hybridize does. A .5 key or value TurboQuant width runs the Split codec (turboquant_split.ts).
//
// KV sharing: a KV-shared layer attends over what its donor layer (the last non-shared layer of
// its type) returned from update_and_fetch. When that donor's cache is converted, mlx-vlm hands
// the shared layer quantized-state proxies and fails inside attention (TypeError in
// mx.fast.scaled_dot_product_attention; bench/kvquant/kv_shared_repro.py reproduces it). The port
// refuses such a model up front (kvSharedDonorConflict) and again at conversion time.
import { fromLegacy, KVQuantError, type LegacyKVQuantArgs, turboquantEnabled } from "../kv_quant.ts";
import { KVCache, type KVCacheLike, RotatingKVCache } from "./index.ts";
import { QuantizedKVCache } from "./kv_quantize_uniform.ts";
import { TurboQuantKVCache, type TurboQuantOptions } from "./turboquant.ts";
import { needsSplitCodec, TurboQuantSplitKVCache } from "./turboquant_split.ts";
import { HybridQuantKVCache } from "./turboquant_hybrid.ts";

export interface KVQuantConfig extends LegacyKVQuantArgs {
  quantizedKvStart: number;
  /** Cache indices read by KV-shared layers (their donors): converting one is refused. */
  sharedDonors?: ReadonlySet<number>;
  /** TurboQuant codec options (rotation matrices for non-power-of-two head dims). */
  turbo?: Pick<TurboQuantOptions, "rotation" | "seed">;
}

/** The layers whose caches KV-shared layers read (Gemma4TextModel.previous_kvs), by type. */
export function sharedDonors(layerTypes: readonly string[], numKvShared: number): Map<number, number[]> {
  const donors = new Map<number, number[]>();
  const M = layerTypes.length - numKvShared;
  if (numKvShared <= 0 || M <= 0) return donors;
  const byType = new Map<string, number>();
  for (let i = 0; i < M; i++) byType.set(layerTypes[i]!, i);
  for (let j = M; j < layerTypes.length; j++) {
    const d = byType.get(layerTypes[j]!);
    if (d === undefined) continue;
    donors.set(d, [...(donors.get(d) ?? []), j]);
  }
  return donors;
}

/**
 * With TurboQuant: the first donor layer whose (full-attention) cache mlx-vlm would convert,
 * i.e. a full-attention donor that is not the last cache entry; null when none. The caches are
 * make_cache's: one per non-shared layer.
 */
export function kvSharedDonorConflict(layerTypes: readonly string[], numKvShared: number): { donor: number; readers: number[] } | null {
  const nCaches = layerTypes.length - numKvShared;
  const last = nCaches > 2 ? nCaches - 1 : -1;
  for (const [d, readers] of sharedDonors(layerTypes, numKvShared)) {
    if (d !== last && layerTypes[d] === "full_attention") return { donor: d, readers };
  }
  return null;
}

export function kvSharedRefusal(c: { donor: number; readers: number[] }): string {
  return (
    `--kv-bits with TurboQuant on this model: KV-shared layer(s) ${c.readers.join(", ")} read layer ${c.donor}'s cache, which would be quantized; ` +
    `mlx-vlm 0.7.10 then fails inside attention (TypeError from scaled_dot_product_attention), so the port refuses (use a model whose last non-shared layer is full attention, or no --kv-bits)`
  );
}

/**
 * maybe_quantize_kv_cache on `cache` in place (replaced entries are disposed). Returns the
 * function generate_step calls after each model call; throws a KVQuantError for a bad policy at
 * once (from_legacy runs first in mlx-vlm too).
 */
export function makeKvQuantizer(cfg: KVQuantConfig): ((cache: KVCacheLike[]) => void) | null {
  const policy = fromLegacy(cfg);
  if (policy === null) return null;
  if (!policy.isHomogeneous) {
    // hybridize (turboquant_hybrid.ts): like TurboQuant's rule, but an empty KVCache or one at the start
    const hstart = cfg.quantizedKvStart;
    new HybridQuantKVCache(policy, undefined, cfg.turbo).dispose();
    return (cache) => {
      const last = cache.length > 2 ? cache.length - 1 : -1;
      for (let i = 0; i < cache.length; i++) {
        const e = cache[i]!;
        if (i === last || !(e instanceof KVCache)) continue; // RotatingKVCache, HybridQuantKVCache, others
        if (!(e.offset >= hstart || e.offset === 0)) continue;
        if (cfg.sharedDonors?.has(i)) throw new KVQuantError(`cache ${i} is read by KV-shared layers; converting it to a HybridQuantKVCache is not checked against mlx-vlm, so the port refuses`);
        cache[i] = HybridQuantKVCache.fromCache(e, policy, cfg.turbo);
        e.dispose();
      }
    };
  }
  const start = cfg.quantizedKvStart;
  if (turboquantEnabled(cfg.kvBits, cfg.kvQuantScheme ?? null)) {
    const opts: TurboQuantOptions = { ...cfg.turbo, keyBits: cfg.kvKeyBits ?? null, valueBits: cfg.kvValueBits ?? null };
    // a .5 key or value width runs mlx-vlm's Split codec (turboquant_split.ts); constructing
    // once validates the bits before generation
    const Cache = needsSplitCodec(cfg.kvBits!, opts.keyBits ?? null, opts.valueBits ?? null) ? TurboQuantSplitKVCache : TurboQuantKVCache;
    new Cache(cfg.kvBits!, opts).dispose();
    return (cache) => {
      const last = cache.length > 2 ? cache.length - 1 : -1;
      for (let i = 0; i < cache.length; i++) {
        if (i === last) continue;
        const e = cache[i]!;
        if (!(e instanceof KVCache)) continue; // RotatingKVCache, TurboQuantKVCache (either class), others
        if (e.offset !== 0 && e.offset < start) continue;
        if (cfg.sharedDonors?.has(i)) throw new KVQuantError(`cache ${i} is read by KV-shared layers; quantizing it fails in mlx-vlm (see kvSharedRefusal)`);
        cache[i] = e.offset === 0 ? new Cache(cfg.kvBits!, opts) : Cache.fromCache(e, cfg.kvBits!, opts);
        e.dispose();
      }
    };
  }
  const groupSize = Math.trunc(cfg.kvGroupSize ?? 64);
  const bits = Math.trunc(cfg.kvBits!);
  return (cache) => {
    for (let i = 0; i < cache.length; i++) {
      const e = cache[i]!;
      if (e.offset < start) continue;
      if (e instanceof RotatingKVCache) throw new KVQuantError("RotatingKVCache Quantization NYI");
      if (!(e instanceof KVCache)) continue; // QuantizedKVCache has no to_quantized
      if (cfg.sharedDonors?.has(i)) throw new KVQuantError(`cache ${i} is read by KV-shared layers; quantizing it fails in mlx-vlm (see kvSharedRefusal)`);
      cache[i] = QuantizedKVCache.fromKVCache(e, groupSize, bits);
      e.dispose();
    }
  };
}
