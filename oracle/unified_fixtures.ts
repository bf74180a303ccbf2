// The gemma4_unified fixture scenarios (fixtures/unified_scenarios.json) and their inputs computed
// on the TS side (used by suites/unified and by `npm run parity`): the prompt ids (each image name
// expanded to boi + image_token * its soft tokens + eoi) and the processor outputs, from the
// fixture images rebuilt from their seeds (mm_fixtures.patternImage) through the TS
// Gemma4UnifiedImageProcessor with the scenario's max_soft_tokens. The oracle takes a scenario
// inline (inlineScenario: the media specs travel with it) and runs mlx-vlm's own processor.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { computeAudioNumTokens } from "../model/gemma4/processing_gemma4.ts";
import { Gemma4UnifiedAudioFeatureExtractor, Gemma4UnifiedImageProcessor, type UnifiedImageProcessorOutput, type UnifiedMediaInputs } from "../model/gemma4_unified/index.ts";
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

/** A fixture audio clip: `samples` float32 values from the integer hash (capture_mm.pattern_wave). */
export interface WaveSpec {
  kind: "audio";
  seed: number;
  samples: number;
}

const SPEC = JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "unified_scenarios.json"), "utf8")) as {
  media: Record<string, ImageSpec | WaveSpec>;
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

/** pattern_wave(seed, n): ((hash(seed, i) >> 8) / 2**24 - 0.5) in float32 (every step exact). */
export function patternWave(seed: number, samples: number): Float32Array {
  const mul = (a: number, b: number) => Math.imul(a, b) >>> 0;
  const out = new Float32Array(samples);
  for (let i = 0; i < samples; i++) {
    let v = (mul(seed, 0x9e3779b1) + mul(i, 0xc2b2ae3d)) >>> 0;
    v = (v ^ (v >>> 15)) >>> 0;
    v = mul(v, 0x2c1b3c6d);
    v = (v ^ (v >>> 12)) >>> 0;
    v = mul(v, 0x297a2d39);
    v = (v ^ (v >>> 15)) >>> 0;
    out[i] = (v >>> 8) / 2 ** 24 - 0.5;
  }
  return out;
}

/** Whether a checkpoint has the parts a scenario needs ("vision": the embedder, "audio": embed_audio). */
export function scenarioFits(scn: UnifiedScenario, parts: { vision: boolean; audio: boolean }): boolean {
  return scn.needs.every((n) => parts[n as "vision" | "audio"] === true);
}

function toMx(a: HostArray): mx.MlxArray {
  return mx.array(a.data as never, a.shape, a.dtype as mx.Dtype);
}

/**
 * The prompt ids and media of a scenario, computed by the TS processor: each image through
 * Gemma4UnifiedImageProcessor (its max_soft_tokens), stacked; each image name expanded to
 * boi + image_token * (its soft tokens) + eoi.
 */
export function unifiedInputs(
  scn: UnifiedScenario,
  tokens: { image_token_id: number; boi_token_id: number; eoi_token_id: number; audio_token_id: number; boa_token_id: number; eoa_token_id: number | null },
): { ids: number[]; media: UnifiedMediaInputs } {
  const proc = new Gemma4UnifiedImageProcessor();
  const ids: number[] = [];
  const outs: UnifiedImageProcessorOutput[] = [];
  const waves: Float32Array[] = [];
  for (const item of scn.prompt) {
    if (typeof item === "number") {
      ids.push(item);
      continue;
    }
    const spec = UNIFIED_MEDIA[item]!;
    if (spec.kind === "audio") {
      // Gemma4Processor's count: ceil(ms / 40), capped at 750 (the frames the extractor makes for 16 kHz)
      const w = patternWave(spec.seed, spec.samples);
      waves.push(w);
      if (tokens.eoa_token_id === null) throw new Error(`${scn.id}: the config has no eoa token`);
      ids.push(tokens.boa_token_id, ...Array<number>(computeAudioNumTokens(w.length, 16000)).fill(tokens.audio_token_id), tokens.eoa_token_id);
      continue;
    }
    const out = proc.preprocess([{ width: spec.width, height: spec.height, data: patternImage(spec.seed, spec.height, spec.width) }], { max_soft_tokens: spec.max_soft_tokens });
    outs.push(out);
    ids.push(tokens.boi_token_id, ...Array<number>(out.num_soft_tokens_per_image[0]!).fill(tokens.image_token_id), tokens.eoi_token_id);
  }
  const media: UnifiedMediaInputs = {};
  if (waves.length) {
    // the extractor runs over all clips at once (padded to the longest), as Gemma4Processor calls it
    const f = new Gemma4UnifiedAudioFeatureExtractor().call(waves);
    media.input_features = toMx(f.input_features);
    media.input_features_mask = toMx(f.input_features_mask);
  }
  if (outs.length === 0) return { ids, media };
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
  return { ids, media: { ...media, pixel_values: toMx(cat("pixel_values")), image_position_ids: toMx(cat("image_position_ids")) } };
}

