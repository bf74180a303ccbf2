// The gemma4_unified processor (model/gemma4_unified/processing_gemma4_unified.ts) against
// mlx-vlm 0.7.10's own classes (oracle/python/unified_media.py): Gemma4UnifiedImageProcessor's
// pixel_values (model patches), image_position_ids and soft-token counts byte for byte on seeded
// pattern images and on decoded image files of the multimodal media fixtures (make_media.py),
// under several settings (resize, padding, truncation without resize, normalize, uint8 input,
// other patch geometry, num_soft_tokens, a model_patch_size kwarg); the audio feature extractor's
// frames and mask; and the configuration Gemma4UnifiedProcessor.from_pretrained reads from a
// directory (nested, flat, none). Bar: byte-identical; the case counts are asserted.

import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { sharedOracle } from "../../oracle/client.ts";
import { oracleMedia } from "../../oracle/media.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { patternImage } from "../../oracle/mm_fixtures.ts";
import { hostBytes, type HostArray } from "../../model/media/host.ts";
import { ConfigError } from "../../model/gemma4/config.ts";
import { loadImage, type RgbImage } from "../../model/media/image.ts";
import { Gemma4UnifiedAudioFeatureExtractor, Gemma4UnifiedImageProcessor, loadUnifiedProcessorConfig } from "../../model/gemma4_unified/index.ts";
import { makeMedia, makeProcessorDirs, type MediaItem, tempDir } from "../multimodal/media_fixtures.ts";

const tmp = tempDir("unified-proc");
afterAll(tmp.remove);
const oracle = await sharedOracle();

function same(label: string, ours: HostArray, theirs: NpyRecord): void {
  expect({ label, dtype: ours.dtype, shape: ours.shape }).toEqual({ label, dtype: theirs.dtype, shape: theirs.shape });
  expect(Buffer.compare(Buffer.from(hostBytes(ours)), Buffer.from(theirs.data)), `${label}: bytes differ`).toBe(0);
}

interface ImageCase {
  label: string;
  image: RgbImage;
  config?: Record<string, unknown>;
  kwargs?: Record<string, unknown>;
}

function pattern(seed: number, height: number, width: number): RgbImage {
  return { width, height, data: patternImage(seed, height, width) };
}

const cases: ImageCase[] = [
  { label: "144x144 mst 9 (no resize, no padding)", image: pattern(11, 144, 144), kwargs: { max_soft_tokens: 9 } },
  { label: "96x144 mst 9 (3 padding rows)", image: pattern(12, 96, 144), kwargs: { max_soft_tokens: 9 } },
  { label: "200x120 mst 9 (bicubic resize to 144x96)", image: pattern(14, 200, 120), kwargs: { max_soft_tokens: 9 } },
  { label: "37x300 mst 16 (one-patch-high resize)", image: pattern(15, 37, 300), kwargs: { max_soft_tokens: 16 } },
  { label: "normalize", image: pattern(16, 150, 100), config: { do_normalize: true, image_mean: [0.48, 0.46, 0.41], image_std: [0.27, 0.26, 0.28] }, kwargs: { max_soft_tokens: 12 } },
  { label: "uint8 (no rescale)", image: pattern(17, 96, 96), config: { do_rescale: false }, kwargs: { max_soft_tokens: 9 } },
  { label: "no resize: 144x240 truncated to 9 of 15 patches", image: pattern(18, 144, 240), config: { do_resize: false }, kwargs: { max_soft_tokens: 9 } },
  { label: "patch 14, pooling 2 (model patches 28)", image: pattern(19, 90, 130), config: { patch_size: 14, pooling_kernel_size: 2 }, kwargs: { max_soft_tokens: 12 } },
  { label: "num_soft_tokens 10 as max_soft_tokens", image: pattern(20, 130, 170), config: { num_soft_tokens: 10 } },
  { label: "model_patch_size kwarg 24 (24 patches truncated to 9)", image: pattern(21, 96, 144), kwargs: { max_soft_tokens: 9, model_patch_size: 24 } },
];

// decoded image files of the multimodal fixtures (the TS decoder's pixels go to both sides)
const files = makeMedia<MediaItem[]>(join(tmp.dir, "img"), "images", ["--count", "12"]);
for (const item of files.filter((f) => /_97x130_|_40x33_/.test(f.name)).slice(0, 4)) {
  cases.push({ label: `file ${item.name}`, image: await loadImage(item.file), kwargs: { max_soft_tokens: 9 } });
}

describe("gemma4_unified processor vs mlx-vlm", () => {
  it(`Gemma4UnifiedImageProcessor: pixel_values, image_position_ids, counts byte-identical on ${cases.length} images`, async () => {
    let ran = 0;
    for (const c of cases) {
      const ours = new Gemma4UnifiedImageProcessor(c.config ?? {}).preprocess([c.image], c.kwargs ?? {});
      const theirs = await oracleMedia(oracle, "unified_image", {
        pixels: { dtype: "uint8", shape: [c.image.height, c.image.width, 3], data: c.image.data },
        kwargs: c.kwargs ?? {},
        config: c.config ?? {},
      });
      same(`${c.label} pixel_values`, ours.pixel_values, theirs.pixel_values as NpyRecord);
      same(`${c.label} image_position_ids`, ours.image_position_ids, theirs.image_position_ids as NpyRecord);
      expect({ label: c.label, n: ours.num_soft_tokens_per_image }).toEqual({ label: c.label, n: theirs.num_soft_tokens });
      ran++;
    }
    expect(ran).toBe(cases.length);
    expect(cases.length).toBeGreaterThanOrEqual(12);
  }, 120_000);

  it("a model_patch_size that does not divide the image: mlx-vlm's reshape raises, the port one ConfigError", async () => {
    const image = pattern(21, 96, 144);
    expect(() => new Gemma4UnifiedImageProcessor().preprocess([image], { max_soft_tokens: 9, model_patch_size: 32 })).toThrow(ConfigError);
    const theirs = oracleMedia(oracle, "unified_image", { pixels: { dtype: "uint8", shape: [96, 144, 3], data: image.data }, kwargs: { max_soft_tokens: 9, model_patch_size: 32 }, config: {} });
    await expect(theirs).rejects.toThrow(/cannot reshape/);
  }, 30_000);

  it("Gemma4UnifiedAudioFeatureExtractor: frames and mask byte-identical (partial last frame, exact multiple, max_length truncation, padding)", async () => {
    const wave = (n: number, seed: number) => Float32Array.from({ length: n }, (_, i) => Math.fround(Math.sin(i * 0.01 * seed) * 0.5));
    const audioCases: { label: string; wave: Float32Array; max_length: number | null; config: Record<string, unknown> }[] = [
      { label: "1000 samples", wave: wave(1000, 1), max_length: null, config: {} },
      { label: "1280 samples (2 frames exactly)", wave: wave(1280, 2), max_length: null, config: {} },
      { label: "max_length 1 truncates", wave: wave(2000, 3), max_length: 1, config: {} },
      { label: "max_length 6 pads with padding_value", wave: wave(700, 4), max_length: 6, config: { padding_value: 0.25, audio_samples_per_token: 128 } },
    ];
    for (const c of audioCases) {
      const ours = new Gemma4UnifiedAudioFeatureExtractor(c.config).call([c.wave], { max_length: c.max_length });
      const theirs = await oracleMedia(oracle, "unified_audio", {
        waveform: { dtype: "float32", shape: [c.wave.length], data: new Uint8Array(c.wave.buffer) },
        config: c.config,
        max_length: c.max_length,
      });
      same(`${c.label} input_features`, ours.input_features, theirs.input_features as NpyRecord);
      same(`${c.label} input_features_mask`, ours.input_features_mask, theirs.input_features_mask as NpyRecord);
    }
  }, 60_000);

  it("Gemma4UnifiedProcessor.from_pretrained's configuration: nested block, flat file (ignored), none, sequence lengths, the video processor (its block, else the image block's keys)", async () => {
    const dirs = makeProcessorDirs(join(tmp.dir, "proc"), [
      { name: "none", config: null },
      { name: "nested", config: { image_processor: { image_processor_type: "Gemma4UnifiedImageProcessor", num_soft_tokens: 64, model_patch_size: 32, do_normalize: true, image_mean: [0.2], mm_posemb_size: 40 }, audio_seq_length: 300, audio_ms_per_token: 80, feature_extractor: { audio_samples_per_token: 320 } } },
      { name: "flat", config: { max_soft_tokens: 140, pooling_kernel_size: 2 }, flat: true },
      { name: "seq", config: { image_seq_length: 12, image_processor: { max_soft_tokens: 70, do_rescale: false } } },
      { name: "video", config: { image_processor: { patch_size: 14 }, video_processor: { video_processor_type: "Gemma4UnifiedVideoProcessor", num_soft_tokens: 140, num_frames: 8, default_fps: 1.5, do_normalize: true, image_std: [0.3] } } },
    ]);
    for (const d of dirs) {
      const ours = loadUnifiedProcessorConfig(d.dir);
      const theirs = (await oracleMedia(oracle, "unified_processor_config", { model_dir: d.dir })) as Record<string, unknown>;
      const ip = ours.image_processor;
      expect({
        name: d.name,
        image_processor: {
          do_resize: ip.do_resize, do_rescale: ip.do_rescale, rescale_factor: ip.rescale_factor, do_normalize: ip.do_normalize, image_mean: ip.image_mean, image_std: ip.image_std,
          patch_size: ip.patch_size, max_soft_tokens: ip.max_soft_tokens, pooling_kernel_size: ip.pooling_kernel_size, model_patch_size: ip.model_patch_size, mm_posemb_size: ip.mm_posemb_size,
        },
        audio_samples_per_token: new Gemma4UnifiedAudioFeatureExtractor(ours.feature_extractor).audio_samples_per_token,
        image_seq_length: ours.image_seq_length,
        audio_seq_length: ours.audio_seq_length,
        audio_ms_per_token: ours.audio_ms_per_token,
      }).toEqual({ name: d.name, ...theirs });
      // the video processor: its own block, else the image block's geometry and pixel settings
      const vp = ours.video_processor;
      const theirsV = await oracleMedia(oracle, "unified_video_processor_config", { model_dir: d.dir });
      expect({
        name: d.name,
        patch_size: vp.patch_size, max_soft_tokens: vp.max_soft_tokens, pooling_kernel_size: vp.pooling_kernel_size, num_frames: vp.num_frames, do_resize: vp.do_resize,
        do_rescale: vp.do_rescale, rescale_factor: vp.rescale_factor, do_normalize: vp.do_normalize, image_mean: vp.image_mean, image_std: vp.image_std, default_fps: vp.default_fps,
        model_patch_size: vp.model_patch_size, mm_posemb_size: vp.mm_posemb_size,
      }).toEqual({ name: d.name, ...theirsV });
    }
    expect(dirs.length).toBe(5);
  }, 60_000);
});
