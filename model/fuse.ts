// mlx_lm/fuse.py (mlx-lm 0.32.2): load a base model with its adapters, fuse every adapter layer
// into a plain (or re-quantized) layer, optionally de-quantize the whole model, and save it as
// mlx_lm.utils.save does (weights, index, config.json, tokenizer files, *.py and
// generation_config.json copied from the source).
//
// dtype outcomes are mlx-lm's: a LoRA fuse keeps the base dtype (the delta is cast to it), a
// DoRA fuse of a bf16 base writes float32 weights (m is float32), a quantized base is
// re-quantized with its own group size, bits and mode unless `dequantize`.

import { copyFileSync, existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import type { AnyModel, LoadedModel } from "./gemma4/weights.ts";
import { loadModel } from "./gemma4/weights.ts";
import type { Module } from "./gemma4/nn.ts";
import { dequantize_model, loadRawConfig, save_config, save_model } from "./utils.ts";
import { load_adapters } from "./tuner/utils.ts";

interface Fusable extends Module {
  fuse(dequantize: boolean): Module;
}

function isFusable(m: Module): m is Fusable {
  return typeof (m as Partial<Fusable>).fuse === "function";
}

/** mlx_lm.utils.load(path, adapter_path=...): load_model, load_adapters, model.eval(). */
export function loadWithAdapters(dir: string, adapter_path: string | null): LoadedModel {
  const loaded = loadModel(dir);
  loaded.model.eval();
  if (adapter_path !== null) {
    try {
      load_adapters(loaded.model, adapter_path);
    } catch (e) {
      loaded.model.dispose();
      throw e;
    }
    loaded.model.eval();
  }
  return loaded;
}

/** The fuse of mlx_lm.fuse.main on a loaded model: every module with fuse(), then dequantize_model. */
export function fuse_model<M extends Module>(model: M, dequantize = false): M {
  const fused: [string, Module, Module][] = [];
  for (const [n, m] of model.namedModules()) if (isFusable(m)) fused.push([n, m, m.fuse(dequantize)]);
  for (const [n, old, m] of fused) {
    model.replaceModule(n, m);
    for (const p of old.parameters().values()) p.dispose();
  }
  if (dequantize) dequantize_model(model);
  return model;
}

/** Tokenizer files `tokenizer.save_pretrained` would write, copied from the source directory. */
const TOKENIZER_FILES = /^(tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|added_tokens\.json|tokenizer\.model|chat_template\.(jinja|json)|vocab\.json|merges\.txt)$/;

export interface FuseArgs {
  model: string;
  save_path: string;
  adapter_path: string;
  dequantize: boolean;
}

/** mlx_lm.fuse.main without the hub upload and GGUF export. Returns the fused model (caller disposes). */
export function fuse(args: FuseArgs): AnyModel {
  const { model } = loadWithAdapters(args.model, args.adapter_path);
  try {
    const config = loadRawConfig(args.model);
    fuse_model(model, args.dequantize);
    if (args.dequantize) {
      delete config.quantization;
      delete config.quantization_config;
    }
    save_model(args.save_path, model);
    save_config(config, join(args.save_path, "config.json"));
    for (const f of readdirSync(args.model)) {
      if (TOKENIZER_FILES.test(f) || f.endsWith(".py") || f === "generation_config.json") {
        const src = join(args.model, f);
        if (existsSync(src)) copyFileSync(src, join(args.save_path, f));
      }
    }
    return model;
  } catch (e) {
    model.dispose();
    throw e;
  }
}
