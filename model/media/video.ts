// mlx_vlm.utils.load_video (mlx-vlm 0.7.10) on Motion-JPEG AVI files: which frames it samples
// (VideoSampling, DEFAULT_VIDEO_SAMPLING, the nframes / fps paths, np.linspace(...).round()),
// the frames as uint8 RGB, and VideoMetadata's sampled_fps. mlx-vlm decodes with OpenCV
// (libavcodec's MJPEG decoder + swscale); here each frame is decoded by libjpeg-turbo (jpeg.ts),
// so the pixels can differ by a few levels: suites/multimodal/video.test.ts measures the bound
// and the parity runs feed both sides the same decoded frames.
//
// Differences from mlx-vlm, each a clear MediaError instead of another result: a file whose
// frame chunks stop before its declared frame count (OpenCV returns the frames it could read, or
// one, without a word), a video with no frames, and a sampling that asks for more frames than
// the processor keeps (mlx-vlm subsamples again and then labels the kept frames with the wrong
// times: docs, "Oracle quirks").

import { readFileSync, statSync } from "node:fs";
import { parseAvi } from "./avi.ts";
import { MediaError } from "./errors.ts";
import { decodeJpeg } from "./jpeg.ts";

/** mlx_vlm.utils.VideoSampling: unset fields fall back in merge order. */
export interface VideoSampling {
  fps?: number | null;
  nframes?: number | null;
  min_frames?: number | null;
  max_frames?: number | null;
  frame_factor?: number | null;
}

export const DEFAULT_VIDEO_SAMPLING = Object.freeze({ fps: 2.0, min_frames: 4, max_frames: 768, frame_factor: 2 });

/** VideoSampling.merge: every unset field taken from `fallback`. */
export function mergeSampling(a: VideoSampling, fallback: VideoSampling): VideoSampling {
  const out: VideoSampling = {};
  for (const k of ["fps", "nframes", "min_frames", "max_frames", "frame_factor"] as const) out[k] = a[k] ?? fallback[k] ?? null;
  return out;
}

/** Python's round() / numpy's .round() on a double: half to even. */
export function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** np.linspace(0, stop, num) (endpoint, float64): i * step, the last one exactly `stop`. */
export function linspace(stop: number, num: number): number[] {
  const out: number[] = [];
  if (num <= 0) return out;
  const div = num - 1;
  const step = div > 0 ? stop / div : NaN;
  for (let i = 0; i < num; i++) {
    if (div === 0) out.push(0);
    else if (step === 0) out.push((i / div) * stop);
    else out.push(i * step);
  }
  if (num > 1) out[num - 1] = stop;
  return out;
}

/**
 * resolve_video_sampling: the caller's overrides, then what the processor declares
 * (Gemma4VideoProcessor.video_sampling_defaults: max_frames = num_frames), then
 * DEFAULT_VIDEO_SAMPLING (applied in sampleIndices).
 */
export function resolveVideoSampling(explicit: VideoSampling, processorDefaults: VideoSampling): VideoSampling {
  return mergeSampling(explicit, processorDefaults);
}

/** The frame indices load_video reads (its non-frame_sampler paths), or its ValueError text. */
export function sampleIndices(total: number, videoFps: number, s: VideoSampling): number[] {
  const r = mergeSampling(s, DEFAULT_VIDEO_SAMPLING);
  const ff = r.frame_factor!;
  let n: number;
  if (r.nframes !== null && r.nframes !== undefined) {
    n = roundHalfEven(r.nframes / ff) * ff;
  } else {
    const lo = Math.ceil(r.min_frames! / ff) * ff;
    const hi = Math.floor(Math.min(r.max_frames!, total) / ff) * ff;
    n = (total / videoFps) * r.fps!;
    n = Math.min(Math.max(n, lo), hi, total);
    n = Math.floor(n / ff) * ff;
  }
  if (!(ff <= n && n <= total)) throw new RangeError(`nframes must be in [${ff}, ${total}], got ${n}.`);
  return linspace(total - 1, n).map(roundHalfEven);
}

export interface LoadedVideo {
  /** Frame rate the file declares (OpenCV's CAP_PROP_FPS). */
  fps: number;
  total_num_frames: number;
  frames_indices: number[];
  /** VideoMetadata.sampled_fps: len(indices) / total * fps, the rate the processor's timestamps use. */
  sampled_fps: number;
  width: number;
  height: number;
  /** One uint8 RGB buffer (H, W, 3) per sampled frame. */
  frames: Uint8Array[];
  /** Set when the decoder is known to give other pixels than OpenCV's (what, by how much). */
  note?: string;
}

/**
 * load_video(path, sampling): the sampled frames of an MJPEG AVI file. `sampling` is the resolved
 * one (resolveVideoSampling with the processor's defaults, as prepare_inputs does); left empty,
 * DEFAULT_VIDEO_SAMPLING alone applies (up to 768 frames, more than Gemma 4's processor keeps).
 */
export async function loadVideo(path: string, sampling: VideoSampling = {}, maxPixels = 2 * 89478485): Promise<LoadedVideo> {
  const file = path.startsWith("file://") ? path.slice(7) : path;
  let bytes: Uint8Array;
  try {
    if (!statSync(file).isFile()) throw new Error("not a file");
    bytes = readFileSync(file);
  } catch (e) {
    throw new MediaError(file, "unreadable", `cannot read the video: ${(e as Error).message}`);
  }
  const avi = parseAvi(bytes, file);
  const total = avi.frames.length;
  if (total === 0) throw new MediaError(file, "empty", "the video has no frames");
  let indices: number[];
  try {
    indices = sampleIndices(total, avi.fps, sampling);
  } catch (e) {
    throw new MediaError(file, "empty", `no frames can be sampled: ${(e as Error).message}`);
  }
  const frames: Uint8Array[] = [];
  for (const i of indices) {
    const c = avi.frames[i]!;
    if (c.size === 0) throw new MediaError(file, "corrupt", `frame ${i} is empty (a dropped frame)`);
    // a copy: Node's Buffer.slice shares the file's memory, and the decoder reads .buffer whole
    const img = await decodeJpeg(Uint8Array.prototype.slice.call(bytes, c.offset, c.offset + c.size), `${file} frame ${i}`, maxPixels);
    if (img.width !== avi.width || img.height !== avi.height)
      throw new MediaError(file, "corrupt", `frame ${i} is ${img.width}x${img.height}, the stream is ${avi.width}x${avi.height}`);
    frames.push(img.rgb);
  }
  return {
    fps: avi.fps,
    total_num_frames: total,
    frames_indices: indices,
    sampled_fps: (indices.length / Math.max(total, 1e-6)) * avi.fps,
    width: avi.width,
    height: avi.height,
    frames,
    note: "decoded by libjpeg-turbo; mlx-vlm's OpenCV (libavcodec MJPEG + swscale) can differ by a few levels per pixel",
  };
}
