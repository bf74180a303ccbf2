// The Gemma 4 model: the text model (port of mlx_lm/models/gemma4_text.py + gemma4.py) and the
// multimodal one (mlx_vlm/models/gemma4: gemma4.py, language.py, vision.py, audio.py).
export * from "./config.ts";
export * as gemma4_text from "./gemma4_text.ts";
export * as gemma4 from "./gemma4.ts";
export {
  type AnyModel,
  checkCheckpoint,
  checkSafetensors,
  isMultimodalCheckpoint,
  type LoadedModel,
  type LoadedMultimodalModel,
  loadModel,
  loadMultimodalModel,
  loadWeights,
  WeightsError,
} from "./weights.ts";
export { MediaError, type MediaInputs, type MultimodalModel } from "./gemma4.ts";
export type { TapMeta, TapSink, TapValue } from "./taps.ts";
export { prefixed } from "./taps.ts";
