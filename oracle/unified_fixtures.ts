// The gemma4_unified fixture scenarios (fixtures/unified_scenarios.json) and their inputs computed
// on the TS side (used by suites/unified and by `npm run parity`): the prompt ids (each image name
// expanded to boi + image_token * its soft tokens + eoi) and the processor outputs, from the
// fixture images rebuilt from their seeds (mm_fixtures.patternImage) through the TS
// Gemma4UnifiedImageProcessor with the scenario's max_soft_tokens. The oracle takes a scenario
// inline (inlineScenario: the media specs travel with it) and runs mlx-vlm's own processor.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { Gemma4UnifiedImageProcessor, type UnifiedImageProcessorOutput, type UnifiedMediaInputs } from "../model/gemma4_unified/index.ts";
import type { HostArray } from "../model/media/host.ts";
import { REPO_ROOT } from "./client.ts";
import { type ImageSpec, patternImage } from "./mm_fixtures.ts";

export interface UnifiedScenario {
  id: string;
  kind: "forward" | "generate";
  needs: string[];
  prompt: (number | string)[];
  prefill_step_size?: number;
  max_tokens?: number;
}

const SPEC = JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "unified_scenarios.json"), "utf8")) as {
  media: Record<string, ImageSpec>;
  scenarios: UnifiedScenario[];
};
export const UNIFIED_MEDIA = SPEC.media;
export const UNIFIED_SCENARIOS: readonly UnifiedScenario[] = SPEC.scenarios;

export function unifiedScenario(id: string): UnifiedScenario {
  const s = UNIFIED_SCENARIOS.find((x) => x.id === id);
  if (!s) throw new Error(`unknown unified scenario ${id}`);
  return s;
}

/** The scenario as the oracle takes it inline (the media specs travel with it). */
export function inlineScenario(scn: UnifiedScenario): Record<string, unknown> {
  return { ...scn, media: UNIFIED_MEDIA };
}

function toMx(a: HostArray): mx.MlxArray {
  return mx.array(a.data as never, a.shape, a.dtype as mx.Dtype);
}

/**
 * The prompt ids and media of a scenario, computed by the TS processor: each image through
 * Gemma4UnifiedImageProcessor (its max_soft_tokens), stacked; each image name expanded to
 * boi + image_token * (its soft tokens) + eoi.
 */
export function unifiedInputs(scn: UnifiedScenario, tokens: { image_token_id: number; boi_token_id: number; eoi_token_id: number }): { ids: number[]; media: UnifiedMediaInputs } {
  const proc = new Gemma4UnifiedImageProcessor();
  const ids: number[] = [];
  const outs: UnifiedImageProcessorOutput[] = [];
  for (const item of scn.prompt) {
    if (typeof item === "number") {
      ids.push(item);
      continue;
    }
    const spec = UNIFIED_MEDIA[item]!;
    const out = proc.preprocess([{ width: spec.width, height: spec.height, data: patternImage(spec.seed, spec.height, spec.width) }], { max_soft_tokens: spec.max_soft_tokens });
    outs.push(out);
    ids.push(tokens.boi_token_id, ...Array<number>(out.num_soft_tokens_per_image[0]!).fill(tokens.image_token_id), tokens.eoi_token_id);
  }
  if (outs.length === 0) return { ids, media: {} };
  const cat = (key: "pixel_values" | "image_position_ids"): HostArray => {
    const first = outs[0]![key];
    if (!outs.every((o) => o[key].shape.slice(1).join() === first.shape.slice(1).join())) throw new Error(`${scn.id}: images of one prompt need the same max_soft_tokens`);
    const per = first.data.length;
    const shape = [outs.length, ...first.shape.slice(1)];
    if (first.dtype === "float32") {
      const d = new Float32Array(per * outs.length);
      outs.forEach((o, i) => d.set(o[key].data as Float32Array, i * per));
      return { dtype: "float32", shape, data: d };
    }
    const d = new BigInt64Array(per * outs.length);
    outs.forEach((o, i) => d.set(o[key].data as BigInt64Array, i * per));
    return { dtype: "int64", shape, data: d };
  };
  return { ids, media: { pixel_values: toMx(cat("pixel_values")), image_position_ids: toMx(cat("image_position_ids")) } };
}

