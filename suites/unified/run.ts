// Running the TS gemma4_unified model the way the oracle ran mlx-vlm (suites/unified): the prompt
// ids and the processor outputs computed here (the fixture images rebuilt from their seeds, through
// the TS Gemma4UnifiedImageProcessor), every tap collected under the oracle's names; the oracle's
// record of the same scenario (passed inline: fixtures/unified_scenarios.json).

import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { generateStep } from "../../model/generate.ts";
import { Gemma4UnifiedImageProcessor, type Model, type UnifiedImageProcessorOutput, mmTokenTypes, type UnifiedMediaInputs, unifiedGenerationModel } from "../../model/gemma4_unified/index.ts";
import { disposeUnifiedMedia } from "../../model/gemma4_unified/gemma4_unified.ts";
import type { HostArray } from "../../model/media/host.ts";
import { stepTaps } from "../../model/runtime.ts";
import { type OracleClient, REPO_ROOT } from "../../oracle/client.ts";
import { type ImageSpec, patternImage } from "../../oracle/mm_fixtures.ts";
import { fromOracle, TapCollector, type TapData } from "../gemma4/tap_compare.ts";

export const CKPT_ROOT = join(REPO_ROOT, ".cache", "checkpoints");

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

export interface UnifiedReference {
  taps: TapData[];
  calls: unknown[];
  generated?: number[];
  prefill_chunks?: number[];
}

/** A live capture of mlx-vlm running the scenario (every tap). */
export async function unifiedReference(oracle: OracleClient, ckpt: string, scn: UnifiedScenario): Promise<UnifiedReference> {
  const cap = await oracle.capture(ckpt, inlineScenario(scn) as never, { mode: "full" });
  const meta = cap.meta as { generated?: number[]; prefill_chunks?: number[] };
  return { taps: cap.taps.map(fromOracle), calls: cap.calls, generated: meta.generated, prefill_chunks: meta.prefill_chunks };
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

/** Every tap of a single forward (Model.__call__; mm_token_type_ids passed and dropped, as mlx-vlm does). */
export function unifiedForwardTaps(model: Model, scn: UnifiedScenario): TapData[] {
  const { ids, media } = unifiedInputs(scn, model.config);
  const col = new TapCollector();
  try {
    using x = mx.array(Int32Array.from(ids), [1, ids.length], "int32");
    const types = mmTokenTypes(ids, model.config);
    using mm = mx.array(Int32Array.from(types), [1, types.length], "int32");
    using _logits = model.call(x, { ...media, mm_token_type_ids: mm, taps: col.sink });
  } finally {
    disposeUnifiedMedia(media);
  }
  return col.taps;
}

/** Every tap of mlx-vlm's generate_step on the scenario (embed call, prefill chunks, steps); the tokens. */
export async function unifiedGenerateTaps(model: Model, scn: UnifiedScenario): Promise<{ taps: TapData[]; tokens: number[]; chunks: number[] }> {
  const { ids, media } = unifiedInputs(scn, model.config);
  const col = new TapCollector();
  const run = unifiedGenerationModel(model, { ids, media }, col.sink);
  const tokens: number[] = [];
  const chunks: number[] = [];
  try {
    const onStep = stepTaps(col.sink);
    for await (const t of generateStep(run.generate, ids, {
      maxTokens: scn.max_tokens!,
      prefillStepSize: scn.prefill_step_size!,
      chunkedPrefill: run.chunked,
      onStep: (info) => {
        if (info.call.kind === "prefill") chunks.push(info.inputs.length);
        onStep(info);
      },
    })) {
      tokens.push(t.token);
    }
  } finally {
    run.dispose();
    disposeUnifiedMedia(media);
  }
  return { taps: col.taps, tokens, chunks };
}

export async function unifiedTaps(model: Model, scn: UnifiedScenario): Promise<{ taps: TapData[]; tokens: number[]; chunks: number[] }> {
  return scn.kind === "forward" ? { taps: unifiedForwardTaps(model, scn), tokens: [], chunks: [] } : unifiedGenerateTaps(model, scn);
}
