// The batch mode of `npm run generate`: several prompts (repeated --prompt or --tokens, or a
// --prompt-file with one prompt per line) through model/generate_batch.ts's batch_generate, then
// each completion and mlx-lm's batch_generate statistics (prompt and generation tok/s, peak
// memory). Flag names are mlx-lm's (BatchGenerator's options as flags). batchPlan makes every
// check before the model loads (generate_cli's generatePlan calls it), runBatch does the work.
import { existsSync, readFileSync, statSync } from "node:fs";
import * as mx from "@mlx-bun/mlx";
import { batchGenerate, batchModel, type BatchTokenizer } from "../model/generate_batch.ts";
import { checkCheckpoint, loadModel } from "../model/gemma4/index.ts";
import { makeSampler } from "../model/sample.ts";
import { type FlagSpec, type Parsed, UsageError } from "./args.ts";
import type { DeviceInfo } from "./device.ts";
import { type CheckpointInfo, checkPromptLength, parseTokenList, tokenizePrompt } from "./inputs.ts";

export const BATCH_FLAGS: FlagSpec[] = [
  { name: "prompt-file", kind: "string", valueName: "path", help: "batch mode: a text file with one prompt per line" },
  { name: "prefill-batch-size", kind: "int", valueName: "N", help: "batch mode: sequences prefilled together (BatchGenerator's prefill_batch_size)", default: 8 },
  { name: "completion-batch-size", kind: "int", valueName: "N", help: "batch mode: sequences decoded together (BatchGenerator's completion_batch_size)", default: 32 },
];

const list = (v: unknown): string[] => (Array.isArray(v) ? v : typeof v === "string" ? [v] : []);

/** Batch mode: more than one --prompt / --tokens, or a --prompt-file. */
export function isBatch(a: Parsed): boolean {
  return a["prompt-file"] !== undefined || list(a.prompt).length > 1 || list(a.tokens).length > 1;
}

/** The prompts of a batch run as token ids, validated (one UsageError naming the prompt). */
async function batchPrompts(dir: string, a: Parsed, info: CheckpointInfo, maxTokens: number): Promise<{ ids: number[][]; text: boolean }> {
  const texts = list(a.prompt);
  const tokens = list(a.tokens);
  const file = a["prompt-file"];
  if (tokens.length && (texts.length || file !== undefined)) throw new UsageError("give prompts as text (--prompt, --prompt-file) or as --tokens, not both");
  if (a.chat && tokens.length) throw new UsageError("--chat needs text prompts");
  if (typeof file === "string") {
    if (!existsSync(file) || !statSync(file).isFile()) throw new UsageError(`--prompt-file: no such file: ${file}`);
    texts.push(...readFileSync(file, "utf8").split(/\r?\n/).filter((l) => l.trim().length > 0));
  }
  const ids = tokens.length ? tokens.map(parseTokenList) : await Promise.all(texts.map((t) => tokenizePrompt(dir, t, a.chat === true)));
  if (ids.length === 0) throw new UsageError(`the batch is empty: ${typeof file === "string" ? `${file} has no non-empty line` : "give at least one prompt"}`);
  const vocab = Number(info.text.vocab_size ?? 262144);
  ids.forEach((p, i) => {
    if (p.length === 0) throw new UsageError(`prompt ${i + 1} is empty`);
    const bad = p.find((t) => t >= vocab);
    if (bad !== undefined) throw new UsageError(`prompt ${i + 1}: token id ${bad} is outside the vocabulary (vocab_size ${vocab})`);
    try {
      checkPromptLength(p, maxTokens, info);
    } catch (e) {
      throw new UsageError(`prompt ${i + 1}: ${(e as Error).message}`);
    }
  });
  return { ids, text: tokens.length === 0 };
}

export interface BatchPlan {
  a: Parsed;
  dir: string;
  ids: number[][];
  text: boolean;
  maxTokens: number;
  temp: number;
}

/** Every check of a batch run before the model is loaded (flags, prompts, the checkpoint's weights). */
export async function batchPlan(dir: string, a: Parsed, info: CheckpointInfo): Promise<BatchPlan> {
  const maxTokens = Number(a["max-tokens"]);
  for (const k of ["max-tokens", "prefill-step-size", "prefill-batch-size", "completion-batch-size"]) {
    if (Number(a[k]) < 1) throw new UsageError(`--${k} must be at least 1`);
  }
  const temp = Number(a.temp);
  if (temp < 0) throw new UsageError("--temp must be >= 0");
  for (const k of ["top-p", "min-p"] as const) if (Number(a[k]) < 0 || Number(a[k]) > 1) throw new UsageError(`--${k} must be between 0 and 1`);
  if (Number(a["top-k"]) < 0) throw new UsageError("--top-k must be >= 0");
  if (a.seed !== undefined && (Number(a.seed) < 0 || !Number.isSafeInteger(Number(a.seed)))) throw new UsageError("--seed must be a non-negative integer");
  const { ids, text } = await batchPrompts(dir, a, info, maxTokens);
  checkCheckpoint(dir);
  return { a, dir, ids, text, maxTokens, temp };
}

export interface BatchHelpers {
  loadTokenizer(dir: string): Promise<{ decode(ids: number[], opts?: { skip_special_tokens?: boolean }): string } | null>;
  eosIds(dir: string): number[];
}

/** Runs the batch; prints every completion, then the statistics and the device. */
export async function runBatch(plan: BatchPlan, dev: DeviceInfo, helpers: BatchHelpers): Promise<number> {
  const { a, dir, ids, text, maxTokens, temp } = plan;
  const tokenizer = text ? await helpers.loadTokenizer(dir) : null;
  const tok: BatchTokenizer = {
    eosTokenIds: helpers.eosIds(dir),
    decode: (t) => (tokenizer ? tokenizer.decode(t, { skip_special_tokens: true }) : t.join(" ")),
  };
  const loaded = loadModel(dir);
  if (typeof a.seed === "number") mx.random.seed(a.seed);
  const sampler = makeSampler({ temp, topP: Number(a["top-p"]), topK: Number(a["top-k"]), minP: Number(a["min-p"]) });
  mx.resetPeakMemory();
  try {
    const r = batchGenerate(batchModel(loaded), tok, ids, {
      maxTokens,
      sampler,
      prefillStepSize: Number(a["prefill-step-size"]),
      prefillBatchSize: Number(a["prefill-batch-size"]),
      completionBatchSize: Number(a["completion-batch-size"]),
      onFinish: (i, n) => process.stderr.write(`[batch_generate] Finished processing ${i}/${n} ...${i === n ? "\n" : "\r"}`),
    });
    process.stdout.write("==========\n");
    r.texts.forEach((t, i) => process.stdout.write(`[${i + 1}] ${t}\n`));
    process.stdout.write("==========\n");
    const s = r.stats;
    process.stdout.write(`[batch_generate] Prompt: ${s.promptTokens} tokens, ${s.promptTps.toFixed(3)} tokens-per-sec\n`);
    process.stdout.write(`[batch_generate] Generation: ${s.generationTokens} tokens, ${s.generationTps.toFixed(3)} tokens-per-sec\n`);
    process.stdout.write(`[batch_generate] Peak memory: ${s.peakMemory.toFixed(3)} GB\n`);
    process.stdout.write(`Device: ${dev.device} (${dev.backend} backend${dev.gpu ? `, ${dev.gpu}` : ""})\n`);
  } finally {
    sampler.dispose?.();
    loaded.model.dispose();
  }
  return 0;
}
