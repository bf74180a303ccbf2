// Batched-generation parity: one batch scenario run by mlx-lm's BatchGenerator (the oracle,
// oracle/python/batch.py) and by model/generate_batch.ts on the same checkpoint, recorded after
// every next() call and compared call by call: the prompt responses, every generation response
// (uid, token, finish reason, logprobs bytes; on finish all_tokens and the extracted caches) and
// the state of every batch cache of the generation and prompt batches (per-sequence offsets and
// left padding, physical index, rotation, buffer shapes and sha256 of the key/value buffers).
// Used by `npm run parity -- --mode batch` and suites/batch.
import { createHash } from "node:crypto";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVCache, type KVCacheLike, RotatingKVCache } from "../model/cache/index.ts";
import { type BatchCacheLike, BatchKVCache, BatchRotatingKVCache } from "../model/cache/batch.ts";
import { BatchGenerator, type BatchModel, type GenerationResponse } from "../model/generate_batch.ts";
import { makeSampler, type Sampler } from "../model/sample.ts";
import type { NpyRef, OracleClient } from "../oracle/client.ts";
import { compareRaw, formatDiff, type RawTensor, rawOf } from "../oracle/compare.ts";

/** A batch scenario (the wire format of oracle/python/batch.py). */
export interface BatchScenario {
  id: string;
  prompts: number[][];
  max_tokens?: number | number[];
  join?: { at: number; prompts: number[][]; max_tokens?: number | number[] }[];
  remove?: { at: number; uids: number[] }[];
  stop_tokens?: number[][] | null;
  /** Stop sequences taken from a first oracle run without them: uid's tokens [at, at + len). */
  stop_from?: { uid: number; at: number; len: number }[];
  prefill_batch_size?: number;
  completion_batch_size?: number;
  prefill_step_size?: number;
  sampler?: { temp: number; top_p?: number; top_k?: number; min_p?: number; seed?: number } | null;
  /** Cache states without the key/value buffer hashes (cheaper; the properties use it). */
  light?: boolean;
  /** Features the run must show (runFeatures). */
  expect?: string[];
  about?: string;
}

export type CacheState = Record<string, unknown>;

export interface GenRecord {
  uid: number;
  token: number;
  finish_reason: string | null;
  logprobs: RawTensor;
  all_tokens?: number[];
  prompt_cache?: CacheState[];
}

export interface CallRecord {
  joined?: number[];
  removed?: number[];
  prompt: { uid: number; progress: number[]; end_of_segment: boolean; end_of_prompt: boolean }[];
  generation: GenRecord[];
  generation_batch: { uids: number[]; cache: CacheState[] };
  prompt_batch: { uids: number[]; cache: CacheState[] };
}

export interface BatchRun {
  uids: number[];
  calls: CallRecord[];
}

function sha(a: MlxArray | null): string | null {
  return a === null ? null : createHash("sha256").update(a.toBytes()).digest("hex");
}

/** The TS twin of batch.py cache_state (`light`: without the buffer hashes). */
export function cacheState(c: KVCacheLike | BatchCacheLike, light = false): CacheState {
  const d: CacheState = { type: c.constructor.name };
  const bufs = c as unknown as { keys: MlxArray | null; values: MlxArray | null };
  if (c instanceof BatchKVCache || c instanceof BatchRotatingKVCache) {
    d.offset = c.offset.toNumbers();
    d.left_padding = c.leftPadding.toNumbers();
    d.idx = c.idx;
    if (c instanceof BatchRotatingKVCache) Object.assign(d, { max_size: c.maxSize, _offset: c.processed, rotated: c.rotated });
  } else {
    d.offset = (c as KVCacheLike).offset;
    if (c instanceof RotatingKVCache) Object.assign(d, { keep: c.keep, max_size: c.maxSize, idx: c.idx });
    else if (!(c instanceof KVCache)) throw new Error(`cacheState: unknown cache ${c.constructor.name}`);
  }
  d.keys_shape = bufs.keys ? bufs.keys.shape : null;
  d.values_shape = bufs.values ? bufs.values.shape : null;
  if (!light) {
    d.keys_sha = sha(bufs.keys);
    d.values_sha = sha(bufs.values);
  }
  return d;
}

/** mx.random.seed + make_sampler, as batch.py _sampler (null: greedy). */
export function scenarioSampler(s: BatchScenario["sampler"]): Sampler | null {
  if (!s) return null;
  if (s.seed !== undefined && s.seed !== null) mx.random.seed(s.seed);
  return makeSampler({ temp: s.temp, topP: s.top_p ?? 0, topK: s.top_k ?? 0, minP: s.min_p ?? 0 });
}

function perPrompt(v: number | number[] | undefined, n: number): number[] {
  return Array.isArray(v) ? v : Array.from({ length: n }, () => v ?? 16);
}

function genRecord(r: GenerationResponse, light: boolean): GenRecord {
  const g: GenRecord = { uid: r.uid, token: r.token, finish_reason: r.finishReason, logprobs: rawOf(r.logprobs) };
  if (r.finishReason !== null) {
    g.all_tokens = [...r.allTokens!];
    g.prompt_cache = r.promptCache!.map((c) => cacheState(c, light));
  }
  return g;
}

/** Runs a (resolved) scenario on the TS side, recording what batch.py run_scenario records. */
export function runTsBatch(model: BatchModel, scn: BatchScenario): BatchRun {
  const sampler = scenarioSampler(scn.sampler);
  const gen = new BatchGenerator(model, {
    maxTokens: 16,
    stopTokens: scn.stop_tokens ?? null,
    sampler: sampler ?? undefined,
    prefillBatchSize: scn.prefill_batch_size,
    completionBatchSize: scn.completion_batch_size,
    prefillStepSize: scn.prefill_step_size,
  });
  try {
    const joins = new Map((scn.join ?? []).map((j) => [j.at, j]));
    const removes = new Map((scn.remove ?? []).map((r) => [r.at, r]));
    const lastEvent = Math.max(-1, ...joins.keys(), ...removes.keys());
    const uids = scn.prompts.length ? gen.insert(scn.prompts, { maxTokens: perPrompt(scn.max_tokens, scn.prompts.length) }) : [];
    const calls: CallRecord[] = [];
    for (let i = 0; i < 10_000; i++) {
      const rec = {} as CallRecord;
      const j = joins.get(i);
      if (j) rec.joined = gen.insert(j.prompts, { maxTokens: perPrompt(j.max_tokens, j.prompts.length) });
      const r = removes.get(i);
      if (r) {
        gen.remove(r.uids);
        rec.removed = [...r.uids];
      }
      const [pr, gr] = gen.next();
      rec.prompt = pr.map((p) => ({ uid: p.uid, progress: [...p.progress], end_of_segment: p.endOfSegment, end_of_prompt: p.endOfPrompt }));
      const light = scn.light === true;
      rec.generation = gr.map((g) => genRecord(g, light));
      rec.generation_batch = { uids: [...gen.generationBatch.uids], cache: gen.generationBatch.promptCache.map((c) => cacheState(c, light)) };
      rec.prompt_batch = { uids: [...gen.promptBatch.uids], cache: gen.promptBatch.promptCache.map((c) => cacheState(c, light)) };
      calls.push(rec);
      if (pr.length === 0 && gr.length === 0 && i >= lastEvent) return { uids, calls };
    }
    throw new Error(`batch scenario ${scn.id} did not finish within 10000 next() calls`);
  } finally {
    gen.close();
    sampler?.dispose?.();
  }
}

interface WireCall extends Omit<CallRecord, "generation"> {
  generation: (Omit<GenRecord, "logprobs"> & { logprobs: NpyRef })[];
}

/** The oracle side of a resolved scenario. */
export async function runOracleBatch(oracle: OracleClient, checkpoint: string, scn: BatchScenario): Promise<BatchRun> {
  const r = await oracle.request<{ uids: number[]; calls: WireCall[] }>("batch_run", { checkpoint, scenario: scn });
  return {
    uids: r.uids,
    calls: r.calls.map((c) => ({ ...c, generation: c.generation.map((g) => ({ ...g, logprobs: oracle.readArray(g.logprobs) })) })),
  };
}

/** Resolves stop_from into stop_tokens with a first oracle run (which both sides then use). */
export async function resolveScenario(oracle: OracleClient, checkpoint: string, scn: BatchScenario): Promise<BatchScenario> {
  if (!scn.stop_from?.length) return scn;
  const { stop_from, ...rest } = scn;
  const first = await runOracleBatch(oracle, checkpoint, { ...rest, stop_tokens: null });
  const byUid = new Map<number, number[]>();
  for (const c of first.calls) for (const g of c.generation) (byUid.get(g.uid) ?? byUid.set(g.uid, []).get(g.uid)!).push(g.token);
  const stops = stop_from.map(({ uid, at, len }) => {
    const toks = (byUid.get(uid) ?? []).slice(at, at + len);
    if (toks.length !== len) throw new Error(`scenario ${scn.id}: sequence ${uid} generated fewer than ${at + len} tokens`);
    return toks;
  });
  return { ...rest, stop_tokens: stops };
}

export interface BatchDivergence {
  call: number;
  what: string;
  detail: string;
}

export interface BatchComparison {
  scenario: string;
  calls: number;
  /** Generation responses compared (token, finish reason and logprobs bytes each). */
  steps: number;
  bitExact: number;
  /** Cache states compared (batch caches after every call, extracted caches on finish). */
  cacheStates: number;
  sequences: number;
  first: BatchDivergence | null;
}

const canon = (x: unknown): string =>
  JSON.stringify(x, (_k, v: unknown) => (v && typeof v === "object" && !Array.isArray(v) ? Object.fromEntries(Object.entries(v as Record<string, unknown>).sort(([a], [b]) => a.localeCompare(b))) : v));

/** Compares two runs call by call; stops at the first divergence. */
export function compareRuns(scenario: string, ts: BatchRun, py: BatchRun): BatchComparison {
  const res: BatchComparison = { scenario, calls: 0, steps: 0, bitExact: 0, cacheStates: 0, sequences: new Set(py.calls.flatMap((c) => c.generation.map((g) => g.uid))).size, first: null };
  const fail = (call: number, what: string, detail: string) => {
    res.first = { call, what, detail };
    return res;
  };
  if (canon(ts.uids) !== canon(py.uids)) return fail(-1, "uids", `TS ${canon(ts.uids)} vs oracle ${canon(py.uids)}`);
  const n = Math.max(ts.calls.length, py.calls.length);
  for (let i = 0; i < n; i++) {
    const t = ts.calls[i];
    const p = py.calls[i];
    if (!t || !p) return fail(i, "calls", `TS made ${ts.calls.length} next() calls, oracle ${py.calls.length}`);
    for (const k of ["joined", "removed", "prompt"] as const) {
      if (canon(t[k]) !== canon(p[k])) return fail(i, k, `TS ${canon(t[k])} vs oracle ${canon(p[k])}`);
    }
    if (t.generation.length !== p.generation.length) return fail(i, "generation", `TS returned ${t.generation.length} responses, oracle ${p.generation.length}`);
    for (let j = 0; j < p.generation.length; j++) {
      const a = t.generation[j]!;
      const b = p.generation[j]!;
      const where = `uid ${b.uid}`;
      if (a.uid !== b.uid || a.token !== b.token || a.finish_reason !== b.finish_reason) {
        return fail(i, `${where} token`, `TS (uid ${a.uid}, token ${a.token}, ${a.finish_reason}) vs oracle (uid ${b.uid}, token ${b.token}, ${b.finish_reason})`);
      }
      const d = compareRaw(`${where} logprobs`, a.logprobs, b.logprobs);
      res.steps++;
      if (!d.equal) return fail(i, `${where} logprobs`, formatDiff(d));
      res.bitExact++;
      if (canon(a.all_tokens) !== canon(b.all_tokens)) return fail(i, `${where} all_tokens`, `TS ${canon(a.all_tokens)} vs oracle ${canon(b.all_tokens)}`);
      const pc = compareStates(a.prompt_cache ?? [], b.prompt_cache ?? []);
      res.cacheStates += b.prompt_cache?.length ?? 0;
      if (pc) return fail(i, `${where} extracted cache ${pc.what}`, pc.detail);
    }
    for (const k of ["generation_batch", "prompt_batch"] as const) {
      if (canon(t[k].uids) !== canon(p[k].uids)) return fail(i, `${k} uids`, `TS ${canon(t[k].uids)} vs oracle ${canon(p[k].uids)}`);
      const d = compareStates(t[k].cache, p[k].cache);
      res.cacheStates += p[k].cache.length;
      if (d) return fail(i, `${k} ${d.what}`, d.detail);
    }
    res.calls++;
  }
  return res;
}

function compareStates(ts: CacheState[], py: CacheState[]): { what: string; detail: string } | null {
  if (ts.length !== py.length) return { what: "layers", detail: `TS ${ts.length} caches vs oracle ${py.length}` };
  for (let l = 0; l < py.length; l++) {
    const a = ts[l]!;
    const b = py[l]!;
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    const bad = keys.filter((k) => canon(a[k]) !== canon(b[k]));
    if (bad.length) {
      const fields = bad.map((k) => (k.endsWith("_sha") ? `${k.slice(0, -4)} bytes differ` : `${k} TS ${canon(a[k])} vs oracle ${canon(b[k])}`));
      return { what: `layer ${l} (${String(b.type)})`, detail: fields.join("; ") };
    }
  }
  return null;
}

/**
 * Resolve, run both sides, compare. The oracle request goes out first, so mlx-lm computes while
 * the TS side runs (two processes); `ms.oracle` is the time until its answer was read.
 */
export async function batchParity(oracle: OracleClient, checkpoint: string, model: BatchModel, scn: BatchScenario): Promise<BatchComparison & { ms: { oracle: number; ts: number }; oracleRun: BatchRun }> {
  const resolved = await resolveScenario(oracle, checkpoint, scn);
  const t0 = performance.now();
  const pending = runOracleBatch(oracle, checkpoint, resolved);
  pending.catch(() => {}); // surfaces at the await below
  await oracle.sent(); // the oracle's run starts before (not after) the TS run
  let ts: BatchRun;
  try {
    ts = runTsBatch(model, resolved);
  } catch (e) {
    await pending.catch(() => {});
    throw e;
  }
  const t1 = performance.now();
  const py = await pending;
  const t2 = performance.now();
  return { ...compareRuns(scn.id, ts, py), ms: { oracle: t2 - t0, ts: t1 - t0 }, oracleRun: py };
}

/**
 * What a run exercised, read off the oracle's records: the scenario file names the features each
 * scenario is there for (`expect`), and the suites check that the run really showed them.
 */
export function runFeatures(run: BatchRun): Set<string> {
  const f = new Set<string>();
  const finishCall = new Map<number, number>();
  const chunks = new Map<number, number>();
  let prevIdx: number | null = null;
  let inserted = run.uids.length;
  for (const [i, c] of run.calls.entries()) {
    const live = c.generation_batch.cache;
    const lp = live.flatMap((s) => (Array.isArray(s.left_padding) ? (s.left_padding as number[]) : []));
    if (live.some((s) => s.rotated === true)) f.add("rotated");
    if (lp.some((x) => x < 0)) f.add("negative_left_padding");
    const kv = live.find((s) => s.type === "BatchKVCache");
    const idx = kv ? (kv.idx as number) : null;
    if (prevIdx !== null && idx !== null && idx < prevIdx) f.add("filter_shift");
    prevIdx = idx;
    if (live.some((s) => ((s.keys_shape as number[] | null)?.[2] ?? 0) > 256)) f.add("kv_growth");
    if (c.prompt_batch.uids.length && c.generation_batch.uids.length) f.add("prefill_while_decoding");
    for (const p of c.prompt) if (!p.end_of_prompt) chunks.set(p.uid, (chunks.get(p.uid) ?? 0) + 1);
    if (c.joined) {
      inserted += c.joined.length;
      if (c.generation_batch.uids.some((u) => !c.joined!.includes(u))) f.add("join_while_running");
    }
    if (c.removed) f.add("removed");
    for (const g of c.generation) {
      if (g.finish_reason === "stop") f.add("stop");
      if (g.finish_reason !== null) finishCall.set(g.uid, i);
      if (!f.has("sampled") && g.token !== argmaxOf(g.logprobs)) f.add("sampled");
    }
  }
  if ([...chunks.values()].some((n) => n >= 2)) f.add("multi_chunk_prefill");
  if (new Set(finishCall.values()).size >= 3) f.add("staggered_finish");
  if (Math.max(0, ...run.calls.map((c) => c.generation_batch.uids.length)) < inserted) f.add("queued");
  return f;
}

function argmaxOf(t: RawTensor): number {
  using a = mx.fromBytes(t.data, t.shape, t.dtype as mx.Dtype);
  using m = mx.argmax(a, -1);
  return m.item() as number;
}
