// Rewinding caches after a speculative round, right past the sliding window too.
//
// mlx-lm rewinds with trim_prompt_cache, which only works while every RotatingKVCache has
// offset < max_size: once a window has filled, trim is refused for ALL caches (all-or-nothing)
// and the rejected draft tokens stay in every cache (docs: mlxlm-extras §6). The classes here
// keep what the window needs instead:
//
// - RecordingCache (the draft model): forwards every call to its cache and records the
//   keys/values it was fed. rewind(n) trims exactly as mlx-lm when the cache is trimmable;
//   otherwise it restores the cache as it was when the round began and replays the recorded
//   updates without their last n tokens. MLX arrays are immutable, so the snapshot is two
//   handles, not a copy.
//
// - WindowVerifyCache (the target's block verify): a block of L tokens through a
//   RotatingKVCache takes the concatenating path, whose key layout differs from the one that L
//   single-token steps build in place (slots overwritten in rotation). To keep the target's
//   logits bit-identical to plain decoding, the view simulates those L in-place steps on slot
//   labels and returns ONE key array that holds every slot's history in slot order (a slot's old
//   entry directly before the entry that overwrites it), with a bool mask row per query that
//   keeps exactly what the in-place step would attend over. Masked keys get exp(min - max) = 0
//   and add exact zeros, so each row reduces the same values in the same order as the in-place
//   step (sequential reductions: the CPU backend; its SIMD width is 1 on Linux). The cache itself
//   is not touched by the forward; commit(m) applies the first m tokens as m in-place updates,
//   which is what plain decoding would have done.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { MakeMaskOptions, Mask } from "../mask.ts";
import { CacheError, KVCache, type KVCacheLike, RotatingKVCache } from "./index.ts";

/** Keys/values as one update_and_fetch call received them (owned handles). */
interface Update {
  keys: MlxArray;
  values: MlxArray;
}

function sliceTokens(x: MlxArray, start: number, stop: number): MlxArray {
  const s = x.shape;
  return mx.slice(x, [0, 0, start, 0], [s[0]!, s[1]!, stop, s[3]!]);
}

/** A rotating cache's state as handles (MLX arrays are immutable: no copy). */
interface RotatingSnapshot {
  keys: MlxArray | null;
  values: MlxArray | null;
  offset: number;
  idx: number;
}

function snapshot(c: RotatingKVCache): RotatingSnapshot {
  return { keys: c.keys && mx.alias(c.keys), values: c.values && mx.alias(c.values), offset: c.offset, idx: c.idx };
}

function restore(c: RotatingKVCache, s: RotatingSnapshot): void {
  c.keys?.dispose();
  c.values?.dispose();
  c.keys = s.keys;
  c.values = s.values;
  c.offset = s.offset;
  c.idx = s.idx;
}

function disposeSnapshot(s: RotatingSnapshot): void {
  s.keys?.dispose();
  s.values?.dispose();
}

/** Feeds `keys`/`values` to a cache one token at a time (the in-place path), dropping the results. */
function feedSingles(c: KVCacheLike, keys: MlxArray, values: MlxArray, count: number): void {
  for (let i = 0; i < count; i++) {
    using k = sliceTokens(keys, i, i + 1);
    using v = sliceTokens(values, i, i + 1);
    const [a, b] = c.updateAndFetch(k, v);
    a.dispose();
    b.dispose();
  }
}

/** A view of one cache: the queries a model makes on a cache go to `base`. */
abstract class CacheView implements KVCacheLike {
  constructor(readonly base: KVCacheLike) {}

  abstract updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray];
  abstract makeMask(N: number, opts?: MakeMaskOptions): Mask;
  abstract isTrimmable(): boolean;
  abstract trim(n: number): number;
  abstract dispose(): void;

  get offset(): number {
    return this.base.offset;
  }

  get state(): MlxArray[] {
    return this.base.state;
  }

  set state(_v: MlxArray[]) {
    throw new CacheError(this.constructor.name, "a speculative view has no settable state");
  }

  get metaState(): string[] {
    return this.base.metaState;
  }

  set metaState(_v: string[]) {
    throw new CacheError(this.constructor.name, "a speculative view has no settable state");
  }

  size(): number {
    return this.base.size();
  }

  empty(): boolean {
    return this.base.empty();
  }

  get nbytes(): number {
    return this.base.nbytes;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

// ------------------------------------------------------------------ RecordingCache

/**
 * A cache for one speculative round of the draft model: forwards everything to `base`, records
 * each update, and rewinds exactly (see the file comment). Call rewind() or finish() once.
 */
export class RecordingCache extends CacheView {
  private readonly updates: Update[] = [];
  private readonly snap: RotatingSnapshot | null;

  constructor(base: KVCacheLike) {
    super(base);
    this.snap = base instanceof RotatingKVCache ? snapshot(base) : null;
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    const out = this.base.updateAndFetch(keys, values);
    if (this.snap) this.updates.push({ keys: mx.alias(keys), values: mx.alias(values) });
    return out;
  }

  makeMask(N: number, opts?: MakeMaskOptions): Mask {
    return this.base.makeMask(N, opts);
  }

  isTrimmable(): boolean {
    return true;
  }

  trim(n: number): number {
    this.rewind(n);
    return n;
  }

  /** Removes the last n tokens fed this round; the base cache ends as if they were never fed. */
  rewind(n: number): void {
    if (n > 0) {
      if (this.base.isTrimmable() || this.snap === null) {
        this.base.trim(n);
      } else {
        const fed = this.updates.reduce((s, u) => s + u.keys.shape[2]!, 0);
        if (n > fed) throw new CacheError("RecordingCache.rewind", `cannot rewind ${n} tokens, this round fed ${fed}`);
        const c = this.base as RotatingKVCache;
        restore(c, { ...this.snap, keys: this.snap.keys && mx.alias(this.snap.keys), values: this.snap.values && mx.alias(this.snap.values) });
        let keep = fed - n;
        for (const u of this.updates) {
          if (keep === 0) break;
          const S = u.keys.shape[2]!;
          const take = Math.min(S, keep);
          if (take === S) {
            const [a, b] = c.updateAndFetch(u.keys, u.values);
            a.dispose();
            b.dispose();
          } else {
            using k = sliceTokens(u.keys, 0, take);
            using v = sliceTokens(u.values, 0, take);
            const [a, b] = c.updateAndFetch(k, v);
            a.dispose();
            b.dispose();
          }
          keep -= take;
        }
      }
    }
    this.finish();
  }

  /** Ends the round without a rewind (frees the records). */
  finish(): void {
    for (const u of this.updates) {
      u.keys.dispose();
      u.values.dispose();
    }
    this.updates.length = 0;
    if (this.snap) disposeSnapshot(this.snap);
  }

  dispose(): void {
    this.finish();
  }
}

// ------------------------------------------------------------------ WindowVerifyCache

/** A key slot's content in the simulation: an old buffer slot, a new token, or an unused zero slot. */
type Entry = { kind: "old"; slot: number } | { kind: "new"; j: number } | { kind: "zero" };

/** The merged key layout of L in-place steps: gather indices and per-step visibility. */
export interface WindowPlan {
  /** Index into concatenate([old buffer, new keys], axis 2) per merged key. */
  gather: number[];
  /** visible[j][c]: merged key c is attended over at step j. */
  visible: boolean[][];
}

/**
 * Simulates L single-token RotatingKVCache.updateInPlace steps (the same branch conditions as
 * model/cache/index.ts) on slot labels, and merges the L key layouts into one.
 */
export function planWindowSteps(c: RotatingKVCache, L: number): WindowPlan {
  const bufLen = c.keys === null ? 0 : c.keys.shape[2]!;
  const entries: Entry[] = [];
  const order: number[] = []; // entry ids in merged order
  let slots: number[] = []; // entry id per physical slot
  for (let i = 0; i < bufLen; i++) {
    entries.push({ kind: "old", slot: i });
    order.push(i);
    slots.push(i);
  }
  let empty = c.keys === null;
  let { offset, idx } = c;
  const { keep, maxSize } = c;
  const visibleIds: Set<number>[] = [];
  for (let j = 0; j < L; j++) {
    const prev = offset;
    if (empty || (prev >= slots.length && slots.length < maxSize)) {
      const newSize = Math.min(RotatingKVCache.step, maxSize - prev);
      for (let i = 0; i < newSize; i++) {
        entries.push({ kind: "zero" });
        order.push(entries.length - 1);
        slots.push(entries.length - 1);
      }
      empty = false;
      idx = prev;
    }
    const trimSize = slots.length - maxSize;
    if (trimSize > 0) {
      slots = [...slots.slice(0, keep), ...slots.slice(trimSize + keep)];
      idx = maxSize;
    }
    if (idx === maxSize) idx = keep;
    // Assign: the new entry goes right after the content it overwrites.
    entries.push({ kind: "new", j });
    const id = entries.length - 1;
    order.splice(order.indexOf(slots[idx]!) + 1, 0, id);
    slots[idx] = id;
    offset += 1;
    idx += 1;
    visibleIds.push(new Set(offset < slots.length ? slots.slice(0, offset) : slots));
  }
  const merged = order.filter((id) => entries[id]!.kind !== "zero" && visibleIds.some((v) => v.has(id)));
  // Every step's visible keys must appear in the merged order in that step's slot order.
  const pos = new Map(merged.map((id, i) => [id, i]));
  const gather = merged.map((id) => {
    const e = entries[id]!;
    return e.kind === "old" ? e.slot : bufLen + (e as { j: number }).j;
  });
  for (const v of visibleIds) {
    let last = -1;
    for (const id of v) {
      const p = pos.get(id)!;
      if (p <= last) throw new CacheError("planWindowSteps", "the merged key layout does not preserve a step's slot order");
      last = p;
    }
  }
  return { gather, visible: visibleIds.map((v) => merged.map((id) => v.has(id))) };
}

/**
 * The verify view of one RotatingKVCache for a block of L tokens (see the file comment). Give
 * the model a list where each RotatingKVCache past (or reaching) its window is replaced by one of
 * these; after the forward, commit(m) keeps the first m tokens and dispose() frees the records.
 */
export class WindowVerifyCache extends CacheView {
  private readonly plan: WindowPlan;
  private pending: Update | null = null;

  constructor(
    override readonly base: RotatingKVCache,
    readonly L: number,
  ) {
    super(base);
    this.plan = planWindowSteps(base, L);
  }

  /** The bool mask (L, merged length): row j keeps what in-place step j attends over. */
  makeMask(N: number, { windowSize = null }: MakeMaskOptions = {}): Mask {
    if (N !== this.L) throw new CacheError("WindowVerifyCache.makeMask", `planned for ${this.L} tokens, asked for ${N}`);
    if (windowSize !== null && windowSize !== undefined && windowSize !== this.base.maxSize) {
      throw new CacheError("WindowVerifyCache.makeMask", `window_size ${windowSize} != max_size ${this.base.maxSize} is not supported`);
    }
    const C = this.plan.gather.length;
    const bits = new Uint8Array(N * C);
    this.plan.visible.forEach((row, j) => row.forEach((on, c) => (bits[j * C + c] = on ? 1 : 0)));
    return mx.array(bits, [N, C], "bool");
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (this.pending !== null) throw new CacheError("WindowVerifyCache.updateAndFetch", "one update per verify block");
    if (keys.shape[2] !== this.L) throw new CacheError("WindowVerifyCache.updateAndFetch", `planned for ${this.L} tokens, got ${keys.shape[2]}`);
    this.pending = { keys: mx.alias(keys), values: mx.alias(values) };
    using idx = mx.array(Int32Array.from(this.plan.gather), [this.plan.gather.length], "int32");
    const merged = (old: MlxArray | null, fresh: MlxArray): MlxArray => {
      if (old === null) return mx.take(fresh, idx, 2);
      using all = mx.concatenate([old, fresh], 2);
      return mx.take(all, idx, 2);
    };
    const k = merged(this.base.keys, keys);
    try {
      return [k, merged(this.base.values, values)];
    } catch (e) {
      k.dispose();
      throw e;
    }
  }

  /** Applies the first m verified tokens to the cache as m single-token updates. */
  commit(m: number): void {
    if (this.pending === null) throw new CacheError("WindowVerifyCache.commit", "no verify forward ran");
    if (!Number.isInteger(m) || m < 0 || m > this.L) throw new CacheError("WindowVerifyCache.commit", `m must be in [0, ${this.L}], got ${m}`);
    feedSingles(this.base, this.pending.keys, this.pending.values, m);
    this.dispose();
  }

  isTrimmable(): boolean {
    return false;
  }

  trim(_n: number): number {
    throw new CacheError("WindowVerifyCache", "commit(m) instead of trim");
  }

  dispose(): void {
    if (this.pending) {
      this.pending.keys.dispose();
      this.pending.values.dispose();
      this.pending = null;
    }
  }
}

/**
 * The target's caches for one verify block of L tokens: each RotatingKVCache that reaches its
 * window during the block (offset + L >= max_size: mlx-lm's trim would be refused afterwards) is
 * replaced by its WindowVerifyCache; every other cache is used as is (concatenating update, then
 * trim, exactly as mlx-lm).
 */
export function verifyCaches(caches: readonly KVCacheLike[], L: number): KVCacheLike[] {
  return caches.map((c) => (c instanceof RotatingKVCache && c.offset + L >= c.maxSize ? new WindowVerifyCache(c, L) : c));
}

/**
 * After the verify block: keep `keep` of its L tokens in every cache (views commit by replay,
 * the rest trim L - keep, as mlx-lm). Frees the views.
 */
export function commitVerify(views: readonly KVCacheLike[], L: number, keep: number): void {
  for (const c of views) {
    if (c instanceof WindowVerifyCache) c.commit(keep);
    else if (L - keep > 0) {
      if (!(c instanceof KVCache) && !c.isTrimmable()) throw new CacheError("commitVerify", "a cache became untrimmable during the verify block");
      c.trim(L - keep);
    }
  }
}
