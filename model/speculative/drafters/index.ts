// mlx_vlm/speculative/drafters/__init__.py (mlx-vlm 0.7.10), the part this port runs: which round
// loop a drafter needs (DRAFTER_KIND_BY_MODEL_TYPE, resolve_drafter_kind), the normalized model type
// of a drafter checkpoint (mlx_vlm.utils.get_model_type's drafter rules) and load_drafter for the
// DFlash kind (the MTP drafters load through gemma4_assistant.ts's loadAssistant).
import { ConfigError, type LoadedConfig } from "../../gemma4/config.ts";
import { loadDrafterWeights, readDrafterConfig } from "./load.ts";
import { dflashConfigFromDict } from "./qwen3_dflash/config.ts";
import { DFlashDraftModel } from "./qwen3_dflash/dflash.ts";
import { Gemma4DFlashDraftModel, gemma4DFlashConfigFromDict } from "./gemma4_dflash/index.ts";
import { gemma4DsparkConfigFromDict } from "./gemma4_dspark/config.ts";
import { Gemma4DSparkDraftModel } from "./gemma4_dspark/gemma4_dspark.ts";

export type DrafterKind = "dflash" | "mtp" | "eagle3";

/** Drafter model_type → the round loop it needs (others: DEFAULT_DRAFTER_KIND). */
export const DRAFTER_KIND_BY_MODEL_TYPE: Readonly<Record<string, DrafterKind>> = {
  nemotron_h_mtp: "mtp",
  deepseek_v4_mtp: "mtp",
  deepseek_v4_dspark: "dflash",
  dspark: "dflash",
  gemma4_dspark: "dflash",
  eagle3: "eagle3",
  gemma4_assistant: "mtp",
  gemma4_unified_assistant: "mtp",
  glm4_moe_lite_mtp: "mtp",
  glm5_next_mtp: "mtp",
  glm_moe_dsa_mtp: "mtp",
  hy_v4_mtp: "mtp",
  inkling_mtp: "mtp",
  qwen3_5_mtp: "mtp",
  qwen4_exp_mtp: "mtp",
  laguna: "dflash",
  muse_glimmer_assistant: "dflash",
  qwen3_dspark: "dflash",
};
export const DEFAULT_DRAFTER_KIND: DrafterKind = "dflash";

/**
 * mlx_vlm.utils.get_model_type for drafter configs: the declared model_type (or
 * speculators_model_type), lower-cased; a Gemma4DSparkModel architecture is gemma4_dspark; a
 * dflash_config makes it dspark (projector_type dspark or a markov_rank > 0) or `<type>_dflash`.
 */
export function drafterModelType(config: Record<string, unknown>): string | null {
  const raw = config.model_type ?? config.speculators_model_type;
  if (raw === undefined || raw === null) return null;
  const type = String(raw).toLowerCase();
  const archs = new Set(Array.isArray(config.architectures) ? config.architectures.map(String) : []);
  const d = config.dflash_config as Record<string, unknown> | null | undefined;
  if (archs.has("DFlash2DraftModel")) return "dflash2";
  if (archs.has("Gemma4DSparkModel")) return "gemma4_dspark";
  if (d !== undefined && d !== null) {
    const markov = Number(config.markov_rank || d.markov_rank || 0);
    return d.projector_type === "dspark" || markov > 0 ? "dspark" : `${type}_dflash`;
  }
  return type;
}

/** _expected_drafter_kind: the mapping, then an "mtp" model type name, then declared next-token-prediction layers. */
export function expectedDrafterKind(modelType: string | null, config?: Record<string, unknown>): DrafterKind | null {
  if (modelType !== null && Object.hasOwn(DRAFTER_KIND_BY_MODEL_TYPE, modelType)) return DRAFTER_KIND_BY_MODEL_TYPE[modelType]!;
  if (String(modelType).toLowerCase().includes("mtp")) return "mtp";
  for (const c of [config, config?.text_config as Record<string, unknown> | undefined]) {
    const n = c?.num_nextn_predict_layers;
    if (typeof n === "number" && Number.isInteger(n) && n > 0) return "mtp";
  }
  return null;
}

export { readDrafterConfig } from "./load.ts";

/**
 * resolve_drafter_kind for a checkpoint: the kind its model type requires; an explicit `kind` that
 * disagrees is overridden (as Python, which warns); without either, DEFAULT_DRAFTER_KIND.
 * Returns the normalized model type with it.
 */
export function resolveDrafterKind(dir: string, kind?: DrafterKind): { kind: DrafterKind; modelType: string | null } {
  const { raw } = readDrafterConfig(dir);
  const modelType = drafterModelType(raw);
  const expected = expectedDrafterKind(modelType, raw);
  return { kind: expected ?? kind ?? DEFAULT_DRAFTER_KIND, modelType };
}

/** load_drafter for the DFlash-kind drafters this port has (gemma4_dflash, qwen3_dflash, gemma4_dspark): config, sanitize, quantization, strict weights. */
export function loadDFlashDrafter(dir: string): DFlashDraftModel {
  const { raw, file } = readDrafterConfig(dir);
  const type = drafterModelType(raw);
  let model: DFlashDraftModel;
  if (type === "gemma4_dflash") model = new Gemma4DFlashDraftModel(gemma4DFlashConfigFromDict(raw, file));
  else if (type === "qwen3_dflash") model = new DFlashDraftModel(dflashConfigFromDict(raw, file));
  else if (type === "gemma4_dspark") model = new Gemma4DSparkDraftModel(gemma4DsparkConfigFromDict(raw, file));
  else throw new ConfigError(file, "model_type", `a DFlash drafter (model_type "gemma4" or "qwen3" with a dflash_config, or a Gemma4DSparkModel) was expected, this is ${JSON.stringify(type)}`);
  return loadDrafterWeights(model, dir, { layout: "gemma4_text", args: {}, raw, file } as unknown as LoadedConfig);
}
