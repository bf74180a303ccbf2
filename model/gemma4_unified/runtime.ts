// mlx_vlm.generate.generate_step's prefill for a gemma4_unified prompt: the same calls as for
// gemma4 (../runtime.ts mediaGenerationModel: get_input_embeddings once, taps under "embed/", then
// every language-model call with logits_to_keep=1, prefill chunks and the first _step reading
// their slice of the embeddings with the full per-layer inputs and mm_token_type_ids, so a
// 'vision' text config makes image and video-frame blocks bidirectional here, unlike
// Model.__call__), on the unified model's own get_input_embeddings (the prompt's media, video
// included: pixel_values_videos and video_position_ids go in once, as generate_step hands its
// kwargs to get_input_embeddings). `chunked` is Model.chunked_prefill_policy (no chunks for an
// image or video prompt without audio under 'vision': token types 1 and 2 are visual).

import type { GenerateModel } from "../generate.ts";
import type { TapSink } from "../gemma4/taps.ts";
import { type MediaPrompt, mediaGenerationModel, mmTokenTypes } from "../runtime.ts";
import type { Model, UnifiedMediaInputs } from "./gemma4_unified.ts";

/** Gemma4UnifiedProcessor's mm_token_type_ids (Gemma4Processor.__call__'s): 1 on image, 2 on video, 3 on audio placeholders, else 0. */
export { mmTokenTypes };

export type UnifiedPrompt = MediaPrompt<UnifiedMediaInputs>;

export function unifiedGenerationModel(model: Model, prompt: UnifiedPrompt, taps?: TapSink): { generate: GenerateModel; chunked: boolean; dispose(): void } {
  return mediaGenerationModel(model, prompt, taps);
}
