// The speculative-decoding and prompt-cache parts of `npm run generate`, with the reference
// tools' flag names:
//   --draft-model DIR        mlx_lm.generate's: a draft Gemma 4 checkpoint (speculative decoding),
//                            or, as mlx_vlm.generate auto-detects from its model_type, a
//                            gemma4_assistant / gemma4_unified_assistant drafter (MTP) or a
//                            gemma4_dflash / gemma4_dspark drafter (DFlash round loop)
//   --num-draft-tokens N     mlx_lm.generate's (default 3)
//   --draft-kind mtp|dflash  mlx_vlm.generate's (a drafter's model_type overrides it, as there)
//   --draft-block-size N     mlx_vlm.generate's: tokens per round instead of the drafter's block_size
//   --prompt-cache-file F    mlx_lm.generate's: continue from a cache file; the prompt is the suffix
// Every bad input is one clear error (UsageError, exit 2; or a load error naming file and key).
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { createHash } from "node:crypto";
import type { KVCacheLike } from "../model/cache/index.ts";
import { checkPromptCacheFits, loadPromptCache, PromptCacheError } from "../model/cache/prompt_cache.ts";
import type { GenerateModel, GenerationResponse } from "../model/generate.ts";
import { speculativeGenerateStep } from "../model/generate_speculative.ts";
import type { LoadedModel } from "../model/gemma4/index.ts";
import { loadGenerationModel } from "../model/runtime.ts";
import type { SamplerOptions } from "../model/sample.ts";
import { type Gemma4AssistantDraftModel, loadAssistant } from "../model/speculative/drafters/gemma4_assistant/gemma4_assistant.ts";
import { mtpGenerateStep } from "../model/speculative/mtp.ts";
import { dflashGenerateStep } from "../model/speculative/dflash.ts";
import type { SpeculativeSampling } from "../model/speculative/sampling.ts";
import { type DrafterKind, drafterModelType, expectedDrafterKind, loadDFlashDrafter } from "../model/speculative/drafters/index.ts";
import { type FlagSpec, type Parsed, UsageError } from "./args.ts";
import { inspectCheckpoint } from "./inputs.ts";

export const SPECULATIVE_FLAGS: FlagSpec[] = [
  { name: "draft-model", kind: "string", valueName: "dir", help: "speculative decoding: a draft Gemma 4 checkpoint with the target's vocabulary (mlx-lm), or a gemma4_assistant / gemma4_unified_assistant (MTP) or gemma4_dflash / gemma4_dspark (DFlash) drafter, as mlx-vlm" },
  { name: "num-draft-tokens", kind: "int", valueName: "N", help: "draft tokens per round with a draft checkpoint", default: 3 },
  { name: "draft-kind", kind: "string", valueName: "mtp|dflash", help: "drafter family, as mlx_vlm.generate (default: from the drafter's model_type, which overrides it)" },
  { name: "draft-block-size", kind: "int", valueName: "N", help: "MTP / DFlash: tokens per round (drafts + 1) instead of the drafter's block_size" },
  { name: "prompt-cache-file", kind: "string", valueName: "file", help: "continue from this prompt-cache file (npm run cache-prompt, or mlx_lm.cache_prompt); the prompt is the suffix" },
];

/** The model directory: --model, or the "model" a prompt-cache file was written for (as mlx_lm.generate). */
export function modelDirOf(a: Parsed): string {
  if (a.model !== undefined) return resolve(String(a.model));
  if (typeof a["prompt-cache-file"] === "string") {
    const { metadata, cache } = loadPromptCache(resolve(a["prompt-cache-file"]));
    for (const c of cache) c.dispose();
    if (metadata.model) return resolve(metadata.model);
  }
  throw new UsageError("--model <dir> is required (see --help)");
}

/** Checks the flags that need no model; call before loading anything. */
export function checkSpeculativeFlags(a: Parsed): void {
  const k = Number(a["num-draft-tokens"]);
  if (!Number.isInteger(k) || k < 1) throw new UsageError(`--num-draft-tokens must be at least 1, got ${a["num-draft-tokens"]}`);
  if (a["draft-kind"] !== undefined && a["draft-kind"] !== "mtp" && a["draft-kind"] !== "dflash") throw new UsageError(`--draft-kind ${a["draft-kind"]} is not supported (this port has mtp and dflash)`);
  if (a["draft-block-size"] !== undefined && Number(a["draft-block-size"]) < 2) throw new UsageError("--draft-block-size must be at least 2 (one draft token per round)");
  for (const f of ["draft-kind", "draft-block-size"]) if (a[f] !== undefined && a["draft-model"] === undefined) throw new UsageError(`--${f} needs --draft-model`);
}

/** The prompt cache of --prompt-cache-file, checked against the model it is loaded for. */
export function faceLoadPromptCache(file: string, dir: string, loaded: LoadedModel): KVCacheLike[] {
  const path = resolve(file);
  const { cache, metadata } = loadPromptCache(path);
  try {
    if (metadata.model !== undefined && resolve(metadata.model) !== dir) {
      throw new PromptCacheError(path, "0.model", `was written for the model ${metadata.model}, not ${dir} (mlx_lm.generate refuses this too)`);
    }
    const fresh = loaded.text.makeCache();
    try {
      const shapes = fresh.map((_, i) => ({ heads: loaded.text.layers[i]!.self_attn.n_kv_heads, headDim: loaded.text.layers[i]!.self_attn.head_dim }));
      checkPromptCacheFits(path, cache, fresh, shapes);
    } finally {
      for (const c of fresh) c.dispose();
    }
    return cache;
  } catch (e) {
    for (const c of cache) c.dispose();
    throw e;
  }
}

/** A tokenizer.json's vocabulary (token → id and the added tokens), hashed, or null without one. */
function tokenizerFingerprint(dir: string): string | null {
  const p = join(dir, "tokenizer.json");
  if (!existsSync(p)) return null;
  let t: { model?: { vocab?: unknown }; added_tokens?: { id: number; content: string }[] };
  try {
    t = JSON.parse(readFileSync(p, "utf8"));
  } catch (e) {
    throw new UsageError(`${p} is not valid JSON: ${(e as Error).message}`);
  }
  const vocab = t.model?.vocab;
  const entries = Array.isArray(vocab) ? vocab.map((v, i) => [JSON.stringify(v), i]) : Object.entries((vocab ?? {}) as Record<string, number>).sort(([a], [b]) => (a < b ? -1 : 1));
  const added = (t.added_tokens ?? []).map((x) => [x.content, x.id]);
  return createHash("sha256").update(JSON.stringify([entries, added])).digest("hex");
}

export interface FaceStream {
  tokens: AsyncGenerator<GenerationResponse | { token: number; n: number; finishReason: "stop" | "length" | null }>;
  /** mlx-vlm's speculative statistics line (rounds, accepted drafts, acceptance rate). */
  stats(): string | null;
  dispose(): void;
}

interface StreamOptions {
  maxTokens: number;
  prefillStepSize: number;
  eosTokenIds: readonly number[];
  samplerOptions: SamplerOptions;
  seed?: number;
  promptCache?: KVCacheLike[];
}

/** The options both drafter round loops take from the face. */
interface LoopOptions {
  maxTokens: number;
  draftBlockSize: number | undefined;
  sampling: SpeculativeSampling;
  seed: number | undefined;
  onRound: (r: { accepted: number; drafted: readonly number[] }) => void;
}

/** mlx_vlm's _format_speculative_stats. */
function statsLine(rounds: number, accepted: number, drafted: number): string | null {
  if (rounds === 0) return null;
  const meanAccept = accepted / rounds;
  return (
    `Speculative decoding: ${((accepted + rounds) / rounds).toFixed(2)} accepted tokens/round ` +
    `(${meanAccept.toFixed(2)} accepted drafts/round, ${drafted ? ((100 * accepted) / drafted).toFixed(1) : "0.0"}% of drafted, ` +
    `avg draft ${(drafted / rounds).toFixed(2)}) over ${rounds} rounds`
  );
}

async function* withStops<T extends { token: number }>(inner: AsyncGenerator<T>, eos: ReadonlySet<number>, maxTokens: number): AsyncGenerator<{ token: number; n: number; finishReason: "stop" | "length" | null }> {
  let n = 0;
  try {
    for await (const t of inner) {
      const stop = eos.has(t.token);
      yield { token: t.token, n, finishReason: stop ? "stop" : n + 1 === maxTokens ? "length" : null };
      n++;
      if (stop || n === maxTokens) return;
    }
  } finally {
    await inner.return(undefined);
  }
}

/**
 * The token stream of --draft-model (speculative or MTP), or null without it. Loads and checks
 * the drafter against the target first.
 */
export function speculativeFaceStream(a: Parsed, dir: string, loaded: LoadedModel, model: GenerateModel, prompt: readonly number[], o: StreamOptions): FaceStream | null {
  if (a["draft-model"] === undefined) return null;
  const draftDir = resolve(String(a["draft-model"]));
  if (!existsSync(join(draftDir, "config.json"))) throw new UsageError(`--draft-model ${draftDir} has no config.json`);
  let rawConfig: Record<string, unknown>;
  try {
    rawConfig = JSON.parse(readFileSync(join(draftDir, "config.json"), "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new UsageError(`--draft-model ${draftDir}: config.json is not valid JSON: ${(e as Error).message}`);
  }
  const draftType = String(rawConfig.model_type ?? "");
  // resolve_drafter_kind: the drafter's (normalized) model_type decides, --draft-kind only without one
  const normalized = drafterModelType(rawConfig);
  const kind: DrafterKind | null = expectedDrafterKind(normalized, rawConfig) ?? (normalized?.endsWith("_dflash") ? "dflash" : null) ?? ((a["draft-kind"] as DrafterKind | undefined) ?? null);
  const eos = new Set(o.eosTokenIds);
  let rounds = 0;
  let accepted = 0;
  let drafted = 0;
  const blockSize = a["draft-block-size"] === undefined ? undefined : Number(a["draft-block-size"]);
  const MTP_TYPES = ["gemma4_assistant", "gemma4_unified_assistant"];
  const DFLASH_TYPES = ["gemma4_dflash", "qwen3_dflash", "gemma4_dspark"];
  // A drafter's round loop as this face's stream: the sampling flags as mlx_vlm.generate passes them
  // (make_sampler on the global key, seeded by --seed), the statistics line from its rounds, and
  // its argument errors (the pairing, the sampling options) as bad input, exit 2.
  const loopStream = (drafter: { dispose(): void }, start: (common: LoopOptions) => AsyncGenerator<{ token: number }>): FaceStream => {
    try {
      const inner = start({
        maxTokens: o.maxTokens,
        draftBlockSize: blockSize,
        sampling: { temp: o.samplerOptions.temp ?? 0, topP: o.samplerOptions.topP, topK: o.samplerOptions.topK, minP: o.samplerOptions.minP },
        seed: o.seed,
        onRound: (r) => {
          rounds++;
          accepted += r.accepted;
          drafted += r.drafted.length;
        },
      });
      return { tokens: withStops(inner, eos, o.maxTokens), stats: () => statsLine(rounds, accepted, drafted), dispose: () => drafter.dispose() };
    } catch (e) {
      drafter.dispose();
      throw new UsageError(`--draft-model ${draftDir}: ${(e as Error).message}`);
    }
  };
  if (kind === "dflash" && normalized !== null && DFLASH_TYPES.includes(normalized)) {
    if (o.promptCache) throw new UsageError("--prompt-cache-file is not supported with a DFlash drafter");
    const drafter = loadDFlashDrafter(draftDir);
    return loopStream(drafter, (common) => dflashGenerateStep(loaded.text, drafter, prompt, common));
  }
  if (kind !== null && kind !== "mtp" && a["draft-kind"] !== "mtp") {
    throw new UsageError(`--draft-model ${draftDir} is a ${normalized} drafter (kind ${kind}), which this port does not run (it has gemma4_assistant, gemma4_unified_assistant, gemma4_dflash and gemma4_dspark)`);
  }
  if (MTP_TYPES.includes(draftType) || kind === "mtp" || a["draft-kind"] === "mtp") {
    if (!MTP_TYPES.includes(draftType)) throw new UsageError(`--draft-kind mtp needs a gemma4_assistant or gemma4_unified_assistant drafter, ${draftDir} is a ${draftType || "(no model_type)"}`);
    if (o.promptCache) throw new UsageError("--prompt-cache-file is not supported with an MTP drafter");
    const drafter: Gemma4AssistantDraftModel = loadAssistant(draftDir);
    return loopStream(drafter, (common) => mtpGenerateStep(loaded.text, drafter, prompt, { ...common, prefillStepSize: o.prefillStepSize }));
  }
  // A draft checkpoint: the same vocabulary and tokenizer as the target (mlx_lm.generate's check).
  const tInfo = inspectCheckpoint(dir);
  const dInfo = inspectCheckpoint(draftDir);
  const tv = Number(tInfo.text.vocab_size ?? 262144);
  const dv = Number(dInfo.text.vocab_size ?? 262144);
  if (tv !== dv) throw new UsageError(`the draft model's vocabulary (${dv} tokens, ${draftDir}) differs from the target's (${tv}): speculative decoding needs the target's tokenizer`);
  const [tf, df] = [tokenizerFingerprint(dir), tokenizerFingerprint(draftDir)];
  if (tf !== null && df !== null && tf !== df) throw new UsageError(`the draft model's tokenizer.json (${draftDir}) maps tokens to other ids than the target's: speculative decoding needs the target's tokenizer`);
  const { loaded: dLoaded, model: draft } = loadGenerationModel(draftDir);
  const inner = speculativeGenerateStep(model, draft, prompt, {
    numDraftTokens: Number(a["num-draft-tokens"]),
    maxTokens: o.maxTokens,
    prefillStepSize: o.prefillStepSize,
    samplerOptions: o.samplerOptions,
    seed: o.seed,
    promptCache: o.promptCache,
    onRound: (r) => {
      rounds++;
      accepted += r.accepted;
      drafted += r.drafted.length;
    },
  });
  return { tokens: withStops(inner, eos, o.maxTokens), stats: () => statsLine(rounds, accepted, drafted), dispose: () => dLoaded.model.dispose() };
}
