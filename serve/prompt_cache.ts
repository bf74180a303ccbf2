// mlx-lm 0.32.2's LRUPromptCache and PromptTrie (mlx_lm/models/cache.py), the prompt cache
// mlx_lm.server keeps across requests: caches stored under the token sequence they hold, in three
// LRU queues by kind ("assistant", "user", "system"); fetchNearest finds the exact sequence, else
// the shortest stored one that extends the prompt (used only when its caches can be trimmed back to
// the common prefix), else the longest stored prefix of the prompt, and returns a copy with the
// tokens still to prefill; insert evicts by count and bytes; trimTo evicts to a budget.
//
// The cache lists are opaque here (CacheOps says how to measure, copy, trim and free one), so the
// behaviour is checked on stand-ins against mlx-lm's own class (suites/serve/prompt_cache.test.ts).
// The server uses it through serve/prefix_cache.ts (PrefixReuse), wired in serve/engine.ts as
// mlx_lm.server's ResponseGenerator wires it (--prompt-cache-size, --prompt-cache-bytes).
//
// Ownership: an inserted list belongs to the cache (freed with dispose when evicted or replaced);
// fetchNearest returns a copy the caller owns.

export type CacheType = "assistant" | "user" | "system";

export interface CacheOps<C> {
  nbytes(c: C): number;
  canTrim(c: C): boolean;
  copy(c: C): C;
  /** Trims n tokens from the end, in place. */
  trim(c: C, n: number): void;
  dispose(c: C): void;
}

interface Entry<C> {
  cache: C;
  nbytes: number;
  cacheType: CacheType;
}

interface TrieNode<C> {
  /** Children in insertion order (Python dict order decides the search's ties). */
  children: Map<number, TrieNode<C>>;
  value?: Entry<C>;
}

export interface TrieSearch {
  exact: number[] | null;
  shorter: number[] | null;
  longer: number[] | null;
  commonPrefix: number;
}

const size = <C>(n: TrieNode<C>) => n.children.size + (n.value !== undefined ? 1 : 0);

/** PromptTrie for one model (the server serves one). */
export class PromptTrie<C> {
  private readonly root: TrieNode<C> = { children: new Map() };

  add(tokens: readonly number[], value: Entry<C>): Entry<C> | undefined {
    let cur = this.root;
    for (const t of tokens) {
      let next = cur.children.get(t);
      if (!next) cur.children.set(t, (next = { children: new Map() }));
      cur = next;
    }
    const prev = cur.value;
    cur.value = value;
    return prev;
  }

  get(tokens: readonly number[]): Entry<C> {
    let cur = this.root;
    for (const t of tokens) cur = cur.children.get(t)!;
    return cur.value!;
  }

  pop(tokens: readonly number[]): Entry<C> {
    const path = [this.root];
    for (const t of tokens) path.push(path[path.length - 1]!.children.get(t)!);
    const last = path[path.length - 1]!;
    const value = last.value!;
    delete last.value;
    for (let i = tokens.length; i > 0; i--) {
      if (size(path[i]!) > 0) break;
      path[i - 1]!.children.delete(tokens[i - 1]!);
    }
    return value;
  }

  /** Removes and returns the values stored at proper prefixes of tokens, with their lengths. */
  popPrefixes(tokens: readonly number[]): [number, Entry<C>][] {
    const values: [number, Entry<C>][] = [];
    let cur = this.root;
    tokens.forEach((t, i) => {
      if (cur.value !== undefined) {
        values.push([i, cur.value]);
        delete cur.value;
      }
      cur = cur.children.get(t)!;
    });
    return values;
  }

  search(tokens: readonly number[]): TrieSearch {
    let cur = this.root;
    if (tokens.length === 0 && cur.value !== undefined) return { exact: [], shorter: null, longer: null, commonPrefix: 0 };
    let lastIndex = -1;
    let index = 0;
    while (index < tokens.length && cur.children.has(tokens[index]!)) {
      cur = cur.children.get(tokens[index]!)!;
      if (cur.value !== undefined) lastIndex = index;
      index++;
    }
    if (lastIndex === tokens.length - 1 && tokens.length - 1 >= 0) return { exact: [...tokens], shorter: null, longer: null, commonPrefix: 0 };
    // as in Python: a one-token prefix is not offered (last_index > 0)
    const shorter = lastIndex > 0 ? tokens.slice(0, lastIndex + 1) : null;
    let longer: number[] | null = null;
    if (index > 0) {
      let best: number[] | null = null;
      const stack: [TrieNode<C>, number[]][] = [[cur, []]];
      while (stack.length) {
        const [node, extra] = stack.pop()!;
        if (node.value !== undefined) {
          if (best === null || extra.length < best.length) best = extra;
        } else if (best === null || extra.length < best.length) {
          for (const [t, child] of node.children) stack.push([child, [...extra, t]]);
        }
      }
      longer = [...tokens.slice(0, index), ...best!];
    }
    return { exact: null, shorter, longer, commonPrefix: index };
  }
}

const ORDERING: CacheType[] = ["assistant", "user", "system"];
const sameTokens = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((t, i) => t === b[i]);

/** LRUPromptCache.CacheOrder: one LRU queue per kind; eviction takes from the fuller queue, assistant first. */
class CacheOrder {
  readonly lrus = new Map<CacheType, number[][]>(ORDERING.map((k) => [k, []]));
  get length(): number {
    let n = 0;
    for (const q of this.lrus.values()) n += q.length;
    return n;
  }
  push(tokens: number[], cacheType: CacheType): void {
    this.lrus.get(cacheType)!.push(tokens);
  }
  remove(tokens: readonly number[]): void {
    for (const k of ORDERING) {
      const q = this.lrus.get(k)!;
      const i = q.findIndex((t) => sameTokens(t, tokens));
      if (i >= 0) {
        q.splice(i, 1);
        return;
      }
    }
  }
  pop(): number[] {
    let i = 0;
    while (i + 1 < ORDERING.length) {
      const a = this.lrus.get(ORDERING[i]!)!;
      const b = this.lrus.get(ORDERING[i + 1]!)!;
      if (a.length && a.length >= b.length) return a.shift()!;
      i++;
    }
    const last = this.lrus.get(ORDERING[ORDERING.length - 1]!)!;
    if (!last.length) throw new Error("pop from an empty prompt cache"); // Python: IndexError from popleft
    return last.shift()!;
  }
}

export class LRUPromptCache<C> {
  private readonly trie = new PromptTrie<C>();
  private readonly lru = new CacheOrder();
  private nBytes = 0;
  private readonly bytesByType = new Map<CacheType, number>(ORDERING.map((k) => [k, 0]));

  constructor(
    private readonly ops: CacheOps<C>,
    readonly maxSize = 10,
    readonly maxBytes = Number.MAX_SAFE_INTEGER,
  ) {}

  get length(): number {
    return this.lru.length;
  }

  get nbytes(): number {
    return this.nBytes;
  }

  /** The LRU queues, oldest first (for checks). */
  order(): Record<CacheType, number[][]> {
    return Object.fromEntries(ORDERING.map((k) => [k, this.lru.lrus.get(k)!.map((t) => [...t])])) as Record<CacheType, number[][]>;
  }

  /** [a copy of the nearest cache (caller-owned) or null, the tokens still to process]. */
  fetchNearest(tokens: readonly number[]): [C | null, number[]] {
    const r = this.trie.search(tokens);
    if (r.exact !== null) return [this.ops.copy(this.trie.get(r.exact).cache), []];
    const shortLength = r.shorter !== null ? r.shorter.length : 0;
    if (r.longer !== null && r.commonPrefix > shortLength) {
      const entry = this.trie.get(r.longer);
      if (this.ops.canTrim(entry.cache)) {
        const cache = this.ops.copy(entry.cache);
        const prefix = Math.min(tokens.length - 1, r.commonPrefix);
        this.ops.trim(cache, r.longer.length - prefix);
        return [cache, tokens.slice(prefix)];
      }
    }
    if (shortLength > 0) return [this.ops.copy(this.trie.get(r.shorter!).cache), tokens.slice(shortLength)];
    return [null, [...tokens]];
  }

  private drop(tokens: readonly number[]): void {
    const entry = this.trie.pop(tokens);
    this.account(entry, -1);
    this.ops.dispose(entry.cache);
  }

  private account(e: Entry<C>, sign: 1 | -1): void {
    this.nBytes += sign * e.nbytes;
    this.bytesByType.set(e.cacheType, this.bytesByType.get(e.cacheType)! + sign * e.nbytes);
  }

  insert(tokens: readonly number[], cache: C, cacheType: CacheType = "assistant"): void {
    const key = [...tokens];
    const entry: Entry<C> = { cache, nbytes: this.ops.nbytes(cache), cacheType };
    this.account(entry, 1);
    const prev = this.trie.add(key, entry);
    if (prev !== undefined) {
      this.account(prev, -1);
      this.lru.remove(key);
      if (prev.cache !== cache) this.ops.dispose(prev.cache);
    }
    this.lru.push(key, cacheType);
    // a trimmable cache makes its stored prefixes useless: they go
    if (this.ops.canTrim(cache)) {
      for (const [n, e] of this.trie.popPrefixes(key)) {
        this.account(e, -1);
        this.lru.remove(key.slice(0, n));
        this.ops.dispose(e.cache);
      }
    }
    if (this.lru.length > this.maxSize) this.drop(this.lru.pop());
    while (this.nBytes > this.maxBytes) this.drop(this.lru.pop());
  }

  trimTo({ nSequences, nBytes }: { nSequences?: number; nBytes?: number }): void {
    const seqs = nSequences !== undefined ? Math.max(0, nSequences) : Number.MAX_SAFE_INTEGER;
    const bytes = nBytes !== undefined ? Math.max(0, nBytes) : Number.MAX_SAFE_INTEGER;
    while (this.lru.length > seqs) this.drop(this.lru.pop());
    while (this.nBytes > bytes) this.drop(this.lru.pop());
  }

  statsByType(): Record<CacheType, { nSequences: number; nBytes: number }> {
    return Object.fromEntries(ORDERING.map((k) => [k, { nSequences: this.lru.lrus.get(k)!.length, nBytes: this.bytesByType.get(k)! }])) as Record<CacheType, { nSequences: number; nBytes: number }>;
  }

  dispose(): void {
    for (const k of ORDERING) for (const t of [...this.lru.lrus.get(k)!]) this.drop(t);
  }
}
