// `npm run generate -- --model <dir> --prompt "..."`: streams text from the TS model alone and
// ends with mlx_lm.generate's statistics (prompt and generation tok/s, peak memory).
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { type GenerateModel, generate } from "../model/generate.ts";
import { loadGenerationModel, mediaGenerationModel } from "../model/runtime.ts";
import { checkCheckpoint, loadMultimodalModel, MediaError } from "../model/gemma4/index.ts";
import { disposeMediaInputs } from "../model/gemma4/gemma4.ts";
import { type FlagSpec, helpText, type Parsed, parseArgs, runMain, UsageError } from "./args.ts";
import { checkMediaCheckpoint, MEDIA_FLAGS, mediaPlan, type PreparedMedia, VIDEO_FLAGS, wantsMedia } from "./media.ts";
import { checkUnifiedCheckpoint, isUnifiedCheckpoint, unifiedFaceModel, unifiedMediaPlan } from "./unified_face.ts";
import { applyDeviceFlag, DEVICE_FLAG } from "./device.ts";
import { checkPromptLength, inspectCheckpoint, resolvePrompt } from "./inputs.ts";
import { checkSpeculativeFlags, faceLoadPromptCache, modelDirOf, SPECULATIVE_FLAGS, speculativeFaceStream } from "./speculative_face.ts";
import { BATCH_FLAGS, batchPlan, isBatch, runBatch } from "./generate_batch.ts";
import { KV_QUANT_FLAGS, kvQuantPlan } from "./kv_quant_flags.ts";
import { kvBatchPlan, runKvBatch } from "./kv_quant_batch_generate.ts";
import { makeKvQuantizer } from "../model/cache/kv_quantize.ts";

export const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "a local Gemma 4 checkpoint (required)" },
  { name: "prompt", kind: "string", valueName: "text", help: "prompt text, tokenized with the checkpoint's tokenizer.json (repeat for a batch)", multiple: true },
  { name: "chat", kind: "bool", help: "apply the checkpoint's chat template to --prompt" },
  { name: "tokens", kind: "string", valueName: "1,2,3", help: "prompt token ids instead of --prompt (output is printed as ids; repeat for a batch)", multiple: true },
  { name: "max-tokens", kind: "int", valueName: "N", help: "tokens to generate", default: 100 },
  { name: "temp", kind: "number", valueName: "T", help: "sampling temperature (0 = greedy)", default: 0 },
  { name: "top-p", kind: "number", valueName: "P", help: "nucleus sampling threshold (0 = off)", default: 0 },
  { name: "top-k", kind: "int", valueName: "K", help: "top-k sampling (0 = off)", default: 0 },
  { name: "min-p", kind: "number", valueName: "P", help: "min-p sampling (0 = off)", default: 0 },
  { name: "seed", kind: "int", valueName: "S", help: "random seed (mx.random.seed)" },
  { name: "prefill-step-size", kind: "int", valueName: "N", help: "prefill chunk size", default: 2048 },
  ...MEDIA_FLAGS,
  ...VIDEO_FLAGS,
  DEVICE_FLAG,
  ...SPECULATIVE_FLAGS,
  ...BATCH_FLAGS,
  ...KV_QUANT_FLAGS,
  { name: "verbose", kind: "bool", help: "stack traces on errors" },
  { name: "help", kind: "bool", help: "show this help" },
];

interface Detokenizer {
  decode(ids: number[], opts?: { skip_special_tokens?: boolean }): string;
}

async function loadTokenizer(dir: string): Promise<Detokenizer | null> {
  const p = join(dir, "tokenizer.json");
  if (!existsSync(p)) return null;
  const cfgPath = join(dir, "tokenizer_config.json");
  const { Tokenizer } = await import("@huggingface/tokenizers");
  return new Tokenizer(JSON.parse(readFileSync(p, "utf8")), existsSync(cfgPath) ? JSON.parse(readFileSync(cfgPath, "utf8")) : {});
}

function eosIds(dir: string, info: Record<string, unknown>): number[] {
  const ids = new Set<number>();
  const add = (v: unknown) => {
    if (typeof v === "number") ids.add(v);
    else if (Array.isArray(v)) for (const x of v) if (typeof x === "number") ids.add(x);
  };
  add(info.eos_token_id);
  const gen = join(dir, "generation_config.json");
  if (existsSync(gen)) add((JSON.parse(readFileSync(gen, "utf8")) as Record<string, unknown>).eos_token_id);
  return [...ids];
}

/** Everything checked before the model is loaded (flags, device, checkpoint without its weights, prompt). */
export async function generatePlan(argv: readonly string[]) {
  const a: Parsed = parseArgs(argv, FLAGS);
  if (a.help) return null;
  checkSpeculativeFlags(a);
  const batch = isBatch(a);
  for (const f of ["draft-model", "prompt-cache-file"]) if (batch && a[f] !== undefined) throw new UsageError(`--${f} does not apply to a batch (several prompts)`);
  const dev = applyDeviceFlag(a.device);
  const dir = modelDirOf(a);
  const info = inspectCheckpoint(dir);
  if (batch && wantsMedia(a)) throw new UsageError("--image / --audio / --video do not apply to a batch (several prompts)");
  // several prompts with --kv-bits: mlx-vlm's batch path (mlx-lm's batch_generate has no working quantized cache for Gemma 4)
  if (batch && a["kv-bits"] !== undefined) return { a, dev, dir, info, batch: null, kvBatch: await kvBatchPlan(dir, a, info), media: null };
  if (batch) return { a, dev, dir, info, batch: await batchPlan(dir, a, info), media: null };
  for (const k of ["prompt", "tokens"]) if (Array.isArray(a[k])) a[k] = (a[k] as string[])[0];
  // --image / --audio: the TS Gemma4Processor (mlx-vlm's, ported) gives the expanded prompt and
  // the media arrays, checked against the model's rules
  if (wantsMedia(a)) for (const f of ["draft-model", "prompt-cache-file"]) if (a[f] !== undefined) throw new UsageError(`--${f} does not apply to --image / --audio / --video runs`);
  // a gemma4_unified checkpoint: its own processor and model (parity/unified_face.ts)
  const unified = wantsMedia(a) && isUnifiedCheckpoint(dir) ? await unifiedMediaPlan(dir, a) : null;
  const media = wantsMedia(a) && !unified ? await mediaPlan(dir, a) : null;
  const prompt = unified ? unified.ids : media ? media.ids : await resolvePrompt(dir, a);
  const maxTokens = Number(a["max-tokens"]);
  if (maxTokens < 1) throw new UsageError("--max-tokens must be at least 1");
  const temp = Number(a.temp);
  if (temp < 0) throw new UsageError("--temp must be >= 0");
  for (const k of ["top-p", "min-p"] as const) if (Number(a[k]) < 0 || Number(a[k]) > 1) throw new UsageError(`--${k} must be between 0 and 1`);
  if (Number(a["top-k"]) < 0) throw new UsageError("--top-k must be >= 0");
  if (Number(a["prefill-step-size"]) < 1) throw new UsageError("--prefill-step-size must be at least 1");
  if (a.seed !== undefined && (Number(a.seed) < 0 || !Number.isSafeInteger(Number(a.seed)))) throw new UsageError("--seed must be a non-negative integer");
  const vocab = Number(info.text.vocab_size ?? 262144);
  const bad = prompt.find((t) => t >= vocab);
  if (bad !== undefined) throw new UsageError(`token id ${bad} is outside the vocabulary (vocab_size ${vocab})`);
  checkPromptLength(prompt, maxTokens, info);
  const otherMode = media || unified ? "--image / --audio runs" : a["draft-model"] !== undefined ? "--draft-model" : a["prompt-cache-file"] !== undefined ? "--prompt-cache-file" : null;
  const kvQuant = kvQuantPlan(a, info.text, { prompt: prompt.length, maxTokens, otherMode });
  if (media) checkMediaCheckpoint(dir);
  else if (unified) checkUnifiedCheckpoint(dir);
  else checkCheckpoint(dir);
  return { a, dev, dir, info, prompt, maxTokens, temp, media, unified, batch: null, kvQuant };
}

/** The multimodal model on the prepared media: mlx-vlm's generate_step from the merged embeddings. */
function mediaModel(dir: string, prepared: PreparedMedia): { generate: GenerateModel; chunked: boolean } {
  try {
    const { model } = loadMultimodalModel(dir);
    return mediaGenerationModel(model, prepared);
  } catch (e) {
    if (e instanceof MediaError) throw new UsageError(e.message);
    throw e;
  } finally {
    disposeMediaInputs(prepared.media);
  }
}

async function main(argv: string[]): Promise<number> {
  const plan = await generatePlan(argv);
  if (plan === null) {
    process.stdout.write(
      helpText(
        "npm run generate -- --model <dir> (--prompt \"text\" | --tokens 1,2,3) [--image a.png] [--audio b.wav] [options]",
        "Generates text with the TypeScript Gemma 4 model, no oracle (mlx-lm's generate_step; with media, mlx-vlm's, after the TS port of its Gemma4Processor). Several --prompt / --tokens, or --prompt-file, run a batch (mlx-lm's batch_generate; with --kv-bits, mlx-vlm's batch path with quantized KV caches, greedy).",
        FLAGS,
      ),
    );
    return 0;
  }
  if (plan.kvBatch) return runKvBatch(plan.kvBatch, plan.dev, { loadTokenizer });
  if (plan.batch) {
    const rootCfg = JSON.parse(readFileSync(join(plan.dir, "config.json"), "utf8")) as Record<string, unknown>;
    return runBatch(plan.batch, plan.dev, { loadTokenizer, eosIds: (d) => eosIds(d, { ...plan.info.text, ...rootCfg }) });
  }
  const { a, dev, dir, info, prompt, maxTokens, temp, media, unified, kvQuant } = plan;

  const tokenizer = typeof a.prompt === "string" ? await loadTokenizer(dir) : null;
  const mm = media ? mediaModel(dir, media) : unified ? unifiedFaceModel(dir, unified) : null;
  const loaded = mm ? null : loadGenerationModel(dir);
  const model = mm ? mm.generate : loaded!.model;
  const promptCache = loaded && typeof a["prompt-cache-file"] === "string" ? faceLoadPromptCache(a["prompt-cache-file"], dir, loaded.loaded) : undefined;
  const rootCfg = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  const eos = eosIds(dir, { ...info.text, ...rootCfg });

  mx.resetPeakMemory();
  const out: number[] = [];
  let printed = "";
  let tic = performance.now();
  let promptTps = 0;
  let n = 0;
  const opts = {
    maxTokens,
    prefillStepSize: Number(a["prefill-step-size"]),
    eosTokenIds: eos,
    samplerOptions: { temp, topP: Number(a["top-p"]), topK: Number(a["top-k"]), minP: Number(a["min-p"]) },
    seed: typeof a.seed === "number" ? a.seed : undefined,
    promptCache,
    quantizeCache: kvQuant ? (makeKvQuantizer(kvQuant) ?? undefined) : undefined,
  };
  const face = loaded ? speculativeFaceStream(a, dir, loaded.loaded, model, prompt, opts) : null;
  process.stdout.write("==========\n");
  const stream = face ? face.tokens : generate(model, prompt, { ...opts, chunkedPrefill: mm?.chunked ?? true });
  // a KV quantization error mid-run (mlx-vlm's own failure point) is bad input: exit 2 after the tokens so far
  const guarded = (async function* () {
    try {
      yield* stream;
    } catch (e) {
      if (e instanceof Error && e.name === "KVQuantError") throw new UsageError(e.message);
      throw e;
    }
  })();
  for await (const t of guarded) {
    if (t.n === 0) {
      promptTps = prompt.length / ((performance.now() - tic) / 1000);
      tic = performance.now();
    }
    n = t.n;
    if (t.finishReason === "stop") break;
    out.push(t.token);
    if (tokenizer) {
      // Print the newly completed text (decoding the whole sequence keeps multi-byte pieces intact).
      const text = tokenizer.decode(out, { skip_special_tokens: true });
      if (text.startsWith(printed)) process.stdout.write(text.slice(printed.length));
      printed = text;
    } else process.stdout.write(`${t.token} `);
  }
  const genTps = (n + 1) / ((performance.now() - tic) / 1000);
  process.stdout.write("\n==========\n");
  process.stdout.write(`Prompt: ${prompt.length} tokens, ${promptTps.toFixed(3)} tokens-per-sec\n`);
  process.stdout.write(`Generation: ${n + 1} tokens, ${genTps.toFixed(3)} tokens-per-sec\n`);
  const stats = face?.stats();
  if (stats) process.stdout.write(`${stats}\n`);
  process.stdout.write(`Peak memory: ${(mx.getPeakMemory() / 1e9).toFixed(3)} GB\n`);
  process.stdout.write(`Device: ${dev.device} (${dev.backend} backend${dev.gpu ? `, ${dev.gpu}` : ""})\n`);
  face?.dispose();
  for (const c of promptCache ?? []) c.dispose();
  return 0;
}

if (import.meta.main) runMain(main);
