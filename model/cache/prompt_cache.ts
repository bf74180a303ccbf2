// Prompt-cache files in mlx-lm's format (mlx_lm/models/cache.py save_prompt_cache /
// load_prompt_cache / can_trim_prompt_cache / trim_prompt_cache, mlx-lm 0.32.2), so that a file
// written here loads in mlx-lm and continues bit for bit, and the other way round.
//
// The file is one .safetensors:
//   tensors   "{layer}.{i}": the i-th entry of the layer's mlx-lm `state` tuple
//             KVCache         (keys, values, offset)
//             RotatingKVCache (keys, values, offset, keep, max_size, _idx)
//             integers are 0-d int32 arrays, an absent buffer (empty cache) is mx.array([]) (f32 (0,))
//   metadata  tree_flatten([user metadata, class names, scalars]):
//             "0.<key>" user metadata; "1.<layer>" class name; "2.0" = "" (sentinel);
//             "2.<n>.0" a tensor key, "2.<n>.1" "scalar" | "none" (how to read it back), n = 1, 2, …
//             in state order.
// Buffers are written as held (KVCache: the whole 256-step buffer; RotatingKVCache: physical
// order), as mlx-lm's `state` returns them, so a loaded cache continues exactly where it was.
//
// Quantized caches (mlx-vlm 0.7.10's TurboQuantKVCache): mlx-lm cannot load them and mlx-vlm has
// no prompt-cache functions, so a file holding one is written in the interop format of
// oracle/python/kv_quant_prompt_cache.py: exactly what mlx-lm's save_prompt_cache writes from
// mlx-vlm's cache objects (their `state`: KVCache (keys[:offset], values[:offset]), RotatingKVCache
// (keys, values) sliced to the offset while it is below the buffer, TurboQuantKVCache
// ((key norms, key indices), (value norms, value indices)) sliced to the offset, tensors
// "{layer}.{i}[.{j}]"), plus the user-metadata entry "mlx_vlm_meta_state": JSON, every cache's
// meta_state ("" for KVCache), which mlx-lm 0.32.2's files have no place for. Such a file loads
// here and in Python (load_vlm_prompt_cache, into mlx-vlm's classes) and continues bit for bit
// (suites/kvquant/prompt_cache_interop.test.ts).
//
// Writing goes to a temporary name beside the target and is renamed into place: an interrupted
// save never leaves a half-written file. Every problem is a PromptCacheError naming the file and
// the key at fault.
import { existsSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { GenerateModel } from "../generate.ts";
import { prefillChunks } from "../generate_speculative.ts";
import { CacheError, KVCache, type KVCacheLike, RotatingKVCache } from "./index.ts";
import { TurboQuantKVCache } from "./turboquant.ts";

/** The user-metadata key of the mlx-vlm interop format (see the header). */
export const VLM_META_STATE_KEY = "mlx_vlm_meta_state";

export class PromptCacheError extends Error {
  constructor(
    readonly file: string,
    readonly key: string | null,
    detail: string,
  ) {
    super(`${file}${key !== null ? ` [${key}]` : ""}: ${detail}`);
    this.name = "PromptCacheError";
  }
}

/** The cache classes a prompt-cache file can hold (mlx-lm's class names). */
export type PromptCacheClass = "KVCache" | "RotatingKVCache" | "TurboQuantKVCache";

type StateEntry = MlxArray | number | null;

function className(c: KVCacheLike): PromptCacheClass {
  // exact classes: a subclass (mlx-vlm's BufferedRotatingKVCache) has another layout and state
  if (c.constructor === RotatingKVCache) return "RotatingKVCache";
  if (c.constructor === KVCache) return "KVCache";
  if (c.constructor === TurboQuantKVCache) return "TurboQuantKVCache";
  throw new CacheError("savePromptCache", `cannot save a ${c.constructor.name} (mlx-lm files hold KVCache and RotatingKVCache; the mlx-vlm interop format adds TurboQuantKVCache)`);
}

function sliceTo(a: MlxArray, end: number): MlxArray {
  const stop = [...a.shape];
  stop[2] = end;
  return mx.slice(a, a.shape.map(() => 0), stop);
}

/**
 * The flattened `state` of the mlx-vlm cache object a port cache stands for, and its meta_state:
 * [suffix of the tensor key, entry] pairs (arrays caller-owned).
 */
function vlmState(c: KVCacheLike): { entries: [string, MlxArray | null][]; meta: string[] | "" } {
  if (c instanceof TurboQuantKVCache) {
    const st = c.quantizedState;
    if (st.length === 0) return { entries: [["0", null], ["1", null]], meta: c.metaState };
    return { entries: [["0.0", st[0]!], ["0.1", st[1]!], ["1.0", st[2]!], ["1.1", st[3]!]], meta: c.metaState };
  }
  const buf = c as KVCache | RotatingKVCache;
  const kv = (): [string, MlxArray | null][] => {
    if (buf.keys === null || buf.values === null) return [["0", null], ["1", null]];
    // KVCache: sliced unless the offset fills the buffer; RotatingKVCache: sliced while below it
    if (c.offset < buf.keys.shape[2]!) return [["0", sliceTo(buf.keys, c.offset)], ["1", sliceTo(buf.values, c.offset)]];
    return [["0", mx.alias(buf.keys)], ["1", mx.alias(buf.values)]];
  };
  if (c instanceof RotatingKVCache) return { entries: kv(), meta: [c.keep, c.maxSize, c.offset, c.idx].map(String) };
  return { entries: kv(), meta: "" };
}

/** The interop format for mlx-vlm cache objects (see the header); chosen by savePromptCache when a cache is quantized. */
export function saveVlmPromptCache(file: string, cache: readonly KVCacheLike[], metadata: Record<string, string> = {}): void {
  if (!file.endsWith(".safetensors")) throw new PromptCacheError(file, null, "a prompt-cache file name must end in .safetensors (MLX appends the suffix otherwise)");
  if (VLM_META_STATE_KEY in metadata) throw new PromptCacheError(file, `0.${VLM_META_STATE_KEY}`, "this metadata key is reserved for the caches' meta_state");
  const arrays = new Map<string, MlxArray>();
  const meta: Record<string, string> = {};
  const owned: MlxArray[] = [];
  for (const [k, v] of Object.entries(metadata)) {
    if (typeof v !== "string") throw new PromptCacheError(file, `0.${k}`, `metadata values must be strings, got ${typeof v}`);
    meta[`0.${k}`] = v;
  }
  meta["2.0"] = "";
  let n = 0;
  const metas: (string[] | "")[] = [];
  try {
    cache.forEach((c, layer) => {
      meta[`1.${layer}`] = className(c);
      const { entries, meta: m } = vlmState(c);
      metas.push(m);
      for (const [suffix, a] of entries) {
        const key = `${layer}.${suffix}`;
        if (a !== null) {
          owned.push(a);
          arrays.set(key, a);
          continue;
        }
        n += 1;
        meta[`2.${n}.0`] = key;
        meta[`2.${n}.1`] = "none";
        const empty = mx.array(new Float32Array(0), [0], "float32"); // mx.array([])
        owned.push(empty);
        arrays.set(key, empty);
      }
    });
    meta[`0.${VLM_META_STATE_KEY}`] = JSON.stringify(metas);
    const tmp = join(dirname(file), `.${basename(file, ".safetensors")}.${process.pid}.tmp.safetensors`);
    try {
      mx.saveSafetensors(tmp, arrays, meta);
      renameSync(tmp, file);
    } catch (e) {
      rmSync(tmp, { force: true });
      throw new PromptCacheError(file, null, `cannot write the prompt cache: ${(e as Error).message}`);
    }
  } finally {
    for (const a of owned) a.dispose();
  }
}

/** The mlx-lm 0.32.2 `state` tuple of a cache; arrays are borrowed from the cache. */
function stateTuple(c: KVCacheLike): StateEntry[] {
  const buf = c as KVCache | RotatingKVCache;
  const kv: StateEntry[] = [buf.keys, buf.values];
  if (c instanceof RotatingKVCache) return [...kv, c.offset, c.keep, c.maxSize, c.idx];
  return [...kv, c.offset];
}

/** save_prompt_cache(file, cache, metadata). */
export function savePromptCache(file: string, cache: readonly KVCacheLike[], metadata: Record<string, string> = {}): void {
  // mlx-lm cannot hold a quantized cache: such a list is written in the mlx-vlm interop format
  if (cache.some((c) => c instanceof TurboQuantKVCache)) return saveVlmPromptCache(file, cache, metadata);
  if (!file.endsWith(".safetensors")) throw new PromptCacheError(file, null, "a prompt-cache file name must end in .safetensors (MLX appends the suffix otherwise)");
  const arrays = new Map<string, MlxArray>();
  const meta: Record<string, string> = {};
  const owned: MlxArray[] = [];
  for (const [k, v] of Object.entries(metadata)) {
    if (typeof v !== "string") throw new PromptCacheError(file, `0.${k}`, `metadata values must be strings, got ${typeof v}`);
    meta[`0.${k}`] = v;
  }
  meta["2.0"] = "";
  let n = 0;
  try {
    cache.forEach((c, layer) => {
      meta[`1.${layer}`] = className(c);
      stateTuple(c).forEach((entry, i) => {
        const key = `${layer}.${i}`;
        if (entry instanceof mx.MlxArray) {
          arrays.set(key, entry);
          return;
        }
        n += 1;
        meta[`2.${n}.0`] = key;
        if (entry === null) {
          meta[`2.${n}.1`] = "none";
          const empty = mx.array(new Float32Array(0), [0], "float32"); // mx.array([])
          owned.push(empty);
          arrays.set(key, empty);
        } else {
          meta[`2.${n}.1`] = "scalar";
          const s = mx.array(Int32Array.from([entry]), [], "int32"); // mx.array(int)
          owned.push(s);
          arrays.set(key, s);
        }
      });
    });
    const tmp = join(dirname(file), `.${basename(file, ".safetensors")}.${process.pid}.tmp.safetensors`);
    try {
      mx.saveSafetensors(tmp, arrays, meta);
      renameSync(tmp, file);
    } catch (e) {
      rmSync(tmp, { force: true });
      throw new PromptCacheError(file, null, `cannot write the prompt cache: ${(e as Error).message}`);
    }
  } finally {
    for (const a of owned) a.dispose();
  }
}

export interface LoadedPromptCache {
  cache: KVCacheLike[];
  /** The user metadata ("0.<key>" entries, prefix removed). */
  metadata: Record<string, string>;
}

function intOf(file: string, key: string, a: MlxArray): number {
  if (a.ndim !== 0 || !(a.dtype.startsWith("int") || a.dtype.startsWith("uint"))) {
    throw new PromptCacheError(file, key, `expected an integer scalar, got ${a.dtype}[${a.shape}]`);
  }
  return a.item() as number;
}

/** load_prompt_cache(file, return_metadata=True). The caller owns the returned caches. */
export function loadPromptCache(file: string): LoadedPromptCache {
  if (!existsSync(file)) throw new PromptCacheError(file, null, "no such prompt-cache file");
  if (!statSync(file).isFile()) throw new PromptCacheError(file, null, "not a file");
  let loaded: mx.Safetensors;
  try {
    loaded = mx.loadSafetensors(file);
  } catch (e) {
    throw new PromptCacheError(file, null, `not a readable safetensors file (truncated or corrupt?): ${(e as Error).message}`);
  }
  const { arrays, metadata: raw } = loaded;
  const out: KVCacheLike[] = [];
  try {
    const metadata: Record<string, string> = {};
    const classes: string[] = [];
    const kinds = new Map<string, string>();
    const scalarKeys = new Map<number, { key?: string; kind?: string }>();
    for (const [k, v] of Object.entries(raw)) {
      const parts = k.split(".");
      if (parts[0] === "0" && parts.length > 1) metadata[parts.slice(1).join(".")] = v;
      else if (parts[0] === "1" && parts.length === 2 && /^\d+$/.test(parts[1]!)) classes[Number(parts[1])] = v;
      else if (parts[0] === "2" && parts.length === 3 && /^\d+$/.test(parts[1]!) && (parts[2] === "0" || parts[2] === "1")) {
        const e = scalarKeys.get(Number(parts[1])) ?? {};
        if (parts[2] === "0") e.key = v;
        else e.kind = v;
        scalarKeys.set(Number(parts[1]), e);
      }
    }
    if (classes.length === 0 || !("2.0" in raw)) {
      throw new PromptCacheError(file, null, "not a prompt-cache file: the metadata has no cache class names (\"1.<layer>\") or no scalar table (\"2.0\")");
    }
    if (VLM_META_STATE_KEY in metadata) {
      loadVlmLayers(file, arrays, classes, kinds, scalarKeys, metadata, out);
      return { cache: out, metadata };
    }
    for (const [n, e] of scalarKeys) {
      if (e.key === undefined || e.kind === undefined) throw new PromptCacheError(file, `2.${n}`, "incomplete scalar entry in the metadata");
      if (e.kind !== "scalar" && e.kind !== "none") throw new PromptCacheError(file, `2.${n}.1`, `unknown scalar type ${JSON.stringify(e.kind)}`);
      kinds.set(e.key, e.kind);
    }
    const entry = (layer: number, i: number, want: "array" | "int"): MlxArray | number | null => {
      const key = `${layer}.${i}`;
      const a = arrays.get(key);
      if (a === undefined) throw new PromptCacheError(file, key, "missing tensor (the file is truncated or was written for another cache layout)");
      const kind = kinds.get(key);
      if (kind === "none") return null;
      if (want === "int") {
        if (kind !== "scalar") throw new PromptCacheError(file, key, "expected a scalar entry");
        return intOf(file, key, a);
      }
      if (kind === "scalar") throw new PromptCacheError(file, key, "expected an array, found a scalar");
      return a;
    };
    for (let layer = 0; layer < classes.length; layer++) {
      const cls = classes[layer];
      if (cls === undefined) throw new PromptCacheError(file, `1.${layer}`, "missing class name");
      const keys = entry(layer, 0, "array") as MlxArray | null;
      const values = entry(layer, 1, "array") as MlxArray | null;
      if ((keys === null) !== (values === null)) throw new PromptCacheError(file, `${layer}.0`, "keys and values must both be present or both absent");
      const state = keys && values ? [keys, values] : [];
      try {
        if (cls === "KVCache") {
          out.push(KVCache.fromState(state, [String(entry(layer, 2, "int"))]));
        } else if (cls === "RotatingKVCache") {
          const [offset, keep, maxSize, idx] = [2, 3, 4, 5].map((i) => String(entry(layer, i, "int")));
          out.push(RotatingKVCache.fromState(state, [keep!, maxSize!, offset!, idx!]));
        } else {
          throw new PromptCacheError(file, `1.${layer}`, `unsupported cache class ${JSON.stringify(cls)} (this port reads KVCache and RotatingKVCache)`);
        }
      } catch (e) {
        if (e instanceof CacheError) throw new PromptCacheError(file, `${layer}.*`, e.message);
        throw e;
      }
    }
    return { cache: out, metadata };
  } catch (e) {
    for (const c of out) c.dispose();
    throw e;
  } finally {
    for (const a of arrays.values()) a.dispose();
  }
}

/** The layers of an interop-format file (mlx-vlm cache objects' state + meta_state; see the header). */
function loadVlmLayers(
  file: string,
  arrays: Map<string, MlxArray>,
  classes: string[],
  kinds: Map<string, string>,
  scalarKeys: Map<number, { key?: string; kind?: string }>,
  metadata: Record<string, string>,
  out: KVCacheLike[],
): void {
  for (const [n, e] of scalarKeys) {
    if (e.key === undefined || e.kind !== "none") throw new PromptCacheError(file, `2.${n}`, "the mlx-vlm interop format has only \"none\" entries in its scalar table");
    kinds.set(e.key, e.kind);
  }
  let metas: unknown;
  try {
    metas = JSON.parse(metadata[VLM_META_STATE_KEY]!);
  } catch (e) {
    throw new PromptCacheError(file, `0.${VLM_META_STATE_KEY}`, `not JSON: ${(e as Error).message}`);
  }
  delete metadata[VLM_META_STATE_KEY];
  if (!Array.isArray(metas) || metas.length !== classes.length || !metas.every((m) => m === "" || (Array.isArray(m) && m.every((x) => typeof x === "string")))) {
    throw new PromptCacheError(file, `0.${VLM_META_STATE_KEY}`, `must be a JSON list of ${classes.length} meta_states (lists of strings, or "")`);
  }
  const get = (key: string): MlxArray | null => {
    if (kinds.get(key) === "none") return null;
    const a = arrays.get(key);
    if (a === undefined) throw new PromptCacheError(file, key, "missing tensor (the file is truncated or was written for another cache layout)");
    return a;
  };
  const pair = (a: MlxArray | null, b: MlxArray | null, key: string): MlxArray[] => {
    if ((a === null) !== (b === null)) throw new PromptCacheError(file, key, "keys and values must both be present or both absent");
    return a && b ? [a, b] : [];
  };
  for (let layer = 0; layer < classes.length; layer++) {
    const cls = classes[layer];
    const m = metas[layer] as string[] | "";
    if (cls === undefined) throw new PromptCacheError(file, `1.${layer}`, "missing class name");
    try {
      if (cls === "KVCache") {
        const st = pair(get(`${layer}.0`), get(`${layer}.1`), `${layer}.0`);
        out.push(KVCache.fromState(st, [String(st.length ? st[0]!.shape[2]! : 0)]));
      } else if (cls === "RotatingKVCache") {
        if (m === "" || m.length !== 4) throw new PromptCacheError(file, `0.${VLM_META_STATE_KEY}`, `layer ${layer}: a RotatingKVCache meta_state is [keep, max_size, offset, _idx]`);
        out.push(RotatingKVCache.fromState(pair(get(`${layer}.0`), get(`${layer}.1`), `${layer}.0`), m));
      } else if (cls === "TurboQuantKVCache") {
        if (m === "" || m.length < 3) throw new PromptCacheError(file, `0.${VLM_META_STATE_KEY}`, `layer ${layer}: a TurboQuantKVCache meta_state is [offset, bits, seed, key_bits, value_bits]`);
        const empty = kinds.get(`${layer}.0`) === "none";
        const st = empty ? [] : [`${layer}.0.0`, `${layer}.0.1`, `${layer}.1.0`, `${layer}.1.1`].map((k) => get(k)!);
        if (!empty && [`${layer}.0.2`, `${layer}.1.2`].some((k) => arrays.has(k) || arrays.has(`${k}.0`))) {
          throw new PromptCacheError(file, `${layer}.0`, "a TurboQuant state other than the MSE codec's (norms, indices): the Split codec's outlier indices are in neither state nor meta_state, so it cannot be restored");
        }
        const t = new TurboQuantKVCache(Number(m[1]));
        try {
          t.state = st; // then meta_state, as mlx-vlm: its offset wins
          t.metaState = m;
        } catch (e) {
          t.dispose();
          throw e;
        }
        out.push(t);
      } else {
        throw new PromptCacheError(file, `1.${layer}`, `unsupported cache class ${JSON.stringify(cls)} (the mlx-vlm interop format holds KVCache, RotatingKVCache and TurboQuantKVCache)`);
      }
    } catch (e) {
      if (e instanceof CacheError || (e instanceof Error && e.name === "KVQuantError")) throw new PromptCacheError(file, `${layer}.*`, e.message);
      throw e;
    }
  }
}

/** can_trim_prompt_cache: every cache is trimmable. */
export function canTrimPromptCache(cache: readonly KVCacheLike[]): boolean {
  return cache.every((c) => c.isTrimmable());
}

/**
 * trim_prompt_cache(cache, n): trims every cache by n tokens (each clamped to its offset, as
 * Python's `min(offset, n)`) or, if any cache is not trimmable, none at all; returns the first
 * cache's count (0 for none).
 */
export function trimPromptCache(cache: readonly KVCacheLike[], numTokens: number): number {
  if (!Number.isInteger(numTokens) || numTokens < 0) throw new CacheError("trimPromptCache", `numTokens must be a non-negative integer, got ${numTokens}`);
  if (!canTrimPromptCache(cache) || cache.length === 0) return 0;
  return cache.map((c) => c.trim(Math.min(c.offset, numTokens)))[0]!;
}

/**
 * Checks that loaded caches fit a model: as many caches as the model's make_cache, the same
 * class and window per layer, and keys/values of the layer's head count and head size.
 * `expected` is the model's fresh makeCache() list (disposed by the caller).
 */
export function checkPromptCacheFits(file: string, loaded: readonly KVCacheLike[], expected: readonly KVCacheLike[], kvShapes: readonly { heads: number; headDim: number }[]): void {
  if (loaded.length !== expected.length) {
    throw new PromptCacheError(file, null, `holds ${loaded.length} layer caches, but this model makes ${expected.length}: the file was written for another model`);
  }
  loaded.forEach((c, i) => {
    const want = expected[i]!;
    if (c instanceof TurboQuantKVCache && want instanceof KVCache) {
      // a converted full-attention layer: its heads are the norms' axis 1
      const st = c.quantizedState;
      try {
        const heads = st.length ? st[0]!.shape[1]! : kvShapes[i]!.heads;
        if (heads !== kvShapes[i]!.heads) throw new PromptCacheError(file, `${i}.0.0`, `layer ${i} holds ${heads} KV heads, this model has ${kvShapes[i]!.heads}: the file was written for another model`);
      } finally {
        for (const a of st) a.dispose();
      }
      return;
    }
    if (className(c) !== className(want)) throw new PromptCacheError(file, `1.${i}`, `layer ${i} is a ${className(c)}, this model uses a ${className(want)}: the file was written for another model`);
    if (c instanceof RotatingKVCache && want instanceof RotatingKVCache && (c.maxSize !== want.maxSize || c.keep !== want.keep)) {
      throw new PromptCacheError(file, `${i}.4`, `layer ${i} has window max_size=${c.maxSize} keep=${c.keep}, this model uses max_size=${want.maxSize} keep=${want.keep}`);
    }
    const k = (c as KVCache).keys;
    const v = (c as KVCache).values;
    const s = kvShapes[i]!;
    for (const [name, a] of [["keys", k], ["values", v]] as const) {
      if (a === null) continue;
      if (a.shape[1] !== s.heads || a.shape[3] !== s.headDim) {
        throw new PromptCacheError(file, `${i}.${name === "keys" ? 0 : 1}`, `layer ${i} ${name} have shape [${a.shape}], this model needs [B, ${s.heads}, S, ${s.headDim}]: the file was written for another model`);
      }
    }
  });
}

function int32Ids(tokens: readonly number[]): MlxArray {
  return mx.array(Int32Array.from(tokens), [1, tokens.length], "int32");
}

/**
 * mlx_lm.cache_prompt's prefill: the whole prompt into `cache` as generate_step(max_tokens=0)
 * runs it (prompt[:-1] in chunks of prefillStepSize, then the last token as one step), caches
 * evaluated.
 */
export function cachePrompt(model: GenerateModel, prompt: readonly number[], cache: KVCacheLike[], prefillStepSize = 2048): void {
  if (prompt.length === 0) throw new CacheError("cachePrompt", "the prompt must contain at least one token");
  const rest = prefillChunks(model, cache, prompt, prefillStepSize, int32Ids);
  {
    using inp = int32Ids(rest);
    model.forward(inp, cache, { kind: "step", index: 0 }).dispose();
  }
  const states = cache.flatMap((c) => c.state);
  try {
    mx.evaluate(states);
  } finally {
    for (const s of states) s.dispose();
  }
}
