// mlx_vlm.generate.generate_step's prefill for a gemma4_unified prompt, as a GenerateModel for
// ../generate.ts generateStep (the same calls ../runtime.ts mediaGenerationModel makes for gemma4):
// get_input_embeddings once (taps under "embed/"), then every language-model call with
// logits_to_keep=1; prefill chunks and the first _step read their slice of the embeddings and the
// full per-layer inputs and mm_token_type_ids (so a 'vision' text config makes image blocks
// bidirectional here, unlike Model.__call__); decode steps embed their own token. `chunked` is
// Model.chunked_prefill_policy (no chunks for an image prompt without audio under 'vision').

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../cache/index.ts";
import type { CallInfo, GenerateModel } from "../generate.ts";
import { prefixed, type TapSink } from "../gemma4/taps.ts";
import { cacheFactory, callPrefix } from "../runtime.ts";
import type { ModelConfig } from "./config.ts";
import type { Model, UnifiedMediaInputs } from "./gemma4_unified.ts";

export interface UnifiedPrompt {
  ids: readonly number[];
  media: UnifiedMediaInputs;
}

/** Gemma4UnifiedProcessor's mm_token_type_ids: 1 on image, 2 on video, 3 on audio placeholders, else 0. */
export function mmTokenTypes(ids: readonly number[], config: ModelConfig): number[] {
  return ids.map((t) => (t === config.image_token_id ? 1 : t === config.video_token_id ? 2 : t === config.audio_token_id ? 3 : 0));
}

export function unifiedGenerationModel(model: Model, prompt: UnifiedPrompt, taps?: TapSink): { generate: GenerateModel; chunked: boolean; dispose(): void } {
  const types = mmTokenTypes(prompt.ids, model.config);
  using ids = mx.array(Int32Array.from(prompt.ids), [1, prompt.ids.length], "int32");
  const { inputs_embeds, per_layer_inputs } = model.get_input_embeddings(ids, prompt.media, taps ? prefixed(taps, "embed/") : undefined);
  const mm = mx.array(Int32Array.from(types), [1, types.length], "int32");
  let offset = 0;
  const generate: GenerateModel = {
    makeCache: () => model.makeCache(cacheFactory) as KVCacheLike[],
    forward: (inputs: MlxArray, cache: KVCacheLike[], call: CallInfo): MlxArray => {
      const t = taps ? prefixed(taps, callPrefix(call)) : undefined;
      if (call.kind === "step" && call.index > 0) return model.language_model.call(inputs, { cache, logits_to_keep: 1, taps: t });
      const n = call.kind === "prefill" ? inputs.shape[1]! : inputs_embeds.shape[1]! - offset;
      const s = inputs_embeds.shape;
      using chunk = mx.slice(inputs_embeds, [0, offset, 0], [s[0]!, offset + n, s[2]!]);
      offset += n;
      return model.language_model.call(inputs, { inputs_embeds: chunk, per_layer_inputs, mm_token_type_ids: mm, cache, logits_to_keep: 1, taps: t });
    },
  };
  return {
    generate,
    // Model._should_disable_chunked_prefill with the processor's token types
    chunked: model.language_model.chunkedPrefill(types),
    dispose: () => {
      inputs_embeds.dispose();
      per_layer_inputs?.dispose();
      mm.dispose();
    },
  };
}
