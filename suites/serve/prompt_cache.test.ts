// serve/prompt_cache.ts (LRUPromptCache, PromptTrie) against mlx-lm 0.32.2's own LRUPromptCache
// (oracle/python/lru_prompt_cache_ref.py, one Python process for all runs), on stand-in caches
// (an id, a byte size, whether it is trimmable, the tokens trimmed from it): 40 random runs of 60
// operations each (insert with a random kind, size and trimmability; fetch; trim_to by count or
// bytes) over a 3-token alphabet and prompts of 0..6 tokens, so that exact hits, shorter and
// longer neighbours, common prefixes, replaced entries, popped prefixes and evictions all occur.
// Compared after every operation: each fetch's result (which entry was copied, how many tokens
// were trimmed from the copy, the tokens left to process), the entry count, the byte total, the
// three LRU queues in order and the per-kind statistics. The counts of each outcome are asserted
// so that the cases are known to occur. Stand-ins, not MLX caches: what a copy or a trim does to
// a real cache is model/cache's, tested there.
import { expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { type CacheType, LRUPromptCache } from "../../serve/prompt_cache.ts";

const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");

interface StandIn {
  id: number;
  nbytes: number;
  trimmable: boolean;
  trimmed: number;
}

type Op = { op: "insert"; tokens: number[]; id: number; nbytes: number; trimmable: boolean; type: CacheType } | { op: "fetch"; tokens: number[] } | { op: "trim_to"; n_sequences: number | null; n_bytes: number | null };

function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function makeRun(seed: number): { max_size: number; max_bytes: number | null; ops: Op[] } {
  const r = rng(seed);
  const int = (n: number) => Math.floor(r() * n);
  const tokens = () => Array.from({ length: int(7) }, () => int(3));
  const ops: Op[] = [];
  let id = 0;
  for (let i = 0; i < 60; i++) {
    const x = r();
    if (x < 0.5) ops.push({ op: "insert", tokens: tokens(), id: ++id, nbytes: 1 + int(100), trimmable: r() < 0.4, type: (["assistant", "user", "system"] as const)[int(3)]! });
    else if (x < 0.92) ops.push({ op: "fetch", tokens: tokens() });
    else ops.push(r() < 0.5 ? { op: "trim_to", n_sequences: int(6), n_bytes: null } : { op: "trim_to", n_sequences: null, n_bytes: int(300) });
  }
  return { max_size: 2 + int(8), max_bytes: r() < 0.5 ? 150 + int(300) : null, ops };
}

it("LRUPromptCache = mlx-lm's on 40 random runs of 60 operations (stand-in caches)", () => {
  const runs = Array.from({ length: 40 }, (_, i) => makeRun(1000 + i));
  const py = spawnSync(PYTHON, ["oracle/python/lru_prompt_cache_ref.py"], { cwd: REPO_ROOT, input: JSON.stringify({ runs }), encoding: "utf8", timeout: 60_000 });
  expect(py.status, py.stderr).toBe(0);
  const want = JSON.parse(py.stdout) as { cache?: { id: number; trimmed: number } | null; rest?: number[]; state: unknown }[][];
  expect(want).toHaveLength(runs.length);
  const seen = { exact: 0, shorter: 0, trimmedLonger: 0, miss: 0, evicted: 0 };
  let compared = 0;
  runs.forEach((run, ri) => {
    let disposed = 0;
    const c = new LRUPromptCache<StandIn>(
      { nbytes: (s) => s.nbytes, canTrim: (s) => s.trimmable, copy: (s) => ({ ...s }), trim: (s, n) => void (s.trimmed += n), dispose: () => void disposed++ },
      run.max_size,
      run.max_bytes ?? Number.MAX_SAFE_INTEGER,
    );
    run.ops.forEach((op, oi) => {
      const rec: Record<string, unknown> = {};
      if (op.op === "insert") c.insert(op.tokens, { id: op.id, nbytes: op.nbytes, trimmable: op.trimmable, trimmed: 0 }, op.type);
      else if (op.op === "fetch") {
        const [cache, rest] = c.fetchNearest(op.tokens);
        rec.cache = cache === null ? null : { id: cache.id, trimmed: cache.trimmed };
        rec.rest = rest;
        if (cache === null) seen.miss++;
        else if (rest.length === 0) seen.exact++;
        else if (cache.trimmed > 0) seen.trimmedLonger++;
        else seen.shorter++;
      } else c.trimTo({ ...(op.n_sequences !== null ? { nSequences: op.n_sequences } : {}), ...(op.n_bytes !== null ? { nBytes: op.n_bytes } : {}) });
      const stats = c.statsByType();
      rec.state = {
        len: c.length,
        nbytes: c.nbytes,
        order: c.order(),
        stats: Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, { n_sequences: v.nSequences, n_bytes: v.nBytes }])),
      };
      expect([ri, oi, rec]).toEqual([ri, oi, want[ri]![oi]]);
      compared++;
    });
    seen.evicted += disposed;
  });
  expect(compared).toBe(40 * 60);
  // every kind of outcome occurred
  for (const [k, v] of Object.entries(seen)) expect([k, v > 0]).toEqual([k, true]);
});
