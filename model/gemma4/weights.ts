// Loading a checkpoint directory the way mlx_lm.utils.load_model does (spec §7.2):
//   config → every model*.safetensors → Model(args) → sanitize → nn.quantize(class_predicate)
//   → load_weights(strict=True) → mx.eval(parameters)
// with one difference in kind, not in result: every problem is reported as ONE error that names
// the file and key(s) at fault (mlx-lm stops at the first category, often deep in MLX).

import { closeSync, existsSync, openSync, readdirSync, readFileSync, readSync, statSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { ConfigError, type LoadedConfig, loadConfig, type MultimodalConfig, multimodalConfigFromDict } from "./config.ts";
import * as gemma4 from "./gemma4.ts";
import * as gemma4_text from "./gemma4_text.ts";
import { Module, type QuantMode, type QuantParams, QuantizeError } from "./nn.ts";
import type { Tensor } from "./tensors.ts";

export type { Tensor } from "./tensors.ts";

/** A checkpoint problem; `file` and `keys` say where. */
export class WeightsError extends Error {
  override readonly name = "WeightsError";
  constructor(
    readonly file: string,
    readonly keys: readonly string[],
    readonly detail: string,
  ) {
    super(`${file}${keys.length ? ` [${keys.slice(0, 3).join(", ")}${keys.length > 3 ? ", …" : ""}]` : ""}: ${detail}`);
  }
}

export type AnyModel = gemma4_text.Model | gemma4.Model;

export interface LoadedModel {
  model: AnyModel;
  config: LoadedConfig;
  /** The text model (the wrapper's language_model, or the model itself). */
  text: gemma4_text.Model;
}

// ------------------------------------------------------------------ safetensors

const ST_DTYPES: Record<string, [mx.Dtype, number]> = {
  BOOL: ["bool", 1],
  U8: ["uint8", 1],
  I8: ["int8", 1],
  U16: ["uint16", 2],
  I16: ["int16", 2],
  U32: ["uint32", 4],
  I32: ["int32", 4],
  U64: ["uint64", 8],
  I64: ["int64", 8],
  F16: ["float16", 2],
  BF16: ["bfloat16", 2],
  F32: ["float32", 4],
  F64: ["float64", 8],
};

/** The safetensors format's own limit on the header (MLX and the Rust reference refuse longer ones). */
const MAX_HEADER = 100_000_000;

/** A checked safetensors header's tensor entries (without `__metadata__`). */
export type SafetensorsHeader = Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;

/**
 * Checks a .safetensors file's header against its size before MLX maps it: a truncated or
 * corrupt file otherwise fails lazily, at the first eval, far from the file name. Every
 * problem the format allows (wrong types, unknown dtypes, shapes and offsets that disagree,
 * overflow, ranges past the end or overlapping each other) is one WeightsError naming the key.
 * Returns the checked header's tensor entries; only the header is read.
 */
export function checkSafetensors(file: string): SafetensorsHeader {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch (e) {
    throw new WeightsError(file, [], `cannot open: ${(e as Error).message}`);
  }
  try {
    const size = statSync(file).size;
    if (size < 8) throw new WeightsError(file, [], `truncated safetensors file: ${size} bytes, no header`);
    const lenBuf = Buffer.alloc(8);
    readSync(fd, lenBuf, 0, 8, 0);
    const hlen = lenBuf.readBigUInt64LE(0);
    if (hlen === 0n || hlen >= BigInt(MAX_HEADER)) throw new WeightsError(file, [], `corrupt safetensors file: header length ${hlen} is not between 1 and ${MAX_HEADER} bytes`);
    if (8n + hlen > BigInt(size)) {
      throw new WeightsError(file, [], `truncated or corrupt safetensors file: header of ${hlen} bytes does not fit in ${size} bytes`);
    }
    const hbuf = Buffer.alloc(Number(hlen));
    readSync(fd, hbuf, 0, hbuf.length, 8);
    let header: unknown;
    try {
      header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(hbuf));
    } catch (e) {
      throw new WeightsError(file, [], `corrupt safetensors header: ${(e as Error).message}`);
    }
    if (header === null || typeof header !== "object" || Array.isArray(header)) throw new WeightsError(file, [], "corrupt safetensors header: not a JSON object");
    checkHeader(file, header as Record<string, unknown>, size - 8 - Number(hlen));
    const { __metadata__: _, ...tensors } = header as Record<string, unknown>;
    return tensors as SafetensorsHeader;
  } finally {
    closeSync(fd);
  }
}

function checkHeader(file: string, header: Record<string, unknown>, dataSize: number): void {
  const bad = (key: string, detail: string) => new WeightsError(file, [key], detail);
  const meta = header.__metadata__;
  if (meta !== undefined) {
    if (meta === null || typeof meta !== "object" || Array.isArray(meta)) throw bad("__metadata__", "must be an object of strings");
    for (const [k, v] of Object.entries(meta)) if (typeof v !== "string") throw bad(`__metadata__.${k}`, `metadata values must be strings, got ${JSON.stringify(v)}`);
  }
  const ranges: [number, number, string][] = [];
  for (const [key, info] of Object.entries(header)) {
    if (key === "__metadata__") continue;
    if (key.includes("\0")) throw bad(key, "tensor name contains a NUL byte");
    if (info === null || typeof info !== "object" || Array.isArray(info)) throw bad(key, "malformed tensor entry (not an object)");
    const t = info as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const dt = typeof t.dtype === "string" && Object.hasOwn(ST_DTYPES, t.dtype) ? ST_DTYPES[t.dtype] : undefined;
    if (!dt) throw bad(key, `unsupported or missing dtype ${JSON.stringify(t.dtype)} (expected one of ${Object.keys(ST_DTYPES).join(", ")})`);
    const shape = t.shape;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0 && d <= 2 ** 31 - 1)) {
      throw bad(key, `shape must be a list of non-negative int32 dimensions, got ${JSON.stringify(shape)}`);
    }
    const off = t.data_offsets;
    if (!Array.isArray(off) || off.length !== 2 || !off.every((o) => Number.isSafeInteger(o) && o >= 0)) {
      throw bad(key, `data_offsets must be two non-negative integers, got ${JSON.stringify(off)}`);
    }
    const [b, e] = off as [number, number];
    const need = (shape as number[]).reduce((x, y) => x * BigInt(y), BigInt(dt[1]));
    if (e < b || BigInt(e - b) !== need) throw bad(key, `data_offsets [${b}, ${e}] hold ${e - b} bytes, shape [${shape}] of ${t.dtype} needs ${need}`);
    if (e > dataSize) throw bad(key, `truncated safetensors file: tensor ends at byte ${e} of a ${dataSize}-byte data section`);
    if (e > b) ranges.push([b, e, key]);
  }
  ranges.sort((x, y) => x[0] - y[0]);
  for (let i = 1; i < ranges.length; i++) {
    const [b, , k] = ranges[i]!;
    const [, pe, pk] = ranges[i - 1]!;
    if (b < pe) throw new WeightsError(file, [pk, k], `corrupt safetensors header: the data of ${pk} and ${k} overlap`);
  }
}

/**
 * Every model*.safetensors in `dir` (utils.load_model's glob), after checking the shard index
 * (model.safetensors.index.json) names no missing file.
 */
export function loadWeights(dir: string): Map<string, Tensor> {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new WeightsError(dir, [], "not a checkpoint directory");
  const files = readdirSync(dir)
    .filter((f) => /^model.*\.safetensors$/.test(f))
    .sort();
  const indexFile = join(dir, "model.safetensors.index.json");
  if (existsSync(indexFile)) {
    let index: { weight_map?: Record<string, string> };
    try {
      index = JSON.parse(readFileSync(indexFile, "utf8")) as { weight_map?: Record<string, string> };
    } catch (e) {
      throw new WeightsError(indexFile, [], `invalid JSON: ${(e as Error).message}`);
    }
    const byFile = new Map<string, string[]>();
    for (const [k, f] of Object.entries(index.weight_map ?? {})) {
      if (!byFile.has(f)) byFile.set(f, []);
      byFile.get(f)!.push(k);
    }
    for (const [f, keys] of byFile) {
      if (!existsSync(join(dir, f))) {
        throw new WeightsError(join(dir, f), keys, `missing shard: model.safetensors.index.json maps ${keys.length} tensor(s) to this file, which does not exist`);
      }
    }
  }
  if (files.length === 0) throw new WeightsError(dir, [], "No safetensors found (expected model*.safetensors)");
  const weights = new Map<string, Tensor>();
  for (const f of files) {
    const file = join(dir, f);
    checkSafetensors(file);
    let loaded: mx.Safetensors;
    try {
      loaded = mx.loadSafetensors(file);
    } catch (e) {
      throw new WeightsError(file, [], `cannot load: ${(e as Error).message}`);
    }
    for (const [key, array] of loaded.arrays) {
      const old = weights.get(key);
      if (old) old.array.dispose();
      weights.set(key, { array, file, key });
    }
  }
  return weights;
}

// ------------------------------------------------------------------ quantization

interface Quantizable extends Module {
  toQuantized(q: QuantParams, what: string): Module;
  weight: MlxArray;
}

function isQuantizable(m: Module): m is Quantizable {
  return typeof (m as Partial<Quantizable>).toQuantized === "function";
}

/** utils.infer_quant_config: group_size/bits/mode from the stored scales and packed weight. */
export function inferQuantConfig(path: string, module: Quantizable, weights: Map<string, Tensor>): QuantParams {
  const scales = weights.get(`${path}.scales`)!.array;
  const wq = weights.get(`${path}.weight`);
  if (!wq) throw new WeightsError(weights.get(`${path}.scales`)!.file, [`${path}.weight`], `has ${path}.scales but no packed weight`);
  const inDims = module.weight.shape[module.weight.ndim - 1]!;
  const ss = scales.shape;
  const group_size = Math.floor(inDims / ss[ss.length - 1]!);
  const ws = wq.array.shape;
  const bits = Math.floor((ws[ws.length - 1]! * 32) / inDims);
  if (scales.dtype !== "uint8") return { group_size, bits, mode: "affine" };
  if (bits === 4 && group_size === 16) return { group_size, bits, mode: "nvfp4" };
  if (bits === 4 && group_size === 32) return { group_size, bits, mode: "mxfp4" };
  if (bits === 8 && group_size === 32) return { group_size, bits, mode: "mxfp8" };
  throw new WeightsError(wq.file, [`${path}.scales`], `Cannot infer the quantization mode of ${path}: ${bits} bits with group size ${group_size}.`);
}

/** The `quantization` entry, or the legacy quantization_config mapped as utils.load_model maps it. */
function quantizationOf(config: LoadedConfig): Record<string, unknown> | null {
  const q = config.raw.quantization;
  if (q !== undefined && q !== null) {
    if (typeof q !== "object") throw new ConfigError(config.file, "quantization", "must be an object");
    return q as Record<string, unknown>;
  }
  const qc = config.raw.quantization_config as Record<string, unknown> | undefined;
  if (!qc) return null;
  const method = qc.quant_method;
  if (method === "mxfp4") return { group_size: 32, bits: 4, mode: "mxfp4" };
  if (method === "mxfp8") return { group_size: 32, bits: 8, mode: "mxfp8" };
  throw new ConfigError(config.file, "quantization_config.quant_method", `unsupported legacy quantization ${JSON.stringify(method)} (convert the checkpoint with mlx-lm)`);
}

/**
 * nn.quantize(model, group_size, bits, mode, class_predicate) with utils.load_model's predicate:
 * a per-path entry of config["quantization"] wins (a dict, True, or False); otherwise a module is
 * quantized iff it can be and "<path>.scales" exists in the (sanitized) weights.
 */
export function quantizeModel(model: Module, config: LoadedConfig, weights: Map<string, Tensor>): void {
  const quantization = quantizationOf(config);
  if (quantization === null) return;
  const file = config.file;
  const top = (k: string) => {
    if (!(k in quantization)) throw new ConfigError(file, `quantization.${k}`, "is required");
    return quantization[k];
  };
  const group_size = top("group_size") as number;
  const bits = top("bits") as number;
  const mode = (quantization.mode ?? "affine") as QuantMode;
  for (const [path, m] of model.leafModules()) {
    let params: boolean | QuantParams;
    if (Object.hasOwn(quantization, path)) {
      const v = quantization[path];
      if (typeof v === "boolean") params = v;
      else if (v && typeof v === "object") params = v as QuantParams;
      else throw new ConfigError(file, `quantization.${path}`, `must be true, false or an object, got ${JSON.stringify(v)}`);
    } else if (!isQuantizable(m)) {
      params = false;
    } else if (!weights.has(`${path}.scales`)) {
      params = false;
    } else {
      params = inferQuantConfig(path, m, weights);
    }
    if (params === false) continue;
    if (!isQuantizable(m)) {
      throw new ConfigError(file, `quantization.${path}`, `Unable to quantize model of type ${m.constructor.name}`);
    }
    const q: QuantParams = params === true ? { group_size, bits, mode } : params;
    try {
      model.replaceModule(path, m.toQuantized(q, path));
    } catch (e) {
      if (e instanceof QuantizeError) {
        const src = weights.get(`${path}.weight`)?.file ?? file;
        throw new WeightsError(src, [`${path}.weight`], e.message);
      }
      throw e;
    }
  }
}

// ------------------------------------------------------------------ strict load

/**
 * Module.load_weights(weights, strict=True): every parameter present, no extra key, every shape
 * equal. All problems go into one error (extras and shape mismatches name their file).
 */
export function loadWeightsStrict(model: Module, weights: Map<string, Tensor>, dir: string): void {
  const params = model.parameters();
  const extra = [...weights.keys()].filter((k) => !params.has(k)).sort();
  const missing = [...params.keys()].filter((k) => !weights.has(k)).sort();
  const wrong: string[] = [];
  for (const [k, p] of params) {
    const w = weights.get(k);
    if (!w) continue;
    const a = w.array.shape;
    const b = p.shape;
    if (a.length !== b.length || a.some((d, i) => d !== b[i])) {
      wrong.push(`${k} (${w.file}: key ${w.key}): expected shape (${b.join(", ")}) but received shape (${a.join(", ")})`);
    }
  }
  if (extra.length || missing.length || wrong.length) {
    const lines: string[] = [];
    if (extra.length) {
      lines.push(`Received ${extra.length} parameters not in model:`);
      for (const k of extra) {
        const w = weights.get(k)!;
        lines.push(`  ${k} (${w.file}: key ${w.key})`);
      }
    }
    if (missing.length) {
      lines.push(`Missing ${missing.length} parameters (in no model*.safetensors of ${dir}):`);
      for (const k of missing) lines.push(`  ${k}`);
    }
    if (wrong.length) {
      lines.push(`${wrong.length} parameters with the wrong shape:`);
      for (const l of wrong) lines.push(`  ${l}`);
    }
    const files = [...new Set([...extra, ...wrong.map((l) => l.split(" ")[0]!)].map((k) => weights.get(k)?.file).filter((f): f is string => !!f))];
    throw new WeightsError(files.length === 1 ? files[0]! : dir, [...extra, ...missing, ...wrong.map((l) => l.split(" ")[0]!)], `checkpoint does not match the model:\n${lines.join("\n")}`);
  }
  for (const [k, w] of weights) model.setParameter(k, w.array);
}

// ------------------------------------------------------------------ load_model

/** Builds the model class the config names (gemma4_text or the gemma4 wrapper). */
export function buildModel(config: LoadedConfig): AnyModel {
  if (config.layout === "gemma4") return new gemma4.Model(config.args, String(config.raw.model_type));
  return new gemma4_text.Model(config.args);
}

/** mlx_lm.utils.load_model(path, lazy=False, strict=True) for Gemma 4 checkpoints. */
export function loadModel(dir: string, { lazy = false }: { lazy?: boolean } = {}): LoadedModel {
  const config = loadConfig(dir);
  let weights = loadWeights(dir);
  let model: AnyModel | undefined;
  try {
    model = buildModel(config);
    weights = model.sanitize(weights);
    quantizeModel(model, config, weights);
    model.eval(); // as load_model: a loaded model is in eval mode (Dropout off until train())
    loadWeightsStrict(model, weights, dir);
    if (!lazy) {
      const ps = [...model.parameters().values()];
      try {
        mx.evaluate(ps);
      } catch (e) {
        throw new WeightsError(dir, [], `reading the weights failed: ${(e as Error).message}`);
      }
    }
    const text = model instanceof gemma4.Model ? model.language_model : model;
    return { model, config, text };
  } catch (e) {
    for (const w of weights.values()) if (!w.array.disposed) w.array.dispose();
    model?.dispose();
    throw e;
  }
}

/**
 * Everything loadModel refuses, checked without reading the weights: the config, the shard
 * index, every file's header against its size, and every parameter's presence and shape. MLX
 * maps safetensors lazily, so building and checking the model reads no tensor data. Used to
 * refuse a bad checkpoint before an oracle process is started for it.
 */
export function checkCheckpoint(dir: string): LoadedConfig {
  const { model, config } = loadModel(dir, { lazy: true });
  model.dispose();
  return config;
}

// ------------------------------------------------------------------ mlx_vlm.utils.load_model (multimodal)

export interface LoadedMultimodalModel {
  model: gemma4.MultimodalModel;
  config: MultimodalConfig;
  /** The quantization entries as loadModel reads them (null when none). */
  raw: Record<string, unknown>;
}

/** Whether a checkpoint directory's config.json describes a gemma4 model with vision or audio towers. */
export function isMultimodalCheckpoint(dir: string): boolean {
  try {
    const c = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    return c.model_type === "gemma4" && ((c.vision_config !== undefined && c.vision_config !== null) || (c.audio_config !== undefined && c.audio_config !== null));
  } catch {
    return false;
  }
}

/**
 * mlx_vlm.utils.load_model for a gemma4 checkpoint: the model with its vision/audio towers
 * (mlx-vlm's config defaults), Model.sanitize + LanguageModel.sanitize, nn.quantize with the
 * load predicate (a per-path entry wins; otherwise modules with "<path>.scales"), the top-level
 * towers without weights dropped (_drop_modules_without_weights), load_weights(strict=True).
 * Every tower weight is kept; problems are one error naming file and key.
 */
export function loadMultimodalModel(dir: string, { lazy = false }: { lazy?: boolean } = {}): LoadedMultimodalModel {
  const text = loadConfig(dir); // the same file checks, tagged floats and quantization lifting
  const config = multimodalConfigFromDict(text.raw, text.file);
  let weights = loadWeights(dir);
  let model: gemma4.MultimodalModel | undefined;
  try {
    model = new gemma4.MultimodalModel(config);
    weights = model.sanitize(weights);
    const declared = declaredKeys(dir);
    model.dropModulesWithoutWeights(new Set([...weights.keys(), ...declared]));
    quantizeModel(model, text, weights);
    model.eval(); // as load_model
    loadWeightsStrict(model, weights, dir);
    if (!lazy) {
      try {
        mx.evaluate([...model.parameters().values()]);
      } catch (e) {
        throw new WeightsError(dir, [], `reading the weights failed: ${(e as Error).message}`);
      }
    }
    return { model, config, raw: text.raw };
  } catch (e) {
    for (const w of weights.values()) if (!w.array.disposed) w.array.dispose();
    model?.dispose();
    throw e;
  }
}

/** The weight_map keys of model.safetensors.index.json (mlx-vlm's declared_keys), after its own sanitize-free read. */
function declaredKeys(dir: string): string[] {
  const f = join(dir, "model.safetensors.index.json");
  if (!existsSync(f)) return [];
  try {
    const idx = JSON.parse(readFileSync(f, "utf8")) as { weight_map?: Record<string, string> };
    return Object.keys(idx.weight_map ?? {}).map((k) => (k.startsWith("model.") ? k.slice("model.".length) : k));
  } catch {
    return [];
  }
}
