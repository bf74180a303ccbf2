// The Gemma 4 text model (port of mlx_lm/models/gemma4_text.py + gemma4.py).
export * from "./config.ts";
export * as gemma4_text from "./gemma4_text.ts";
export * as gemma4 from "./gemma4.ts";
export { type AnyModel, type LoadedModel, loadModel, loadWeights, WeightsError, checkSafetensors, checkCheckpoint } from "./weights.ts";
export type { TapMeta, TapSink, TapValue } from "./taps.ts";
export { prefixed } from "./taps.ts";
