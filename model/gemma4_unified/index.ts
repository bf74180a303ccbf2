// The gemma4_unified model (mlx_vlm/models/gemma4_unified/__init__.py): config, model, processor,
// loader. The language model and MultimodalEmbedder are gemma4's (../gemma4/).
export * from "./config.ts";
export { _compact_prefix_rows, disposeUnifiedMedia, LayerNorm, Model, type UnifiedCallOptions, type UnifiedMediaInputs, VisionEmbedder, VisionModel, validRowCounts } from "./gemma4_unified.ts";
export { isUnifiedCheckpoint, type LoadedUnifiedModel, loadUnifiedModel } from "./load.ts";
export { mmTokenTypes, type UnifiedPrompt, unifiedGenerationModel } from "./runtime.ts";
export { UNIFIED_MUTATIONS, UNIFIED_VIDEO_MUTATIONS, type UnifiedMutation, type UnifiedVideoMutation, withUnifiedMutation, withUnifiedMutationAsync } from "./mutations.ts";
export {
  _convert_image_to_model_patches,
  _pad_patches,
  Gemma4UnifiedAudioFeatureExtractor,
  Gemma4UnifiedImageProcessor,
  Gemma4UnifiedVideoProcessor,
  loadUnifiedProcessorConfig,
  type UnifiedVideoProcessorConfig,
  type UnifiedVideoProcessorOutput,
  unifiedVideoProcessorConfig,
  type UnifiedImageProcessorConfig,
  type UnifiedImageProcessorOutput,
  unifiedImageProcessorConfig,
  type UnifiedProcessorConfig,
} from "./processing_gemma4_unified.ts";
