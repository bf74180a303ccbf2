// Media inputs of the parity and generate commands (--image, --audio): the files, where their
// placeholders go in the prompt, and the checkpoint's towers. Every problem is one UsageError
// (exit code 2). The processor's work (decoding, resize, rescale, log-mel features, the
// soft-token counts) is the TS port of mlx-vlm's Gemma4Processor (model/gemma4/processing_gemma4.ts,
// byte-identical to mlx-vlm's; the parity face's oracle side runs mlx-vlm's own from the same files).

import { accessSync, constants, existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { ConfigError, type MultimodalConfig, multimodalConfigFromDict } from "../model/gemma4/config.ts";
import { checkMediaInputs, disposeMediaInputs, type MediaInputs, MediaError } from "../model/gemma4/gemma4.ts";
import { checkSafetensors, loadMultimodalModel } from "../model/gemma4/weights.ts";
import { type ImageKwargs, Gemma4Processor } from "../model/gemma4/processing_gemma4.ts";
import { MediaError as MediaFileError } from "../model/media/errors.ts";
import { type HostArray, hostBytes } from "../model/media/host.ts";
import { loadVideo, resolveVideoSampling, type VideoSampling } from "../model/media/video.ts";
import { expandVideoPrompt, Gemma4VideoProcessor, type ProcessedVideo, videoProcessorConfigFromDir } from "../model/gemma4/processing_gemma4_video.ts";
import { mediaTokensFromTokenizerConfig } from "../model/gemma4/processing_gemma4.ts";
import { type FlagSpec, type Parsed, UsageError } from "./args.ts";
import { parseTokenList, tokenizePrompt } from "./inputs.ts";

export const MEDIA_FLAGS: FlagSpec[] = [
  {
    name: "image",
    kind: "string",
    valueName: "a.png[,b.jpg]",
    help: "with --model: image file(s), comma-separated; each goes where the prompt says 'image' (--tokens) or <|image|> (--prompt), else where --chat's template puts images (before the text), else before the prompt",
  },
  { name: "audio", kind: "string", valueName: "a.wav[,b.wav]", help: "with --model: audio file(s), comma-separated; placeholders as for --image ('audio', <|audio|>)" },
  { name: "max-soft-tokens", kind: "int", valueName: "N", help: "with --image: image soft tokens (Gemma4ImageProcessor's max_soft_tokens; default: the checkpoint's processor config, else 280)" },
];

/**
 * mlx-vlm's video flags (generate/dispatch.py: --video, --fps, --video-num-frames,
 * --video-min-frames, --video-max-frames), for `npm run generate`.
 */
export const VIDEO_FLAGS: FlagSpec[] = [
  {
    name: "video",
    kind: "string",
    valueName: "a.avi[,b.avi]",
    help: "with --model and --prompt: Motion-JPEG AVI file(s); each goes where the prompt has <|video|>, else before the prompt (needs the checkpoint's tokenizer and a config video_token_id)",
  },
  { name: "fps", kind: "number", valueName: "F", help: "with --video: frames per second to sample (mlx-vlm's --fps, default 2.0)" },
  { name: "video-num-frames", kind: "int", valueName: "N", help: "with --video: exact number of frames to sample, overriding --fps" },
  { name: "video-min-frames", kind: "int", valueName: "N", help: "with --video: lower bound on the sampled frames (default 4)" },
  { name: "video-max-frames", kind: "int", valueName: "N", help: "with --video: upper bound on the sampled frames (default: the processor's num_frames, 32)" },
];

export interface MediaFile {
  kind: "image" | "audio";
  path: string;
  max_soft_tokens?: number;
}

/** An inline multimodal scenario for the oracle: prompt ids and media names, the media files. */
export interface MediaRequest {
  prompt: (number | string)[];
  media: Record<string, MediaFile>;
  config: MultimodalConfig;
  /** --prompt: its token ids before the placeholders were marked, and the user message content. */
  tokenized?: { ids: number[]; content: unknown };
  /** --video: each video's processor outputs, already expanded into the prompt's ids (frame timestamps are text). */
  videos?: ProcessedVideo[];
}

function files(flag: string, v: unknown): string[] {
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

/** Whether the flags ask for media. */
export function wantsMedia(a: Parsed): boolean {
  return a.image !== undefined || a.audio !== undefined || a.video !== undefined;
}

/**
 * The towers a gemma4 checkpoint really has: a tower is built when its config is not null and
 * kept when the weights (or the shard index) hold keys under its name, as mlx-vlm's load_model
 * drops weightless modules.
 */
export function checkpointTowers(dir: string): { config: MultimodalConfig; vision: boolean; audio: boolean } {
  const cfgPath = join(dir, "config.json");
  const raw = JSON.parse(readFileSync(cfgPath, "utf8")) as Record<string, unknown>;
  if (raw.model_type !== "gemma4") throw new UsageError(`${dir} is a ${String(raw.model_type)} checkpoint: media need a gemma4 checkpoint with a vision or audio tower`);
  let config: MultimodalConfig;
  try {
    config = multimodalConfigFromDict(raw, cfgPath);
  } catch (e) {
    if (e instanceof ConfigError) throw new UsageError(e.message);
    throw e;
  }
  const keys = new Set<string>();
  const index = join(dir, "model.safetensors.index.json");
  if (existsSync(index)) for (const k of Object.keys((JSON.parse(readFileSync(index, "utf8")) as { weight_map?: object }).weight_map ?? {})) keys.add(k);
  for (const f of readdirSync(dir).filter((x) => /^model.*\.safetensors$/.test(x))) for (const k of safetensorsKeys(join(dir, f))) keys.add(k);
  const has = (name: string) => [...keys].some((k) => k.startsWith(`${name}.`) || k.startsWith(`model.${name}.`));
  return { config, vision: config.vision !== null && has("vision_tower"), audio: config.audio !== null && has("audio_tower") };
}

/** The tensor names in a .safetensors header (only the header is read; a bad file has none here: loading reports it). */
function safetensorsKeys(file: string): string[] {
  try {
    return Object.keys(checkSafetensors(file));
  } catch {
    return [];
  }
}

/**
 * The prompt with media placeholders: --tokens may hold the words 'image' / 'audio' (one per
 * file, in order); in a --prompt, each <|image|> / <|audio|> token is one. Without any, with
 * --chat, the chat template places them as mlx-vlm does (images before the text, audio after);
 * otherwise the images and then the audio clips go first (after a leading BOS). prepareMedia expands each into
 * boi + image_token * n + eoi (boa + audio_token * n + eoa), n from the processor.
 */
export async function mediaRequest(dir: string, a: Parsed): Promise<MediaRequest> {
  const images = files("image", a.image);
  const audios = files("audio", a.audio);
  const videoFiles = files("video", a.video);
  const towers = checkpointTowers(dir);
  if (images.length && !towers.vision) throw new UsageError(`--image given, but ${dir} has no vision tower (${towers.config.vision === null ? "vision_config is null" : "no vision_tower weights"})`);
  if (audios.length && !towers.audio) throw new UsageError(`--audio given, but ${dir} has no audio tower (${towers.config.audio === null ? "audio_config is null" : "no audio_tower weights"})`);
  const { config } = towers;
  const soft = a["max-soft-tokens"] === undefined ? undefined : Number(a["max-soft-tokens"]);
  if (soft !== undefined && (!Number.isInteger(soft) || soft < 1)) throw new UsageError("--max-soft-tokens must be a positive integer");
  const media: Record<string, MediaFile> = {};
  images.forEach((path, k) => (media[`image:${k}`] = soft === undefined ? { kind: "image", path } : { kind: "image", path, max_soft_tokens: soft }));
  audios.forEach((path, k) => (media[`audio:${k}`] = { kind: "audio", path }));
  let items: (number | string)[];
  let tokenized: MediaRequest["tokenized"];
  let ni = 0;
  let na = 0;
  if (typeof a.tokens === "string") {
    items = a.tokens
      .split(",")
      .map((t) => t.trim())
      .filter((t) => t.length > 0)
      .map((t) => (t === "image" ? `image:${ni++}` : t === "audio" ? `audio:${na++}` : parseTokenList(t)[0]!));
  } else if (typeof a.prompt === "string" && videoFiles.length) {
    // the processor's order: the text is expanded (per frame "mm:ss <boi>video×n<eoi>"), then tokenized whole
    if (a.chat === true) throw new UsageError("--chat with --video is not supported (the chat template's video placement is not ported); give the full prompt with <|video|> where the video goes");
    const videos = await processVideos(dir, videoFiles, a, towers);
    const tokens = mediaTokensFromTokenizerConfig(dir);
    let text = a.prompt;
    if (!text.includes(tokens.video_token)) text = tokens.video_token.repeat(videoFiles.length) + text;
    try {
      text = expandVideoPrompt(text, tokens, videos);
    } catch (e) {
      if (e instanceof ConfigError) throw new UsageError(`${e.detail} (--video gives ${videoFiles.length} file${videoFiles.length === 1 ? "" : "s"})`);
      throw e;
    }
    const ids = await tokenizePrompt(dir, text, false);
    const mark = (xs: number[]) => xs.map((t) => (t === config.image_token_id ? `image:${ni++}` : t === config.audio_token_id ? `audio:${na++}` : t));
    items = mark(ids);
    tokenized = { ids, content: a.prompt };
    if (ni !== 0 || na !== 0 || images.length || audios.length) {
      if (ni !== images.length || na !== audios.length) throw new UsageError("with --video, give every --image / --audio a <|image|> / <|audio|> placeholder in the prompt");
    }
    return { prompt: items, media, config, tokenized, videos };
  } else if (typeof a.prompt === "string") {
    const mark = (ids: number[]) => ids.map((t) => (t === config.image_token_id ? `image:${ni++}` : t === config.audio_token_id ? `audio:${na++}` : t));
    let ids = await tokenizePrompt(dir, a.prompt, a.chat === true);
    let content: unknown = a.prompt;
    items = mark(ids);
    // --chat without placeholders: the user turn mlx-vlm's apply_chat_template builds for gemma4
    // (prompt_utils' LIST_WITH_IMAGE_TYPE_TEXT: one {type: image} per image, the text, one
    // {type: audio} per clip), as the chat template renders it
    if (ni === 0 && na === 0 && a.chat === true) {
      content = [...images.map(() => ({ type: "image" })), { type: "text", text: a.prompt }, ...audios.map(() => ({ type: "audio" }))];
      ids = await tokenizePrompt(dir, a.prompt, true, content);
      items = mark(ids);
    }
    tokenized = { ids, content };
  } else {
    throw new UsageError('give a prompt: --prompt "text" or --tokens 1,2,3 (with the words image / audio where the media go)');
  }
  if (videoFiles.length) throw new UsageError("--video needs --prompt: its frame timestamps are text that the checkpoint's tokenizer encodes");
  if (ni === 0 && na === 0) {
    const head = items[0] === 2 ? [2] : [];
    items = [...head, ...images.map((_, k) => `image:${k}`), ...audios.map((_, k) => `audio:${k}`), ...items.slice(head.length)];
    ni = images.length;
    na = audios.length;
  }
  if (ni !== images.length) throw new UsageError(`the prompt has ${ni} image placeholder${ni === 1 ? "" : "s"} but --image gives ${images.length} file${images.length === 1 ? "" : "s"}`);
  if (na !== audios.length) throw new UsageError(`the prompt has ${na} audio placeholder${na === 1 ? "" : "s"} but --audio gives ${audios.length} file${audios.length === 1 ? "" : "s"}`);
  return { prompt: items, media, config, ...(tokenized ? { tokenized } : {}) };
}

/** The video flags as load_video's VideoSampling (caller's overrides). */
export function videoSampling(a: Parsed): VideoSampling {
  const num = (flag: string, int: boolean) => {
    const v = a[flag];
    if (v === undefined) return null;
    const n = Number(v);
    if (!(n > 0) || (int && !Number.isInteger(n))) throw new UsageError(`--${flag} must be a positive ${int ? "integer" : "number"}`);
    return n;
  };
  return { fps: num("fps", false), nframes: num("video-num-frames", true), min_frames: num("video-min-frames", true), max_frames: num("video-max-frames", true) };
}

/** load_video + Gemma4VideoProcessor for each --video file; every problem a UsageError. */
async function processVideos(dir: string, paths: string[], a: Parsed, towers: { config: MultimodalConfig; vision: boolean }): Promise<ProcessedVideo[]> {
  if (!towers.vision) throw new UsageError(`--video given, but ${dir} has no vision tower (${towers.config.vision === null ? "vision_config is null" : "no vision_tower weights"})`);
  if (towers.config.video_token_id === null)
    throw new UsageError(`--video given, but ${join(dir, "config.json")} has no video_token_id: mlx-vlm would silently drop the video; set it to the tokenizer's <|video|> id`);
  try {
    const proc = new Gemma4VideoProcessor(videoProcessorConfigFromDir(dir));
    const sampling = resolveVideoSampling(videoSampling(a), proc.video_sampling_defaults());
    const out: ProcessedVideo[] = [];
    for (const p of paths) {
      const v = await loadVideo(p, sampling);
      out.push(proc.processOne(v, v.sampled_fps, p));
    }
    return out;
  } catch (e) {
    if (e instanceof MediaFileError || e instanceof ConfigError) throw new UsageError(e.message);
    throw e;
  }
}

/** As Gemma4VideoProcessor returns them: one stacked (N, T, L, D) array when every video has the same shape, else one array per video. */
function videoArrays(vids: ProcessedVideo[]): Pick<MediaInputs, "pixel_values_videos" | "video_position_ids"> {
  const same = vids.every((v) => JSON.stringify(v.pixel_values_videos.shape) === JSON.stringify(vids[0]!.pixel_values_videos.shape));
  const arr = (h: HostArray): MlxArray => mx.fromBytes(hostBytes(h), h.shape, h.dtype);
  if (!same) return { pixel_values_videos: vids.map((v) => arr(v.pixel_values_videos)), video_position_ids: vids.map((v) => arr(v.video_position_ids)) };
  const stack = (hs: HostArray[]): MlxArray => {
    const parts = hs.map(arr);
    try {
      return parts.length === 1 ? mx.alias(parts[0]!) : mx.concatenate(parts, 0);
    } finally {
      for (const p of parts) p.dispose();
    }
  };
  return { pixel_values_videos: stack(vids.map((v) => v.pixel_values_videos)), video_position_ids: stack(vids.map((v) => v.video_position_ids)) };
}

export interface PreparedMedia {
  ids: number[];
  media: MediaInputs;
}

/**
 * The processor's outputs for the request: the checkpoint's Gemma4Processor (processor_config.json
 * / preprocessor_config.json, else mlx-vlm's defaults) on the files, the prompt's placeholders
 * expanded with the config's boundary and soft-token ids, all checked against the model's rules
 * before anything runs. Every problem (a bad file, a placeholder count that does not match) is
 * a UsageError.
 */
export async function prepareMedia(dir: string, req: MediaRequest, towers: { vision: boolean; audio: boolean }): Promise<PreparedMedia> {
  let proc: Gemma4Processor;
  try {
    proc = Gemma4Processor.fromPretrained(dir);
  } catch (e) {
    if (e instanceof ConfigError) throw new UsageError(e.message);
    throw e;
  }
  const names = req.prompt.filter((x): x is string => typeof x === "string");
  const of = (kind: "image" | "audio") => names.filter((n) => req.media[n]!.kind === kind);
  const [imageNames, audioNames] = [of("image"), of("audio")];
  const soft = imageNames.map((n) => req.media[n]!.max_soft_tokens).find((x) => x !== undefined);
  const kw: ImageKwargs = soft === undefined ? {} : { max_soft_tokens: soft };
  let counts: Map<string, number>;
  let host: { pixel_values?: HostArray | HostArray[]; input_features?: HostArray; input_features_mask?: HostArray };
  try {
    const img = imageNames.length ? await proc.processImages(imageNames.map((n) => req.media[n]!.path), kw) : undefined;
    const aud = audioNames.length ? proc.processAudio(audioNames.map((n) => req.media[n]!.path)) : undefined;
    counts = new Map([...imageNames.map((n, k) => [n, img!.num_soft_tokens_per_image[k]!] as const), ...audioNames.map((n, k) => [n, aud!.num_audio_tokens[k]!] as const)]);
    host = { pixel_values: img?.pixel_values, input_features: aud?.input_features, input_features_mask: aud?.input_features_mask };
  } catch (e) {
    if (e instanceof MediaFileError || e instanceof ConfigError) throw new UsageError(e.message);
    throw e;
  }
  const c = req.config;
  const ids = req.prompt.flatMap((x) => {
    if (typeof x === "number") return [x];
    const n = counts.get(x)!;
    return req.media[x]!.kind === "image"
      ? [c.boi_token_id, ...Array<number>(n).fill(c.image_token_id), c.eoi_token_id]
      : [c.boa_token_id, ...Array<number>(n).fill(c.audio_token_id), c.eoa_token_id];
  });
  const arr = (h: HostArray): MlxArray => mx.fromBytes(hostBytes(h), h.shape, h.dtype);
  const pv = host.pixel_values === undefined ? null : Array.isArray(host.pixel_values) ? host.pixel_values.map(arr) : arr(host.pixel_values);
  const vids = req.videos ?? [];
  const media: MediaInputs = {
    pixel_values: pv,
    input_features: host.input_features ? arr(host.input_features) : null,
    input_features_mask: host.input_features_mask ? arr(host.input_features_mask) : null,
    ...(vids.length ? videoArrays(vids) : {}),
  };
  try {
    checkMediaInputs(req.config, towers, ids, media);
  } catch (e) {
    disposeMediaInputs(media);
    if (e instanceof MediaError) throw new UsageError(e.message);
    throw e;
  }
  return { ids, media };
}

/** The media part of a face's pre-flight: the request (flags, files, towers, placeholders) and the processor's outputs. */
export async function mediaPlan(dir: string, a: Parsed): Promise<PreparedMedia & { request: MediaRequest }> {
  const request = await mediaRequest(dir, a);
  return { ...(await prepareMedia(dir, request, checkpointTowers(dir))), request };
}

/** Everything loadMultimodalModel refuses, without reading the weights (MLX maps safetensors lazily). */
export function checkMediaCheckpoint(dir: string): void {
  const { model } = loadMultimodalModel(dir, { lazy: true });
  model.dispose();
}
