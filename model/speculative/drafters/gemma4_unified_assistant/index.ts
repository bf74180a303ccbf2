// mlx_vlm/speculative/drafters/gemma4_unified_assistant/__init__.py (mlx-vlm 0.7.10): the MTP
// drafter of gemma4_unified is gemma4_assistant's model and config under the model_type
// "gemma4_unified_assistant" (Model = Gemma4AssistantDraftModel, ModelConfig =
// Gemma4AssistantConfig); it runs mlx-vlm's MTP round loop (model/speculative/mtp.ts).
export { type Gemma4AssistantConfig as ModelConfig, assistantConfigFromDict } from "../gemma4_assistant/config.ts";
export { Gemma4AssistantDraftModel, Gemma4AssistantDraftModel as Model, loadAssistant } from "../gemma4_assistant/gemma4_assistant.ts";
