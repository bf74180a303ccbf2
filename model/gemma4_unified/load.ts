// mlx_vlm.utils.load_model for a gemma4_unified checkpoint (mlx-vlm 0.7.10): the config as
// load_model reads it (config.ts), Model.sanitize + LanguageModel.sanitize, the top-level parts
// without weights dropped (_drop_modules_without_weights, the index's declared keys counting),
// nn.quantize with the load predicate (a per-path entry wins; otherwise modules with
// "<path>.scales"), load_weights(strict=True). Problems are one error naming file and key.

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadConfig } from "../gemma4/config.ts";
import { loadWeights, loadWeightsStrict, quantizeModel, WeightsError } from "../gemma4/weights.ts";
import { type ModelConfig, modelConfigFromDict } from "./config.ts";
import { Model } from "./gemma4_unified.ts";

export interface LoadedUnifiedModel {
  model: Model;
  config: ModelConfig;
}

/** Whether a checkpoint directory's config.json is a gemma4_unified model. */
export function isUnifiedCheckpoint(dir: string): boolean {
  try {
    return (JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>).model_type === "gemma4_unified";
  } catch {
    return false;
  }
}

/** The weight_map keys of model.safetensors.index.json (load_model's declared_keys). */
function declaredKeys(dir: string): string[] {
  const f = join(dir, "model.safetensors.index.json");
  if (!existsSync(f)) return [];
  try {
    const idx = JSON.parse(readFileSync(f, "utf8")) as { weight_map?: Record<string, string> };
    return Object.keys(idx.weight_map ?? {});
  } catch {
    return [];
  }
}

export function loadUnifiedModel(dir: string, { lazy = false }: { lazy?: boolean } = {}): LoadedUnifiedModel {
  const file = loadConfig(dir); // the file checks, tagged floats and quantization lifting
  const config = modelConfigFromDict(file.raw, file.file);
  let weights = loadWeights(dir);
  let model: Model | undefined;
  try {
    model = new Model(config);
    weights = model.sanitize(weights);
    model.dropModulesWithoutWeights(new Set([...weights.keys(), ...declaredKeys(dir)]));
    quantizeModel(model, file, weights);
    model.eval(); // as load_model
    loadWeightsStrict(model, weights, dir);
    if (!lazy) {
      try {
        mx.evaluate([...model.parameters().values()]);
      } catch (e) {
        throw new WeightsError(dir, [], `reading the weights failed: ${(e as Error).message}`);
      }
    }
    return { model, config };
  } catch (e) {
    for (const w of weights.values()) if (!w.array.disposed) w.array.dispose();
    model?.dispose();
    throw e;
  }
}
