// The faces' gemma4_unified part: `npm run generate -- --model U --image IMG` and `npm run parity
// -- --model U --image IMG` on a local gemma4_unified checkpoint. The pre-flight builds what
// mlx-vlm's prepare_inputs builds for it: the image files decoded and cut into model patches by
// the TS Gemma4UnifiedImageProcessor with the checkpoint's processor config
// (model/gemma4_unified/processing_gemma4_unified.ts loadUnifiedProcessorConfig), and the prompt
// with each image placeholder expanded to boi + image_token * n + eoi (n = the image's real
// patches). The parity run hands the same files to mlx-vlm (oracle/python/capture_mm.py: load_image,
// the checkpoint's Gemma4UnifiedImageProcessor), so the embed call's taps compare the two
// processors too. Every problem is a UsageError (exit 2): a missing or undecodable file, --audio or
// --video (not wired for this model), a checkpoint without the image embedder, a placeholder count
// that does not match the files.

import { accessSync, constants, existsSync, readFileSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { ConfigError } from "../model/gemma4/config.ts";
import { MediaError as MediaFileError } from "../model/media/errors.ts";
import { hostBytes } from "../model/media/host.ts";
import { loadImage } from "../model/media/image.ts";
import { disposeUnifiedMedia, isUnifiedCheckpoint, loadUnifiedModel, type ModelConfig, modelConfigFromDict, type UnifiedPrompt, unifiedGenerationModel } from "../model/gemma4_unified/index.ts";
import { Gemma4UnifiedImageProcessor, loadUnifiedProcessorConfig } from "../model/gemma4_unified/processing_gemma4_unified.ts";
import { MediaError } from "../model/gemma4/gemma4.ts";
import type { GenerateModel } from "../model/generate.ts";
import { type Parsed, UsageError } from "./args.ts";
import { parseTokenList, tokenizePrompt } from "./inputs.ts";

export { isUnifiedCheckpoint };

/** What the oracle's inline scenario needs, and the TS inputs. */
export interface UnifiedMediaPlan extends UnifiedPrompt {
  /** Prompt items for the oracle: token ids and media names ("image:0", ...). */
  items: (number | string)[];
  media: UnifiedPrompt["media"];
  files: Record<string, { kind: "image"; path: string; max_soft_tokens?: number }>;
  /** --prompt: its ids before the placeholders were expanded, and the user message content. */
  tokenized?: { ids: number[]; content: unknown };
}

function imageFiles(v: unknown): string[] {
  const out = String(v)
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s.length > 0)
    .map((s) => resolve(s));
  if (out.length === 0) throw new UsageError("--image needs a file path");
  for (const f of out) {
    if (!existsSync(f)) throw new UsageError(`--image: file not found: ${f}`);
    if (!statSync(f).isFile()) throw new UsageError(`--image: not a file: ${f}`);
    try {
      accessSync(f, constants.R_OK);
    } catch {
      throw new UsageError(`--image: cannot read ${f} (permission denied)`);
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

/** The pre-flight of a unified media run: flags, files, the processor's outputs, the expanded prompt. */
export async function unifiedMediaPlan(dir: string, a: Parsed): Promise<UnifiedMediaPlan> {
  if (a.audio !== undefined || a.video !== undefined) throw new UsageError("a gemma4_unified checkpoint takes --image in the faces (--audio / --video are not wired for it)");
  if (a.image === undefined) throw new UsageError("a gemma4_unified media run needs --image");
  const paths = imageFiles(a.image);
  const config = unifiedConfig(dir);
  if (config.vision === null) throw new UsageError(`--image given, but ${dir} has no vision part (vision_config is null)`);
  const soft = a["max-soft-tokens"] === undefined ? undefined : Number(a["max-soft-tokens"]);
  if (soft !== undefined && (!Number.isInteger(soft) || soft < 1)) throw new UsageError("--max-soft-tokens must be a positive integer");
  const names = paths.map((_, k) => `image:${k}`);
  const files: UnifiedMediaPlan["files"] = {};
  paths.forEach((path, k) => (files[names[k]!] = soft === undefined ? { kind: "image", path } : { kind: "image", path, max_soft_tokens: soft }));

  // the prompt: placeholders where the user put them (<|image|> in --prompt, the word "image" in
  // --tokens), else the images after a leading BOS (or, with --chat, the user turn mlx-vlm builds:
  // one {type: image} per file, then the text)
  let items: (number | string)[];
  let tokenized: UnifiedMediaPlan["tokenized"];
  let n = 0;
  const mark = (ids: number[]) => ids.map((t) => (t === config.image_token_id ? `image:${n++}` : t));
  if (a.prompt !== undefined && a.tokens !== undefined) throw new UsageError("give either --prompt or --tokens, not both");
  if (typeof a.tokens === "string") {
    items = a.tokens
      .split(",")
      .map((t) => t.trim())
      .filter((t) => t.length > 0)
      .map((t) => (t === "image" ? `image:${n++}` : parseTokenList(t)[0]!));
  } else if (typeof a.prompt === "string") {
    let ids = await tokenizePrompt(dir, a.prompt, a.chat === true);
    let content: unknown = a.prompt;
    items = mark(ids);
    if (n === 0 && a.chat === true) {
      content = [...paths.map(() => ({ type: "image" })), { type: "text", text: a.prompt }];
      ids = await tokenizePrompt(dir, a.prompt, true, content);
      items = mark(ids);
    }
    tokenized = { ids, content };
  } else {
    throw new UsageError('give a prompt: --prompt "text" or --tokens 1,2,3 (with the word image where each image goes)');
  }
  if (n === 0) {
    const head = items[0] === 2 ? [2] : [];
    items = [...head, ...names, ...items.slice(head.length)];
    n = names.length;
  }
  if (n !== paths.length) throw new UsageError(`the prompt has ${n} image placeholder${n === 1 ? "" : "s"} but --image gives ${paths.length} file${paths.length === 1 ? "" : "s"}`);

  // the processor (the checkpoint's config), on the decoded files
  let out: ReturnType<Gemma4UnifiedImageProcessor["preprocess"]>;
  try {
    // (the resolved config: every field set, so the constructor keeps them all)
    const proc = new Gemma4UnifiedImageProcessor({ ...loadUnifiedProcessorConfig(dir).image_processor } as Record<string, unknown>);
    const images = [];
    for (const p of paths) images.push(await loadImage(p));
    out = proc.preprocess(images, soft === undefined ? {} : { max_soft_tokens: soft });
  } catch (e) {
    if (e instanceof MediaFileError || e instanceof ConfigError) throw new UsageError(e.message);
    throw e;
  }
  const counts = new Map(names.map((nm, k) => [nm, out.num_soft_tokens_per_image[k]!] as const));
  const ids = items.flatMap((x) => (typeof x === "number" ? [x] : [config.boi_token_id, ...Array<number>(counts.get(x)!).fill(config.image_token_id), config.eoi_token_id]));
  const vocab = config.text.vocab_size;
  const bad = ids.find((t) => !Number.isInteger(t) || t < 0 || t >= vocab);
  if (bad !== undefined) throw new UsageError(`token id ${bad} is outside the vocabulary (vocab_size ${vocab})`);
  const media = {
    pixel_values: mx.fromBytes(hostBytes(out.pixel_values), out.pixel_values.shape, out.pixel_values.dtype),
    image_position_ids: mx.fromBytes(hostBytes(out.image_position_ids), out.image_position_ids.shape, out.image_position_ids.dtype),
  };
  return { ids, media, items, files, ...(tokenized ? { tokenized } : {}) };
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
  return { id: "parity-cli-unified", kind: "generate", prompt: plan.items, media: plan.files, prefill_step_size: prefillStepSize, max_tokens: steps };
}
