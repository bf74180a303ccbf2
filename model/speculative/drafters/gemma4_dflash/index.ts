// mlx_vlm/speculative/drafters/gemma4_dflash/__init__.py (mlx-vlm 0.7.10): the Gemma 4 DFlash
// drafter, a thin layer over qwen3_dflash: Gemma4DFlashConfig defaults the mask token to 4 (Gemma's
// <mask>) and Gemma4DFlashDraftModel is DFlashDraftModel unchanged.
import { drafterMutated } from "../../mutations.ts";
import { type DFlashConfig, dflashConfigFromDict } from "../qwen3_dflash/config.ts";
import { DFlashDraftModel, DFlashKVCache } from "../qwen3_dflash/dflash.ts";

export type Gemma4DFlashConfig = DFlashConfig;

/** Gemma4DFlashConfig.from_dict: dflash_config.mask_token_id defaults to 4. */
export function gemma4DFlashConfigFromDict(params: Record<string, unknown>, file = "config.json"): Gemma4DFlashConfig {
  const flat: Record<string, unknown> = { ...params };
  const dflashCfg = { ...((flat.dflash_config as Record<string, unknown> | null | undefined) ?? {}) };
  if (!("mask_token_id" in dflashCfg) && !drafterMutated("gemma4_dflash_mask_default_lost")) dflashCfg.mask_token_id = 4;
  flat.dflash_config = dflashCfg;
  return dflashConfigFromDict(flat, file);
}

export class Gemma4DFlashDraftModel extends DFlashDraftModel {}

export { DFlashKVCache };
