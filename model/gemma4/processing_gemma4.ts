// mlx_vlm/models/gemma4/processing_gemma4.py (mlx-vlm 0.7.10): `Gemma4ImageProcessor` (the
// aspect-preserving resize, rescale, normalize, channels-first), the configuration that
// `Gemma4Processor.from_pretrained` reads from the checkpoint, and the prompt side of
// `Gemma4Processor.__call__` (how many soft tokens each image and audio clip gets, and the
// placeholder expansion with its boundary tokens), as data the faces use.
//
// Numerics follow numpy 2 exactly: the resize is Pillow's 8-bit BICUBIC (model/media), the
// rescale is a float32 multiply by float32(rescale_factor) (NEP 50: the Python float is weak),
// normalize is float32 `(x - mean) / std`. The result is what mlx-vlm stacks into
// `pixel_values`: float32 [N, 3, H', W'] (uint8 when neither rescale nor normalize is on).
// Patchify happens in the model (vision tower), not here.

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { HostArray } from "../media/host.ts";
import { type LoadImageOptions, loadImage, type RgbImage } from "../media/image.ts";
import { resizeBicubic } from "../media/pil_resample.ts";
import { loadAudio } from "../media/wav.ts";
import { featureExtractorConfig, Gemma4AudioFeatureExtractor } from "./audio_feature_extractor.ts";
import { ConfigError } from "./config.ts";

// ---------------------------------------------------------------- configuration

/** `Gemma4ImageProcessor.__init__` fields that change the output (defaults = mlx-vlm's). */
export interface ImageProcessorConfig {
  do_resize: boolean;
  do_rescale: boolean;
  rescale_factor: number;
  do_normalize: boolean;
  image_mean: number[];
  image_std: number[];
  patch_size: number;
  max_soft_tokens: number;
  pooling_kernel_size: number;
}

export const IMAGE_PROCESSOR_DEFAULTS: Readonly<ImageProcessorConfig> = Object.freeze({
  do_resize: true,
  do_rescale: true,
  rescale_factor: 1 / 255,
  do_normalize: false,
  image_mean: [0.5, 0.5, 0.5],
  image_std: [0.5, 0.5, 0.5],
  patch_size: 16,
  max_soft_tokens: 280,
  pooling_kernel_size: 3,
});

/** The checkpoint's processor settings, as `Gemma4Processor.from_pretrained` reads them. */
export interface ProcessorConfig {
  /** processor_config.json or preprocessor_config.json, whichever was read (undefined: none). */
  file: string | undefined;
  image_processor: ImageProcessorConfig;
  /** The "feature_extractor" block (minus its type), for `Gemma4AudioFeatureExtractor`. */
  feature_extractor: Record<string, unknown>;
  /** Fallback soft-token count per image (`max_soft_tokens` of the image processor block). */
  image_seq_length: number;
  audio_seq_length: number;
  audio_ms_per_token: number;
}

type Dict = Record<string, unknown>;

function isDict(v: unknown): v is Dict {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** A JSON file holding an object; anything else is a ConfigError naming the file. */
function readJsonObject(p: string): Dict {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(p, "utf8"));
  } catch (e) {
    throw new ConfigError(p, "(file)", `not valid JSON: ${(e as Error).message}`);
  }
  if (!isDict(parsed)) throw new ConfigError(p, "(file)", "must hold a JSON object");
  return parsed;
}

/** Python truthiness of a JSON flag (bool or number). */
function flag(d: Dict, key: string, dflt: boolean, file: string, where: string): boolean {
  const v = d[key];
  if (v === undefined || v === null) return v === null ? false : dflt;
  if (typeof v === "boolean") return v;
  if (typeof v === "number") return v !== 0;
  throw new ConfigError(file, `${where}${key}`, `must be true or false, got ${JSON.stringify(v)}`);
}

function positiveInt(d: Dict, key: string, dflt: number, file: string, where: string): number {
  const v = d[key] === undefined ? dflt : d[key];
  if (typeof v !== "number" || !Number.isInteger(v) || v < 1)
    throw new ConfigError(file, `${where}${key}`, `must be a positive integer, got ${JSON.stringify(v)}`);
  return v;
}

function finite(d: Dict, key: string, dflt: number, file: string, where: string): number {
  const v = d[key] === undefined ? dflt : d[key];
  if (typeof v !== "number" || !Number.isFinite(v)) throw new ConfigError(file, `${where}${key}`, `must be a number, got ${JSON.stringify(v)}`);
  return v;
}

/** `image_mean or [0.5]*3`: an empty or missing list takes the default; numpy broadcasts 1 or 3. */
function channelList(d: Dict, key: string, file: string, where: string): number[] {
  const v = d[key];
  if (v === undefined || v === null || (Array.isArray(v) && v.length === 0)) return [0.5, 0.5, 0.5];
  if (!Array.isArray(v) || (v.length !== 1 && v.length !== 3) || !v.every((x) => typeof x === "number" && Number.isFinite(x)))
    throw new ConfigError(file, `${where}${key}`, `must be a list of 1 or 3 numbers, got ${JSON.stringify(v)}`);
  return v.length === 1 ? [v[0], v[0], v[0]] : [...v];
}

/** `Gemma4ImageProcessor(**d)`: unknown keys are accepted and ignored, as in Python. */
export function imageProcessorConfig(d: Dict, file = "<image processor>", where = ""): ImageProcessorConfig {
  const D = IMAGE_PROCESSOR_DEFAULTS;
  return {
    do_resize: flag(d, "do_resize", D.do_resize, file, where),
    do_rescale: flag(d, "do_rescale", D.do_rescale, file, where),
    rescale_factor: finite(d, "rescale_factor", D.rescale_factor, file, where),
    do_normalize: flag(d, "do_normalize", D.do_normalize, file, where),
    image_mean: channelList(d, "image_mean", file, where),
    image_std: channelList(d, "image_std", file, where),
    patch_size: positiveInt(d, "patch_size", D.patch_size, file, where),
    max_soft_tokens: positiveInt(d, "max_soft_tokens", D.max_soft_tokens, file, where),
    pooling_kernel_size: positiveInt(d, "pooling_kernel_size", D.pooling_kernel_size, file, where),
  };
}

/** Keys taken from a flat (preprocessor_config.json-style) file. */
const FLAT_IMAGE_KEYS = [
  "patch_size",
  "max_soft_tokens",
  "pooling_kernel_size",
  "do_resize",
  "do_rescale",
  "do_normalize",
  "rescale_factor",
  "image_mean",
  "image_std",
  "size",
];

/**
 * The configuration part of `Gemma4Processor.from_pretrained(dir)`: processor_config.json,
 * else preprocessor_config.json, else nothing (all defaults). The image processor settings come
 * from its "image_processor" block, or from the top level of a flat file that has no
 * "image_processor_type" but one of patch_size/max_soft_tokens/pooling_kernel_size; the audio
 * feature extractor's from a "feature_extractor" block (defaults otherwise).
 */
export function loadProcessorConfig(dir: string): ProcessorConfig {
  let file: string | undefined;
  let cfg: Dict = {};
  for (const name of ["processor_config.json", "preprocessor_config.json"]) {
    const p = join(dir, name);
    if (!existsSync(p)) continue;
    file = p;
    cfg = readJsonObject(p);
    break;
  }
  const f = file ?? join(dir, "processor_config.json");
  let ip: Dict = {};
  let where = "";
  if (isDict(cfg.image_processor)) {
    ip = { ...cfg.image_processor };
    delete ip.image_processor_type;
    where = "image_processor.";
  } else if (!("image_processor_type" in cfg) && ["patch_size", "max_soft_tokens", "pooling_kernel_size"].some((k) => k in cfg)) {
    for (const k of FLAT_IMAGE_KEYS) if (k in cfg) ip[k] = cfg[k];
  }
  let fe: Dict = {};
  if (isDict(cfg.feature_extractor)) {
    fe = { ...cfg.feature_extractor };
    delete fe.feature_extractor_type;
  }
  return {
    file,
    image_processor: imageProcessorConfig(ip, f, where),
    feature_extractor: fe,
    image_seq_length: positiveInt(ip, "max_soft_tokens", 280, f, where),
    audio_seq_length: positiveInt(cfg, "audio_seq_length", 750, f, ""),
    audio_ms_per_token: finite(cfg, "audio_ms_per_token", 40, f, ""),
  };
}

// ---------------------------------------------------------------- image processor

/** `get_aspect_ratio_preserving_size`, in Python's double precision (same in JS). */
export function getAspectRatioPreservingSize(
  height: number,
  width: number,
  patchSize: number,
  maxPatches: number,
  poolingKernelSize: number,
): [number, number] {
  const targetPx = maxPatches * patchSize ** 2;
  const factor = Math.sqrt(targetPx / (height * width));
  const sideMult = poolingKernelSize * patchSize;
  let th = Math.floor((factor * height) / sideMult) * sideMult;
  let tw = Math.floor((factor * width) / sideMult) * sideMult;
  if (th === 0 && tw === 0) throw new ConfigError("<image processor>", "max_soft_tokens", "attempting to resize to a 0 x 0 image");
  const maxSideLength = Math.floor(maxPatches / poolingKernelSize ** 2) * sideMult;
  if (th === 0) {
    th = sideMult;
    tw = Math.min(Math.floor(width / height) * sideMult, maxSideLength);
  } else if (tw === 0) {
    tw = sideMult;
    th = Math.min(Math.floor(height / width) * sideMult, maxSideLength);
  }
  return [th, tw];
}

/** The per-call overrides `Gemma4ImageProcessor.preprocess` accepts. */
export interface ImageKwargs {
  max_soft_tokens?: number;
  patch_size?: number;
  pooling_kernel_size?: number;
}

export interface ImageProcessorOutput {
  /** One array [N, 3, H, W] when every image has the same shape, else one [3, H, W] per image. */
  pixel_values: HostArray | HostArray[];
  num_soft_tokens_per_image: number[];
}

export class Gemma4ImageProcessor {
  readonly config: ImageProcessorConfig;

  constructor(config: Partial<ImageProcessorConfig> = {}) {
    this.config = { ...IMAGE_PROCESSOR_DEFAULTS, ...config };
  }

  private sizes(kw: ImageKwargs): { patch: number; pool: number; maxPatches: number } {
    const patch = kw.patch_size ?? this.config.patch_size;
    const pool = kw.pooling_kernel_size ?? this.config.pooling_kernel_size;
    return { patch, pool, maxPatches: (kw.max_soft_tokens ?? this.config.max_soft_tokens) * pool ** 2 };
  }

  /** The (height, width) an image of this size is resized to (the input size when it is kept). */
  targetSize(height: number, width: number, kw: ImageKwargs = {}): [number, number] {
    if (!this.config.do_resize) return [height, width];
    const { patch, pool, maxPatches } = this.sizes(kw);
    return getAspectRatioPreservingSize(height, width, patch, maxPatches, pool);
  }

  /** Soft tokens an image of this size produces: (H'/patch)(W'/patch) / pool². */
  numSoftTokens(height: number, width: number, kw: ImageKwargs = {}): number {
    const [h, w] = this.targetSize(height, width, kw);
    const { patch, pool } = this.sizes(kw);
    return Math.floor((Math.floor(h / patch) * Math.floor(w / patch)) / pool ** 2);
  }

  /** One image: resize (unless the size is already right), rescale, normalize, CHW. */
  processOne(image: RgbImage, kw: ImageKwargs = {}): { pixel_values: HostArray; num_soft_tokens: number } {
    const c = this.config;
    const [h, w] = this.targetSize(image.height, image.width, kw);
    const pixels =
      h === image.height && w === image.width ? image.data : resizeBicubic(image.data, image.width, image.height, w, h);
    const n = h * w;
    const shape = [3, h, w];
    let pixel_values: HostArray;
    if (!c.do_rescale && !c.do_normalize) {
      const out = new Uint8Array(3 * n);
      for (let i = 0; i < n; i++) for (let ch = 0; ch < 3; ch++) out[ch * n + i] = pixels[3 * i + ch]!;
      pixel_values = { dtype: "uint8", shape, data: out };
    } else {
      const scale = Math.fround(c.rescale_factor);
      const mean = c.image_mean.map(Math.fround);
      const std = c.image_std.map(Math.fround);
      const out = new Float32Array(3 * n);
      for (let ch = 0; ch < 3; ch++) {
        const m = mean[ch]!;
        const s = std[ch]!;
        for (let i = 0; i < n; i++) {
          // Each float32 op is one double op rounded once: exact for + - * / on float32 inputs.
          let v = c.do_rescale ? Math.fround(pixels[3 * i + ch]! * scale) : pixels[3 * i + ch]!;
          if (c.do_normalize) v = Math.fround(Math.fround(v - m) / s);
          out[ch * n + i] = v;
        }
      }
      pixel_values = { dtype: "float32", shape, data: out };
    }
    return { pixel_values, num_soft_tokens: this.numSoftTokens(image.height, image.width, kw) };
  }

  /** `Gemma4ImageProcessor.preprocess(images, **kwargs)`: stacked when all shapes agree. */
  preprocess(images: RgbImage[], kw: ImageKwargs = {}): ImageProcessorOutput {
    const each = images.map((im) => this.processOne(im, kw));
    const num_soft_tokens_per_image = each.map((e) => e.num_soft_tokens);
    const arrays = each.map((e) => e.pixel_values);
    const first = arrays[0];
    const same = first !== undefined && arrays.every((a) => a.dtype === first.dtype && a.shape.join() === first.shape.join());
    if (!same) return { pixel_values: arrays, num_soft_tokens_per_image };
    return { pixel_values: stack(arrays), num_soft_tokens_per_image };
  }
}

/** np.stack of same-dtype, same-shape arrays along a new axis 0. */
export function stack(arrays: HostArray[]): HostArray {
  const first = arrays[0]!;
  const per = first.data.length;
  const shape = [arrays.length, ...first.shape];
  if (first.dtype === "float32") {
    const out = new Float32Array(per * arrays.length);
    arrays.forEach((a, i) => out.set(a.data as Float32Array, i * per));
    return { dtype: "float32", shape, data: out };
  }
  if (first.dtype === "int64") {
    const out = new BigInt64Array(per * arrays.length);
    arrays.forEach((a, i) => out.set(a.data as BigInt64Array, i * per));
    return { dtype: "int64", shape, data: out };
  }
  const out = new Uint8Array(per * arrays.length);
  arrays.forEach((a, i) => out.set(a.data as Uint8Array, i * per));
  return { dtype: first.dtype, shape, data: out };
}

// ---------------------------------------------------------------- prompt side of Gemma4Processor

/** The placeholder and boundary token strings the processor reads from the tokenizer. */
export interface MediaTokens {
  image_token: string;
  boi_token: string;
  eoi_token: string;
  audio_token: string;
  boa_token: string;
  eoa_token: string;
  video_token: string;
}

/** What mlx-vlm's `getattr(tokenizer, name, default)` gives when the tokenizer lacks one:
 * "" (no boundary token at all), except the video token. */
const MISSING_TOKENS: MediaTokens = {
  image_token: "",
  boi_token: "",
  eoi_token: "",
  audio_token: "",
  boa_token: "",
  eoa_token: "",
  video_token: "<|video|>",
};

/** The token strings of a Gemma 4 tokenizer (Hugging Face's release uses these). */
export const GEMMA4_MEDIA_TOKENS: Readonly<MediaTokens> = Object.freeze({
  image_token: "<|image|>",
  boi_token: "<|image>",
  eoi_token: "<image|>",
  audio_token: "<|audio|>",
  boa_token: "<|audio>",
  eoa_token: "<audio|>",
  video_token: "<|video|>",
});

function tokenString(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (isDict(v) && typeof v.content === "string") return v.content;
  return undefined;
}

/**
 * The media token strings of a checkpoint's tokenizer_config.json, resolved as transformers 5
 * does: `extra_special_tokens` (a dict), overridden by top-level `*_token` keys, overridden by
 * `model_specific_special_tokens`. A token that none names is missing ("" except the video one).
 */
export function mediaTokensFromTokenizerConfig(dir: string): MediaTokens {
  const p = join(dir, "tokenizer_config.json");
  if (!existsSync(p)) return { ...MISSING_TOKENS };
  const cfg = readJsonObject(p);
  const out: MediaTokens = { ...MISSING_TOKENS };
  const layers = [isDict(cfg.extra_special_tokens) ? cfg.extra_special_tokens : {}, cfg, isDict(cfg.model_specific_special_tokens) ? cfg.model_specific_special_tokens : {}];
  for (const layer of layers)
    for (const k of Object.keys(out) as (keyof MediaTokens)[]) {
      const s = tokenString(layer[k]);
      if (s !== undefined) out[k] = s;
    }
  return out;
}

/** `Gemma4Processor._compute_audio_num_tokens`: ceil(duration in ms / ms per token), capped.
 * It counts the waveform as loaded (before the extractor's 30 s truncation and padding). */
export function computeAudioNumTokens(
  numSamples: number,
  samplingRate: number,
  audioMsPerToken = 40,
  audioSeqLength = 750,
): number {
  const durationMs = (numSamples / samplingRate) * 1000.0;
  return Math.min(Math.ceil(durationMs / audioMsPerToken), audioSeqLength);
}

/** The soft-token counts of the media of one prompt. */
export interface MediaCounts {
  /** Per image, in order (`num_soft_tokens_per_image`). */
  images?: number[];
  /** Per audio clip, in order (`computeAudioNumTokens`). */
  audio?: number[];
}

function countOf(text: string, token: string): number {
  return token === "" ? 0 : text.split(token).length - 1;
}

/**
 * The text expansion of `Gemma4Processor.__call__`: each image placeholder becomes
 * boi + image_token × n + eoi and each audio placeholder boa + audio_token × n + eoa, in order
 * (re.sub, left to right). Stricter than Python: the number of placeholders must equal the
 * number of images (audio clips); mlx-vlm raises on too many placeholders and silently
 * mis-scatters features on too few. Audio is expanded only when the tokenizer has an audio
 * token, as in Python.
 */
export function expandPrompt(text: string, tokens: MediaTokens, counts: MediaCounts): string {
  const images = counts.images ?? [];
  const audio = counts.audio ?? [];
  if (images.length > 0) {
    if (tokens.image_token === "") throw new ConfigError("tokenizer_config.json", "image_token", "the tokenizer names no image token, so images cannot be placed");
    const found = countOf(text, tokens.image_token);
    if (found !== images.length)
      throw new ConfigError("<prompt>", tokens.image_token, `the prompt has ${found} image placeholder(s) for ${images.length} image(s)`);
    const parts = text.split(tokens.image_token);
    text = parts.map((p, i) => (i === 0 ? p : `${tokens.boi_token}${tokens.image_token.repeat(images[i - 1]!)}${tokens.eoi_token}${p}`)).join("");
  }
  if (audio.length > 0 && tokens.audio_token !== "") {
    const found = countOf(text, tokens.audio_token);
    if (found !== audio.length)
      throw new ConfigError("<prompt>", tokens.audio_token, `the prompt has ${found} audio placeholder(s) for ${audio.length} clip(s)`);
    const parts = text.split(tokens.audio_token);
    text = parts.map((p, i) => (i === 0 ? p : `${tokens.boa_token}${tokens.audio_token.repeat(audio[i - 1]!)}${tokens.eoa_token}${p}`)).join("");
  }
  return text;
}

/** Token ids of the placeholders (`tokenizer.convert_tokens_to_ids` of the strings above). */
export interface MediaTokenIds {
  image_token_id?: number;
  video_token_id?: number;
  audio_token_id?: number;
}

/**
 * The text inputs mlx-vlm hands the model for one prompt of token ids (batch 1, no padding):
 * input_ids, attention_mask (all ones) and mm_token_type_ids (1 image, 2 video, 3 audio,
 * 0 text), int64 [1, L] as the processor's `to_mlx` makes them.
 */
export function textInputs(ids: number[], t: MediaTokenIds): { input_ids: HostArray; attention_mask: HostArray; mm_token_type_ids: HostArray } {
  const L = ids.length;
  const types = new BigInt64Array(L);
  ids.forEach((id, i) => {
    if (id === t.image_token_id) types[i] = 1n;
    if (id === t.video_token_id) types[i] = 2n;
    if (id === t.audio_token_id) types[i] = 3n;
  });
  return {
    input_ids: { dtype: "int64", shape: [1, L], data: BigInt64Array.from(ids, BigInt) },
    attention_mask: { dtype: "int64", shape: [1, L], data: new BigInt64Array(L).fill(1n) },
    mm_token_type_ids: { dtype: "int64", shape: [1, L], data: types },
  };
}

// ---------------------------------------------------------------- Gemma4Processor

/** The model inputs `mlx_vlm.utils.prepare_inputs` builds for one prompt (batch 1). */
export interface ProcessorInputs {
  input_ids: HostArray;
  attention_mask: HostArray;
  mm_token_type_ids: HostArray;
  /** float32 [N, 3, H, W] (a list when the images' shapes differ). */
  pixel_values?: HostArray | HostArray[];
  /** float32 [B, T, 128] and bool [B, T]. */
  input_features?: HostArray;
  input_features_mask?: HostArray;
  /** Soft tokens per image and per audio clip, as placed in the prompt. */
  num_soft_tokens_per_image: number[];
  num_audio_tokens: number[];
}

export interface ProcessorCall {
  /** The prompt with one placeholder (tokens.image_token / audio_token) per image / clip. */
  text: string;
  images?: string[];
  audio?: string[];
  /** The checkpoint tokenizer, without special tokens added (prepare_inputs' add_special_tokens=False). */
  tokenize: (text: string) => number[];
  /** Token id of a token string (for the mm_token_type_ids), undefined when unknown. */
  tokenId: (token: string) => number | undefined;
  image?: LoadImageOptions & ImageKwargs;
}

/**
 * `Gemma4Processor` as `mlx_vlm.load` builds it from a checkpoint directory, minus the
 * tokenizer (the caller's): the image processor, the audio feature extractor, the media token
 * strings and the counts that tie them to the prompt.
 */
export class Gemma4Processor {
  constructor(
    readonly config: ProcessorConfig,
    readonly tokens: MediaTokens,
    readonly image_processor: Gemma4ImageProcessor,
    readonly feature_extractor: Gemma4AudioFeatureExtractor,
  ) {}

  /** `Gemma4Processor.from_pretrained(dir)` (configs read as mlx-vlm reads them). */
  static fromPretrained(dir: string): Gemma4Processor {
    const config = loadProcessorConfig(dir);
    const file = config.file ?? join(dir, "processor_config.json");
    return new Gemma4Processor(
      config,
      mediaTokensFromTokenizerConfig(dir),
      new Gemma4ImageProcessor(config.image_processor),
      new Gemma4AudioFeatureExtractor(featureExtractorConfig(config.feature_extractor, file)),
    );
  }

  /** `load_image` + the image processor for image files. */
  async processImages(paths: string[], opts: LoadImageOptions & ImageKwargs = {}): Promise<ImageProcessorOutput> {
    const images: RgbImage[] = [];
    for (const p of paths) images.push(await loadImage(p, opts));
    return this.image_processor.preprocess(images, opts);
  }

  /** `load_audio` + the feature extractor for WAV files: stacked [B, T, 128] features. */
  processAudio(paths: string[]): { input_features: HostArray; input_features_mask: HostArray; num_audio_tokens: number[] } {
    const sr = this.feature_extractor.samplingRate;
    const waves = paths.map((p) => loadAudio(p, sr).samples);
    const f = this.feature_extractor.call(waves);
    return {
      input_features: stack(f.input_features),
      input_features_mask: stack(f.input_features_mask),
      num_audio_tokens: waves.map((w) => computeAudioNumTokens(w.length, sr, this.config.audio_ms_per_token, this.config.audio_seq_length)),
    };
  }

  /** `prepare_inputs(processor, images, audio, prompts=text)`: every model input. */
  async call(c: ProcessorCall): Promise<ProcessorInputs> {
    const img = c.images?.length ? await this.processImages(c.images, c.image) : undefined;
    const aud = c.audio?.length ? this.processAudio(c.audio) : undefined;
    const counts = { images: img?.num_soft_tokens_per_image ?? [], audio: aud?.num_audio_tokens ?? [] };
    const ids = c.tokenize(expandPrompt(c.text, this.tokens, counts));
    const t = this.tokens;
    const text = textInputs(ids, {
      image_token_id: t.image_token ? c.tokenId(t.image_token) : undefined,
      video_token_id: c.tokenId(t.video_token),
      audio_token_id: t.audio_token ? c.tokenId(t.audio_token) : undefined,
    });
    return {
      ...text,
      ...(img ? { pixel_values: img.pixel_values } : {}),
      ...(aud ? { input_features: aud.input_features, input_features_mask: aud.input_features_mask } : {}),
      num_soft_tokens_per_image: counts.images,
      num_audio_tokens: counts.audio,
    };
  }
}
