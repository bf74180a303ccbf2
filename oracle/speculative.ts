// The comparison core of speculative decoding and prompt-cache files, shared by the suites
// (suites/speculative) and the parity command (`npm run parity -- --mode speculative|mtp`):
// each function runs the TS side and its oracle on the same checkpoints and inputs and
// compares bytes.
//
//   speculativeParity   TS speculativeGenerateStep vs mlx-lm speculative_generate_step (inside
//                       every cache's window: tokens, logprobs, from_draft, final caches), and
//                       vs plain greedy generate_step (TS, and mlx-lm's) at every length;
//                       mlx-lm's own divergence from greedy is reported, not hidden
//   mtpParity           TS mtpGenerateStep vs mlx-vlm's MTP rounds, round by round: block size,
//                       drafted tokens, drafter logits, accepted count, target logits at each
//                       walked position, every cache after the rollback
//   exactVerifyParity   Gemma4ExactSpeculativeVerifier vs mlx-vlm's
//   promptCacheInterop  a cache file written by TS continues in mlx-lm and the other way round
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { BufferedRotatingKVCache } from "../model/cache/buffered_rotating.ts";
import { KVCache, type KVCacheLike, RotatingKVCache } from "../model/cache/index.ts";
import { cachePrompt, loadPromptCache, savePromptCache } from "../model/cache/prompt_cache.ts";
import { generateStep, type GenerateModel } from "../model/generate.ts";
import { speculativeGenerateStep } from "../model/generate_speculative.ts";
import { type LoadedModel, loadModel } from "../model/gemma4/index.ts";
import { generationModel } from "../model/runtime.ts";
import { type Gemma4AssistantDraftModel, loadAssistant } from "../model/speculative/drafters/gemma4_assistant/gemma4_assistant.ts";
import { mtpGenerateStep, type MtpRound } from "../model/speculative/mtp.ts";
import { clampTemperature, positionedSequenceSampler, type SpeculativeSampling } from "../model/speculative/sampling.ts";
import { Gemma4ExactSpeculativeVerifier } from "../model/speculative/speculative_verifier.ts";
import type { NpyRecord } from "./npy.ts";
import { type NpyRef, type OracleClient } from "./client.ts";
import { compareRaw, formatDiff, type RawTensor, rawOf, rawOfNpy } from "./compare.ts";

// ------------------------------------------------------------------ plumbing

/** Every {npy, dtype} reference in a reply, read into an NpyRecord (and its file removed). */
export function readTree(oracle: OracleClient, v: unknown): any {
  if (Array.isArray(v)) return v.map((x) => readTree(oracle, x));
  if (v !== null && typeof v === "object") {
    if ("npy" in v && "dtype" in v) return oracle.readArray(v as NpyRef);
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, readTree(oracle, x)]));
  }
  return v;
}

export interface Mismatch {
  where: string;
  detail: string;
}

/** JSON with object keys sorted (key order carries no meaning here). */
function canonical(v: unknown): string {
  return JSON.stringify(v, (_k, x) => (x !== null && typeof x === "object" && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1))) : x));
}

/** Counts compared tensors and values; keeps the first mismatch. */
export class Tally {
  tensors = 0;
  values = 0;
  first: Mismatch | null = null;

  tensor(where: string, actual: RawTensor | null, expected: RawTensor | null): void {
    if (actual === null || expected === null) {
      this.value(where, actual === null ? "none" : "array", expected === null ? "none" : "array");
      return;
    }
    this.tensors++;
    const d = compareRaw(where, actual, expected);
    if (!d.equal && !this.first) this.first = { where, detail: formatDiff(d) };
  }

  value(where: string, actual: unknown, expected: unknown): void {
    this.values++;
    const a = canonical(actual);
    const e = canonical(expected);
    if (a !== e && !this.first) this.first = { where, detail: `${a} vs ${e}` };
  }

  get ok(): boolean {
    return this.first === null;
  }

  summary(): TallySummary {
    return { tensors: this.tensors, values: this.values, first: this.first };
  }
}

export interface TallySummary {
  tensors: number;
  values: number;
  first: Mismatch | null;
}

/** Loaded TS models, one per directory, disposed together. */
export class ModelPool {
  private readonly models = new Map<string, LoadedModel>();
  private readonly drafters = new Map<string, Gemma4AssistantDraftModel>();

  model(dir: string): LoadedModel {
    let m = this.models.get(dir);
    if (!m) this.models.set(dir, (m = loadModel(dir)));
    return m;
  }

  generation(dir: string): GenerateModel {
    return generationModel(this.model(dir));
  }

  drafter(dir: string): Gemma4AssistantDraftModel {
    let d = this.drafters.get(dir);
    if (!d) this.drafters.set(dir, (d = loadAssistant(dir)));
    return d;
  }

  dispose(): void {
    for (const m of this.models.values()) m.model.dispose();
    for (const d of this.drafters.values()) d.dispose();
    this.models.clear();
    this.drafters.clear();
  }
}

const raw = (a: MlxArray | null): RawTensor | null => (a === null ? null : rawOf(a));
const rawN = (r: NpyRecord | null | undefined): RawTensor | null => (r ? rawOfNpy(r) : null);

/** A cache's state in the oracle's vocabulary (for comparison with mlx-lm / mlx-vlm caches). */
function cacheFields(c: KVCacheLike): { type: string; ints: Record<string, number>; keys: MlxArray | null; values: MlxArray | null } {
  if (c instanceof BufferedRotatingKVCache) {
    return { type: "BufferedRotatingKVCache", ints: { offset: c.offset, idx: c.idx, start_position: c.startPosition, buffer_size: c.bufferSize, max_size: c.maxSize }, keys: c.keys, values: c.values };
  }
  if (c instanceof RotatingKVCache) return { type: "RotatingKVCache", ints: { offset: c.offset, keep: c.keep, max_size: c.maxSize, idx: c.idx }, keys: c.keys, values: c.values };
  if (c instanceof KVCache) return { type: "KVCache", ints: { offset: c.offset }, keys: c.keys, values: c.values };
  throw new Error(`no oracle form for a ${c.constructor.name}`);
}

/** Compares caches with the oracle's cache states (type, integers, raw buffers). */
export function compareCaches(t: Tally, where: string, caches: readonly KVCacheLike[], oracle: Record<string, any>[]): void {
  t.value(`${where} count`, caches.length, oracle.length);
  caches.forEach((c, i) => {
    const o = oracle[i];
    if (!o) return;
    const f = cacheFields(c);
    t.value(`${where}[${i}] type`, f.type, o.type);
    for (const [k, v] of Object.entries(f.ints)) if (k in o) t.value(`${where}[${i}].${k}`, v, o[k]);
    t.tensor(`${where}[${i}].keys`, raw(f.keys), rawN(o.keys));
    t.tensor(`${where}[${i}].values`, raw(f.values), rawN(o.values));
  });
}

function firstDiffIndex(a: readonly string[], b: readonly string[]): number | null {
  const n = Math.max(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return null;
}

const hexOf = (a: MlxArray | NpyRecord): string => Buffer.from(a instanceof mx.MlxArray ? a.toBytes() : a.data).toString("hex");

/** The smallest sliding window of a checkpoint (Infinity without sliding layers). */
function windowOf(m: LoadedModel): number {
  return m.text.args.layer_types.includes("sliding_attention") ? m.text.args.sliding_window : Infinity;
}

// ------------------------------------------------------------------ speculative (draft model)

export interface SpeculativeSpec {
  /** Target and draft checkpoint directories. */
  target: string;
  draft: string;
  prompt: number[];
  numDraftTokens: number;
  maxTokens: number;
  /** speculative_generate_step's prefill_step_size (default 512). */
  prefillStepSize?: number;
}

export interface SpeculativeResult {
  spec: SpeculativeSpec;
  /** Every cache of both models stays inside its window for the whole run (P + max_tokens + k < window). */
  inWindow: boolean;
  tokens: number[];
  rounds: number;
  drafted: number;
  accepted: number;
  /** TS speculative vs TS plain greedy generate_step: tokens and logprob bytes. */
  vsGreedy: TallySummary;
  /** TS speculative vs mlx-lm's speculative_generate_step (only inside the window, where mlx-lm is right). */
  vsOracle: TallySummary | null;
  /** mlx-lm's speculative run vs mlx-lm's plain greedy generate_step: first differing token / logprob index (null: none). */
  oracleVsGreedy: { token: number | null; logprobs: number | null };
  ms: number;
}

export async function speculativeParity(oracle: OracleClient, pool: ModelPool, spec: SpeculativeSpec): Promise<SpeculativeResult> {
  const t0 = performance.now();
  const prefill = spec.prefillStepSize ?? 512;
  const target = pool.model(spec.target);
  const draftLoaded = pool.model(spec.draft);
  const W = Math.min(windowOf(target), windowOf(draftLoaded));
  const inWindow = spec.prompt.length + spec.maxTokens + spec.numDraftTokens < W;
  const orc = readTree(
    oracle,
    await oracle.request("speculative", { checkpoint: spec.target, draft: spec.draft, prompt: spec.prompt, num_draft_tokens: spec.numDraftTokens, max_tokens: spec.maxTokens, prefill_step_size: prefill }),
  );
  const greedyOracle = await oracle.generate(spec.target, spec.prompt, { maxTokens: spec.maxTokens });

  // TS speculative, with explicit caches so that they can be compared after the final rewind.
  const model = pool.generation(spec.target);
  const draft = pool.generation(spec.draft);
  const cache = model.makeCache();
  const draftCache = draft.makeCache();
  const tokens: number[] = [];
  const lps: string[] = [];
  const fromDraft: boolean[] = [];
  let rounds = 0;
  let drafted = 0;
  let accepted = 0;
  const vsGreedy = new Tally();
  let vsOracle: Tally | null = null;
  try {
    const lpRecs: RawTensor[] = [];
    for await (const t of speculativeGenerateStep(model, draft, spec.prompt, {
      numDraftTokens: spec.numDraftTokens,
      maxTokens: spec.maxTokens,
      prefillStepSize: prefill,
      promptCache: cache,
      draftPromptCache: draftCache,
      onRound: (r) => {
        rounds++;
        drafted += r.drafted.length;
        accepted += r.accepted;
      },
    })) {
      tokens.push(t.token);
      lpRecs.push(rawOf(t.logprobs));
      lps.push(hexOf(t.logprobs));
      fromDraft.push(t.fromDraft);
    }
    // plain greedy, TS
    let i = 0;
    for await (const g of generateStep(model, spec.prompt, { maxTokens: spec.maxTokens })) {
      vsGreedy.value(`token ${i}`, tokens[i], g.token);
      vsGreedy.tensor(`logprobs ${i}`, lpRecs[i] ?? null, rawOf(g.logprobs));
      i++;
    }
    if (inWindow) {
      vsOracle = new Tally();
      vsOracle.value("tokens", tokens, orc.tokens);
      vsOracle.value("from_draft", fromDraft, orc.from_draft);
      lpRecs.forEach((r, k) => vsOracle!.tensor(`logprobs ${k}`, r, rawN(orc.logprobs[k])));
      compareCaches(vsOracle, "target cache", cache, orc.cache);
      compareCaches(vsOracle, "draft cache", draftCache, orc.draft_cache);
    }
  } finally {
    for (const c of [...cache, ...draftCache]) c.dispose();
  }
  const oTokens = (orc.tokens as number[]).map(String);
  const gTokens = greedyOracle.tokens.map(String);
  return {
    spec,
    inWindow,
    tokens,
    rounds,
    drafted,
    accepted,
    vsGreedy: vsGreedy.summary(),
    vsOracle: vsOracle?.summary() ?? null,
    oracleVsGreedy: { token: firstDiffIndex(oTokens, gTokens), logprobs: firstDiffIndex((orc.logprobs as NpyRecord[]).map(hexOf), greedyOracle.logprobs.map(hexOf)) },
    ms: performance.now() - t0,
  };
}

/**
 * The per-round bookkeeping of the round-by-round comparisons (MTP here, DFlash in
 * speculative_dflash.ts): counts rounds, accepted and drafted tokens, rounds with an accepted and
 * with a rejected draft, and pairs each TS round with the oracle's.
 */
export class RoundCounts implements RoundTotals {
  rounds = 0;
  acceptRounds = 0;
  rejectRounds = 0;
  accepted = 0;
  drafted = 0;

  /** Counts one TS round; its label and the oracle's round of the same index (null, recorded in `t`, when the oracle had none). */
  // the oracle's rounds are readTree's untyped JSON
  next(t: Tally, oracleRounds: readonly any[], accepted: number, drafted: number): { w: string; o: any } {
    const k = this.rounds++;
    const w = `round ${k}`;
    this.accepted += accepted;
    this.drafted += drafted;
    if (accepted > 0) this.acceptRounds++;
    if (accepted < drafted) this.rejectRounds++;
    const o = oracleRounds[k];
    if (!o) t.value(w, "a round", "no round");
    return { w, o: o ?? null };
  }

  totals(): RoundTotals {
    return { rounds: this.rounds, acceptRounds: this.acceptRounds, rejectRounds: this.rejectRounds, accepted: this.accepted, drafted: this.drafted };
  }
}

/** What a round-by-round comparison reports about its rounds. */
export interface RoundTotals {
  rounds: number;
  /** Rounds with at least one accepted draft / with a rejected draft. */
  acceptRounds: number;
  rejectRounds: number;
  accepted: number;
  drafted: number;
}

// ------------------------------------------------------------------ MTP

export interface MtpSpec {
  /** Target checkpoint (flat gemma4_text, tied) and gemma4_assistant drafter directories. */
  target: string;
  drafter: string;
  prompt: number[];
  maxTokens: number;
  draftBlockSize?: number;
  prefillStepSize?: number;
  /** Sampled run (mlx_vlm.generate --temp T --seed S and top_p / top_k / min_p); absent: greedy. */
  sampling?: SampledSpec;
}

/** A sampled run's options and seed. */
export type SampledSpec = SpeculativeSampling & { seed: number };

/** The oracle request's `sampling` (generate_step's names; the seed goes to mx.random.seed there), null when greedy. */
export const samplingRequest = (sp: SampledSpec | undefined) => (sp ? { temp: sp.temp, top_p: sp.topP ?? 0, top_k: sp.topK ?? 0, min_p: sp.minP ?? 0, seed: sp.seed, positioned: !!sp.positioned } : null);

/**
 * generate_step options for the plain run a speculative run must equal: greedy, or the same seed and
 * sampler (positioned: token n drawn with the key of position n). The caller disposes `sampler`.
 */
export const plainDecoding = (sp: SampledSpec | undefined) =>
  !sp ? {} : sp.positioned ? { sampler: positionedSequenceSampler(sp, sp.seed) } : { seed: sp.seed, samplerOptions: { temp: clampTemperature(sp.temp), topP: sp.topP ?? 0, topK: sp.topK ?? 0, minP: sp.minP ?? 0 } };

/** Runs plain generate_step as plainDecoding says and returns its tokens. */
export async function plainTokens(model: GenerateModel, prompt: readonly number[], maxTokens: number, sp: SampledSpec | undefined): Promise<number[]> {
  const o = plainDecoding(sp);
  const out: number[] = [];
  try {
    for await (const g of generateStep(model, prompt, { maxTokens, ...o })) out.push(g.token);
  } finally {
    if ("sampler" in o) o.sampler?.dispose?.();
  }
  return out;
}

export interface MtpResult extends RoundTotals {
  spec: MtpSpec;
  tokens: number[];
  /** TS vs mlx-vlm, round by round. */
  vsOracle: TallySummary;
  /** TS MTP output vs TS plain generate_step (tokens): greedy, or sampled with the same seed. */
  vsGreedy: TallySummary;
  /** The largest start_position of a BufferedRotatingKVCache seen (> 0: old keys were compacted away). */
  maxStartPosition: number;
  ms: number;
}

export async function mtpParity(oracle: OracleClient, pool: ModelPool, spec: MtpSpec): Promise<MtpResult> {
  const t0 = performance.now();
  const orc = readTree(
    oracle,
    await oracle.request("mtp", { checkpoint: spec.target, drafter: spec.drafter, prompt: spec.prompt, max_tokens: spec.maxTokens, draft_block_size: spec.draftBlockSize ?? null, prefill_step_size: spec.prefillStepSize ?? 2048, sampling: samplingRequest(spec.sampling) }),
  );
  const target = pool.model(spec.target).text;
  const drafter = pool.drafter(spec.drafter);
  const t = new Tally();
  const tokens: number[] = [];
  const n = new RoundCounts();
  let maxStartPosition = 0;
  const onRound = (r: MtpRound): void => {
    for (const c of r.cache) if (c instanceof BufferedRotatingKVCache) maxStartPosition = Math.max(maxStartPosition, c.startPosition);
    const { w, o } = n.next(t, orc.rounds, r.accepted, r.drafted.length);
    if (!o) return;
    t.value(`${w} block_size`, r.blockSize, o.block_size);
    t.value(`${w} drafted`, r.drafted, o.drafted);
    t.value(`${w} accepted`, r.accepted, o.accepted);
    t.value(`${w} drafter logits count`, r.draftLogits.length, (o.draft_logits ?? []).length);
    r.draftLogits.forEach((l, j) => t.tensor(`${w} drafter logits ${j}`, rawOf(l), rawN(o.draft_logits?.[j])));
    t.value(`${w} target logits count`, r.targetLogits.length, o.target_logits.length);
    r.targetLogits.forEach((l, j) => t.tensor(`${w} target logits ${j}`, rawOf(l), rawN(o.target_logits[j])));
    if (spec.sampling && !spec.sampling.positioned) t.tensor(`${w} random key`, r.rngKey ? rawOf(r.rngKey) : null, rawN(o.rng));
    compareCaches(t, `${w} cache`, r.cache, o.cache);
  };
  for await (const tok of mtpGenerateStep(target, drafter, spec.prompt, {
    maxTokens: spec.maxTokens,
    draftBlockSize: spec.draftBlockSize,
    prefillStepSize: spec.prefillStepSize,
    sampling: spec.sampling,
    seed: spec.sampling?.seed,
    onPrefill: (p) => {
      t.value("first token", p.token, orc.first.token);
      using lp = mx.squeeze(p.logprobs, 0);
      t.tensor("first logprobs", rawOf(lp), rawN(orc.first.logprobs));
      compareCaches(t, "cache after prefill", p.cache, orc.first.cache);
    },
    onRound,
  })) {
    tokens.push(tok.token);
  }
  t.value("rounds", n.rounds, orc.rounds.length);
  t.value("tokens", tokens, orc.tokens);
  const vsGreedy = new Tally();
  (await plainTokens(pool.generation(spec.target), spec.prompt, spec.maxTokens, spec.sampling)).forEach((g, i) => vsGreedy.value(`token ${i}`, tokens[i], g));
  return { spec, tokens, ...n.totals(), vsOracle: t.summary(), vsGreedy: vsGreedy.summary(), maxStartPosition, ms: performance.now() - t0 };
}

// ------------------------------------------------------------------ exact verifier

export interface ExactVerifyResult {
  /** TS verifier vs mlx-vlm's verifier: logits and caches. */
  vsOracle: TallySummary;
  /** Whether mlx-vlm's verifier logits equal its ordinary forward's on the same block. */
  oracleEqualsForward: boolean;
}

export async function exactVerifyParity(oracle: OracleClient, pool: ModelPool, target: string, prompt: number[], block: number[]): Promise<ExactVerifyResult> {
  const orc = readTree(oracle, await oracle.request("exact_verify", { checkpoint: target, prompt, block }));
  const text = pool.model(target).text;
  const cache = text.makeCache();
  const t = new Tally();
  try {
    if (prompt.length) {
      using inp = mx.array(Int32Array.from(prompt), [1, prompt.length], "int32");
      text.call(inp, { cache }).dispose();
    }
    using b = mx.array(Int32Array.from(block), [1, block.length], "int32");
    using logits = new Gemma4ExactSpeculativeVerifier().call(text, b, { cache });
    t.tensor("logits", rawOf(logits), rawN(orc.verifier.logits));
    compareCaches(t, "cache", cache, orc.verifier.cache);
  } finally {
    for (const c of cache) c.dispose();
  }
  return { vsOracle: t.summary(), oracleEqualsForward: hexOf(orc.verifier.logits) === hexOf(orc.forward.logits) };
}

// ------------------------------------------------------------------ prompt-cache files

export interface PromptCacheSpec {
  checkpoint: string;
  prompt: number[];
  suffix: number[];
  maxTokens: number;
}

export interface PromptCacheResult {
  spec: PromptCacheSpec;
  /** Cache types in the file. */
  types: string[];
  /** Whether a rotating cache has wrapped (offset past its window) when the file is written. */
  rotated: boolean;
  /** TS cachePrompt's caches vs mlx-lm's (bytes), the TS file loaded by mlx-lm vs the TS caches. */
  written: TallySummary;
  /** Continuations from a loaded file, all against mlx-lm continuing from its own file. */
  tsFileInMlxLm: TallySummary;
  mlxLmFileInTs: TallySummary;
  tsFileInTs: TallySummary;
}

export async function promptCacheInterop(oracle: OracleClient, pool: ModelPool, spec: PromptCacheSpec): Promise<PromptCacheResult> {
  const dir = mkdtempSync(join(tmpdir(), "prompt-cache-"));
  const pyFile = join(dir, "py.safetensors");
  const tsFile = join(dir, "ts.safetensors");
  const meta = { model: spec.checkpoint, tokenizer_config: "{}" };
  try {
    const saved = readTree(oracle, await oracle.request("prompt_cache_save", { checkpoint: spec.checkpoint, prompt: spec.prompt, file: pyFile, metadata: meta }));
    const model = pool.generation(spec.checkpoint);
    const written = new Tally();
    const cache = model.makeCache();
    let types: string[];
    let rotated: boolean;
    try {
      cachePrompt(model, spec.prompt, cache);
      compareCaches(written, "cache_prompt caches", cache, saved.cache);
      savePromptCache(tsFile, cache, meta);
      types = cache.map((c) => cacheFields(c).type);
      rotated = cache.some((c) => c instanceof RotatingKVCache && c.offset > c.maxSize);
    } finally {
      for (const c of cache) c.dispose();
    }
    const cont = async (file: string) => readTree(oracle, await oracle.request("prompt_cache_continue", { checkpoint: spec.checkpoint, file, suffix: spec.suffix, max_tokens: spec.maxTokens }));
    const ref = await cont(pyFile);
    const fromTs = await cont(tsFile);
    const tsFileInMlxLm = new Tally();
    tsFileInMlxLm.value("metadata", fromTs.metadata, meta);
    (fromTs.loaded as Record<string, any>[]).forEach((l, i) => {
      const r = ref.loaded[i];
      tsFileInMlxLm.value(`loaded[${i}] type`, l.type, r.type);
      tsFileInMlxLm.tensor(`loaded[${i}].keys`, rawN(l.keys), rawN(r.keys));
      tsFileInMlxLm.tensor(`loaded[${i}].values`, rawN(l.values), rawN(r.values));
    });
    tsFileInMlxLm.value("tokens", fromTs.tokens, ref.tokens);
    (fromTs.logprobs as NpyRecord[]).forEach((lp, i) => tsFileInMlxLm.tensor(`logprobs ${i}`, rawN(lp), rawN(ref.logprobs[i])));
    const tsContinue = async (file: string): Promise<TallySummary> => {
      const t = new Tally();
      const { cache: loaded, metadata } = loadPromptCache(file);
      try {
        t.value("metadata", metadata, meta);
        let i = 0;
        for await (const g of generateStep(model, spec.suffix, { maxTokens: spec.maxTokens, promptCache: loaded })) {
          t.value(`token ${i}`, g.token, ref.tokens[i]);
          t.tensor(`logprobs ${i}`, rawOf(g.logprobs), rawN(ref.logprobs[i]));
          i++;
        }
        compareCaches(t, "caches after the continuation", loaded, ref.cache);
      } finally {
        for (const c of loaded) c.dispose();
      }
      return t.summary();
    };
    return { spec, types, rotated, written: written.summary(), tsFileInMlxLm: tsFileInMlxLm.summary(), mlxLmFileInTs: await tsContinue(pyFile), tsFileInTs: await tsContinue(tsFile) };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
