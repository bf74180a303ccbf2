// The video half of mlx_vlm/models/gemma4/processing_gemma4.py (mlx-vlm 0.7.10):
// `Gemma4VideoProcessor` (_sample_frames, _resize_frames, rescale / normalize,
// _convert_video_to_patches, _pad_video_patches, the timestamps) and the `<|video|>` expansion of
// `Gemma4Processor.__call__` ("mm:ss <boi>{video_token × n}<eoi>" per frame, joined by spaces),
// with `mm_token_type_ids = 2` for video tokens. The image/audio side is processing_gemma4.ts.
//
// Numerics as the image processor's: Pillow's 8-bit BICUBIC (model/media/pil_resample.ts),
// float32 `x * float32(rescale_factor)` (NEP 50), float32 `(x - mean) / std`.
//
// Where mlx-vlm gives no error, this port does (never a different result): more frames than
// `num_frames` (mlx-vlm subsamples and labels the kept frames j / fps, not their own times), a
// prompt whose <|video|> count differs from the videos given (mlx-vlm stops with a bare
// StopIteration, or drops the extra videos).

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { resizeBicubic } from "../media/pil_resample.ts";
import type { HostArray } from "../media/host.ts";
import { MediaError } from "../media/errors.ts";
import { ConfigError } from "./config.ts";
import { videoMutated } from "./mutations.ts";

export const SUPPORTED_SOFT_TOKENS = [70, 140, 280, 560, 1120] as const;

/** `Gemma4VideoProcessor.__init__` fields (defaults = mlx-vlm's). */
export interface VideoProcessorConfig {
  patch_size: number;
  max_soft_tokens: number;
  pooling_kernel_size: number;
  num_frames: number;
  do_resize: boolean;
  do_rescale: boolean;
  rescale_factor: number;
  do_normalize: boolean;
  image_mean: number[];
  image_std: number[];
  default_fps: number;
}

export const VIDEO_PROCESSOR_DEFAULTS: Readonly<VideoProcessorConfig> = Object.freeze({
  patch_size: 16,
  max_soft_tokens: 70,
  pooling_kernel_size: 3,
  num_frames: 32,
  do_resize: true,
  do_rescale: true,
  rescale_factor: 1 / 255,
  do_normalize: false,
  image_mean: [0.0, 0.0, 0.0],
  image_std: [1.0, 1.0, 1.0],
  default_fps: 2.0,
});

/** One decoded video: T frames of uint8 RGB (H, W, 3), as load_video returns them (transposed). */
export interface VideoFrames {
  width: number;
  height: number;
  frames: readonly Uint8Array[];
}

export interface ProcessedVideo {
  /** float32 (1, T, max_patches, p*p*C): one video's pixel_values_videos. */
  pixel_values_videos: HostArray & { dtype: "float32" };
  /** int64 (1, T, max_patches, 2): [x, y] of each patch, -1 for padding. */
  video_position_ids: HostArray & { dtype: "int64" };
  num_frames: number;
  num_soft_tokens_per_frame: number;
  frame_timestamps: number[];
}

/** Python's float `a // b` (floatobject.c float_floor_div) for finite a, b > 0. */
function pyFloorDiv(a: number, b: number): number {
  let mod = a % b; // fmod
  let div = (a - mod) / b;
  if (mod && b < 0 !== mod < 0) {
    mod += b;
    div -= 1.0;
  }
  if (div) {
    let fl = Math.floor(div);
    if (div - fl > 0.5) fl += 1.0;
    return fl;
  }
  return 0;
}

/** Python's float `a % b` for b > 0. */
function pyMod(a: number, b: number): number {
  let mod = a % b;
  if (mod) {
    if (b < 0 !== mod < 0) mod += b;
  } else mod = 0;
  return mod;
}

/** `f"{int(secs // 60):02d}:{int(secs % 60):02d}"` */
export function frameTimestamp(secs: number): string {
  const mm = Math.trunc(pyFloorDiv(secs, 60));
  const ss = Math.trunc(pyMod(secs, 60));
  const two = (n: number) => (n < 0 ? "-" + String(-n).padStart(2, "0") : String(n).padStart(2, "0"));
  return `${two(mm)}:${two(ss)}`;
}

export class Gemma4VideoProcessor {
  readonly config: VideoProcessorConfig;

  constructor(cfg: Partial<VideoProcessorConfig> = {}) {
    this.config = { ...VIDEO_PROCESSOR_DEFAULTS, ...cfg };
    if (!(SUPPORTED_SOFT_TOKENS as readonly number[]).includes(this.config.max_soft_tokens))
      throw new ConfigError("processor_config.json", "video_processor.max_soft_tokens", `must be one of ${SUPPORTED_SOFT_TOKENS.join(", ")}, got ${this.config.max_soft_tokens}`);
  }

  /** video_sampling_defaults: the decoder reads at most the frames this processor keeps. */
  video_sampling_defaults(): { max_frames: number } {
    return { max_frames: this.config.num_frames };
  }

  /** _resize_frames' target size (H, W) for a frame of H x W (no resize: the same size). */
  targetSize(H: number, W: number): [number, number] {
    const c = this.config;
    const max_patches = c.max_soft_tokens * c.pooling_kernel_size ** 2;
    const target_px = max_patches * c.patch_size ** 2;
    const factor = Math.sqrt(target_px / (H * W));
    const side_mult = c.pooling_kernel_size * c.patch_size;
    let target_h = Math.floor((factor * H) / side_mult) * side_mult;
    let target_w = Math.floor((factor * W) / side_mult) * side_mult;
    const max_side = Math.floor(max_patches / c.pooling_kernel_size ** 2) * side_mult;
    if (target_h === 0) {
      target_h = side_mult;
      target_w = Math.min(Math.floor(W / H) * side_mult, max_side);
    }
    if (target_w === 0) {
      target_w = side_mult;
      target_h = Math.min(Math.floor(H / W) * side_mult, max_side);
    }
    return [target_h, target_w];
  }

  /** Gemma4VideoProcessor.__call__ on one video, `fps` the sampling rate of its frames. */
  processOne(video: VideoFrames, fps: number | null = null, file = "video"): ProcessedVideo {
    const c = this.config;
    const T = video.frames.length;
    if (T === 0) throw new MediaError(file, "empty", "the video has no frames");
    if (T > c.num_frames)
      throw new MediaError(file, "too_large", `${T} frames given, the processor keeps at most num_frames = ${c.num_frames} (mlx-vlm would subsample and time the kept frames as if consecutive); sample at most ${c.num_frames} frames`);
    const max_patches = c.max_soft_tokens * c.pooling_kernel_size ** 2;
    let [H, W] = [video.height, video.width];
    let frames = video.frames;
    if (c.do_resize) {
      const [th, tw] = this.targetSize(H, W);
      if (th !== H || tw !== W) {
        frames = frames.map((f) => resizeBicubic(f, W, H, tw, th));
        [H, W] = [th, tw];
      }
    }
    const p = c.patch_size;
    const pH = Math.floor(H / p);
    const pW = Math.floor(W / p);
    const num_patches = pH * pW;
    const dim = p * p * 3;
    const keep = Math.min(num_patches, max_patches);
    const out = new Float32Array(T * max_patches * dim);
    const pos = new BigInt64Array(T * max_patches * 2).fill(-1n);
    const rf = Math.fround(c.rescale_factor);
    const mean = c.image_mean.map(Math.fround);
    const std = c.image_std.map(Math.fround);
    // video_f = float32(frames) [* float32(rescale)] [(x - mean) / std], then patchified as
    // (T, C, pH, p, pW, p) -> (T, pH, pW, p, p, C) -> (T, pH*pW, p*p*C)
    const value = (v: number, ch: number): number => {
      let x = v;
      if (c.do_rescale) x = Math.fround(x * rf);
      if (c.do_normalize) x = Math.fround(Math.fround(x - mean[ch]!) / std[ch]!);
      return x;
    };
    for (let t = 0; t < T; t++) {
      const f = frames[t]!;
      for (let n = 0; n < keep; n++) {
        const py = Math.floor(n / pW);
        const px = n % pW;
        const base = (t * max_patches + n) * dim;
        let k = 0;
        for (let r = 0; r < p; r++) {
          const row = (py * p + r) * W;
          for (let q = 0; q < p; q++) {
            const pix = (row + px * p + q) * 3;
            for (let ch = 0; ch < 3; ch++) out[base + k++] = value(f[pix + ch]!, ch);
          }
        }
        const swap = videoMutated("video_positions_xy_swapped");
        pos[(t * max_patches + n) * 2] = BigInt(swap ? py : px);
        pos[(t * max_patches + n) * 2 + 1] = BigInt(swap ? px : py);
      }
    }
    const sr = fps && fps > 0 ? fps : c.default_fps;
    return {
      pixel_values_videos: { dtype: "float32", shape: [1, T, max_patches, dim], data: out },
      video_position_ids: { dtype: "int64", shape: [1, T, max_patches, 2], data: pos },
      num_frames: T,
      num_soft_tokens_per_frame: Math.floor(keep / c.pooling_kernel_size ** 2),
      frame_timestamps: Array.from({ length: T }, (_, j) => (videoMutated("video_timestamp_off_by_one") ? j + 1 : j) / sr),
    };
  }
}

/** The media tokens the expansion writes (the processor's tokenizer attributes). */
export interface VideoTokens {
  video_token: string;
  boi_token: string;
  eoi_token: string;
}

/** The per-frame text of one video: "mm:ss <boi>{video × n}<eoi>" joined by spaces. */
export function videoReplacement(t: VideoTokens, n_tokens: number, timestamps: readonly number[]): string {
  return timestamps.map((s) => `${frameTimestamp(s)} ${t.boi_token}${t.video_token.repeat(n_tokens)}${t.eoi_token}`).join(" ");
}

/**
 * Gemma4Processor.__call__'s `re.sub(video_token, next(replacements))`: each placeholder, in
 * order, becomes its video's frame sequence. The count of placeholders must equal the videos'.
 */
export function expandVideoPrompt(prompt: string, t: VideoTokens, videos: readonly { num_soft_tokens_per_frame: number; frame_timestamps: readonly number[] }[]): string {
  const parts = prompt.split(t.video_token);
  const n = parts.length - 1;
  if (n !== videos.length)
    throw new ConfigError("prompt", t.video_token, `the prompt has ${n} ${t.video_token} placeholder${n === 1 ? "" : "s"} but ${videos.length} video${videos.length === 1 ? " is" : "s are"} given (mlx-vlm would ${n > videos.length ? "fail with a bare StopIteration" : "silently drop the extra videos"})`);
  let out = parts[0]!;
  for (let i = 0; i < n; i++) out += videoReplacement(t, videos[i]!.num_soft_tokens_per_frame, videos[i]!.frame_timestamps) + parts[i + 1]!;
  return out;
}

/**
 * `Gemma4Processor.from_pretrained`'s video_processor block: processor_config.json (else
 * preprocessor_config.json) "video_processor" (minus its type); other keys are ignored, as
 * `Gemma4VideoProcessor(**kwargs)` ignores them. No file or no block: the defaults.
 */
export function videoProcessorConfigFromDir(dir: string): Partial<VideoProcessorConfig> {
  for (const name of ["processor_config.json", "preprocessor_config.json"]) {
    const p = join(dir, name);
    if (!existsSync(p)) continue;
    let cfg: unknown;
    try {
      cfg = JSON.parse(readFileSync(p, "utf8"));
    } catch (e) {
      throw new ConfigError(p, "", `not valid JSON: ${(e as Error).message}`);
    }
    const vp = (cfg as Record<string, unknown> | null)?.video_processor;
    if (vp === null || typeof vp !== "object" || Array.isArray(vp)) return {};
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(VIDEO_PROCESSOR_DEFAULTS)) {
      if (!(k in vp)) continue;
      const v = (vp as Record<string, unknown>)[k];
      const want = typeof VIDEO_PROCESSOR_DEFAULTS[k as keyof VideoProcessorConfig];
      const ok = want === "object" ? Array.isArray(v) && v.length === 3 && v.every((x) => typeof x === "number") : typeof v === want;
      if (!ok) throw new ConfigError(p, `video_processor.${k}`, `expected ${want === "object" ? "3 numbers" : want}, got ${JSON.stringify(v)}`);
      out[k] = v;
    }
    return out as Partial<VideoProcessorConfig>;
  }
  return {};
}
