// The saving side of mlx_lm/utils.py (mlx-lm 0.32.2): load_config as a raw dict, save_config,
// make_shards, save_model, get_total_parameters, dequantize_model. Used by the fuse and the
// trainer (adapter_config.json). Files are written under a temporary name and renamed, so a
// failure leaves no half-written file.

import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { Embedding, type Linear, type Module, QuantizedEmbedding, QuantizedLinear } from "./gemma4/nn.ts";
import { QuantizedSwitchLinear, type SwitchLinear } from "./gemma4/switch_layers.ts";
import { dumpPyJson, parsePyJson, PyFloat, type PyJson, sortedTop } from "./pyjson.ts";
import { dequantizeLinear, initLinear, initSwitchLinear } from "./tuner/lora.ts";

type Dict = { [k: string]: PyJson };

/** Writes a file atomically (temp name in the same directory, then rename). */
export function writeAtomic(path: string, data: string | Uint8Array): void {
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.tmp-${process.pid}`;
  try {
    writeFileSync(tmp, data);
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
}

/** mx.save_safetensors through a temporary name. */
export function saveSafetensorsAtomic(path: string, arrays: Map<string, MlxArray>, metadata: Record<string, string> = {}): void {
  mkdirSync(dirname(path), { recursive: true });
  // MLX appends ".safetensors" to a name without it, so the temp name keeps the suffix
  const tmp = `${path.replace(/\.safetensors$/, "")}.tmp-${process.pid}.safetensors`;
  try {
    mx.saveSafetensors(tmp, arrays, metadata);
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
}

/** Python truthiness of a JSON value. */
function pyTruthy(v: PyJson | undefined): boolean {
  if (v === undefined || v === null || v === false || v === 0 || v === "") return false;
  if (v instanceof PyFloat) return v.value !== 0;
  if (Array.isArray(v)) return v.length > 0;
  if (typeof v === "object") return Object.keys(v).length > 0;
  return true;
}

/**
 * load_model's view of config.json as a dict (floats kept as floats): load_config (plus
 * generation_config.json's eos_token_id), the text_config.quantization_config lift and the
 * legacy mxfp4/mxfp8 quantization_config → quantization mapping. This is the config mlx_lm.fuse
 * saves.
 */
export function loadRawConfig(dir: string): Dict {
  const config = parsePyJson(readFileSync(join(dir, "config.json"), "utf8")) as Dict;
  const gen = join(dir, "generation_config.json");
  if (existsSync(gen)) {
    let g: PyJson = null;
    try {
      g = parsePyJson(readFileSync(gen, "utf8"));
    } catch {
      // load_config ignores a generation_config.json that is not valid JSON
    }
    const eos = g !== null && typeof g === "object" && !Array.isArray(g) && !(g instanceof PyFloat) ? g.eos_token_id : undefined;
    if (pyTruthy(eos)) config.eos_token_id = eos!;
  }
  if (!("quantization_config" in config)) {
    const tc = config.text_config;
    if (tc && typeof tc === "object" && !Array.isArray(tc) && "quantization_config" in (tc as Dict)) config.quantization_config = (tc as Dict).quantization_config!;
  }
  const qc = config.quantization_config as Dict | undefined;
  if (!("quantization" in config) || config.quantization === null) {
    const method = qc && typeof qc === "object" ? qc.quant_method : undefined;
    if (method === "mxfp4" || method === "mxfp8") {
      const q: Dict = { group_size: 32, bits: method === "mxfp4" ? 4 : 8, mode: method };
      config.quantization = q;
      config.quantization_config = q;
    }
  }
  return config;
}

/** save_config(config, path): drops _name_or_path and vision_config, mirrors quantization, sorts, indent 4. */
export function save_config(config: Dict, path: string, { keep_vision_config = false } = {}): void {
  const c: Dict = { ...config };
  delete c._name_or_path;
  if (!keep_vision_config) delete c.vision_config;
  if ("quantization" in c) c.quantization_config = c.quantization!;
  writeAtomic(path, dumpPyJson(sortedTop(c)));
}

/** make_shards: consecutive tensors, a new shard when the next would pass the limit. */
export function make_shards(weights: Map<string, MlxArray>, max_file_size_gb = 5): Map<string, MlxArray>[] {
  const max = max_file_size_gb * 2 ** 30;
  const shards: Map<string, MlxArray>[] = [];
  let size = 0;
  for (const [k, v] of weights) {
    if (shards.length === 0 || size + v.nbytes > max) {
      shards.push(new Map());
      size = 0;
    }
    shards[shards.length - 1]!.set(k, v);
    size += v.nbytes;
  }
  return shards;
}

/** get_total_parameters: leaf modules only; a quantized layer counts its unpacked weight. */
export function get_total_parameters(model: Module): number {
  let n = 0;
  for (const m of model.leafModules().values()) {
    const q = m as Partial<QuantizedLinear>;
    if (typeof q.bits === "number" && q.weight) n += (q.bias ? q.bias.size : 0) + Math.floor((q.weight.size * 32) / q.bits);
    else for (const p of m.parameters().values()) n += p.size;
  }
  return n;
}

/** save_model(save_path, model): model.safetensors (or model-0000i-of-0000n) with {"format": "mlx"} and the index. */
export function save_model(save_path: string, model: Module): void {
  mkdirSync(save_path, { recursive: true });
  const weights = model.parameters();
  const shards = make_shards(weights);
  const name = (i: number) => (shards.length > 1 ? `model-${String(i + 1).padStart(5, "0")}-of-${String(shards.length).padStart(5, "0")}.safetensors` : "model.safetensors");
  let total_size = 0;
  for (const v of weights.values()) total_size += v.nbytes;
  const weight_map: Record<string, string> = {};
  shards.forEach((shard, i) => {
    saveSafetensorsAtomic(join(save_path, name(i)), shard, { format: "mlx" });
    for (const k of shard.keys()) weight_map[k] = name(i);
  });
  const sorted = Object.fromEntries(Object.keys(weight_map).sort().map((k) => [k, weight_map[k]!]));
  const index = { metadata: { total_size, total_parameters: get_total_parameters(model) }, weight_map: sorted };
  writeAtomic(join(save_path, "model.safetensors.index.json"), JSON.stringify(index, null, 4));
}

/**
 * dequantize_model: every QuantizedLinear / QuantizedEmbedding / QuantizedSwitchLinear becomes
 * its float layer holding mx.dequantize(...). The float classes' constructors draw their random
 * init as Python's do (with Python's argument order, `weight.shape[::-1]`).
 */
export function dequantize_model<M extends Module>(model: M): M {
  const layers: [string, Module, Module][] = [];
  for (const [name, m] of model.namedModules()) {
    if (!(m instanceof QuantizedLinear || m instanceof QuantizedEmbedding || m instanceof QuantizedSwitchLinear)) continue;
    const weight = dequantizeLinear(m);
    const s = weight.shape;
    let out: Linear | Embedding | SwitchLinear;
    if (m instanceof QuantizedLinear) out = initLinear(s[1]!, s[0]!, m.bias !== undefined);
    else if (m instanceof QuantizedSwitchLinear) out = initSwitchLinear(s[2]!, s[1]!, s[0]!, m.bias !== undefined);
    else {
      // nn.Embedding(*weight.shape[::-1]) draws normal((dims, N), scale=sqrt(1/N)), then takes the weight
      mx.random.normal({ shape: [s[1]!, s[0]!], scale: Math.sqrt(1 / s[0]!) }).dispose();
      out = new Embedding(s[0]!, s[1]!);
    }
    const bias = (m as { bias?: MlxArray }).bias;
    if (bias !== undefined) out.setParameter("bias", mx.alias(bias));
    out.setParameter("weight", weight);
    layers.push([name, m, out]);
  }
  for (const [name, old, m] of layers) {
    model.replaceModule(name, m);
    for (const p of old.parameters().values()) p.dispose();
  }
  return model;
}
