// The loaded Gemma 4 model as generation drives it: loadModel + the model's makeCache with
// model/cache's classes + a forward that optionally emits taps under the oracle's call prefixes
// ("prefill{k}/", "step{n}/"). Used by the parity command, `npm run generate` and the benchmarks.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVCache, type KVCacheLike, RotatingKVCache } from "./cache/index.ts";
import type { CallInfo, GenerateModel, StepInfo } from "./generate.ts";
import type { MultimodalConfig } from "./gemma4/config.ts";
import type { InputEmbeddings, MediaInputs } from "./gemma4/gemma4.ts";
import type { LanguageModel } from "./gemma4/language.ts";
import { type LoadedModel, loadModel, prefixed, type TapSink } from "./gemma4/index.ts";

export const cacheFactory = {
  kvCache: (): KVCacheLike => new KVCache(),
  rotatingKVCache: (maxSize: number, keep: number): KVCacheLike => new RotatingKVCache(maxSize, keep),
};

/** The oracle's tap prefix of one generate_step model call. */
export function callPrefix(call: CallInfo): string {
  return `${call.kind}${call.index}/`;
}

/** Wraps a loaded model for generateStep; `taps` (optional) receives every tap, prefixed per call. */
export function generationModel(loaded: LoadedModel, taps?: TapSink): GenerateModel {
  const { model } = loaded;
  return {
    makeCache: () => model.makeCache(cacheFactory) as KVCacheLike[],
    forward: (inputs: MlxArray, cache: KVCacheLike[], call: CallInfo): MlxArray =>
      model.call(inputs, { cache, taps: taps ? prefixed(taps, callPrefix(call)) : undefined }),
  };
}

export function loadGenerationModel(dir: string, taps?: TapSink): { loaded: LoadedModel; model: GenerateModel } {
  const loaded = loadModel(dir);
  return { loaded, model: generationModel(loaded, taps) };
}

/**
 * generate_step's own taps of each _step call, as the oracle records them: the sampler's input
 * `logprobs` (B, V) and its output `token`. Pass the result as generateStep's onStep.
 */
export function stepTaps(taps: TapSink): (info: StepInfo) => void {
  return (info) => {
    if (info.call.kind !== "step" || !info.logprobs || !info.sampled) return;
    const prefix = callPrefix(info.call);
    taps(`${prefix}logprobs`, info.logprobs);
    taps(`${prefix}token`, info.sampled);
  };
}

/** The prompt of a multimodal generation: token ids (placeholders included) and the media. */
export interface MediaPrompt<M = MediaInputs> {
  ids: readonly number[];
  media: M;
}

/** The media token ids mm_token_type_ids is made from (gemma4's and gemma4_unified's configs). */
type MediaTokenIds = Pick<MultimodalConfig, "image_token_id" | "audio_token_id" | "video_token_id">;

/** Gemma4Processor's mm_token_type_ids: 1 on image, 2 on video (when the config has a video token), 3 on audio placeholders, else 0. */
export function mmTokenTypes(ids: readonly number[], config: MediaTokenIds): number[] {
  return ids.map((t) => (t === config.image_token_id ? 1 : t === config.video_token_id ? 2 : t === config.audio_token_id ? 3 : 0));
}

/**
 * What mediaGenerationModel uses of a multimodal model: gemma4's MultimodalModel and
 * gemma4_unified's Model (which differ only in how get_input_embeddings encodes the media; the
 * language model and generate_step's calls are gemma4's in both).
 */
export interface EmbeddingModel<M> {
  readonly config: MediaTokenIds;
  language_model: LanguageModel;
  get_input_embeddings(input_ids: MlxArray, media: M, taps?: TapSink): InputEmbeddings;
  makeCache(factory: typeof cacheFactory): KVCacheLike[];
}

/**
 * mlx_vlm.generate.generate_step's prefill for a multimodal prompt, as a GenerateModel for
 * generateStep: get_input_embeddings once (taps under "embed/"), then every language-model call
 * with logits_to_keep=1; prefill chunks and the first _step read their slice of the embeddings
 * and the full per-layer inputs and token types; decode steps embed their own token. `chunked`
 * is the model's chunked-prefill policy (pass it as generateStep's chunkedPrefill). dispose()
 * frees the embeddings.
 */
export function mediaGenerationModel<M = MediaInputs>(model: EmbeddingModel<M>, prompt: MediaPrompt<M>, taps?: TapSink): { generate: GenerateModel; chunked: boolean; dispose(): void } {
  const types = mmTokenTypes(prompt.ids, model.config);
  using ids = mx.array(Int32Array.from(prompt.ids), [1, prompt.ids.length], "int32");
  const { inputs_embeds, per_layer_inputs } = model.get_input_embeddings(ids, prompt.media, taps ? prefixed(taps, "embed/") : undefined);
  const mm = mx.array(Int32Array.from(types), [1, types.length], "int32");
  let offset = 0;
  const generate: GenerateModel = {
    makeCache: () => model.makeCache(cacheFactory),
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
    chunked: model.language_model.chunkedPrefill(types),
    dispose: () => {
      inputs_embeds.dispose();
      per_layer_inputs?.dispose();
      mm.dispose();
    },
  };
}
