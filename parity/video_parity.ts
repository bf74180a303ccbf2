// `npm run parity -- --model DIR --video a.avi --prompt "..."`: the video path against live
// mlx-vlm 0.7.10, block by block, then tap by tap:
//   1. sampling: load_video's frame indices, frame count and fps (TS decoder vs OpenCV), equal;
//      the pixel difference of the two decoders is printed (not a verdict: two decoders);
//   2. processor, from OpenCV's frames on both sides: pixel_values_videos, video_position_ids,
//      soft tokens per frame, timestamps, byte for byte;
//   3. the model, from those arrays and the TS face's prompt ids: vision tower, video features,
//      merged embeddings, per-layer inputs, logits; then --steps greedy steps of generate_step
//      (tokens and log-probs), byte for byte;
//   4. every tap of generate_step on the same prompt and OpenCV frames (parity/video_taps.ts,
//      oracle/TAPS.md condition "video"): the tower's every layer, the merge, every
//      language-model call with token type 2 and the video-block masks, byte for byte.
// Exit 0 when all agree, 1 on a divergence (its first block named), 2 on bad input.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { OracleClient } from "../oracle/client.ts";
import { oracleMedia } from "../oracle/media.ts";
import type { NpyRecord } from "../oracle/npy.ts";
import { generateStep } from "../model/generate.ts";
import { loadMultimodalModel } from "../model/gemma4/weights.ts";
import { Gemma4VideoProcessor, type ProcessedVideo, videoProcessorConfigFromDir } from "../model/gemma4/processing_gemma4_video.ts";
import { loadVideo, resolveVideoSampling, type VideoSampling } from "../model/media/video.ts";
import { mediaGenerationModel, mmTokenTypes } from "../model/runtime.ts";
import { disposeMediaInputs } from "../model/gemma4/gemma4.ts";
import { type Parsed, UsageError } from "./args.ts";
import { mediaPlan, videoSampling } from "./media.ts";
import { type VideoTapFile, videoTapParity } from "./video_taps.ts";

const buf = (r: NpyRecord) => Buffer.from(r.data.buffer, r.data.byteOffset, r.data.byteLength);
const rec = (dtype: "float32" | "int64", shape: number[], data: Float32Array | BigInt64Array): NpyRecord => ({ dtype, shape, data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) });
const bytesOf = (a: MlxArray): Buffer => {
  const f = a.dtype === "bfloat16" ? mx.astype(a, "float32") : mx.alias(a);
  try {
    return Buffer.from(f.toBytes());
  } finally {
    f.dispose();
  }
};

/** (T, C, H, W) uint8 -> (H, W, 3) frames. */
function hwc(r: NpyRecord): { width: number; height: number; frames: Uint8Array[] } {
  const [T, C, H, W] = r.shape as [number, number, number, number];
  const frames = Array.from({ length: T }, (_, t) => {
    const f = new Uint8Array(H * W * 3);
    for (let c = 0; c < C; c++) for (let i = 0; i < H * W; i++) f[i * 3 + c] = r.data[(t * C + c) * H * W + i]!;
    return f;
  });
  return { width: W, height: H, frames };
}

/** Checks the flags and files before the oracle starts (every problem a UsageError). */
export async function videoParityPreflight(a: Parsed): Promise<void> {
  if (a.model === undefined) throw new UsageError("--video needs --model");
  if (a.image !== undefined || a.audio !== undefined) throw new UsageError("npm run parity takes --video alone (no --image / --audio with it yet)");
  const plan = await mediaPlan(String(a.model), a);
  disposeMediaInputs(plan.media);
}

export async function videoParity(oracle: OracleClient, a: Parsed): Promise<boolean> {
  const dir = String(a.model);
  const steps = Number(a.steps);
  const prefill = Number(a["prefill-step-size"]);
  const plan = await mediaPlan(dir, a);
  disposeMediaInputs(plan.media); // the TS-decoded arrays: parity runs from OpenCV's frames
  const paths = String(a.video).split(",").map((s) => s.trim()).filter(Boolean);
  const vcfg = videoProcessorConfigFromDir(dir);
  const proc = new Gemma4VideoProcessor(vcfg);
  const sampling: VideoSampling = resolveVideoSampling(videoSampling(a), proc.video_sampling_defaults());
  const explicit = videoSampling(a);
  const problems: string[] = [];
  const say = (s: string) => process.stdout.write(`${s}\n`);
  const processed: ProcessedVideo[] = [];
  for (const p of paths) {
    const ts = await loadVideo(p, sampling);
    const py = (await oracleMedia(oracle, "video_load", { path: p, fps: explicit.fps, nframes: explicit.nframes, min_frames: explicit.min_frames, max_frames: explicit.max_frames, processor_config: vcfg })) as {
      frames: NpyRecord; frames_indices: number[]; total_num_frames: number; source_fps: number; sampled_fps: number;
    };
    const same = JSON.stringify(ts.frames_indices) === JSON.stringify(py.frames_indices) && ts.total_num_frames === py.total_num_frames && ts.fps === py.source_fps && ts.sampled_fps === py.sampled_fps;
    if (!same) problems.push(`sampling of ${p}: TS frames ${ts.frames_indices.join(",")} at ${ts.sampled_fps} fps, mlx-vlm ${py.frames_indices.join(",")} at ${py.sampled_fps} fps`);
    const o = hwc(py.frames);
    let maxd = 0;
    ts.frames.forEach((f, t) => f.forEach((v, i) => (maxd = Math.max(maxd, Math.abs(v - o.frames[t]![i]!)))));
    say(`${p}: ${ts.frames.length} of ${ts.total_num_frames} frames at ${py.sampled_fps.toFixed(3)} fps, sampling ${same ? "identical" : "DIFFERENT"}; decoder max |d| vs OpenCV ${maxd} (not compared: two decoders)`);
    const mine = proc.processOne(o, py.sampled_fps, p);
    const ref = (await oracleMedia(oracle, "video_process", { frames: py.frames, fps: py.sampled_fps, processor_config: vcfg })) as Record<string, unknown>;
    const eq =
      buf(ref.pixel_values_videos as NpyRecord).equals(buf(rec("float32", mine.pixel_values_videos.shape, mine.pixel_values_videos.data))) &&
      buf(ref.video_position_ids as NpyRecord).equals(buf(rec("int64", mine.video_position_ids.shape, mine.video_position_ids.data))) &&
      JSON.stringify(ref.frame_timestamps) === JSON.stringify([mine.frame_timestamps]) &&
      JSON.stringify(ref.num_soft_tokens_per_frame) === JSON.stringify([mine.num_soft_tokens_per_frame]);
    if (!eq) problems.push(`processor outputs of ${p} differ from Gemma4VideoProcessor's`);
    processed.push(mine);
  }
  if (new Set(processed.map((p) => JSON.stringify(p.pixel_values_videos.shape))).size > 1) throw new UsageError("npm run parity --video takes several videos only when they give the same frame count and size");
  const cat = <T extends Float32Array | BigInt64Array>(xs: T[], make: (n: number) => T): T => {
    const out = make(xs.reduce((n, x) => n + x.length, 0));
    let o = 0;
    for (const x of xs) (out.set(x as never, o), (o += x.length));
    return out;
  };
  const shape = [processed.length, ...processed[0]!.pixel_values_videos.shape.slice(1)];
  const pshape = [processed.length, ...processed[0]!.video_position_ids.shape.slice(1)];
  const pv = cat(processed.map((p) => p.pixel_values_videos.data), (n) => new Float32Array(n));
  const pos = cat(processed.map((p) => p.video_position_ids.data), (n) => new BigInt64Array(n));
  const ids = plan.ids;
  const { model } = loadMultimodalModel(dir);
  try {
    const types = mmTokenTypes(ids, model.config);
    const args = {
      model_dir: dir,
      input_ids: rec("int64", [1, ids.length], BigInt64Array.from(ids, BigInt)),
      pixel_values_videos: rec("float32", shape, pv),
      video_position_ids: rec("int64", pshape, pos),
      mm_token_type_ids: rec("int64", [1, ids.length], BigInt64Array.from(types, BigInt)),
    };
    const ref = (await oracleMedia(oracle, "video_forward", args)) as Record<string, NpyRecord>;
    const got: Record<string, Buffer> = {};
    {
      using x = mx.array(Int32Array.from(ids), [1, ids.length], "int32");
      using mm = mx.array(Int32Array.from(types), [1, types.length], "int32");
      using pva = mx.array(pv, shape, "float32");
      using posa = mx.array(pos, pshape, "int64");
      const e = model.get_input_embeddings(x, { pixel_values_videos: pva, video_position_ids: posa }, (name, v) => {
        const k = name === "merge/video" ? "merged" : name;
        if (k === "vision_tower" || k === "video_features" || k === "merged") got[k] = bytesOf(v as MlxArray);
      });
      try {
        got.inputs_embeds = bytesOf(e.inputs_embeds);
        if (e.per_layer_inputs) got.per_layer_inputs = bytesOf(e.per_layer_inputs);
        using logits = model.language_model.call(null, { inputs_embeds: e.inputs_embeds, per_layer_inputs: e.per_layer_inputs, mm_token_type_ids: mm });
        got.logits = bytesOf(logits);
      } finally {
        e.inputs_embeds.dispose();
        e.per_layer_inputs?.dispose();
      }
    }
    const blocks = ["vision_tower", "video_features", "merged", "inputs_embeds", "per_layer_inputs", "logits"].filter((k) => k in ref);
    const firstBad = blocks.find((k) => !got[k] || !got[k]!.equals(buf(ref[k]!)));
    say(`forward (${ids.length} tokens): ${firstBad ? `DIVERGES first at ${firstBad}` : `${blocks.length} of ${blocks.length} blocks byte-identical (${blocks.join(", ")})`}`);
    if (firstBad) problems.push(`forward diverges first at ${firstBad}`);
    const gen = (await oracleMedia(oracle, "video_generate", { ...args, max_tokens: steps, prefill_step_size: prefill })) as { tokens: number[]; logprobs: NpyRecord };
    const pva = mx.array(pv, shape, "float32");
    const posa = mx.array(pos, pshape, "int64");
    const run = mediaGenerationModel(model, { ids, media: { pixel_values_videos: pva, video_position_ids: posa } });
    const toks: number[] = [];
    const lps: Buffer[] = [];
    try {
      for await (const t of generateStep(run.generate, ids, { maxTokens: steps, prefillStepSize: prefill, chunkedPrefill: run.chunked })) {
        toks.push(t.token);
        lps.push(bytesOf(t.logprobs));
      }
    } finally {
      run.dispose();
      pva.dispose();
      posa.dispose();
    }
    const V = gen.logprobs.shape[1]!;
    const refLp = buf(gen.logprobs);
    const badStep = toks.findIndex((t, i) => t !== gen.tokens[i] || !lps[i]!.equals(refLp.subarray(i * V * 4, (i + 1) * V * 4)));
    const genOk = badStep < 0 && toks.length === gen.tokens.length;
    say(`generation: ${toks.length} greedy steps, ${genOk ? "tokens and log-probs byte-identical" : `DIVERGES at step ${badStep < 0 ? toks.length : badStep}`} (${toks.join(",")})`);
    if (!genOk) problems.push(`generation diverges at step ${badStep}`);
  } finally {
    model.dispose();
  }
  // 4. every tap of generate_step (oracle/TAPS.md condition "video"), from the same OpenCV frames
  const files: VideoTapFile[] = paths.map((path) => ({ path, sampling: explicit }));
  const taps = await videoTapParity(oracle, { dir, ids, files, processed, steps, prefillStepSize: prefill, processorConfig: vcfg });
  const tapsOk = taps.firstDivergence === null && taps.bitExact === taps.tapsCompared && JSON.stringify(taps.tokens.ts) === JSON.stringify(taps.tokens.oracle);
  say(
    `taps: ${taps.tapsCompared} compared over the embed call and ${steps} generate_step calls, ${taps.bitExact} byte-identical` +
      (taps.firstDivergence ? `; first divergence at ${taps.firstDivergence.tap} (max abs ${taps.firstDivergence.maxAbs}, ${taps.firstDivergence.mismatches} elements)` : ""),
  );
  if (!tapsOk) problems.push(taps.firstDivergence ? `taps diverge first at ${taps.firstDivergence.tap}` : "tap run: tokens differ");
  for (const p of problems) say(`  - ${p}`);
  say(`Verdict: ${problems.length ? "FAIL" : "PASS"}`);
  return problems.length === 0;
}
