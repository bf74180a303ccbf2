// The faces' gemma4_unified part: `npm run generate -- --model U --image IMG / --audio WAV /
// --video AVI` and `npm run parity -- --model U ...` on a local gemma4_unified checkpoint. The
// pre-flight builds what mlx-vlm's prepare_inputs builds for it, with the checkpoint's processor
// config (model/gemma4_unified/processing_gemma4_unified.ts loadUnifiedProcessorConfig): image
// files decoded and cut into model patches by the TS Gemma4UnifiedImageProcessor; WAV files loaded
// at the extractor's rate and cut into raw frames by Gemma4UnifiedAudioFeatureExtractor, counted as
// Gemma4Processor counts them (ceil(ms / audio_ms_per_token), capped at audio_seq_length); AVI
// files decoded and sampled as load_video does (mlx-vlm's --fps, --video-num-frames,
// --video-min-frames, --video-max-frames) and cut into model patches per frame by
// Gemma4UnifiedVideoProcessor. The prompt: each image placeholder becomes boi + image_token * n +
// eoi (n = the image's real patches), each audio one boa + audio_token * n + eoa, and each
// <|video|> in the text the frames' "mm:ss <boi>{video_token * n}<eoi>" joined by spaces (n = a
// frame's model patches) before the text is tokenized whole, as Gemma4Processor.__call__ does.
// The parity run hands the same files to mlx-vlm (oracle/python/capture_mm.py: load_image /
// load_audio / load_video, the checkpoint's unified processors), so the embed call's taps compare
// the processors too; video frames come from OpenCV on both sides there (useOpenCvFrames: the two
// JPEG decoders differ by a few levels). Every problem is a UsageError (exit 2): a missing or
// undecodable file, a part the checkpoint lacks (no vision embedder, no embed_audio, no
// video_token_id), a placeholder count that does not match the files.

import { accessSync, constants, existsSync, readFileSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { ConfigError } from "../model/gemma4/config.ts";
import { computeAudioNumTokens, mediaTokensFromTokenizerConfig } from "../model/gemma4/processing_gemma4.ts";
import { expandVideoPrompt } from "../model/gemma4/processing_gemma4_video.ts";
import { MediaError as MediaFileError } from "../model/media/errors.ts";
import { type HostArray, hostBytes } from "../model/media/host.ts";
import { loadImage } from "../model/media/image.ts";
import { loadVideo, resolveVideoSampling, type VideoSampling } from "../model/media/video.ts";
import { loadAudio } from "../model/media/wav.ts";
import { disposeUnifiedMedia, isUnifiedCheckpoint, loadUnifiedModel, type ModelConfig, modelConfigFromDict, type UnifiedPrompt, unifiedGenerationModel } from "../model/gemma4_unified/index.ts";
import {
  Gemma4UnifiedAudioFeatureExtractor,
  Gemma4UnifiedImageProcessor,
  Gemma4UnifiedVideoProcessor,
  loadUnifiedProcessorConfig,
  type UnifiedProcessorConfig,
  type UnifiedVideoProcessorOutput,
} from "../model/gemma4_unified/processing_gemma4_unified.ts";
import { MediaError } from "../model/gemma4/gemma4.ts";
import type { GenerateModel } from "../model/generate.ts";
import type { OracleClient } from "../oracle/client.ts";
import { type Parsed, UsageError } from "./args.ts";
import { parseTokenList, tokenizePrompt } from "./inputs.ts";
import { videoSampling } from "./media.ts";
import { openCvFrames } from "./unified_video_taps.ts";

export { isUnifiedCheckpoint };

type MediaFile = { kind: "image"; path: string; max_soft_tokens?: number } | { kind: "audio"; path: string };

/** What the oracle's inline scenario needs, and the TS inputs. */
export interface UnifiedMediaPlan extends UnifiedPrompt {
  /** Prompt items for the oracle: token ids (video placeholders expanded) and media names ("image:0", "audio:0", ...). */
  items: (number | string)[];
  media: UnifiedPrompt["media"];
  files: Record<string, MediaFile>;
  /** --video: the files, the caller's sampling flags, the processor's settings and outputs. */
  videos?: { paths: string[]; sampling: VideoSampling; config: Record<string, unknown>; processed: UnifiedVideoProcessorOutput };
  /** --prompt: its ids before the placeholders were expanded, and the user message content; with --video, the expanded text the tokenizer saw. */
  tokenized?: { ids: number[]; content: unknown; text?: string };
}

function mediaFiles(flag: string, v: unknown): string[] {
  if (v === undefined) return [];
  const out = String(v)
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s.length > 0)
    .map((s) => resolve(s));
  if (out.length === 0) throw new UsageError(`--${flag} needs a file path`);
  for (const f of out) {
    if (!existsSync(f)) throw new UsageError(`--${flag}: file not found: ${f}`);
    if (!statSync(f).isFile()) throw new UsageError(`--${flag}: not a file: ${f}`);
    try {
      accessSync(f, constants.R_OK);
    } catch {
      throw new UsageError(`--${flag}: cannot read ${f} (permission denied)`);
    }
  }
  return out;
}

function unifiedConfig(dir: string): ModelConfig {
  const file = join(dir, "config.json");
  try {
    return modelConfigFromDict(JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>, file);
  } catch (e) {
    if (e instanceof ConfigError || e instanceof SyntaxError) throw new UsageError(e.message);
    throw e;
  }
}

/** A decoding or processor-config problem as the face's one-line error. */
function usage<T>(fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    if (e instanceof MediaFileError || e instanceof ConfigError) throw new UsageError(e.message);
    if (e instanceof RangeError) throw new UsageError(e.message);
    throw e;
  }
}

const toMx = (h: HostArray) => mx.fromBytes(hostBytes(h), h.shape, h.dtype);

/** The pre-flight of a unified media run: flags, files, the processors' outputs, the expanded prompt. */
export async function unifiedMediaPlan(dir: string, a: Parsed): Promise<UnifiedMediaPlan> {
  const images = mediaFiles("image", a.image);
  const audios = mediaFiles("audio", a.audio);
  const videoPaths = mediaFiles("video", a.video);
  if (!images.length && !audios.length && !videoPaths.length) throw new UsageError("a gemma4_unified media run needs --image, --audio or --video");
  const config = unifiedConfig(dir);
  if ((images.length || videoPaths.length) && config.vision === null) throw new UsageError(`--${images.length ? "image" : "video"} given, but ${dir} has no vision part (vision_config is null)`);
  if (audios.length && config.audio === null) throw new UsageError(`--audio given, but ${dir} has no embed_audio (audio_config is null): this checkpoint takes no audio`);
  if (audios.length && config.eoa_token_id === null) throw new UsageError(`--audio given, but ${join(dir, "config.json")} has no eoa_token_id`);
  const vocab = config.text.vocab_size;
  if (videoPaths.length && (config.video_token_id === null || config.video_token_id >= vocab))
    throw new UsageError(`--video given, but ${join(dir, "config.json")} has video_token_id ${config.video_token_id} (outside its vocabulary of ${vocab}): mlx-vlm would silently drop the video; set it to the tokenizer's <|video|> id`);
  const soft = a["max-soft-tokens"] === undefined ? undefined : Number(a["max-soft-tokens"]);
  if (soft !== undefined && (!Number.isInteger(soft) || soft < 1)) throw new UsageError("--max-soft-tokens must be a positive integer");
  if (a.prompt !== undefined && a.tokens !== undefined) throw new UsageError("give either --prompt or --tokens, not both");
  const pcfg: UnifiedProcessorConfig = usage(() => loadUnifiedProcessorConfig(dir));
  const files: UnifiedMediaPlan["files"] = {};
  images.forEach((path, k) => (files[`image:${k}`] = soft === undefined ? { kind: "image", path } : { kind: "image", path, max_soft_tokens: soft }));
  audios.forEach((path, k) => (files[`audio:${k}`] = { kind: "audio", path }));

  // the media through the processors (the checkpoint's settings): counts before the prompt is built
  let video: UnifiedMediaPlan["videos"];
  if (videoPaths.length) {
    const vconfig = { ...pcfg.video_processor } as Record<string, unknown>;
    const sampling = videoSampling(a);
    const proc = usage(() => new Gemma4UnifiedVideoProcessor(vconfig));
    const resolved = resolveVideoSampling(sampling, proc.video_sampling_defaults());
    const decoded: Awaited<ReturnType<typeof loadVideo>>[] = [];
    for (const p of videoPaths) {
      try {
        decoded.push(await loadVideo(p, resolved));
      } catch (e) {
        if (e instanceof MediaFileError || e instanceof RangeError) throw new UsageError(e instanceof MediaFileError ? e.message : `${p}: ${e.message}`);
        throw e;
      }
    }
    // as gemma4's face: more frames than the processor keeps is refused (mlx-vlm's _sample_frames
    // subsamples them again and times the kept frames j / fps as if they were consecutive)
    decoded.forEach((v, k) => {
      if (v.frames.length > proc.config.num_frames)
        throw new UsageError(`${videoPaths[k]}: ${v.frames.length} frames sampled, the processor keeps at most num_frames = ${proc.config.num_frames} (mlx-vlm would subsample them again and time the kept frames as if consecutive); sample at most ${proc.config.num_frames} frames`);
    });
    const processed = usage(() => proc.call(decoded, decoded.map((v) => v.sampled_fps), videoPaths));
    video = { paths: videoPaths, sampling, config: vconfig, processed };
  }
  const fe = usage(() => new Gemma4UnifiedAudioFeatureExtractor(pcfg.feature_extractor));
  const waves = audios.map((p) => usage(() => loadAudio(p, fe.sampling_rate).samples));
  const audioCounts = waves.map((w) => computeAudioNumTokens(w.length, fe.sampling_rate, pcfg.audio_ms_per_token, pcfg.audio_seq_length));
  let imgOut: ReturnType<Gemma4UnifiedImageProcessor["preprocess"]> | null = null;
  if (images.length) {
    // (the resolved config: every field set, so the constructor keeps them all)
    const proc = usage(() => new Gemma4UnifiedImageProcessor({ ...pcfg.image_processor } as Record<string, unknown>));
    const decoded: Awaited<ReturnType<typeof loadImage>>[] = [];
    for (const p of images) {
      try {
        decoded.push(await loadImage(p));
      } catch (e) {
        if (e instanceof MediaFileError) throw new UsageError(e.message);
        throw e;
      }
    }
    imgOut = usage(() => proc.preprocess(decoded, soft === undefined ? {} : { max_soft_tokens: soft }));
  }

  // the prompt: placeholders where the user put them (<|image|> / <|audio|> in --prompt, the words
  // image / audio in --tokens), else the images and then the audio after a leading BOS (or, with
  // --chat, the user turn mlx-vlm builds: one {type: image} per image, the text, one {type: audio}
  // per clip); --video: <|video|> in the text (else the videos first), expanded before tokenizing
  let items: (number | string)[];
  let tokenized: UnifiedMediaPlan["tokenized"];
  let ni = 0;
  let na = 0;
  const mark = (ids: number[]) => ids.map((t) => (t === config.image_token_id ? `image:${ni++}` : t === config.audio_token_id ? `audio:${na++}` : t));
  if (typeof a.tokens === "string") {
    if (video) throw new UsageError("--video needs --prompt: its frame timestamps are text that the checkpoint's tokenizer encodes");
    items = a.tokens
      .split(",")
      .map((t) => t.trim())
      .filter((t) => t.length > 0)
      .map((t) => (t === "image" ? `image:${ni++}` : t === "audio" ? `audio:${na++}` : parseTokenList(t)[0]!));
  } else if (typeof a.prompt === "string" && video) {
    if (a.chat === true) throw new UsageError("--chat with --video is not supported (the chat template's video placement is not ported); give the full prompt with <|video|> where the video goes");
    const tokens = usage(() => mediaTokensFromTokenizerConfig(dir));
    let text = a.prompt;
    if (!text.includes(tokens.video_token)) text = tokens.video_token.repeat(videoPaths.length) + text;
    const perVideo = video.processed.num_soft_tokens_per_frame.map((n, k) => ({ num_soft_tokens_per_frame: n, frame_timestamps: video!.processed.frame_timestamps[k]! }));
    try {
      text = expandVideoPrompt(text, tokens, perVideo);
    } catch (e) {
      if (e instanceof ConfigError) throw new UsageError(`${e.detail} (--video gives ${videoPaths.length} file${videoPaths.length === 1 ? "" : "s"})`);
      throw e;
    }
    const ids = await tokenizePrompt(dir, text, false);
    items = mark(ids);
    tokenized = { ids, content: text, text };
    if ((images.length || audios.length) && (ni !== images.length || na !== audios.length)) throw new UsageError("with --video, give every --image / --audio a <|image|> / <|audio|> placeholder in the prompt");
  } else if (typeof a.prompt === "string") {
    let ids = await tokenizePrompt(dir, a.prompt, a.chat === true);
    let content: unknown = a.prompt;
    items = mark(ids);
    if (ni === 0 && na === 0 && a.chat === true) {
      content = [...images.map(() => ({ type: "image" })), { type: "text", text: a.prompt }, ...audios.map(() => ({ type: "audio" }))];
      ids = await tokenizePrompt(dir, a.prompt, true, content);
      items = mark(ids);
    }
    tokenized = { ids, content };
  } else {
    throw new UsageError('give a prompt: --prompt "text" or --tokens 1,2,3 (with the words image / audio where the media go)');
  }
  if (ni === 0 && na === 0 && !video) {
    const head = items[0] === 2 ? [2] : [];
    items = [...head, ...images.map((_, k) => `image:${k}`), ...audios.map((_, k) => `audio:${k}`), ...items.slice(head.length)];
    ni = images.length;
    na = audios.length;
  }
  if (ni !== images.length) throw new UsageError(`the prompt has ${ni} image placeholder${ni === 1 ? "" : "s"} but --image gives ${images.length} file${images.length === 1 ? "" : "s"}`);
  if (na !== audios.length) throw new UsageError(`the prompt has ${na} audio placeholder${na === 1 ? "" : "s"} but --audio gives ${audios.length} file${audios.length === 1 ? "" : "s"}`);

  const counts = new Map<string, number>([...images.map((_, k) => [`image:${k}`, imgOut!.num_soft_tokens_per_image[k]!] as const), ...audios.map((_, k) => [`audio:${k}`, audioCounts[k]!] as const)]);
  const ids = items.flatMap((x) => {
    if (typeof x === "number") return [x];
    const n = counts.get(x)!;
    return files[x]!.kind === "image"
      ? [config.boi_token_id, ...Array<number>(n).fill(config.image_token_id), config.eoi_token_id]
      : [config.boa_token_id, ...Array<number>(n).fill(config.audio_token_id), config.eoa_token_id!];
  });
  const bad = ids.find((t) => !Number.isInteger(t) || t < 0 || t >= vocab);
  if (bad !== undefined) throw new UsageError(`token id ${bad} is outside the vocabulary (vocab_size ${vocab})`);
  if (video) {
    const want = video.processed.num_frames_per_video.reduce((s, T, k) => s + T * video!.processed.num_soft_tokens_per_frame[k]!, 0);
    const got = ids.filter((t) => t === config.video_token_id).length;
    if (got !== want)
      throw new UsageError(`the expanded prompt has ${got} video tokens (id ${config.video_token_id}) but the frames give ${want}: the tokenizer's <|video|> id must be config.json's video_token_id`);
  }
  const media: UnifiedPrompt["media"] = {};
  if (imgOut) {
    media.pixel_values = toMx(imgOut.pixel_values);
    media.image_position_ids = toMx(imgOut.image_position_ids);
  }
  if (waves.length) {
    // the extractor over all clips at once (padded to the longest), as Gemma4Processor calls it
    const f = fe.call(waves);
    media.input_features = toMx(f.input_features);
    media.input_features_mask = toMx(f.input_features_mask);
  }
  if (video) {
    media.pixel_values_videos = toMx(video.processed.pixel_values_videos);
    media.video_position_ids = toMx(video.processed.video_position_ids);
  }
  return { ids, media, items, files, ...(video ? { videos: video } : {}), ...(tokenized ? { tokenized } : {}) };
}

/**
 * A parity run's video frames: OpenCV's (mlx-vlm's load_video, fetched from the oracle) through
 * the TS processor in place of the TS decoder's, so that both sides start from the same pixels
 * (the decoders differ by a few levels; suites/multimodal/video.test.ts bounds that). The
 * sampling, the frame counts, the tokens per frame and the timestamps must equal the pre-flight's.
 */
export async function useOpenCvFrames(oracle: OracleClient, plan: UnifiedMediaPlan): Promise<void> {
  const v = plan.videos;
  if (!v) return;
  const files = v.paths.map((path) => ({ path, sampling: v.sampling }));
  const { videos, rates } = await openCvFrames(oracle, files, v.config);
  const processed = new Gemma4UnifiedVideoProcessor(v.config).call(videos, rates, v.paths);
  const shape = (p: UnifiedVideoProcessorOutput) => JSON.stringify([p.num_frames_per_video, p.num_soft_tokens_per_frame, p.frame_timestamps, p.pixel_values_videos.shape]);
  if (shape(processed) !== shape(v.processed)) throw new Error(`OpenCV's sampling of ${v.paths.join(", ")} differs from the TS decoder's: ${shape(processed)} vs ${shape(v.processed)}`);
  plan.media.pixel_values_videos?.dispose();
  plan.media.video_position_ids?.dispose();
  plan.media.pixel_values_videos = toMx(processed.pixel_values_videos);
  plan.media.video_position_ids = toMx(processed.video_position_ids);
  v.processed = processed;
}

/** Everything loadUnifiedModel refuses, without reading the weights (a UsageError each). */
export function checkUnifiedCheckpoint(dir: string): void {
  try {
    loadUnifiedModel(dir, { lazy: true }).model.dispose();
  } catch (e) {
    if (e instanceof ConfigError || e instanceof MediaError) throw new UsageError(e.message);
    throw e;
  }
}

/** generate's model for a unified media prompt: mlx-vlm's generate_step from the merged embeddings (the media arrays are disposed here). */
export function unifiedFaceModel(dir: string, plan: UnifiedMediaPlan): { generate: GenerateModel; chunked: boolean } {
  try {
    const { model } = loadUnifiedModel(dir);
    return unifiedGenerationModel(model, plan);
  } catch (e) {
    if (e instanceof MediaError) throw new UsageError(e.message);
    throw e;
  } finally {
    disposeUnifiedMedia(plan.media);
  }
}

/** The oracle's inline scenario for a unified parity run (mlx-vlm's generate_step on the same files). */
export function unifiedScenarioOf(plan: UnifiedMediaPlan, prefillStepSize: number, steps: number): Record<string, unknown> {
  const v = plan.videos;
  const sampling = v ? Object.fromEntries(Object.entries(v.sampling).filter(([, x]) => x !== null && x !== undefined)) : {};
  return {
    id: "parity-cli-unified",
    kind: "generate",
    prompt: plan.items,
    media: plan.files,
    // (no processor_config: mlx-vlm reads the checkpoint's, Gemma4UnifiedProcessor.from_pretrained)
    ...(v ? { videos: v.paths.map((path) => ({ path, ...sampling })) } : {}),
    prefill_step_size: prefillStepSize,
    max_tokens: steps,
  };
}
