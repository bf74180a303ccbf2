// The tap-level gemma4_unified video run (oracle/TAPS.md, gemma4_unified video): mlx-vlm's
// generate_step on a video prompt recorded tap by tap (oracle/python/capture_mm.py: each file
// decoded by OpenCV, mlx_vlm.utils.load_video, every video's sampled frames through
// Gemma4UnifiedVideoProcessor at once), and the TS model run on the TS
// Gemma4UnifiedVideoProcessor's outputs from the same OpenCV frames (fetched from the oracle),
// every tap compared by parity/engine.ts runParity: the embed call (the frames' model patches and
// positions through the VisionEmbedder, embed_vision, video_features, merge/video, the per-layer
// inputs with video ids set to 0), then every prefill chunk and step of the language model (token
// type 2, the video-block masks under a 'vision' text config). Byte for byte.

import * as mx from "@mlx-bun/mlx";
import type { OracleClient } from "../oracle/client.ts";
import { oracleMedia } from "../oracle/media.ts";
import type { NpyRecord } from "../oracle/npy.ts";
import type { VideoFrames } from "../model/gemma4/processing_gemma4_video.ts";
import { Gemma4UnifiedVideoProcessor, type UnifiedVideoProcessorOutput } from "../model/gemma4_unified/processing_gemma4_unified.ts";
import type { UnifiedMediaInputs } from "../model/gemma4_unified/gemma4_unified.ts";
import { disposeUnifiedMedia } from "../model/gemma4_unified/gemma4_unified.ts";
import { hostBytes } from "../model/media/host.ts";
import { runParity } from "./engine.ts";
import type { RunResult } from "./schema.ts";
import { framesHWC, type VideoTapFile, videoRunSpec } from "./video_taps.ts";

/** OpenCV's sampled frames of each file (mlx-vlm's load_video, sampling defaults from the unified processor) and their sampled fps. */
export async function openCvFrames(oracle: OracleClient, files: readonly VideoTapFile[], config: Record<string, unknown> = {}): Promise<{ videos: VideoFrames[]; rates: number[]; records: NpyRecord[] }> {
  const videos: VideoFrames[] = [];
  const rates: number[] = [];
  const records: NpyRecord[] = [];
  for (const f of files) {
    const s = f.sampling ?? {};
    const py = (await oracleMedia(oracle, "video_load", { path: f.path, fps: s.fps, nframes: s.nframes, min_frames: s.min_frames, max_frames: s.max_frames, processor_config: config, unified: true })) as { frames: NpyRecord; sampled_fps: number };
    videos.push(framesHWC(py.frames, f.frames ?? Infinity));
    rates.push(py.sampled_fps);
    records.push(py.frames);
  }
  return { videos, rates, records };
}

/** The TS Gemma4UnifiedVideoProcessor on OpenCV's frames of the files (one call, as Gemma4Processor makes it). */
export async function unifiedProcessFromOpenCv(oracle: OracleClient, files: readonly VideoTapFile[], config: Record<string, unknown> = {}): Promise<UnifiedVideoProcessorOutput> {
  const { videos, rates } = await openCvFrames(oracle, files, config);
  return new Gemma4UnifiedVideoProcessor(config).call(videos, rates, files.map((f) => f.path));
}

/** The processor's host arrays as the model's video inputs. */
export function unifiedVideoInputs(p: UnifiedVideoProcessorOutput): Pick<UnifiedMediaInputs, "pixel_values_videos" | "video_position_ids"> {
  return {
    pixel_values_videos: mx.fromBytes(hostBytes(p.pixel_values_videos), p.pixel_values_videos.shape, "float32"),
    video_position_ids: mx.fromBytes(hostBytes(p.video_position_ids), p.video_position_ids.shape, "int64"),
  };
}

export interface UnifiedVideoTapRun {
  /** The checkpoint (a gemma4_unified directory whose config's video_token_id is in its vocabulary). */
  dir: string;
  /** The prompt's ids, the video placeholders expanded (per frame: timestamp ids, boi, video × n, eoi); the audio placeholders too. */
  ids: readonly number[];
  /** Items for the oracle when the prompt has other media (ids and media names); default: ids. */
  items?: readonly (number | string)[];
  /** Media specs for the oracle's items (fixture audio specs, or files). */
  mediaSpecs?: Record<string, unknown>;
  files: readonly VideoTapFile[];
  /** unifiedProcessFromOpenCv's output for `files`. */
  processed: UnifiedVideoProcessorOutput;
  /** Other TS media of the prompt (audio), disposed after the run. */
  otherMedia?: () => UnifiedMediaInputs;
  steps: number;
  prefillStepSize: number;
  processorConfig?: Record<string, unknown>;
}

/** Every tap of generate_step on the unified video prompt, TS against mlx-vlm (runParity's verdict). */
export async function unifiedVideoTapParity(oracle: OracleClient, r: UnifiedVideoTapRun): Promise<RunResult> {
  const { scenario, spec } = videoRunSpec("unified-video-taps", r.items ?? r.ids, r, r.mediaSpecs ? { media: r.mediaSpecs } : {});
  return await runParity(oracle, {
    ...spec,
    media: {
      scenario,
      unified: () => {
        const other = r.otherMedia?.() ?? {};
        try {
          return { ids: [...r.ids], media: { ...other, ...unifiedVideoInputs(r.processed) } };
        } catch (e) {
          disposeUnifiedMedia(other);
          throw e;
        }
      },
    },
  });
}
