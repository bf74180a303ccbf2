// The server's prefix reuse: mlx_lm.server 0.32.2's prompt cache (serve/prompt_cache.ts, its
// LRUPromptCache) over the port's cache lists, and, beyond mlx-lm and only when asked
// (--prompt-cache-snapshots N), snapshots of a sequence's caches at its prefill chunk boundaries.
//
// Why snapshots: mlx-lm stores a request's caches at its segment ends and at its finish. A stored
// cache serves a later prompt only if it holds a prefix of that prompt, or if it can be trimmed
// back to the shared prefix; a sliding-window cache (RotatingKVCache) past its window cannot be
// trimmed, and every Gemma 4 has sliding layers, so a prompt that shares a long prefix with an
// earlier one but differs before the earlier one's segment end is prefilled again from the start.
// A snapshot is the sequence's cache list right after one of its prefill chunks (the batch
// caches are finalized after every chunk, so the extracted state is exact), stored under the
// tokens it holds; a later prompt starts from the deepest snapshot that is a proper prefix of it
// when that is deeper than what the LRU cache offers.
//
// The equivalence (asserted by suites/serve/prefix_snapshots.test.ts): the response served from a
// snapshot taken at b equals, token for token and logprob for logprob (bit for bit), the response
// of a run that prefills the same prompt with the same chunk boundaries: those of the run that
// made the snapshot up to b, then b + k * prefill_step_size. For a completion prompt prefilled
// from its start (no other reuse), the boundaries are multiples of prefill_step_size, so the
// served response equals the one served with no reuse at all. Both runs must see the same batch
// composition (e.g. one request at a time): batched padding changes bits whether or not a cache
// is reused. Why it holds: the snapshot is the batch cache's exact state (keys, values, offsets)
// after chunk b; re-merged, a RotatingKVCache keeps its last max_size columns in temporal order,
// and the next chunk's update trims to the last max_size - 1 of them in both runs, so every
// later chunk sees the same keys, values, positions and mask.
//
// Byte budget: with --prompt-cache-bytes, the LRU entries, the snapshots and the running batch's
// caches together stay under it (snapshots are evicted first, oldest first, then the LRU trims as
// mlx_lm.server's does).
import type { KVCacheLike } from "../model/cache/index.ts";
import { KVCache, RotatingKVCache } from "../model/cache/index.ts";
import { canTrimPromptCache, trimPromptCache } from "../model/cache/prompt_cache.ts";
import { type CacheOps, type CacheType, LRUPromptCache } from "./prompt_cache.ts";

export type CacheList = KVCacheLike[];

function disposeList(c: readonly KVCacheLike[]): void {
  for (const x of c) x.dispose();
}

/** copy.deepcopy of a cache list: new handles to the same (immutable) arrays, the same scalars. */
export function copyCacheList(caches: readonly KVCacheLike[]): CacheList {
  const out: CacheList = [];
  try {
    for (const c of caches) {
      const st = c.state;
      try {
        if (c instanceof KVCache) out.push(KVCache.fromState(st, c.metaState));
        else if (c instanceof RotatingKVCache) out.push(RotatingKVCache.fromState(st, c.metaState));
        else throw new Error(`the prompt cache cannot copy a ${c.constructor.name}`);
      } finally {
        for (const a of st) a.dispose();
      }
    }
  } catch (e) {
    disposeList(out);
    throw e;
  }
  return out;
}

export const cacheListOps: CacheOps<CacheList> = {
  nbytes: (c) => c.reduce((a, x) => a + x.nbytes, 0),
  canTrim: (c) => canTrimPromptCache(c),
  copy: (c) => copyCacheList(c),
  trim: (c, n) => void trimPromptCache(c, n),
  dispose: (c) => disposeList(c),
};

export interface PrefixOptions {
  /** --prompt-cache-size (mlx_lm.server's default 10). */
  size: number;
  /** --prompt-cache-bytes: null = no limit (mlx_lm.server's default). */
  bytes: number | null;
  /** --prompt-cache-snapshots: how many chunk-boundary snapshots to keep (0: none, mlx_lm.server's behaviour). */
  snapshots: number;
}

/** Counters for /health and the logs. */
export interface PrefixStats {
  lookups: number;
  /** Requests served from an LRU entry (mlx_lm.server's reuse). */
  lruHits: number;
  /** Requests served from a chunk-boundary snapshot. */
  snapshotHits: number;
  /** Prompt tokens not prefilled thanks to reuse. */
  cachedTokens: number;
  /** Exact hits (nothing left to prefill) served as misses: see fetch(). */
  exactAsMiss: number;
  snapshotsTaken: number;
  snapshotsEvicted: number;
  lruEntries: number;
  lruBytes: number;
  snapshotEntries: number;
  snapshotBytes: number;
  /** The running batch's cache bytes at the last budget check, and the most seen. */
  batchBytes: number;
  maxBatchBytes: number;
}

interface Snapshot {
  tokens: number[];
  cache: CacheList;
  nbytes: number;
}

const isPrefix = (p: readonly number[], of: readonly number[]) => p.length <= of.length && p.every((t, i) => t === of[i]);

/** Chunk-boundary snapshots, least recently used first. */
class SnapshotStore {
  /** Oldest first. */
  private items: Snapshot[] = [];
  nbytes = 0;
  evicted = 0;

  constructor(readonly maxCount: number) {}

  get length(): number {
    return this.items.length;
  }

  has(tokens: readonly number[]): boolean {
    return this.items.some((s) => s.tokens.length === tokens.length && isPrefix(s.tokens, tokens));
  }

  add(tokens: number[], cache: CacheList): void {
    const nbytes = cacheListOps.nbytes(cache);
    this.items.push({ tokens, cache, nbytes });
    this.nbytes += nbytes;
    while (this.items.length > this.maxCount) this.evictOldest();
  }

  /** The deepest snapshot holding a proper prefix of prompt (at least one token left to prefill). */
  deepest(prompt: readonly number[]): Snapshot | null {
    let best: Snapshot | null = null;
    for (const s of this.items) {
      if (s.tokens.length >= prompt.length || (best && s.tokens.length <= best.tokens.length)) continue;
      if (isPrefix(s.tokens, prompt)) best = s;
    }
    if (best) {
      // most recently used last
      this.items.splice(this.items.indexOf(best), 1);
      this.items.push(best);
    }
    return best;
  }

  private evictOldest(): void {
    const s = this.items.shift()!;
    this.nbytes -= s.nbytes;
    disposeList(s.cache);
    this.evicted++;
  }

  sizes(): number[] {
    return this.items.map((s) => s.nbytes);
  }

  trimTo(bytes: number): void {
    while (this.items.length && this.nbytes > bytes) this.evictOldest();
  }

  dispose(): void {
    while (this.items.length) this.evictOldest();
  }
}

export interface Fetched {
  /** Caller-owned (null: start from a fresh cache). */
  cache: CacheList | null;
  /** Tokens of the prompt the cache holds (mlx_lm.server's prompt_cache_count). */
  cached: number;
  source: "lru" | "snapshot" | null;
}

export class PrefixReuse {
  readonly lru: LRUPromptCache<CacheList>;
  private readonly snaps: SnapshotStore;
  private readonly counts = { lookups: 0, lruHits: 0, snapshotHits: 0, cachedTokens: 0, exactAsMiss: 0, snapshotsTaken: 0, batchBytes: 0, maxBatchBytes: 0 };

  constructor(readonly opts: PrefixOptions) {
    // mlx_lm.server: LRUPromptCache(prompt_cache_size), no byte bound of its own (trim_to bounds it)
    this.lru = new LRUPromptCache(cacheListOps, opts.size);
    this.snaps = new SnapshotStore(opts.snapshots);
  }

  get snapshotting(): boolean {
    return this.opts.snapshots > 0;
  }

  /**
   * fetch_nearest_cache, then (with snapshots) the deepest snapshot if it holds more of the prompt.
   * One difference from mlx_lm.server: an exact hit (a stored sequence equal to the whole prompt,
   * nothing left to prefill) is served as a miss; mlx_lm.server passes the empty rest on, where
   * BatchGenerator raises "empty prompt" in its generation thread (the thread dies) and
   * generate_step raises for the sequential path.
   */
  fetch(prompt: readonly number[]): Fetched {
    this.counts.lookups++;
    let [cache, rest] = this.lru.fetchNearest(prompt);
    if (cache !== null && rest.length === 0) {
      cacheListOps.dispose(cache);
      this.counts.exactAsMiss++;
      [cache, rest] = [null, [...prompt]];
    }
    let cached = prompt.length - rest.length;
    let source: Fetched["source"] = cache ? "lru" : null;
    if (this.snapshotting) {
      const s = this.snaps.deepest(prompt);
      if (s && s.tokens.length > cached) {
        if (cache) cacheListOps.dispose(cache);
        cache = copyCacheList(s.cache);
        cached = s.tokens.length;
        source = "snapshot";
      }
    }
    if (source === "lru") this.counts.lruHits++;
    if (source === "snapshot") this.counts.snapshotHits++;
    this.counts.cachedTokens += cached;
    return { cache, cached, source };
  }

  /** insert_cache (the list becomes the cache's). */
  insert(tokens: readonly number[], cache: CacheList, type: CacheType): void {
    this.lru.insert(tokens, cache, type);
  }

  /** Keeps a snapshot (the list becomes the store's) unless one with these tokens is kept already. */
  snapshot(tokens: number[], cache: CacheList, activeBytes: number): void {
    if (!this.snapshotting || this.snaps.has(tokens)) {
      cacheListOps.dispose(cache);
      return;
    }
    this.snaps.add(tokens, cache);
    this.counts.snapshotsTaken++;
    this.enforceBytes(activeBytes);
  }

  /** With --prompt-cache-bytes: snapshots first, then the LRU entries, as mlx_lm.server trims (trim_to(total - active)). */
  enforceBytes(activeBytes: number): void {
    this.counts.batchBytes = activeBytes;
    this.counts.maxBatchBytes = Math.max(this.counts.maxBatchBytes, activeBytes);
    if (this.opts.bytes === null) return;
    this.snaps.trimTo(Math.max(0, this.opts.bytes - activeBytes - this.lru.nbytes));
    this.lru.trimTo({ nBytes: this.opts.bytes - activeBytes - this.snaps.nbytes });
  }

  /** The kept snapshots' sizes in bytes, oldest first (for checks). */
  snapshotSizes(): number[] {
    return this.snaps.sizes();
  }

  stats(): PrefixStats {
    return { ...this.counts, snapshotsEvicted: this.snaps.evicted, lruEntries: this.lru.length, lruBytes: this.lru.nbytes, snapshotEntries: this.snaps.length, snapshotBytes: this.snaps.nbytes };
  }

  dispose(): void {
    this.lru.dispose();
    this.snaps.dispose();
  }
}
