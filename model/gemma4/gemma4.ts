// mlx_lm/models/gemma4.py: the multimodal wrapper. Only the text path exists in mlx-lm; the
// wrapper nests the text model under `language_model` and maps raw Hugging Face keys onto it.

import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../cache/index.ts";
import type { ModelArgs } from "./config.ts";
import * as gemma4_text from "./gemma4_text.ts";
import { Module } from "./nn.ts";
import type { Tensor } from "./tensors.ts";

export class Model extends Module {
  readonly model_type: string;
  language_model: gemma4_text.Model;

  /** `text_args` = gemma4_text.ModelArgs.from_dict(args.text_config) (see config.configFromDict). */
  constructor(text_args: ModelArgs, model_type = "gemma4") {
    super();
    this.model_type = model_type;
    this.language_model = new gemma4_text.Model(text_args);
  }

  get args(): ModelArgs {
    return this.language_model.args;
  }

  call(inputs: MlxArray | null, opts: gemma4_text.ModelCallOptions = {}): MlxArray {
    return this.language_model.call(inputs, opts);
  }

  /**
   * gemma4.Model.sanitize: strip "model.", drop the vision/audio towers, keep keys that did not
   * start with "model." verbatim (already-converted MLX checkpoints), map
   * model.language_model.X → language_model.model.X, then the text model's sanitize.
   */
  sanitize(weights: Map<string, Tensor>): Map<string, Tensor> {
    const out = new Map<string, Tensor>();
    const drop = ["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"];
    for (const [k0, v] of weights) {
      const starts_w_model = k0.startsWith("model.");
      let k = starts_w_model ? k0.slice("model.".length) : k0;
      if (drop.some((d) => k.startsWith(d))) {
        v.array.dispose();
        continue;
      }
      if (!starts_w_model) {
        out.set(k, v);
        continue;
      }
      // str.replace replaces EVERY occurrence, as Python's does
      if (k.startsWith("language_model")) k = k.split("language_model.").join("language_model.model.");
      out.set(k, v);
    }
    return this.language_model.sanitize(out);
  }

  /** Releases the weights, the private arrays (RoPE frequencies) and the compiled decode closures. */
  dispose(): void {
    this.language_model.model.disposeCompiled();
    this.disposeArrays();
  }

  get layers(): gemma4_text.DecoderLayer[] {
    return this.language_model.layers;
  }

  makeCache(factory: gemma4_text.CacheFactory = gemma4_text.defaultCacheFactory): KVCacheLike[] {
    return this.language_model.makeCache(factory);
  }
}
