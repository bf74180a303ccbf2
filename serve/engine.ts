// The server's generation, scheduled as mlx_lm.server 0.32.2's ResponseGenerator._generate
// schedules it:
//  - a request without a seed is batchable: it joins the running BatchGenerator (the port's,
//    model/generate_batch.ts, bit-exact against mlx-lm's) with its own sampler, stop sequences
//    and max_tokens, and leaves it on "stop", "length" or when its client goes away;
//  - a seeded request is not batchable (mlx_lm.server runs it through stream_generate): the
//    batch is drained first (no request is taken until every sequence in it has finished), the
//    generator is closed, and the request runs alone through the port's generate_step
//    (model/generate.ts); the next batchable request opens a new generator;
//  - requests are taken from the queue only between "time budgets": once the batch has work, the
//    loop calls BatchGenerator.next() repeatedly for up to 0.5 s (TimeBudget), then removes the
//    sequences whose clients went away (seen on one of their responses in that budget), then
//    takes every queued request (inserted one by one, a chat prompt in the segments the server's
//    _tokenize split it into: system prompt, the rest, a thinking tail) before the next budget.
//    One difference: a request whose client left while it was queued is dropped there (mlx_lm.server
//    inserts it and removes it after the next budget); nothing it would have computed is served.
// Unlike mlx_lm.server's generation thread, this loop shares the one JavaScript thread with the
// HTTP server: it yields to the event loop after every next() call (and every token of a seeded
// request), so health checks and new requests are answered between steps.
//
// Per token, the response is mlx_lm.server's: on "stop" the stop token's text is not used, on
// "length" the detokenizer is finalized; the token's logprob and the top-k entries
// (_format_top_logprobs: argpartition order) come from the step's logprobs row.
//
// Replayable scheduling (--record-schedule FILE): every event that fixes the bits of a response
// is appended to FILE as one JSON line: a generator's opening (its options and the seed given
// to the global MLX random state, which unseeded sampling draws from), each insert (before which
// next() call, with the prompt, max_tokens, sampler and stop sequences), each removal, and each
// sequence's end (its tokens, their logprobs and the sha256 of every step's whole logprobs row),
// and each seeded request served alone. oracle/python/serve_replay.py replays the file through
// mlx-lm's own BatchGenerator (and generate_step for the seeded ones).
import { createHash, randomInt } from "node:crypto";
import { appendFileSync, writeFileSync } from "node:fs";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type GenerateModel, generateStep } from "../model/generate.ts";
import { speculativeGenerateStep } from "../model/generate_speculative.ts";
import { BatchGenerator, type BatchModel, StopSequences as BatchStopSequences } from "../model/generate_batch.ts";
import { makeSampler, type Sampler, type SamplerOptions } from "../model/sample.ts";
import { type CacheList, type PrefixReuse, type PrefixStats } from "./prefix_cache.ts";
import type { CacheType } from "./prompt_cache.ts";
import type { StopSequences } from "./text_state.ts";
import type { ServedTokenizer, StreamingDetokenizer } from "./tokenizer.ts";

export interface TopToken {
  id: number;
  token: string;
  logprob: number;
}

/** One generated token as mlx_lm.server's Response carries it. */
export interface TokenResponse {
  text: string;
  token: number;
  logprob: number;
  finishReason: "stop" | "length" | null;
  /** _format_top_logprobs: the first top_n of argpartition(-logprobs, top_n - 1), in that (unsorted) order. */
  topTokens: TopToken[];
}

export interface EngineRequest {
  prompt: readonly number[];
  maxTokens: number;
  sampler: SamplerOptions;
  seed: number | null;
  /** A request with images or audio (serve/media.ts): run alone through its own prefill, without the prompt cache; the engine disposes it. */
  media?: { generate: GenerateModel; chunked: boolean; dispose(): void };
  /** num_draft_tokens (the request's, else --num-draft-tokens): used only with a draft model. */
  numDraftTokens?: number;
  topLogprobs: number;
  stop: StopSequences;
  /** Checked before the request starts and after every token. */
  cancelled: () => boolean;
  /** A name for the schedule's records (the server gives the response id). */
  tag?: string;
  /** The prompt split as mlx_lm.server's _tokenize splits it (their concatenation is `prompt`); default: one segment. */
  segments?: readonly (readonly number[])[];
  /** _tokenize's segment_types, one per segment (default: "assistant"): the kind each segment-end cache is stored as. */
  segmentTypes?: readonly CacheType[];
  /** Called once the prompt cache was consulted: how many prompt tokens come from it (mlx_lm.server's prompt_cache_count). */
  onCached?: (n: number) => void;
}

export interface EngineOptions {
  prefillStepSize: number;
  /** --prompt-concurrency (mlx_lm.server's default 8): BatchGenerator's prefill_batch_size. */
  prefillBatchSize: number;
  /** --decode-concurrency (32): BatchGenerator's completion_batch_size. */
  completionBatchSize: number;
  /** --record-schedule: the JSON-lines file the schedule is written to (truncated at start). */
  recordSchedule: string | null;
  /** --draft-model: every request runs alone through speculative decoding (mlx_lm.server's draft models are not batchable). */
  draft?: GenerateModel | null;
  /** TimeBudget's budget (0.5 s). */
  timeBudgetMs?: number;
  log?: (line: string) => void;
  /** Informational lines (prompt-cache hits); --log-level INFO or DEBUG only. */
  logInfo?: (line: string) => void;
  /** The prompt cache (mlx_lm.server's LRUPromptCache, with optional snapshots); null: none (--prompt-cache-size 0 still keeps one, as mlx_lm.server does). */
  prefix?: PrefixReuse | null;
}

const tick = () => new Promise<void>((r) => setImmediate(r));

function disposeList(c: readonly { dispose(): void }[]): void {
  for (const x of c) x.dispose();
}

function valueAt(row: MlxArray, id: number): number {
  using one = mx.slice(row, [id], [id + 1]);
  return one.item() as number;
}

/**
 * valueAt for every sequence of a step, read in one evaluation instead of one per sequence (each
 * evaluation is a round trip to MLX's stream thread): the same elements, copied, so the same values.
 */
function valuesAt(rows: readonly { logprobs: MlxArray; token: number }[]): number[] {
  if (rows.length <= 1) return rows.map((r) => valueAt(r.logprobs, r.token));
  const parts = rows.map((r) => mx.slice(r.logprobs, [r.token], [r.token + 1]));
  try {
    using all = mx.concatenate(parts, 0);
    return all.toNumbers();
  } finally {
    disposeList(parts);
  }
}

/** _format_top_logprobs(logprobs, top_n, tokenizer). */
function topTokens(row: MlxArray, n: number, tok: ServedTokenizer): TopToken[] {
  if (n <= 0) return [];
  using neg = mx.negative(row);
  using part = mx.argpartition(neg, n - 1, -1);
  using first = mx.slice(part, [0], [n]);
  using vals = mx.take(row, first);
  const ids = first.toNumbers();
  const lps = vals.toNumbers();
  return ids.map((id, i) => ({ id, token: tok.piece(id), logprob: lps[i]! }));
}

function rowSha(row: MlxArray): string {
  return createHash("sha256").update(row.toBytes()).digest("hex");
}

/** Compiled samplers kept across requests (mx.compile traces once per parameter set, as Python's module-level compiled filters do). */
const SAMPLER_CACHE_SIZE = 16;

type Item = { kind: "token"; r: TokenResponse } | { kind: "end" } | { kind: "error"; e: Error };

/** One request's responses, from the scheduling loop to the HTTP handler. */
class Channel {
  private items: Item[] = [];
  private waiter: (() => void) | null = null;
  closed = false;
  private put(i: Item): void {
    if (this.closed) return;
    if (i.kind !== "token") this.closed = true;
    this.items.push(i);
    this.waiter?.();
    this.waiter = null;
  }
  push(r: TokenResponse): void {
    this.put({ kind: "token", r });
  }
  end(): void {
    this.put({ kind: "end" });
  }
  fail(e: Error): void {
    this.put({ kind: "error", e });
  }
  async take(): Promise<Item> {
    while (this.items.length === 0) await new Promise<void>((r) => (this.waiter = r));
    return this.items.shift()!;
  }
}

interface Job {
  n: number;
  req: EngineRequest;
  ch: Channel;
  /** The consumer stopped reading (the HTTP side went away). */
  abandoned: boolean;
}

interface Active {
  job: Job;
  detok: StreamingDetokenizer;
  samplerKey: string;
  tokens: number[];
  logprobs: number[];
  shas: string[];
  /** segment_types[::-1] of the segments left after the cached prefix: popped at each segment end. */
  segmentTypes: CacheType[];
  /** The cache fetched for it: merged by copy when the sequence enters the prompt batch, freed then. */
  fetched: CacheList | null;
}

const samplerKey = (o: SamplerOptions) => JSON.stringify([o.temp ?? 0, o.topP ?? 0, o.minP ?? 0, o.topK ?? 0]);
const samplerRecord = (o: SamplerOptions) => ({ temp: o.temp ?? 0, top_p: o.topP ?? 0, min_p: o.minP ?? 0, top_k: o.topK ?? 0 });

export class Engine {
  private readonly samplers = new Map<string, Sampler>();
  private readonly waiting: Job[] = [];
  /** ResponseGenerator's unprocessed_requests: taken back first, last in first out. */
  private readonly pushedBack: Job[] = [];
  private wake: (() => void) | null = null;
  private loopRunning = false;
  private gen: BatchGenerator | null = null;
  private readonly active = new Map<number, Active>();
  private drain = false;
  private session = -1;
  /** next() calls of the current generator so far. */
  private step = 0;
  private jobs = 0;
  private closed = false;
  private readonly budgetMs: number;

  constructor(
    private readonly model: GenerateModel,
    private readonly batchModel: BatchModel,
    private readonly tokenizer: ServedTokenizer,
    private readonly opts: EngineOptions,
  ) {
    this.budgetMs = opts.timeBudgetMs ?? 500;
    if (opts.recordSchedule !== null) writeFileSync(opts.recordSchedule, "");
  }

  private record(event: Record<string, unknown>): void {
    if (this.opts.recordSchedule !== null) appendFileSync(this.opts.recordSchedule, `${JSON.stringify(event)}\n`);
  }

  private get prefix(): PrefixReuse | null {
    return this.opts.prefix ?? null;
  }

  private get recording(): boolean {
    return this.opts.recordSchedule !== null;
  }

  private sampler(o: SamplerOptions): Sampler {
    const key = samplerKey(o);
    let s = this.samplers.get(key);
    if (s) {
      this.samplers.delete(key); // most recently used last
    } else {
      s = makeSampler(o);
      if (this.samplers.size >= SAMPLER_CACHE_SIZE) {
        const [oldest, old] = this.samplers.entries().next().value!;
        this.samplers.delete(oldest);
        // a sampler a running sequence still uses is left to the garbage collector
        if (![...this.active.values()].some((a) => a.samplerKey === oldest)) old.dispose?.();
      }
    }
    this.samplers.set(key, s);
    return s;
  }

  private cancelled(job: Job): boolean {
    return job.abandoned || job.req.cancelled();
  }

  /** The request's tokens, in order; ends after the finishing token or on cancellation. */
  async *run(req: EngineRequest): AsyncGenerator<TokenResponse> {
    if (this.closed) throw new Error("the server is shutting down");
    const job: Job = { n: this.jobs++, req, ch: new Channel(), abandoned: false };
    this.waiting.push(job);
    this.kick();
    try {
      while (true) {
        const item = await job.ch.take();
        if (item.kind === "end") return;
        if (item.kind === "error") throw item.e;
        yield item.r;
      }
    } finally {
      job.abandoned = true;
    }
  }

  private kick(): void {
    if (this.wake) {
      const w = this.wake;
      this.wake = null;
      w();
    }
    if (!this.loopRunning) {
      this.loopRunning = true;
      void this.loop().finally(() => (this.loopRunning = false));
    }
  }

  /** ResponseGenerator._generate. */
  private async loop(): Promise<void> {
    while (!this.closed) {
      const job = this.drain ? undefined : (this.pushedBack.pop() ?? this.waiting.shift());
      if (job) {
        if (this.cancelled(job)) {
          job.req.media?.dispose();
          job.ch.end();
          continue;
        }
        const batchable = job.req.seed === null && !this.opts.draft && !job.req.media;
        if (this.gen && batchable) this.insert(job);
        else if (!this.gen) {
          if (!batchable) await this.serveSingle(job);
          else {
            this.openSession();
            this.pushedBack.push(job);
          }
        } else {
          // the batch is drained before a request it cannot take is served
          this.drain = true;
          this.pushedBack.push(job);
        }
        continue;
      }
      if (this.gen) {
        if (this.active.size > 0) {
          await this.runBudget();
          continue;
        }
        if (this.drain) {
          this.closeSession();
          this.drain = false;
          continue;
        }
      }
      if (this.waiting.length === 0 && this.pushedBack.length === 0) await new Promise<void>((r) => (this.wake = r));
    }
  }

  private openSession(): void {
    this.gen = new BatchGenerator(this.batchModel, {
      prefillStepSize: this.opts.prefillStepSize,
      prefillBatchSize: this.opts.prefillBatchSize,
      completionBatchSize: this.opts.completionBatchSize,
    });
    this.session += 1;
    this.step = 0;
    if (this.recording) {
      // unseeded sampling draws from the global random state: fixed here so that a replay can draw the same
      const seed = randomInt(2 ** 31);
      mx.random.seed(seed);
      this.record({ event: "open", session: this.session, rng_seed: seed, prefill_batch_size: this.opts.prefillBatchSize, completion_batch_size: this.opts.completionBatchSize, prefill_step_size: this.opts.prefillStepSize, prompt_cache_size: this.prefix?.opts.size ?? null, prompt_cache_bytes: this.prefix?.opts.bytes ?? null, prompt_cache_snapshots: this.prefix?.opts.snapshots ?? 0 });
    }
  }

  private closeSession(): void {
    this.gen?.close();
    this.gen = null;
    this.record({ event: "close", session: this.session, step: this.step });
  }

  /** fetch_nearest_cache for a prompt (none without a prompt cache), reported to the request. */
  private fetchCache(job: Job): { cache: CacheList | null; cached: number; source: string | null } {
    const f = this.prefix ? this.prefix.fetch(job.req.prompt) : { cache: null, cached: 0, source: null };
    job.req.onCached?.(f.cached);
    if (f.source !== null) this.opts.logInfo?.(`prompt cache: ${job.req.tag ?? `request ${job.n}`} starts from ${f.cached} of its ${job.req.prompt.length} prompt tokens (${f.source === "lru" ? "LRU entry" : "chunk snapshot"})`);
    return f;
  }

  private insert(job: Job): void {
    const r = job.req;
    let uid: number;
    const key = samplerKey(r.sampler);
    const segments = (r.segments ?? [r.prompt]).map((x) => [...x]);
    const types = [...(r.segmentTypes ?? segments.map(() => "assistant" as CacheType))];
    let fetched: CacheList | null = null;
    let cached = 0;
    try {
      ({ cache: fetched, cached } = this.fetchCache(job));
      // the cached tokens leave the front segments (ResponseGenerator._generate)
      let n = cached;
      while (n > 0) {
        if (n >= segments[0]!.length) {
          n -= segments.shift()!.length;
          types.shift();
        } else {
          segments[0] = segments[0]!.slice(n);
          break;
        }
      }
      const shared = this.sampler(r.sampler);
      // one sampler object per request, as mlx_lm.server makes one per request: the batch samples row by row
      const own: Sampler = (lp) => shared(lp);
      [uid] = this.gen!.insertSegments([segments], {
        maxTokens: [r.maxTokens],
        samplers: [own],
        stopSequences: [new BatchStopSequences(r.stop.sequences)],
        ...(fetched ? { caches: [fetched], allTokens: [r.prompt.slice(0, cached)] } : {}),
      }) as [number];
    } catch (e) {
      if (fetched) disposeList(fetched);
      job.ch.fail(e as Error);
      return;
    }
    this.active.set(uid, { job, detok: this.tokenizer.newDetokenizer(), samplerKey: key, tokens: [], logprobs: [], shas: [], segmentTypes: types.reverse(), fetched });
    this.record({ event: "insert", session: this.session, step: this.step, uid, request: job.n, tag: r.tag ?? null, prompt: r.prompt, segments: r.segments ?? [r.prompt], segment_types: r.segmentTypes ?? (r.segments ?? [r.prompt]).map(() => "assistant"), cached, max_tokens: r.maxTokens, sampler: samplerRecord(r.sampler), stop_sequences: r.stop.sequences });
    // mlx_lm.server: the prompt cache is trimmed to what the batch leaves of --prompt-cache-bytes
    this.prefix?.enforceBytes(this.gen!.promptCacheNbytes);
  }

  private releaseFetched(a: Active): void {
    if (a.fetched) disposeList(a.fetched);
    a.fetched = null;
  }

  /** After a next() call, as ResponseGenerator._generate: the caches at segment ends go to the prompt cache; with snapshots, the caches at the other chunk ends too. */
  private storePrefixes(prompts: readonly { uid: number; endOfSegment: boolean; endOfPrompt: boolean }[]): void {
    const gen = this.gen!;
    for (const p of prompts) {
      const a = this.active.get(p.uid);
      if (a) this.releaseFetched(a); // it is in the prompt batch now: merged by copy
    }
    if (!this.prefix) return;
    const eos = prompts.filter((p) => p.endOfSegment && !p.endOfPrompt && (this.active.get(p.uid)?.segmentTypes.length ?? 0) > 0).map((p) => p.uid);
    for (const [uid, { cache, tokens }] of gen.extractCache(eos)) this.prefix.insert(tokens, cache, this.active.get(uid)!.segmentTypes.pop()!);
    if (this.prefix.snapshotting) {
      const stored = new Set(eos);
      const chunkEnds = prompts.filter((p) => !p.endOfPrompt && !stored.has(p.uid) && this.active.has(p.uid)).map((p) => p.uid);
      if (chunkEnds.length) {
        const active = gen.promptCacheNbytes;
        for (const { cache, tokens } of gen.extractCache(chunkEnds).values()) this.prefix.snapshot(tokens, cache, active);
      }
    }
  }

  /** The prompt cache's counters (null without one). */
  prefixStats(): PrefixStats | null {
    return this.prefix?.stats() ?? null;
  }

  private finish(uid: number, a: Active, reason: string): void {
    this.active.delete(uid);
    this.releaseFetched(a);
    a.job.ch.end();
    this.record({ event: "leave", session: this.session, step: this.step, uid, request: a.job.n, tag: a.job.req.tag ?? null, reason, tokens: a.tokens, logprobs: a.logprobs, logprobs_sha256: a.shas });
  }

  /** One TimeBudget of next() calls, then the removal of sequences whose clients went away. */
  private async runBudget(): Promise<void> {
    const gen = this.gen!;
    const t0 = performance.now();
    const remove = new Set<number>();
    try {
      while (performance.now() - t0 <= this.budgetMs) {
        const [prompts, generated] = gen.next();
        this.step += 1;
        if (prompts.length === 0 && generated.length === 0) break;
        for (const p of prompts) {
          const a = this.active.get(p.uid);
          if (a && this.cancelled(a.job)) remove.add(p.uid);
        }
        this.storePrefixes(prompts);
        const logprobs = valuesAt(generated);
        for (const [i, g] of generated.entries()) {
          const a = this.active.get(g.uid);
          if (!a) continue;
          let text: string;
          if (g.finishReason === "stop") {
            a.detok.finalize();
            text = a.detok.lastSegment();
          } else {
            a.detok.addToken(g.token);
            if (g.finishReason === "length") a.detok.finalize();
            text = a.detok.lastSegment();
          }
          const logprob = logprobs[i]!;
          if (this.recording) {
            a.tokens.push(g.token);
            a.logprobs.push(logprob);
            a.shas.push(rowSha(g.logprobs));
          }
          a.job.ch.push({ text, token: g.token, logprob, finishReason: g.finishReason, topTokens: topTokens(g.logprobs, a.job.req.topLogprobs, this.tokenizer) });
          if (g.finishReason !== null) {
            const cache = g.takePromptCache();
            if (cache && this.prefix && g.allTokens) this.prefix.insert(g.allTokens, cache, "assistant");
            else if (cache) disposeList(cache);
            this.finish(g.uid, a, g.finishReason);
          }
          else if (this.cancelled(a.job)) remove.add(g.uid);
        }
        await tick();
      }
      const uids = [...remove].filter((u) => this.active.has(u));
      if (uids.length) {
        gen.remove(uids);
        this.record({ event: "remove", session: this.session, step: this.step, uids });
        for (const u of uids) this.finish(u, this.active.get(u)!, "cancelled");
      }
    } catch (e) {
      // the generator's state is unknown after a failure: every sequence in it fails, a new generator serves the next request
      this.opts.log?.(`error: generation failed: ${(e as Error).stack ?? e}`);
      for (const a of this.active.values()) {
        this.releaseFetched(a);
        a.job.ch.fail(e as Error);
      }
      this.active.clear();
      this.closeSession();
      this.drain = false;
    }
  }

  /** _serve_single: one seeded request alone, through generate_step. */
  private async serveSingle(job: Job): Promise<void> {
    const req = job.req;
    let steps: AsyncGenerator<{ token: number; logprobs: MlxArray; n: number }> | null = null;
    const tokens: number[] = [];
    const logprobs: number[] = [];
    const shas: string[] = [];
    let reason = "cancelled";
    let cache: CacheList | null = null;
    let cached = 0;
    let inserted = false;
    const generated: number[] = [];
    try {
      // mlx_lm.server seeds before it fetches the cache (a copy draws nothing from the random state)
      const draft = this.opts.draft;
      if (req.media) {
        req.onCached?.(0);
        steps = generateStep(req.media.generate, req.prompt, {
          maxTokens: req.maxTokens,
          sampler: this.sampler(req.sampler),
          prefillStepSize: this.opts.prefillStepSize,
          chunkedPrefill: req.media.chunked,
          ...(req.seed !== null ? { seed: req.seed } : {}),
        });
      } else if (draft) {
        // speculative decoding from fresh target and draft caches: no prompt cache with a draft model (README, Serving)
        req.onCached?.(0);
        steps = speculativeGenerateStep(this.model, draft, req.prompt, {
          numDraftTokens: req.numDraftTokens ?? 3,
          maxTokens: req.maxTokens,
          sampler: this.sampler(req.sampler),
          prefillStepSize: this.opts.prefillStepSize,
          ...(req.seed !== null ? { seed: req.seed } : {}),
        });
      } else {
        ({ cache, cached } = this.fetchCache(job));
        cache ??= this.model.makeCache();
        steps = generateStep(this.model, req.prompt.slice(cached), {
          maxTokens: req.maxTokens,
          sampler: this.sampler(req.sampler),
          prefillStepSize: this.opts.prefillStepSize,
          promptCache: cache,
          ...(req.seed !== null ? { seed: req.seed } : {}),
        });
      }
      const matcher = req.stop.matcher();
      const detok = this.tokenizer.newDetokenizer();
      for await (const g of steps) {
        let finishReason: TokenResponse["finishReason"] = null;
        if (g.n + 1 >= req.maxTokens) finishReason = "length";
        if (matcher.advance(g.token)) finishReason = "stop";
        let text = "";
        if (finishReason !== "stop") {
          detok.addToken(g.token);
          if (finishReason === "length") detok.finalize();
          text = detok.lastSegment();
        }
        const logprob = valueAt(g.logprobs, g.token);
        if (this.recording) {
          tokens.push(g.token);
          logprobs.push(logprob);
          shas.push(rowSha(g.logprobs));
        }
        job.ch.push({ text, token: g.token, logprob, finishReason, topTokens: topTokens(g.logprobs, req.topLogprobs, this.tokenizer) });
        generated.push(g.token);
        if (finishReason !== null) {
          reason = finishReason;
          break;
        }
        await tick();
        if (this.cancelled(job)) break;
      }
      job.ch.end();
      await steps.return(undefined);
      // _serve_single saves the cache under the prompt and every generated token, after a cancel too (not after a failure)
      if (this.prefix && cache) {
        this.prefix.insert([...req.prompt, ...generated], cache, "assistant");
        inserted = true;
      }
    } catch (e) {
      job.ch.fail(e as Error);
    } finally {
      await steps?.return(undefined);
      req.media?.dispose();
      if (cache && !inserted) disposeList(cache);
      this.record({ event: "single", request: job.n, tag: req.tag ?? null, prompt: req.prompt, cached, max_tokens: req.maxTokens, seed: req.seed, sampler: samplerRecord(req.sampler), prefill_step_size: this.opts.prefillStepSize, reason, tokens, logprobs, logprobs_sha256: shas });
    }
  }

  /** Frees the generator; requests still running end with an error. */
  close(): void {
    this.closed = true;
    for (const a of this.active.values()) {
      this.releaseFetched(a);
      a.job.ch.fail(new Error("the server is shutting down"));
    }
    this.active.clear();
    for (const j of [...this.waiting, ...this.pushedBack]) {
      j.req.media?.dispose();
      j.ch.fail(new Error("the server is shutting down"));
    }
    if (this.gen) this.closeSession();
    this.prefix?.dispose();
    this.wake?.();
  }
}
