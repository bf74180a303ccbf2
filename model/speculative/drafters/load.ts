// The steps every drafter checkpoint load shares (mlx-vlm 0.7.10's load_drafter): read config.json
// (tagged floats decoded), then the weights through the model's sanitize, quantization where the
// checkpoint is quantized, a strict load and one evaluation. Used by the DFlash-kind loader
// (index.ts loadDFlashDrafter) and the MTP one (gemma4_assistant.ts loadAssistant).
import * as mx from "@mlx-bun/mlx";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { ConfigError, decodeTaggedFloats, type LoadedConfig } from "../../gemma4/config.ts";
import type { Module } from "../../gemma4/nn.ts";
import type { Tensor } from "../../gemma4/tensors.ts";
import { loadWeights, loadWeightsStrict, quantizeModel, WeightsError } from "../../gemma4/weights.ts";

/** Reads a drafter's config.json (tagged floats decoded); a ConfigError when it is missing or not JSON. */
export function readDrafterConfig(dir: string): { raw: Record<string, unknown>; file: string } {
  const file = join(dir, "config.json");
  if (!existsSync(file)) throw new ConfigError(file, "(file)", "no config.json in the drafter directory");
  try {
    return { raw: decodeTaggedFloats(JSON.parse(readFileSync(file, "utf8"))) as Record<string, unknown>, file };
  } catch (e) {
    throw new ConfigError(file, "(file)", `invalid JSON: ${(e as Error).message}`);
  }
}

/**
 * The weights of `dir` into `model` (sanitize, quantize, strict load, evaluate). On any error the
 * weights and the model are disposed and the error is rethrown; on success the model is returned.
 */
export function loadDrafterWeights<M extends Module & { sanitize(w: Map<string, Tensor>): Map<string, Tensor>; dispose(): void }>(model: M, dir: string, loaded: LoadedConfig): M {
  let weights = loadWeights(dir);
  try {
    weights = model.sanitize(weights);
    quantizeModel(model, loaded, weights);
    loadWeightsStrict(model, weights, dir);
    try {
      mx.evaluate([...model.parameters().values()]);
    } catch (e) {
      throw new WeightsError(dir, [], `reading the weights failed: ${(e as Error).message}`);
    }
    return model;
  } catch (e) {
    for (const w of weights.values()) if (!w.array.disposed) w.array.dispose();
    model.dispose();
    throw e;
  }
}
