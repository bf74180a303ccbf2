// The tap-level video run (oracle/TAPS.md, media condition "video"): mlx-vlm's generate_step on a
// video prompt recorded tap by tap (oracle/python/capture_mm.py: each file decoded by OpenCV,
// load_video, its sampled frames through Gemma4VideoProcessor), and the TS model run on the TS
// processor's outputs from the same OpenCV frames (fetched from the oracle), every tap compared
// by parity/engine.ts runParity: the embed call (the frames' patches and positions, the vision
// tower's every layer, embed_vision, video_features, merge/video, the per-layer inputs with
// video ids set to 0), then every prefill chunk and step of the language model (token type 2,
// the video-block masks). Byte for byte; the decoders' own difference is measured elsewhere.

import type { OracleClient } from "../oracle/client.ts";
import { oracleMedia } from "../oracle/media.ts";
import type { NpyRecord } from "../oracle/npy.ts";
import * as mx from "@mlx-bun/mlx";
import { Gemma4VideoProcessor, type ProcessedVideo, type VideoProcessorConfig } from "../model/gemma4/processing_gemma4_video.ts";
import type { VideoSampling } from "../model/media/video.ts";
import { type RunSpec, runParity } from "./engine.ts";
import type { RunResult } from "./schema.ts";

/** One video of a tap-level run: the file, the sampling overrides, and how many sampled frames to keep (all when absent). */
export interface VideoTapFile {
  path: string;
  frames?: number;
  sampling?: VideoSampling;
}

/** (T, C, H, W) uint8 from load_video -> the first `keep` frames as (H, W, 3), as the TS processor takes them. */
export function framesHWC(r: NpyRecord, keep = Infinity): { width: number; height: number; frames: Uint8Array[] } {
  const [T0, C, H, W] = r.shape as [number, number, number, number];
  const T = Math.min(T0, keep);
  const frames = Array.from({ length: T }, (_, t) => {
    const f = new Uint8Array(H * W * 3);
    for (let c = 0; c < C; c++) for (let i = 0; i < H * W; i++) f[i * 3 + c] = r.data[(t * C + c) * H * W + i]!;
    return f;
  });
  return { width: W, height: H, frames };
}

/** OpenCV's frames of each file (mlx-vlm's load_video), through the TS Gemma4VideoProcessor. */
export async function processFromOpenCv(oracle: OracleClient, files: readonly VideoTapFile[], config?: Partial<VideoProcessorConfig>): Promise<ProcessedVideo[]> {
  const proc = new Gemma4VideoProcessor(config);
  const out: ProcessedVideo[] = [];
  for (const f of files) {
    const s = f.sampling ?? {};
    const py = (await oracleMedia(oracle, "video_load", { path: f.path, fps: s.fps, nframes: s.nframes, min_frames: s.min_frames, max_frames: s.max_frames, processor_config: config })) as { frames: NpyRecord; sampled_fps: number };
    out.push(proc.processOne(framesHWC(py.frames, f.frames ?? Infinity), py.sampled_fps, f.path));
  }
  return out;
}

export interface VideoTapRun {
  /** The checkpoint (a gemma4 directory whose config sets video_token_id). */
  dir: string;
  /** The prompt's ids, the video placeholders expanded (per frame: timestamp ids, boi, video × n, eoi). */
  ids: readonly number[];
  files: readonly VideoTapFile[];
  /** processFromOpenCv's outputs for `files` (one stacked batch: same frame count and size). */
  processed: readonly ProcessedVideo[];
  steps: number;
  prefillStepSize: number;
  processorConfig?: Partial<VideoProcessorConfig>;
}

/**
 * What a video tap run (gemma4's or gemma4_unified's) gives the oracle and runParity: the scenario
 * (generate_step on `prompt`, the files as load_video samples them, the schedule; `extra` for
 * other media) and the spec's fields, bit-exact bar.
 */
export function videoRunSpec(
  id: string,
  prompt: readonly (number | string)[],
  r: { dir: string; files: readonly VideoTapFile[]; steps: number; prefillStepSize: number; processorConfig?: object },
  extra: Record<string, unknown> = {},
): { scenario: Record<string, unknown>; spec: Omit<RunSpec, "media"> } {
  const scenario = {
    id,
    kind: "generate",
    prompt: [...prompt],
    ...extra,
    videos: r.files.map((f) => ({ path: f.path, ...(f.frames === undefined ? {} : { frames: f.frames }), ...(f.sampling ?? {}), ...(r.processorConfig ? { processor_config: r.processorConfig } : {}) })),
    prefill_step_size: r.prefillStepSize,
    max_tokens: r.steps,
  };
  const spec = { tsDir: r.dir, oracleCheckpoint: r.dir, model: r.dir.split("/").pop() ?? r.dir, variant: "video", prompt: [], prefillStepSize: r.prefillStepSize, steps: r.steps, budget: { ulp: 0, atol: 0 } };
  return { scenario, spec };
}

/** Every tap of generate_step on the video prompt, TS against mlx-vlm (runParity's verdict). */
export async function videoTapParity(oracle: OracleClient, r: VideoTapRun): Promise<RunResult> {
  const shapes = new Set(r.processed.map((p) => JSON.stringify(p.pixel_values_videos.shape)));
  if (shapes.size !== 1) throw new Error("a tap-level video run takes videos of the same frame count and size (one stacked batch)");
  const first = r.processed[0]!;
  const cat = <T extends Float32Array | BigInt64Array>(xs: T[], make: (n: number) => T): T => {
    const out = make(xs.reduce((n, x) => n + x.length, 0));
    let o = 0;
    for (const x of xs) (out.set(x as never, o), (o += x.length));
    return out;
  };
  const pv = mx.array(cat(r.processed.map((p) => p.pixel_values_videos.data), (n) => new Float32Array(n)), [r.processed.length, ...first.pixel_values_videos.shape.slice(1)], "float32");
  const pos = mx.array(cat(r.processed.map((p) => p.video_position_ids.data), (n) => new BigInt64Array(n)), [r.processed.length, ...first.video_position_ids.shape.slice(1)], "int64");
  const { scenario, spec } = videoRunSpec("video-taps", r.ids, r);
  try {
    return await runParity(oracle, {
      ...spec,
      media: { scenario, prepared: { ids: [...r.ids], media: { pixel_values_videos: pv, video_position_ids: pos } } },
    });
  } finally {
    pv.dispose();
    pos.dispose();
  }
}
