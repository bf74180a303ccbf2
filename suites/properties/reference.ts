// A pure-JS reference model of mlx-lm's KV caches over absolute positions (no MLX).
//
// Each buffer slot holds the absolute position + 1 of the token stored there, or 0 for a
// zero-filled (never written) row. The algorithms follow mlx_lm/models/cache.py 0.32.2 step by
// step on plain arrays, so the MLX implementation's buffers can be compared slot by slot; the
// abstract invariants of gemma4-spec.md §5.4 are checked separately (invariants.ts) and do not
// rely on this simulation.

export type Slots = number[]; // position+1, 0 = zero row

export interface RefStep {
  /** Positions (0-based) returned by update_and_fetch, in returned (physical) order; -1 = zero row. */
  returned: number[];
  offsetBefore: number;
  offsetAfter: number;
}

const posOf = (s: number): number => s - 1;

export class RefKVCache {
  static step = 256;
  buf: Slots | null = null;
  offset = 0;
  /** Buffer capacities seen after each growth. */
  growths: { prev: number; S: number; capBefore: number; capAfter: number; preSliced: boolean }[] = [];

  update(S: number): RefStep {
    const prev = this.offset;
    if (this.buf === null || prev + S > this.buf.length) {
      const nSteps = Math.floor((RefKVCache.step + S - 1) / RefKVCache.step);
      const fresh = new Array<number>(nSteps * RefKVCache.step).fill(0);
      const capBefore = this.buf?.length ?? 0;
      let preSliced = false;
      if (this.buf !== null) {
        if (prev % RefKVCache.step !== 0) {
          this.buf = this.buf.slice(0, prev);
          preSliced = true;
        }
        this.buf = this.buf.concat(fresh);
      } else {
        this.buf = fresh;
      }
      this.growths.push({ prev, S, capBefore, capAfter: this.buf.length, preSliced });
    }
    this.offset += S;
    for (let i = 0; i < S; i++) this.buf[prev + i] = prev + i + 1;
    const out = this.offset < this.buf.length ? this.buf.slice(0, this.offset) : this.buf.slice();
    return { returned: out.map(posOf), offsetBefore: prev, offsetAfter: this.offset };
  }

  trim(n: number): number {
    n = Math.min(this.offset, n);
    this.offset -= n;
    return n;
  }

  get capacity(): number {
    return this.buf?.length ?? 0;
  }
}

export class RefRotatingKVCache {
  static step = 256;
  buf: Slots | null = null;
  offset = 0;
  idx = 0;
  constructor(
    readonly maxSize: number,
    readonly keep = 0,
  ) {}

  private trimArr(trimSize: number, v: Slots, append?: Slots): Slots {
    let out = trimSize > 0 ? [...v.slice(0, this.keep), ...v.slice(trimSize + this.keep)] : v.slice();
    if (append) out = out.concat(append);
    return out;
  }

  private temporalOrder(v: Slots): Slots {
    if (this.idx === v.length) return v.slice();
    if (this.idx < this.offset) return [...v.slice(0, this.keep), ...v.slice(this.idx), ...v.slice(this.keep, this.idx)];
    return v.slice(0, this.idx);
  }

  update(S: number): RefStep {
    const prev = this.offset;
    const newTokens = Array.from({ length: S }, (_, i) => prev + i + 1);
    if (S === 1) {
      if (this.buf === null || (prev >= this.buf.length && this.buf.length < this.maxSize)) {
        const newSize = Math.min(RefRotatingKVCache.step, this.maxSize - prev);
        const fresh = new Array<number>(Math.max(newSize, 0)).fill(0);
        this.buf = this.buf === null ? fresh : this.buf.concat(fresh);
        this.idx = prev;
      }
      const trimSize = this.buf.length - this.maxSize;
      if (trimSize > 0) {
        this.buf = this.trimArr(trimSize, this.buf);
        this.idx = this.maxSize;
      }
      if (this.idx === this.maxSize) this.idx = this.keep;
      // Python slice assignment clips the slice to the buffer; S == 1 always fits here.
      this.buf[this.idx] = newTokens[0]!;
      this.offset += 1;
      this.idx += 1;
      const out = this.offset < this.buf.length ? this.buf.slice(0, this.offset) : this.buf.slice();
      return { returned: out.map(posOf), offsetBefore: prev, offsetAfter: this.offset };
    }
    if (this.buf === null) {
      this.buf = newTokens;
    } else {
      this.buf = this.temporalOrder(this.buf);
      this.idx = this.buf.length;
      const trimSize = this.idx - this.maxSize + 1;
      this.buf = this.trimArr(trimSize, this.buf, newTokens);
    }
    this.offset += S;
    this.idx = this.buf.length;
    return { returned: this.buf.map(posOf), offsetBefore: prev, offsetAfter: this.offset };
  }

  trim(n: number): number {
    n = Math.min(this.offset, n);
    this.offset -= n;
    this.idx -= n;
    return n;
  }

  get capacity(): number {
    return this.buf?.length ?? 0;
  }

  metaState(): string[] {
    return [String(this.keep), String(this.maxSize), String(this.offset), String(this.idx)];
  }
}

/** Mask semantics on absolute positions: which returned columns may query i attend? */
export type MaskModel = { kind: "none" } | { kind: "causal" } | { kind: "array"; rows: boolean[][] };

/** The set of positions query i may attend, from the returned key order and the mask. */
export function attended(returned: number[], N: number, i: number, mask: MaskModel): number[] {
  const kL = returned.length;
  const out: number[] = [];
  for (let j = 0; j < kL; j++) {
    let ok: boolean;
    if (mask.kind === "none") ok = true;
    else if (mask.kind === "causal") ok = j <= kL - N + i;
    else {
      const row = mask.rows[i];
      if (row === undefined || row.length !== kL) throw new Error(`mask row ${i} has length ${row?.length} for ${kL} keys`);
      ok = row[j]!;
    }
    if (ok) out.push(returned[j]!);
  }
  return out.sort((a, b) => a - b);
}

/** The ideal sliding-window set for absolute position p. */
export function windowSet(p: number, W: number): number[] {
  const out: number[] = [];
  for (let q = Math.max(0, p - W + 1); q <= p; q++) out.push(q);
  return out;
}
