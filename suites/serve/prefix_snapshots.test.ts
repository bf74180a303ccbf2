// Chunk-boundary snapshots (serve/prefix_cache.ts, --prompt-cache-snapshots), in process, on the
// tokenizer fixture (2 layers: one sliding with window 8, one full), prefill_step_size 8, prompts
// of 45 tokens (past the window, so the final caches cannot be trimmed and mlx-lm's own
// LRUPromptCache could not serve the shared prefix).
// The equivalence asserted: request B (a 40-token prefix shared with request A, then 5 other
// tokens), served by an engine whose snapshots hold A's caches at its chunk ends 8..40, starts
// from the snapshot at 40 and returns exactly (===, bit for bit) the token ids, the sampled
// tokens' logprobs and the top-5 logprobs that a fresh engine with no reuse at all returns for B
// (whose own prefill chunks also end at 8, 16, ..., 40). The LRU cache is off in both
// (--prompt-cache-size 0) so the snapshot is the only reuse. Also: the hit is counted (one
// snapshot hit, 40 cached tokens, the request's onCached sees 40), a prompt that shares less than
// one chunk is served fresh (no hit), and with a byte budget the kept snapshots stay within it.
// Control (shows the comparison can fail): a planted off-by-one (the snapshot at 40 reported as
// holding 41 tokens, so one prompt token is never prefilled) makes B differ from the fresh run.
// (A snapshot at a boundary B's fresh run does not have, e.g. A prefilled in chunks of 6 and B
// resumed at 36, gave the same bits as the fresh run on this fixture: the equivalence above is
// what is proved, not that other boundaries differ.)
import { beforeAll, describe, expect, it } from "vitest";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { batchModel } from "../../model/generate_batch.ts";
import { loadGenerationModel } from "../../model/runtime.ts";
import { limit } from "../../tests/time_limit.ts";
import { Engine, type TokenResponse } from "../../serve/engine.ts";
import { PrefixReuse } from "../../serve/prefix_cache.ts";
import { makeStopSequences } from "../../serve/text_state.ts";
import { loadServedTokenizer, type ServedTokenizer } from "../../serve/tokenizer.ts";

const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const CASE = limit(30_000);
const STEP = 8;

let tok: ServedTokenizer;
let gen: ReturnType<typeof loadGenerationModel>;

beforeAll(async () => {
  // built by the oracle's make_checkpoints (other serve suites build it too); only when missing, so this file starts no Python
  if (!existsSync(join(DIR, "model.safetensors"))) await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, limit(60_000));
  tok = await loadServedTokenizer(DIR);
  gen = loadGenerationModel(DIR);
}, limit(90_000));

/** Token ids 1000.. (a plain deterministic prompt; <bos> first as the server's encode puts it). */
const ids = (seed: number, n: number) => Array.from({ length: n }, (_, i) => 1000 + ((seed * 7919 + i * 104729) % 50000));

function engine(opts: { snapshots: number; bytes?: number | null; step?: number }): { e: Engine; prefix: PrefixReuse } {
  const prefix = new PrefixReuse({ size: 0, bytes: opts.bytes ?? null, snapshots: opts.snapshots });
  const e = new Engine(gen.model, { ...batchModel(gen.loaded), maxPositions: undefined }, tok, {
    prefillStepSize: opts.step ?? STEP,
    prefillBatchSize: 8,
    completionBatchSize: 32,
    recordSchedule: null,
    timeBudgetMs: 500,
    prefix,
  });
  return { e, prefix };
}

async function serve(e: Engine, prompt: number[]): Promise<{ out: TokenResponse[]; cached: number }> {
  let cached = -1;
  const out: TokenResponse[] = [];
  for await (const r of e.run({ prompt, maxTokens: 6, sampler: { temp: 0 }, seed: null, topLogprobs: 5, stop: makeStopSequences([], [], () => []), cancelled: () => false, onCached: (n) => void (cached = n) })) out.push(r);
  return { out, cached };
}

const bits = (rs: TokenResponse[]) => rs.map((r) => ({ token: r.token, logprob: r.logprob, top: r.topTokens.map((t) => [t.id, t.logprob]) }));

const [BOS] = [2];
const shared = [BOS, ...ids(1, 39)]; // 40 tokens
const A = [...shared, ...ids(2, 5)];
const B = [...shared, ...ids(3, 5)];

describe("prefix snapshots: a response served from a chunk-boundary snapshot equals the fresh run", () => {
  it("B from A's snapshot at 40 = B with no reuse, bit for bit; the hit counted", async () => {
    const fresh = engine({ snapshots: 0 });
    const reuse = engine({ snapshots: 64 });
    try {
      const want = await serve(fresh.e, B);
      expect(want.cached).toBe(0);
      expect(want.out).toHaveLength(6);
      const a = await serve(reuse.e, A);
      expect(a.cached).toBe(0);
      const s1 = reuse.prefix.stats();
      // A's chunk ends 8, 16, 24, 32, 40 (44, its segment end, goes to the LRU cache, size 0 here)
      expect(s1.snapshotsTaken).toBe(5);
      const got = await serve(reuse.e, B);
      expect(got.cached).toBe(40);
      expect(bits(got.out)).toEqual(bits(want.out));
      // === on every double, not only toEqual's deep equality
      got.out.forEach((r, i) => expect(Object.is(r.logprob, want.out[i]!.logprob)).toBe(true));
      const s2 = reuse.prefix.stats();
      expect([s2.snapshotHits, s2.lruHits, s2.cachedTokens, s2.lookups]).toEqual([1, 0, 40, 2]);
      // sharing less than one chunk (7 tokens): no snapshot holds a prefix, served fresh
      const c = await serve(reuse.e, [...shared.slice(0, 7), ...ids(4, 30)]);
      expect(c.cached).toBe(0);
      expect(reuse.prefix.stats().snapshotHits).toBe(1);
    } finally {
      fresh.e.close();
      reuse.e.close();
    }
  }, CASE);

  it("control: a planted off-by-one (the snapshot claims one token more than it holds) breaks the equality", async () => {
    const fresh = engine({ snapshots: 0 });
    const bad = engine({ snapshots: 64 });
    try {
      const want = await serve(fresh.e, B);
      await serve(bad.e, A);
      const fetch = bad.prefix.fetch.bind(bad.prefix);
      bad.prefix.fetch = (p) => {
        const f = fetch(p);
        return f.source === "snapshot" ? { ...f, cached: f.cached + 1 } : f;
      };
      const got = await serve(bad.e, B);
      expect(got.cached).toBe(41);
      const differs = got.out.some((r, i) => !Object.is(r.logprob, want.out[i]!.logprob) || r.token !== want.out[i]!.token);
      expect(differs).toBe(true);
    } finally {
      fresh.e.close();
      bad.e.close();
    }
  }, CASE);

  it("with --prompt-cache-bytes, snapshots are evicted oldest first to stay within the budget (the batch's bytes counted)", async () => {
    const probe = engine({ snapshots: 64 });
    let sizes: number[] = [];
    let batch = 0;
    try {
      await serve(probe.e, A);
      const s = probe.prefix.stats();
      expect(s.snapshotEntries).toBe(5);
      batch = s.maxBatchBytes;
      sizes = probe.prefix.snapshotSizes();
    } finally {
      probe.e.close();
    }
    expect(batch).toBeGreaterThan(0);
    expect(sizes).toHaveLength(5);
    // room for the batch and the two deepest snapshots (32 and 40 tokens), not three
    const budget = batch + sizes[3]! + sizes[4]! + 16;
    expect(budget).toBeLessThan(batch + sizes[2]! + sizes[3]! + sizes[4]!);
    const small = engine({ snapshots: 64, bytes: budget });
    try {
      await serve(small.e, A);
      const s = small.prefix.stats();
      expect(s.snapshotsTaken).toBe(5);
      expect(s.snapshotsEvicted).toBeGreaterThanOrEqual(3);
      expect(s.snapshotEntries).toBe(s.snapshotsTaken - s.snapshotsEvicted);
      expect(s.snapshotBytes + s.lruBytes + s.batchBytes).toBeLessThanOrEqual(budget);
      // oldest (shallowest) first: the deepest survives, and B still starts from 40
      const got = await serve(small.e, B);
      expect(got.cached).toBe(40);
    } finally {
      small.e.close();
    }
  }, CASE);
});
