// mlx_vlm/models/gemma4_unified/processing_gemma4_unified.py (mlx-vlm 0.7.10), the image and audio
// parts: _convert_image_to_model_patches, _pad_patches, Gemma4UnifiedImageProcessor.preprocess (on
// gemma4's resize / rescale / normalize, ../gemma4/processing_gemma4.ts), the audio feature
// extractor (raw waveform frames), Gemma4UnifiedVideoProcessor (on gemma4's video processor:
// _sample_frames, _resize_frames, rescale, normalize, then this file's model patches per frame),
// and the configuration part of Gemma4UnifiedProcessor.from_pretrained. The prompt expansion is
// gemma4's (expandPrompt / expandVideoPrompt there, with these counts: a video frame gets as many
// video tokens as it has model patches).

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { ConfigError } from "../gemma4/config.ts";
import { Gemma4ImageProcessor, type ImageKwargs, type ImageProcessorConfig, imageProcessorConfig } from "../gemma4/processing_gemma4.ts";
import { Gemma4VideoProcessor, type VideoFrames, type VideoProcessorConfig } from "../gemma4/processing_gemma4_video.ts";
import type { HostArray } from "../media/host.ts";
import type { RgbImage } from "../media/image.ts";
import { MediaError } from "../media/errors.ts";
import { resizeBicubic } from "../media/pil_resample.ts";
import { linspace, roundHalfEven } from "../media/video.ts";
import { unifiedMutated } from "./mutations.ts";

/**
 * _convert_image_to_model_patches(image (C, H, W) float32, p): the (pH*pW, p*p*C) patches in
 * (row, col, channel) order within a patch, patches row-major; positions [x = col, y = row] (int64).
 */
export function _convert_image_to_model_patches(image: Float32Array, shape: readonly [number, number, number], p: number): { patches: Float32Array; positions: BigInt64Array; n: number } {
  const [C, H, W] = shape;
  if (H % p !== 0 || W % p !== 0) {
    // numpy's reshape(C, H // p, p, W // p, p) raises there (mlx-vlm: a ValueError from preprocess)
    throw new ConfigError("<image processor>", "model_patch_size", `the ${H}x${W} image is not a whole number of ${p}x${p} model patches (${p} must divide the resized height and width)`);
  }
  const pH = Math.floor(H / p);
  const pW = Math.floor(W / p);
  const n = pH * pW;
  const dim = p * p * C;
  const patches = new Float32Array(n * dim);
  const positions = new BigInt64Array(n * 2);
  for (let py = 0; py < pH; py++) {
    for (let px = 0; px < pW; px++) {
      const k = py * pW + px;
      let o = k * dim;
      // reshape(C, pH, p, pW, p).transpose(1, 3, 2, 4, 0): (row in patch, col in patch, channel)
      for (let r = 0; r < p; r++) {
        for (let c = 0; c < p; c++) {
          const y = py * p + r;
          const x = px * p + c;
          for (let ch = 0; ch < C; ch++) patches[o++] = image[(ch * H + y) * W + x]!;
        }
      }
      positions[2 * k] = BigInt(px);
      positions[2 * k + 1] = BigInt(py);
    }
  }
  return { patches, positions, n };
}

/** _pad_patches: truncated to `target` rows, or padded with zero patches at position -1. */
export function _pad_patches(patches: Float32Array, positions: BigInt64Array, n: number, dim: number, target: number): { patches: Float32Array; positions: BigInt64Array } {
  if (n >= target) return { patches: patches.slice(0, target * dim), positions: positions.slice(0, target * 2) };
  const P = new Float32Array(target * dim);
  P.set(patches);
  const Q = new BigInt64Array(target * 2).fill(-1n);
  Q.set(positions);
  return { patches: P, positions: Q };
}

/** Gemma4UnifiedImageProcessor's settings: gemma4's, plus the unified model's patch geometry. */
export interface UnifiedImageProcessorConfig extends ImageProcessorConfig {
  /** The attribute (patch_size * pooling_kernel_size unless given); preprocess itself ignores it. */
  model_patch_size: number;
  mm_posemb_size: number | null;
}

/** `Gemma4UnifiedImageProcessor(**d)`: num_soft_tokens stands for max_soft_tokens when that is absent. */
export function unifiedImageProcessorConfig(d: Record<string, unknown>, file = "<image processor>", where = ""): UnifiedImageProcessorConfig {
  const given = { ...d };
  if (given.num_soft_tokens !== undefined && given.num_soft_tokens !== null && !("max_soft_tokens" in given)) given.max_soft_tokens = given.num_soft_tokens;
  const base = imageProcessorConfig(given, file, where);
  const mps = given.model_patch_size;
  if (mps !== undefined && mps !== null && !(typeof mps === "number" && Number.isInteger(mps) && mps > 0)) {
    throw new ConfigError(file, `${where}model_patch_size`, `must be a positive integer, got ${JSON.stringify(mps)}`);
  }
  const posemb = given.mm_posemb_size;
  return {
    ...base,
    // `model_patch_size or (patch_size * pooling_kernel_size)`
    model_patch_size: (mps as number | undefined | null) || base.patch_size * base.pooling_kernel_size,
    mm_posemb_size: typeof posemb === "number" ? posemb : null,
  };
}

export interface UnifiedImageKwargs extends ImageKwargs {
  model_patch_size?: number;
}

export interface UnifiedImageProcessorOutput {
  /** (B, max_soft_tokens, p*p*3) float32. */
  pixel_values: HostArray;
  /** (B, max_soft_tokens, 2) int64, -1 at padding. */
  image_position_ids: HostArray;
  num_soft_tokens_per_image: number[];
}

export class Gemma4UnifiedImageProcessor {
  readonly config: UnifiedImageProcessorConfig;
  private readonly base: Gemma4ImageProcessor;

  constructor(config: Partial<UnifiedImageProcessorConfig> & Record<string, unknown> = {}) {
    this.config = unifiedImageProcessorConfig(config);
    this.base = new Gemma4ImageProcessor(this.config);
  }

  /**
   * preprocess(images, **kwargs): per image gemma4's resize, rescale and normalize (float32, channel
   * first), model patches of kwargs' model_patch_size (default patch_size * pooling_kernel_size,
   * not the attribute), padded to max_soft_tokens; num_soft_tokens_per_image counts the patches
   * before padding or truncation.
   */
  preprocess(images: readonly RgbImage[], kw: UnifiedImageKwargs = {}): UnifiedImageProcessorOutput {
    const c = this.config;
    const patch = kw.patch_size ?? c.patch_size;
    const pool = kw.pooling_kernel_size ?? c.pooling_kernel_size;
    const maxSoft = kw.max_soft_tokens ?? c.max_soft_tokens;
    const mps = kw.model_patch_size ?? patch * pool;
    const dim = mps * mps * 3;
    const pv = new Float32Array(images.length * maxSoft * dim);
    const pos = new BigInt64Array(images.length * maxSoft * 2);
    const counts: number[] = [];
    images.forEach((im, b) => {
      const one = this.base.processOne(im, { max_soft_tokens: maxSoft, patch_size: patch, pooling_kernel_size: pool });
      const a = one.pixel_values;
      const [C, H, W] = a.shape as [number, number, number];
      // no rescale and no normalize leave uint8 pixels: the patches are cast to float32
      const f = a.dtype === "float32" ? a.data : Float32Array.from(a.data as Uint8Array);
      const { patches, positions, n } = _convert_image_to_model_patches(f, [C, H, W], mps);
      counts.push(n);
      const padded = _pad_patches(patches, positions, n, dim, maxSoft);
      pv.set(padded.patches, b * maxSoft * dim);
      pos.set(padded.positions, b * maxSoft * 2);
    });
    return {
      pixel_values: { dtype: "float32", shape: [images.length, maxSoft, dim], data: pv },
      image_position_ids: { dtype: "int64", shape: [images.length, maxSoft, 2], data: pos },
      num_soft_tokens_per_image: counts,
    };
  }
}

/** Gemma4UnifiedVideoProcessor's settings: gemma4's video processor's, plus the model patch side. */
export interface UnifiedVideoProcessorConfig extends VideoProcessorConfig {
  /** The attribute (patch_size * pooling_kernel_size unless given): __call__ cuts frames into patches of this side. */
  model_patch_size: number;
  mm_posemb_size: number | null;
}

/** The fields Gemma4VideoProcessor.__init__ takes (the rest of the kwargs it ignores). */
const VIDEO_KEYS = ["patch_size", "max_soft_tokens", "pooling_kernel_size", "num_frames", "do_resize", "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std", "default_fps"] as const;

/**
 * `Gemma4UnifiedVideoProcessor(**d)`: num_soft_tokens stands for max_soft_tokens when that is
 * absent; do_resize defaults to True; image_mean / image_std `None` (or empty) give gemma4's
 * defaults (`image_mean or [0, 0, 0]`); model_patch_size `or` patch_size * pooling_kernel_size.
 */
export function unifiedVideoProcessorConfig(d: Record<string, unknown>, file = "<video processor>", where = ""): UnifiedVideoProcessorConfig {
  const given: Record<string, unknown> = { ...d };
  if (given.num_soft_tokens !== undefined && given.num_soft_tokens !== null && !("max_soft_tokens" in given)) given.max_soft_tokens = given.num_soft_tokens;
  const base: Partial<VideoProcessorConfig> = {};
  for (const k of VIDEO_KEYS) {
    const v = given[k];
    if (v === undefined) continue;
    if (k === "image_mean" || k === "image_std") {
      if (v === null || (Array.isArray(v) && v.length === 0)) continue; // `or` the default
      // normalize broadcasts a scalar or a 1-list over the 3 channels
      const xs = typeof v === "number" ? [v, v, v] : Array.isArray(v) && v.length === 1 ? [v[0], v[0], v[0]] : v;
      if (!Array.isArray(xs) || xs.length !== 3 || !xs.every((x) => typeof x === "number")) throw new ConfigError(file, `${where}${k}`, `expected 3 numbers, got ${JSON.stringify(v)}`);
      base[k] = xs as number[];
      continue;
    }
    const bool = k === "do_resize" || k === "do_rescale" || k === "do_normalize";
    if (bool ? typeof v !== "boolean" : typeof v !== "number" || !Number.isFinite(v)) throw new ConfigError(file, `${where}${k}`, `expected a ${bool ? "boolean" : "number"}, got ${JSON.stringify(v)}`);
    (base as Record<string, unknown>)[k] = v;
  }
  for (const k of ["patch_size", "pooling_kernel_size", "num_frames"] as const) {
    const v = base[k];
    if (v !== undefined && !(Number.isInteger(v) && v > 0)) throw new ConfigError(file, `${where}${k}`, `must be a positive integer, got ${v}`);
  }
  const vp = new Gemma4VideoProcessor(base); // max_soft_tokens must be one of gemma4's supported counts
  const mps = given.model_patch_size;
  if (mps !== undefined && mps !== null && !(typeof mps === "number" && Number.isInteger(mps) && mps >= 0)) {
    throw new ConfigError(file, `${where}model_patch_size`, `must be a positive integer, got ${JSON.stringify(mps)}`);
  }
  const posemb = given.mm_posemb_size;
  return { ...vp.config, model_patch_size: (mps as number | undefined | null) || vp.config.patch_size * vp.config.pooling_kernel_size, mm_posemb_size: typeof posemb === "number" ? posemb : null };
}

export interface UnifiedVideoProcessorOutput {
  /** (sum of frames, max_soft_tokens, p*p*3) float32: every video's frames, concatenated. */
  pixel_values_videos: HostArray & { dtype: "float32" };
  /** (sum of frames, max_soft_tokens, 2) int64 [x, y], -1 at padding. */
  video_position_ids: HostArray & { dtype: "int64" };
  num_frames_per_video: number[];
  /** Per video: the model patches of its first frame (each frame gets as many video tokens). */
  num_soft_tokens_per_frame: number[];
  frame_timestamps: number[][];
}

export class Gemma4UnifiedVideoProcessor {
  readonly config: UnifiedVideoProcessorConfig;
  private readonly base: Gemma4VideoProcessor;

  constructor(config: Record<string, unknown> = {}) {
    this.config = unifiedVideoProcessorConfig(config);
    const { model_patch_size: _m, mm_posemb_size: _p, ...rest } = this.config;
    this.base = new Gemma4VideoProcessor(rest);
  }

  /** video_sampling_defaults: the decoder reads at most the frames this processor keeps. */
  video_sampling_defaults(): { max_frames: number } {
    return { max_frames: this.config.num_frames };
  }

  /** _sample_frames: T <= num_frames keeps every frame, else np.linspace(0, T - 1, num_frames).round() of them. */
  _sample_frames<F>(frames: readonly F[], num_frames: number): F[] {
    if (frames.length <= num_frames) return [...frames];
    return linspace(frames.length - 1, num_frames).map((x) => frames[roundHalfEven(x)]!);
  }

  /**
   * __call__(videos, fps): per video, its frames sampled to num_frames, resized as gemma4's
   * _resize_frames does (Pillow BICUBIC to multiples of patch_size * pooling_kernel_size), cast to
   * float32, rescaled and normalized, cut into model patches of `model_patch_size` with their
   * [x, y] positions and padded to max_soft_tokens rows; all frames concatenated. `fps` is one
   * rate for every video or one per video (the timestamps j / fps; unset or <= 0: default_fps).
   */
  call(videos: readonly VideoFrames[], fps: number | readonly (number | null)[] | null = null, files: readonly string[] = []): UnifiedVideoProcessorOutput {
    const c = this.config;
    const rates = fps === null ? videos.map(() => c.default_fps) : typeof fps === "number" ? videos.map(() => fps) : fps;
    if (rates.length < videos.length) throw new RangeError(`${rates.length} fps values for ${videos.length} videos (mlx-vlm: IndexError)`);
    const p = c.model_patch_size;
    const dim = p * p * 3;
    const maxSoft = c.max_soft_tokens;
    const rf = Math.fround(c.rescale_factor);
    const mean = c.image_mean.map(Math.fround);
    const std = c.image_std.map(Math.fround);
    const pvs: Float32Array[] = [];
    const poss: BigInt64Array[] = [];
    const out: Omit<UnifiedVideoProcessorOutput, "pixel_values_videos" | "video_position_ids"> = { num_frames_per_video: [], num_soft_tokens_per_frame: [], frame_timestamps: [] };
    videos.forEach((video, i) => {
      const file = files[i] ?? "video";
      if (video.frames.length === 0) throw new MediaError(file, "empty", "the video has no frames");
      let frames = this._sample_frames(video.frames, c.num_frames);
      let [H, W] = [video.height, video.width];
      if (c.do_resize) {
        const [th, tw] = this.base.targetSize(H, W);
        if (th !== H || tw !== W) {
          frames = frames.map((f) => resizeBicubic(f, W, H, tw, th));
          [H, W] = [th, tw];
        }
      }
      let tokensPerFrame: number | null = null;
      for (const f of frames) {
        // video_f = float32(frame) [* float32(rescale)] [(x - mean) / std], channel first
        const chw = new Float32Array(3 * H * W);
        for (let y = 0; y < H; y++) {
          for (let x = 0; x < W; x++) {
            for (let ch = 0; ch < 3; ch++) {
              let v = f[(y * W + x) * 3 + ch]!;
              if (c.do_rescale) v = Math.fround(v * rf);
              if (c.do_normalize) v = Math.fround(Math.fround(v - mean[ch]!) / std[ch]!);
              chw[(ch * H + y) * W + x] = v;
            }
          }
        }
        const { patches, positions, n } = _convert_image_to_model_patches(chw, [3, H, W], p);
        if (unifiedMutated("unified_video_positions_xy_swapped")) {
          for (let k = 0; k < n; k++) [positions[2 * k], positions[2 * k + 1]] = [positions[2 * k + 1]!, positions[2 * k]!];
        }
        tokensPerFrame ??= n;
        const padded = _pad_patches(patches, positions, n, dim, maxSoft);
        pvs.push(padded.patches);
        poss.push(padded.positions);
      }
      const T = frames.length;
      out.num_frames_per_video.push(T);
      out.num_soft_tokens_per_frame.push(tokensPerFrame ?? 0);
      const r = rates[i];
      const sr = r && r > 0 ? r : c.default_fps;
      out.frame_timestamps.push(Array.from({ length: T }, (_, j) => j / sr));
    });
    const total = pvs.length;
    const pv = new Float32Array(total * maxSoft * dim);
    const pos = new BigInt64Array(total * maxSoft * 2);
    pvs.forEach((a, k) => pv.set(a, k * maxSoft * dim));
    poss.forEach((a, k) => pos.set(a, k * maxSoft * 2));
    return {
      pixel_values_videos: { dtype: "float32", shape: [total, maxSoft, dim], data: pv },
      video_position_ids: { dtype: "int64", shape: [total, maxSoft, 2], data: pos },
      ...out,
    };
  }
}

/** Gemma4UnifiedAudioFeatureExtractor: the waveform cut into frames of audio_samples_per_token samples. */
export class Gemma4UnifiedAudioFeatureExtractor {
  readonly feature_size: number;
  readonly sampling_rate: number;
  readonly padding_value: number;
  readonly audio_samples_per_token: number;

  constructor(d: Record<string, unknown> = {}) {
    const num = (k: string, dflt: number) => {
      const v = d[k] ?? dflt;
      if (typeof v !== "number" || !Number.isFinite(v)) throw new ConfigError("<feature extractor>", k, `must be a number, got ${JSON.stringify(v)}`);
      return v;
    };
    this.feature_size = num("feature_size", 640);
    this.sampling_rate = num("sampling_rate", 16000);
    this.padding_value = num("padding_value", 0.0);
    this.audio_samples_per_token = num("audio_samples_per_token", 640);
    if (!Number.isInteger(this.audio_samples_per_token) || this.audio_samples_per_token < 1) {
      throw new ConfigError("<feature extractor>", "audio_samples_per_token", `must be a positive integer, got ${this.audio_samples_per_token}`);
    }
  }

  /** __call__(raw_speech, max_length=None, truncation=True): (B, T, S) float32 frames and (B, T) bool mask. */
  call(waves: readonly Float32Array[], { max_length = null, truncation = true }: { max_length?: number | null; truncation?: boolean } = {}): { input_features: HostArray; input_features_mask: HostArray } {
    const S = this.audio_samples_per_token;
    let frames = waves.map((w) => Math.ceil(w.length / S));
    if (max_length !== null && truncation) frames = frames.map((t) => Math.min(t, max_length));
    const T = max_length === null ? Math.max(0, ...frames) : max_length;
    const feats = new Float32Array(waves.length * T * S).fill(Math.fround(this.padding_value));
    const mask = new Uint8Array(waves.length * T);
    waves.forEach((w, b) => {
      const len = Math.min(frames[b]!, T);
      // np.pad(..., constant_values=0): the last frame's tail is 0, not padding_value
      feats.fill(0, b * T * S, b * T * S + len * S);
      feats.set(w.subarray(0, Math.min(w.length, len * S)), b * T * S);
      mask.fill(1, b * T, b * T + len);
    });
    return {
      input_features: { dtype: "float32", shape: [waves.length, T, S], data: feats },
      input_features_mask: { dtype: "bool", shape: [waves.length, T], data: mask },
    };
  }
}

/** The configuration part of Gemma4UnifiedProcessor.from_pretrained(dir) (a local directory). */
export interface UnifiedProcessorConfig {
  file: string | undefined;
  image_processor: UnifiedImageProcessorConfig;
  /** The "video_processor" block, else the image block's geometry and pixel settings. */
  video_processor: UnifiedVideoProcessorConfig;
  feature_extractor: Record<string, unknown>;
  image_seq_length: number;
  audio_seq_length: number;
  audio_ms_per_token: number;
}

function isDict(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * processor_config.json, else preprocessor_config.json, else nothing: the image processor from its
 * "image_processor" block only (a flat file gives the defaults, unlike gemma4's reader), the
 * feature extractor from "feature_extractor", image_seq_length = the file's, else the block's
 * max_soft_tokens, else 280.
 */
export function loadUnifiedProcessorConfig(dir: string): UnifiedProcessorConfig {
  let file: string | undefined;
  let cfg: Record<string, unknown> = {};
  for (const name of ["processor_config.json", "preprocessor_config.json"]) {
    const p = join(dir, name);
    if (!existsSync(p)) continue;
    file = p;
    try {
      const parsed: unknown = JSON.parse(readFileSync(p, "utf8"));
      if (!isDict(parsed)) throw new Error("must hold a JSON object");
      cfg = parsed;
    } catch (e) {
      throw new ConfigError(p, "(file)", `not a JSON object: ${(e as Error).message}`);
    }
    break;
  }
  const f = file ?? join(dir, "processor_config.json");
  const ip: Record<string, unknown> = isDict(cfg.image_processor) ? { ...cfg.image_processor } : {};
  delete ip.image_processor_type;
  let vp: Record<string, unknown> = {};
  if (isDict(cfg.video_processor)) vp = { ...cfg.video_processor };
  else for (const k of ["patch_size", "pooling_kernel_size", "model_patch_size", "mm_posemb_size", "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std"]) if (k in ip) vp[k] = ip[k];
  delete vp.video_processor_type;
  const fe: Record<string, unknown> = isDict(cfg.feature_extractor) ? { ...cfg.feature_extractor } : {};
  delete fe.feature_extractor_type;
  const num = (v: unknown, key: string): number => {
    if (typeof v !== "number" || !Number.isFinite(v)) throw new ConfigError(f, key, `must be a number, got ${JSON.stringify(v)}`);
    return v;
  };
  return {
    file,
    image_processor: unifiedImageProcessorConfig(ip, f, "image_processor."),
    video_processor: unifiedVideoProcessorConfig(vp, f, isDict(cfg.video_processor) ? "video_processor." : "image_processor."),
    feature_extractor: fe,
    image_seq_length: num(cfg.image_seq_length ?? ip.max_soft_tokens ?? 280, "image_seq_length"),
    audio_seq_length: num(cfg.audio_seq_length ?? 750, "audio_seq_length"),
    audio_ms_per_token: num(cfg.audio_ms_per_token ?? 40, "audio_ms_per_token"),
  };
}
