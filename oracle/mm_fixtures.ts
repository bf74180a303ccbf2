// The multimodal fixture scenarios (fixtures/mm_scenarios.json) and their media, rebuilt on the
// TS side (used by the suites and by `npm run parity`): images from the
// same 32-bit hash as oracle/python/capture_mm.pattern_image, through the image processor's
// only step that applies to them (no resize: their sizes fit the patch budget exactly, and no
// normalize: off by default), rescale as numpy does it: float32(u) * float32(1/255). Audio
// features come from the oracle's record (numpy's FFT is not reproducible here).

import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { REPO_ROOT } from "./client.ts";

export interface MmScenario {
  id: string;
  kind: "forward" | "generate";
  /** The towers a checkpoint must have. */
  needs: string[];
  /** Token ids and media names (keys of MM_MEDIA). */
  prompt: (number | string)[];
  prefill_step_size?: number;
  max_tokens?: number;
}

const SPEC = JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "mm_scenarios.json"), "utf8")) as {
  media: Record<string, ImageSpec | { kind: "audio"; seed: number; seconds: number }>;
  scenarios: MmScenario[];
};
export const MM_MEDIA = SPEC.media;
export const MM_SCENARIOS: readonly MmScenario[] = SPEC.scenarios;

export function mmScenario(id: string): MmScenario {
  const s = MM_SCENARIOS.find((x) => x.id === id);
  if (!s) throw new Error(`unknown multimodal scenario ${id}`);
  return s;
}

/**
 * The gemma4 config.json of a multimodal fixture, as make_mm_checkpoints.mm_config builds it:
 * the text fixture plus its overrides, the towers' configs and the media token ids.
 */
export function mmFixtureConfig(name: string): Record<string, unknown> {
  const spec = JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "mm_configs", `${name}.json`), "utf8")) as Record<string, unknown>;
  const text = JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "configs", `${spec.text}.json`), "utf8")) as Record<string, unknown>;
  delete text._comment;
  Object.assign(text, spec.text_overrides ?? {});
  return { model_type: "gemma4", text_config: text, vision_config: spec.vision_config, audio_config: spec.audio_config, vocab_size: text.vocab_size, ...(spec.tokens as object) };
}

/** Which towers a scenario's embed call runs (its prompt's media kinds), and whether its images come as a list (sizes differ). */
export function scenarioMedia(scn: MmScenario): { image: boolean; audio: boolean; imageList: boolean } {
  const kinds = scn.prompt.filter((p): p is string => typeof p === "string").map((n) => MM_MEDIA[n]!.kind);
  const imgs = scenarioImages(scn);
  return { image: kinds.includes("image"), audio: kinds.includes("audio"), imageList: imgs.some((i) => i.height !== imgs[0]!.height || i.width !== imgs[0]!.width) };
}

/** The image specs of a scenario's prompt, in prompt order. */
export function scenarioImages(scn: MmScenario): ImageSpec[] {
  return scn.prompt.filter((p): p is string => typeof p === "string").map((n) => MM_MEDIA[n]!).filter((m): m is ImageSpec => m.kind === "image");
}

export interface ImageSpec {
  kind: "image";
  seed: number;
  height: number;
  width: number;
  max_soft_tokens: number;
}

/** pattern_image(seed, H, W): uint8 values in (H, W, 3) order. */
export function patternImage(seed: number, height: number, width: number): Uint8Array {
  const out = new Uint8Array(height * width * 3);
  const mul = (a: number, b: number) => Math.imul(a, b) >>> 0;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      for (let c = 0; c < 3; c++) {
        let v = (mul(seed, 0x9e3779b1) + mul(y, 0x85ebca77) + mul(x, 0xc2b2ae3d) + mul(c, 0x27d4eb2f)) >>> 0;
        v = (v ^ (v >>> 15)) >>> 0;
        v = mul(v, 0x2c1b3c6d);
        v = (v ^ (v >>> 12)) >>> 0;
        v = mul(v, 0x297a2d39);
        v = (v ^ (v >>> 15)) >>> 0;
        out[(y * width + x) * 3 + c] = v >>> 24;
      }
    }
  }
  return out;
}

/** The processor's pixel_values of one fixture image: (3, H, W) float32, u * float32(1/255) in float32. */
export function fixturePixels(spec: ImageSpec): Float32Array {
  const { height: H, width: W } = spec;
  const u8 = patternImage(spec.seed, H, W);
  const scale = Math.fround(1 / 255);
  const out = new Float32Array(3 * H * W);
  for (let c = 0; c < 3; c++) for (let i = 0; i < H * W; i++) out[c * H * W + i] = Math.fround(u8[i * 3 + c]! * scale);
  return out;
}

/** The images of a prompt as the processor batches them: one (B, 3, H, W) array when all sizes agree, else a list. */
export function fixtureImages(specs: readonly ImageSpec[]): MlxArray | MlxArray[] | null {
  if (specs.length === 0) return null;
  const same = specs.every((s) => s.height === specs[0]!.height && s.width === specs[0]!.width);
  if (same) {
    const { height: H, width: W } = specs[0]!;
    const all = new Float32Array(specs.length * 3 * H * W);
    specs.forEach((s, b) => all.set(fixturePixels(s), b * 3 * H * W));
    return mx.array(all, [specs.length, 3, H, W], "float32");
  }
  return specs.map((s) => mx.array(fixturePixels(s), [3, s.height, s.width], "float32"));
}
