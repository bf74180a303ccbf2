// The processor around the preprocessing: the configuration read from a checkpoint directory
// (as `Gemma4Processor.from_pretrained` reads it, defaults included), the prompt expansion and
// every model input of `mlx_vlm.utils.prepare_inputs` (input_ids, attention_mask,
// mm_token_type_ids, pixel_values, input_features, input_features_mask), compared with
// mlx-vlm's; and one clear typed error for each kind of bad input.

import { afterAll, describe, expect, it } from "vitest";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { sharedOracle } from "../../oracle/client.ts";
import { type MediaFn, oracleMedia } from "../../oracle/media.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { compareRaw, formatDiff } from "../../oracle/tensor_diff.ts";
import { MediaError } from "../../model/media/errors.ts";
import { hostBytes, type HostArray } from "../../model/media/host.ts";
import { imageSize, loadImage } from "../../model/media/image.ts";
import { loadAudio } from "../../model/media/wav.ts";
import { ConfigError } from "../../model/gemma4/config.ts";
import { featureExtractorConfig, Gemma4AudioFeatureExtractor } from "../../model/gemma4/audio_feature_extractor.ts";
import {
  expandPrompt,
  GEMMA4_MEDIA_TOKENS,
  Gemma4ImageProcessor,
  Gemma4Processor,
  loadProcessorConfig,
  mediaTokensFromTokenizerConfig,
} from "../../model/gemma4/processing_gemma4.ts";
import { makeMedia, makeProcessorDirs, type MediaItem, tempDir } from "./media_fixtures.ts";

const tmp = tempDir("proc");
afterAll(tmp.remove);
const oracle = await sharedOracle();

const specs = [
  { name: "none", config: null },
  { name: "nested", config: { image_processor: { image_processor_type: "Gemma4ImageProcessor", max_soft_tokens: 70, do_normalize: true, image_mean: [0.2], foo: 1 }, audio_seq_length: 300, audio_ms_per_token: 80, feature_extractor: { feature_extractor_type: "X", hop_length_ms: 20, preemphasis: 0.5, fft_length: 999, hop_length: 7 } } },
  { name: "flat", config: { max_soft_tokens: 140, pooling_kernel_size: 2, do_rescale: 0, size: { height: 1 }, feature_extractor: { mel_floor: 0.01 } }, flat: true },
  { name: "flat-typed", config: { image_processor_type: "Gemma4ImageProcessor", max_soft_tokens: 140 }, flat: true },
  { name: "no-block", config: { audio_seq_length: 100, image_seq_length: 12 } },
];
const dirs = makeProcessorDirs(join(tmp.dir, "dirs"), specs);

// Tokenizer variants: tokens only in extra_special_tokens; no boundary tokens at all.
const extraDir = dirs[0]!.dir;
{
  const cfg = JSON.parse(readFileSync(join(extraDir, "tokenizer_config.json"), "utf8"));
  const named = Object.fromEntries(Object.entries(cfg).filter(([k]) => /^(image|boi|eoi|audio|boa|eoa)_token$/.test(k)));
  for (const k of Object.keys(named)) delete cfg[k];
  writeFileSync(join(extraDir, "tokenizer_config.json"), JSON.stringify({ ...cfg, extra_special_tokens: named }));
  const cfg2 = JSON.parse(readFileSync(join(dirs[4]!.dir, "tokenizer_config.json"), "utf8"));
  delete cfg2.boi_token;
  delete cfg2.eoi_token;
  writeFileSync(join(dirs[4]!.dir, "tokenizer_config.json"), JSON.stringify(cfg2));
}

describe("configuration read as mlx-vlm reads it", () => {
  for (const d of dirs)
    it(d.name, async () => {
      const info = await oracleMedia(oracle, "processor_info", { model_dir: d.dir });
      const cfg = loadProcessorConfig(d.dir);
      expect(cfg.image_processor).toEqual(
        Object.fromEntries(
          Object.entries(info.image_processor as Record<string, unknown>).map(([k, v]) =>
            // Python keeps a 1-element mean as is and broadcasts it; the TS config holds it per channel.
            [k, (k === "image_mean" || k === "image_std") && Array.isArray(v) && v.length === 1 ? [v[0], v[0], v[0]] : typeof v === "number" && typeof cfg.image_processor[k as keyof typeof cfg.image_processor] === "boolean" ? v !== 0 : v],
          ),
        ),
      );
      const ex = new Gemma4AudioFeatureExtractor(featureExtractorConfig(cfg.feature_extractor, cfg.file));
      const fe = info.feature_extractor as Record<string, unknown>;
      const { frame_length, hop_length, fft_length, ...rest } = fe;
      expect({ frame_length: ex.frameLength, hop_length: ex.hopLength, fft_length: ex.fftLength }).toEqual({ frame_length, hop_length, fft_length });
      const mine = ex.config as unknown as Record<string, unknown>;
      for (const [k, v] of Object.entries(rest)) expect([k, mine[k]]).toEqual([k, v]);
      expect({ image_seq_length: cfg.image_seq_length, audio_seq_length: cfg.audio_seq_length, audio_ms_per_token: cfg.audio_ms_per_token }).toEqual({
        image_seq_length: info.image_seq_length,
        audio_seq_length: info.audio_seq_length,
        audio_ms_per_token: info.audio_ms_per_token,
      });
      expect(mediaTokensFromTokenizerConfig(d.dir)).toEqual(info.tokens);
    });
});

describe("target size = get_aspect_ratio_preserving_size", () => {
  it("2000 sizes, budgets, patch and pooling sizes (extreme aspect ratios included)", async () => {
    let seed = 11;
    const rnd = () => (seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32;
    const cases: number[][] = [];
    for (let i = 0; i < 2000; i++) {
      const side = () => Math.max(1, Math.round(Math.exp(rnd() * Math.log(i % 10 === 0 ? 200000 : 8000))));
      const mst = [70, 140, 280, 560, 1120, 1, 7, 64][i % 8]!;
      cases.push([side(), side(), [16, 14, 8][i % 3]!, mst, [3, 2, 1][(i >> 2) % 3]!]);
    }
    const want = (await oracleMedia(oracle, "target_sizes", { cases })).sizes as (number[] | string)[];
    const bad: string[] = [];
    cases.forEach(([h, w, patch, mst, pool], i) => {
      const proc = new Gemma4ImageProcessor({ patch_size: patch, max_soft_tokens: mst, pooling_kernel_size: pool });
      let got: number[] | string;
      try {
        got = proc.targetSize(h!, w!);
      } catch (e) {
        got = (e as Error).message;
      }
      const ok = typeof want[i] === "string" ? typeof got === "string" : JSON.stringify(got) === JSON.stringify(want[i]);
      if (!ok) bad.push(`${h}x${w} patch ${patch} mst ${mst} pool ${pool}: ${JSON.stringify(got)} vs ${JSON.stringify(want[i])}`);
    });
    expect(bad).toEqual([]);
  });
});

/** The TS side of prepare_inputs with the checkpoint's tokenizer (as the faces tokenize). */
async function tsInputs(dir: string, text: string, images: string[], audio: string[]) {
  const tok = new Tokenizer(JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")), JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")));
  const p = Gemma4Processor.fromPretrained(dir);
  return p.call({ text, images, audio, tokenize: (s) => Array.from(tok.encode(s, { add_special_tokens: false }).ids), tokenId: (t) => tok.token_to_id(t) });
}

const rec = (a: HostArray) => ({ dtype: a.dtype, shape: a.shape, data: hostBytes(a) });

const allImages = makeMedia(join(tmp.dir, "img"), "images", ["--count", "4"]);

describe("every model input of prepare_inputs = mlx-vlm's", () => {
  const imgs = allImages.filter((x) => x.group === "size");
  const wavs = makeMedia(join(tmp.dir, "wav"), "audio", ["--count", "16"]);
  const cases: [string, string, string, MediaItem[], MediaItem[]][] = [
    ["2 same-size images + 2 clips", dirs[1]!.dir, "please describe <|image|> and <|image|> then this <|audio|> and that <|audio|>", [imgs[0]!, imgs[0]!], [wavs[12]!, wavs[13]!]],
    ["images of 2 sizes, tokens in extra_special_tokens", extraDir, "<|image|> what is it <|image|>", [imgs[2]!, imgs[3]!], []],
    ["audio only, no boundary tokens", dirs[4]!.dir, "hello <|audio|> what is it", [], [wavs[14]!]],
    ["image without boi/eoi tokens", dirs[4]!.dir, "hello <|image|>", [imgs[1]!], []],
  ];
  for (const [name, dir, text, images, audio] of cases)
    it(name, async () => {
      const want = await oracleMedia(oracle, "prepare", { model_dir: dir, prompt: text, images: images.map((x) => x.file), audio: audio.map((x) => x.file) });
      const got = await tsInputs(dir, text, images.map((x) => x.file), audio.map((x) => x.file));
      const pairs: [string, HostArray, unknown][] = [
        ["input_ids", got.input_ids, want.input_ids],
        ["attention_mask", got.attention_mask, want.attention_mask],
        ["mm_token_type_ids", got.mm_token_type_ids, want.mm_token_type_ids],
      ];
      if (got.input_features) pairs.push(["input_features", got.input_features, want.input_features], ["input_features_mask", got.input_features_mask!, want.input_features_mask]);
      if (Array.isArray(got.pixel_values)) {
        expect(want.pixel_values_count).toBe(got.pixel_values.length);
        got.pixel_values.forEach((pv, i) => pairs.push([`pixel_values[${i}]`, pv, want[`pixel_values_${i}`]]));
      } else if (got.pixel_values) pairs.push(["pixel_values", got.pixel_values, want.pixel_values]);
      const keys = Object.keys(want).filter((k) => !/^pixel_values_\d+$/.test(k));
      expect(keys.sort()).toEqual([...pairs.map(([k]) => k.replace(/\[\d+\]$/, "")).filter((k) => k !== "pixel_values" || !Array.isArray(got.pixel_values)), ...(Array.isArray(got.pixel_values) ? ["pixel_values_count"] : [])].sort());
      for (const [k, mine, theirs] of pairs) {
        const d = compareRaw(k, rec(mine), theirs as NpyRecord);
        expect(d.equal, formatDiff(d)).toBe(true);
      }
    });

  it("placeholder counts must match the media (mlx-vlm mis-scatters on too few)", () => {
    expect(() => expandPrompt("<|image|>", GEMMA4_MEDIA_TOKENS, { images: [3, 4] })).toThrow(/1 image placeholder\(s\) for 2 image/);
    expect(() => expandPrompt("<|audio|> <|audio|>", GEMMA4_MEDIA_TOKENS, { audio: [3] })).toThrow(/2 audio placeholder\(s\) for 1 clip/);
    expect(expandPrompt("a <|image|> b", GEMMA4_MEDIA_TOKENS, { images: [2] })).toBe("a <|image><|image|><|image|><image|> b");
  });
});

describe("bad input: one typed error each", () => {
  const bad = makeMedia(join(tmp.dir, "bad"), "bad");
  it("the bad-media set holds its 19 files (one test each below)", () => expect(bad.length).toBe(19));
  for (const item of bad)
    it(`${item.name} -> ${item.problem}`, async () => {
      let err: unknown;
      try {
        if (item.name.startsWith("audio")) loadAudio(item.file, 16000);
        else await loadImage(item.file, { maxPixels: 2 * 89478485 });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(MediaError);
      expect((err as MediaError).problem).toBe(item.problem);
      expect((err as MediaError).file).toBe(item.file);
      expect((err as MediaError).message).toContain(item.file);
    });

  it("a configured pixel limit, checked from the header before decoding", async () => {
    const big = allImages.find((x) => x.name.startsWith("jpeg_240x320_s0_p0"))!;
    expect(imageSize(big.file)).toEqual(expect.objectContaining({ width: 320, height: 240 }));
    await expect(loadImage(big.file, { maxPixels: 320 * 240 - 1 })).rejects.toMatchObject({ problem: "too_large" });
    await expect(loadImage(big.file, { maxPixels: 320 * 240 })).resolves.toMatchObject({ width: 320, height: 240 });
  });

  it("an unknown media function is the oracle's LookupError, not a hang", async () => {
    await expect(oracleMedia(oracle, "no_such_fn" as MediaFn)).rejects.toThrow(/LookupError: unknown media function/);
  });

  it("a missing file", async () => {
    await expect(loadImage(join(tmp.dir, "nope.png"))).rejects.toMatchObject({ name: "MediaError", problem: "unreadable" });
    expect(() => loadAudio(join(tmp.dir, "nope.wav"))).toThrow(MediaError);
  });

  const badConfig: [string, Record<string, unknown>, string][] = [
    ["dither", { feature_extractor: { dither: 0.1 } }, "feature_extractor.dither"],
    ["sampling rate", { feature_extractor: { sampling_rate: 8000 } }, "feature_extractor.sampling_rate"],
    ["frame length", { feature_extractor: { frame_length_ms: 25 } }, "feature_extractor.frame_length_ms"],
    ["per-bin mean length", { feature_extractor: { per_bin_mean: [1, 2] } }, "feature_extractor.per_bin_mean"],
    ["max_soft_tokens type", { image_processor: { max_soft_tokens: "70" } }, "image_processor.max_soft_tokens"],
    ["image_mean length", { image_processor: { image_mean: [0.1, 0.2] } }, "image_processor.image_mean"],
    ["do_resize type", { image_processor: { do_resize: "yes" } }, "image_processor.do_resize"],
  ];
  const badDirs = makeProcessorDirs(join(tmp.dir, "badcfg"), [...badConfig.map(([name, config]) => ({ name: name.replace(/\W/g, "_"), config })), { name: "json", config: {} }]);
  badConfig.forEach(([name, , key], i) =>
    it(`config: ${name} -> ConfigError naming ${key}`, () => {
      const dir = badDirs[i]!.dir;
      let err: unknown;
      try {
        Gemma4Processor.fromPretrained(dir);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).key).toBe(key);
      expect((err as ConfigError).file).toBe(join(dir, "processor_config.json"));
    }),
  );

  it("config: invalid JSON names the file", () => {
    const dir = badDirs.at(-1)!.dir;
    writeFileSync(join(dir, "processor_config.json"), "{ not json");
    expect(() => loadProcessorConfig(dir)).toThrow(/processor_config\.json: \(file\): not valid JSON/);
  });
});
