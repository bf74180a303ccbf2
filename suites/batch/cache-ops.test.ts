// The batch caches against mlx-lm's own BatchKVCache / BatchRotatingKVCache (the live oracle's
// batch_cache_ops): random programs (merge of single-sequence caches or left-padded construction,
// decode steps, right-padded and chunked prefills with prepare/finalize, filter, extend with
// another batch, extract, trim) give, after every op, byte-identical returned keys/values and
// masks and the same state: per-sequence offsets and left padding, _idx, _offset, rotation,
// buffer shapes and key/value bytes. Invariants the differential relies on are checked on the TS
// side too (offset = left-padded position, extract = the sequence's own columns).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import fc from "fast-check";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type OracleClient, type NpyRef, sharedOracle } from "../../oracle/client.ts";
import { type NpyRecord, toNpy } from "../../oracle/npy.ts";
import { KVCache, type KVCacheLike, RotatingKVCache } from "../../model/cache/index.ts";
import { type BatchCacheLike, BatchKVCache, BatchRotatingKVCache } from "../../model/cache/batch.ts";
import type { Mask } from "../../model/mask.ts";
import { cacheState } from "../../parity/batch_engine.ts";
import { compareRaw, formatDiff, rawOf, rawOfNpy } from "../../oracle/compare.ts";
import { checkProperty, propertyTimeout } from "../properties/harness.ts";
import { limit } from "../../tests/time_limit.ts";

let oracle: OracleClient;
beforeAll(async () => {
  oracle = await sharedOracle();
}, limit(120_000));

type Dt = "float32" | "bfloat16" | "float16";

type Step =
  | { op: "decode" }
  | { op: "prefill"; S: number; chunks: number; padded: boolean; lens: number[] }
  | { op: "filter"; keep: boolean[]; order: number }
  | { op: "extend"; other: Build }
  | { op: "extract"; i: number }
  | { op: "trim"; n: number };

interface Build {
  /** new: BatchKVCache(left_padding) fed a left-padded prompt of max(lp) + first columns; merge: of single caches. */
  init: { mode: "new"; lp: number[]; first: number } | { mode: "merge"; lens: number[]; decodes: number[] };
  steps: Step[];
}

interface Prog extends Build {
  kind: "K" | "R";
  W: number;
  H: number;
  Dk: number;
  Dv: number;
  dtype: Dt;
  salt: number;
  window: boolean;
}

/** Deterministic pseudo-random data in [-2, 2). */
function data(shape: number[], dtype: Dt, seed: number): { arr: MlxArray; rec: NpyRecord } {
  const n = shape.reduce((a, b) => a * b, 1);
  const f = new Float32Array(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x297a2d39) >>> 0;
    f[i] = ((x >>> 8) / 2 ** 24) * 4 - 2;
  }
  using a32 = mx.array(f, shape);
  const arr = mx.astype(a32, dtype);
  return { arr, rec: { dtype, shape, data: arr.toBytes() } };
}

type WireOp = Record<string, unknown>;
type Expect = { kind: "kv"; k: MlxArray; v: MlxArray } | { kind: "mask"; m: Mask } | { kind: "trim"; n: number } | { kind: "none" };

/** Runs a program on the TS classes, recording the ops for the oracle and what TS returned. */
function interpret(p: Prog): { ops: WireOp[]; got: { expect: Expect; state: Record<string, unknown> }[]; inputs: MlxArray[] } {
  const ops: WireOp[] = [];
  const got: { expect: Expect; state: Record<string, unknown> }[] = [];
  const inputs: MlxArray[] = [];
  const caches = new Map<string, BatchCacheLike | KVCacheLike>();
  let seed = p.salt;
  const record = (op: WireOp, e: Expect, name: string) => {
    ops.push(op);
    const c = caches.get(name)!;
    got.push({ expect: e, state: cacheState(c) });
    // BatchKVCache invariant: every sequence ends at the shared write index (offset + left_padding = _idx)
    if (c instanceof BatchKVCache) {
      const off = c.offset.toNumbers();
      const lp = c.leftPadding.toNumbers();
      if (off.some((o, i) => o + lp[i]! !== c.idx)) throw new Error(`after ${String(op.op)}: offset ${off} + left_padding ${lp} != _idx ${c.idx}`);
    }
  };
  const update = (name: string, B: number, S: number) => {
    const c = caches.get(name)!;
    const k = data([B, p.H, S, p.Dk], p.dtype, ++seed * 7919);
    const v = data([B, p.H, S, p.Dv], p.dtype, ++seed * 7919);
    inputs.push(k.arr, v.arr);
    const [rk, rv] = c.updateAndFetch(k.arr, v.arr);
    record({ op: "update_and_fetch", cache: name, keys: k.rec, values: v.rec }, { kind: "kv", k: rk, v: rv }, name);
  };
  const mask = (name: string, N: number) => {
    const c = caches.get(name)! as BatchCacheLike;
    const window = p.kind === "R" && p.window ? p.W : null;
    record({ op: "make_mask", cache: name, N, window_size: window }, { kind: "mask", m: c.makeMask(N, { windowSize: window }) }, name);
  };
  const build = (name: string, b: Build) => {
    if (b.init.mode === "new") {
      const c = p.kind === "K" ? new BatchKVCache(b.init.lp) : new BatchRotatingKVCache(p.W, b.init.lp);
      caches.set(name, c);
      record({ op: "new", cache: name, type: c.constructor.name, left_padding: b.init.lp, max_size: p.W }, { kind: "none" }, name);
      // the left-padded prompt (a sequence's left padding never exceeds the columns written)
      const S = Math.max(...b.init.lp) + 1 + b.init.first;
      mask(name, S);
      update(name, b.init.lp.length, S);
    } else {
      const srcs: string[] = [];
      b.init.lens.forEach((len, i) => {
        const s = `${name}.s${i}`;
        srcs.push(s);
        const c = p.kind === "K" ? new KVCache() : new RotatingKVCache(p.W);
        caches.set(s, c);
        record({ op: "new_single", cache: s, type: c.constructor.name, max_size: p.W }, { kind: "none" }, s);
        if (len > 0) update(s, 1, len);
        const decodes = b.init.mode === "merge" ? b.init.decodes[i]! : 0;
        for (let d = 0; d < (len > 0 ? decodes : 0); d++) update(s, 1, 1);
      });
      const singles = srcs.map((s) => caches.get(s)! as KVCacheLike);
      caches.set(name, p.kind === "K" ? BatchKVCache.merge(singles) : BatchRotatingKVCache.merge(singles));
      record({ op: "merge", cache: name, sources: srcs }, { kind: "none" }, name);
    }
    for (const st of b.steps) step(name, st);
  };
  const step = (name: string, st: Step) => {
    const c = caches.get(name)! as BatchCacheLike;
    const B = c.batchSize;
    switch (st.op) {
      case "decode":
        mask(name, 1);
        update(name, B, 1);
        return;
      case "prefill": {
        const S = Math.max(st.S, st.padded ? 2 : 1);
        const lens = Array.from({ length: B }, (_, i) => 1 + ((st.lens[i] ?? 0) % S));
        if (st.padded) {
          const rp = lens.map((l) => S - l);
          c.prepare({ lengths: lens, rightPadding: rp });
          record({ op: "prepare", cache: name, lengths: lens, right_padding: rp }, { kind: "none" }, name);
        }
        // chunks of at least 2 columns while padded (a 1-column chunk is a decode step)
        let left = S;
        const per = Math.max(st.padded ? 2 : 1, Math.ceil(S / st.chunks));
        while (left > 0) {
          let n = Math.min(per, left);
          if (st.padded && left - n === 1) n = left;
          mask(name, n);
          update(name, B, n);
          left -= n;
        }
        if (st.padded) {
          c.finalize();
          record({ op: "finalize", cache: name }, { kind: "none" }, name);
        }
        return;
      }
      case "filter": {
        // (an empty cache is filtered only with zero padding in BatchGenerator; with padding
        // Python's shift would drive _idx negative, which BatchKVCache.filter refuses)
        if (c.empty()) return;
        let keep = st.keep.slice(0, B).flatMap((k, i) => (k ? [i] : []));
        if (keep.length === 0) keep = [st.order % B];
        c.filter(keep);
        record({ op: "filter", cache: name, indices: keep }, { kind: "none" }, name);
        return;
      }
      case "extend": {
        const o = `${name}.o${ops.length}`;
        build(o, st.other);
        const oc = caches.get(o)! as BatchCacheLike;
        c.extend(oc);
        record({ op: "extend", cache: name, other: o }, { kind: "none" }, name);
        return;
      }
      case "extract": {
        if (c.empty()) return;
        const i = st.i % B;
        const to = `${name}.x${ops.length}`;
        caches.set(to, c.extract(i));
        ops.push({ op: "extract", cache: name, index: i, to });
        got.push({ expect: { kind: "none" }, state: cacheState(caches.get(to)!) });
        return;
      }
      case "trim": {
        // at most the shortest sequence's tokens (as speculative decoding trims); beyond, offsets
        // go negative, a state BatchKVCache.filter refuses
        if (!c.isTrimmable()) return;
        const n = st.n % (Math.max(0, Math.min(c.size(), ...c.offset.toNumbers())) + 1);
        record({ op: "trim", cache: name, n }, { kind: "trim", n: c.trim(n) }, name);
        return;
      }
    }
  };
  try {
    build("c", p);
  } finally {
    for (const c of caches.values()) c.dispose();
  }
  return { ops, got, inputs };
}

interface PyResult {
  op: string;
  keys?: NpyRef;
  values?: NpyRef;
  mask?: { kind: string } & Partial<NpyRef>;
  trimmed?: number;
  state: Record<string, unknown>;
}

const canon = (x: unknown) => JSON.stringify(x, (_k, v: unknown) => (v && typeof v === "object" && !Array.isArray(v) ? Object.fromEntries(Object.entries(v as object).sort(([a], [b]) => a.localeCompare(b))) : v));

/** What the programs exercised (checked at the end so the property cannot silently degenerate). */
const seen = new Map<string, number>();
function note(ops: WireOp[], got: { state: Record<string, unknown> }[]): void {
  const add = (k: string) => seen.set(k, (seen.get(k) ?? 0) + 1);
  for (const k of new Set(ops.map((o) => String(o.op)))) add(k);
  if (got.some((g) => g.state.rotated === true)) add("rotated");
  if (ops.some((o) => o.op === "prepare")) add("right-padded prefill");
  if (got.some((g) => Array.isArray(g.state.left_padding) && (g.state.left_padding as number[]).some((x) => x < 0))) add("negative left padding");
  if (ops.some((o, i) => o.op === "extend" && got[i]!.state.rotated === false && got.slice(0, i).some((g) => g.state.rotated === true))) add("extend into temporal order");
}

async function diff(p: Prog): Promise<number> {
  const { ops, got, inputs } = interpret(p);
  note(ops, got);
  const written: string[] = [];
  try {
    const wire = ops.map((o) => {
      if (o.op !== "update_and_fetch") return o;
      return { ...o, keys: writeNpy(o.keys as NpyRecord, written), values: writeNpy(o.values as NpyRecord, written) };
    });
    const r = await oracle.request<{ results: PyResult[] }>("batch_cache_ops", { ops: wire });
    expect(r.results.length).toBe(got.length);
    let compared = 0;
    for (let i = 0; i < got.length; i++) {
      const g = got[i]!;
      const py = r.results[i]!;
      const where = `op #${i} ${canon(ops[i]!.op)} on ${String(ops[i]!.cache)}`;
      const e = g.expect;
      if (e.kind === "kv") {
        for (const [name, a, ref] of [["keys", e.k, py.keys!], ["values", e.v, py.values!]] as const) {
          const d = compareRaw(name, rawOf(a), rawOfNpy(oracle.readArray(ref)));
          if (!d.equal) throw new Error(`${where}: returned ${formatDiff(d)}`);
          compared++;
        }
      } else if (e.kind === "mask") {
        if (e.m === null || e.m === "causal") throw new Error(`${where}: a batch cache mask must be an array, got ${String(e.m)}`);
        if (py.mask?.kind !== "array") throw new Error(`${where}: oracle mask ${py.mask?.kind}`);
        const d = compareRaw("mask", rawOf(e.m), rawOfNpy(oracle.readArray(py.mask as NpyRef)));
        if (!d.equal) throw new Error(`${where}: ${formatDiff(d)}`);
        compared++;
      } else if (e.kind === "trim" && e.n !== py.trimmed) throw new Error(`${where}: trimmed ${e.n} vs oracle ${py.trimmed}`);
      if (canon(g.state) !== canon(py.state)) throw new Error(`${where}: state\n  TS     ${canon(g.state)}\n  oracle ${canon(py.state)}`);
      compared++;
    }
    return compared;
  } finally {
    for (const g of got) {
      if (g.expect.kind === "kv") {
        g.expect.k.dispose();
        g.expect.v.dispose();
      } else if (g.expect.kind === "mask" && g.expect.m !== null && g.expect.m !== "causal") g.expect.m.dispose();
    }
    for (const a of inputs) a.dispose();
    for (const w of written) rmSync(w, { force: true });
  }
}

const npyDir = mkdtempSync(join(tmpdir(), "batch-cache-"));
let npySeq = 0;
function writeNpy(rec: NpyRecord, written: string[]): { npy: string; dtype: string } {
  const path = join(npyDir, `in-${npySeq++}.npy`);
  writeFileSync(path, toNpy(rec));
  written.push(path);
  return { npy: path, dtype: rec.dtype };
}

// ------------------------------------------------------------------------------ arbitraries

function arbBuild(B: number, W: number, depth: number): fc.Arbitrary<Build> {
  const init = fc.oneof(
    fc.record({ lp: fc.array(fc.integer({ min: 0, max: 3 }), { minLength: B, maxLength: B }), first: fc.integer({ min: 0, max: W + 2 }) }).map((r) => ({ mode: "new" as const, ...r })),
    fc.record({ lens: fc.array(fc.integer({ min: 0, max: 2 * W + 2 }), { minLength: B, maxLength: B }), decodes: fc.array(fc.integer({ min: 0, max: 3 }), { minLength: B, maxLength: B }) }).map((r) => ({ mode: "merge" as const, ...r })),
  );
  const step: fc.Arbitrary<Step> = fc.oneof(
    { arbitrary: fc.constant({ op: "decode" as const }), weight: 4 },
    { arbitrary: fc.record({ op: fc.constant("prefill" as const), S: fc.integer({ min: 2, max: 2 * W + 3 }), chunks: fc.integer({ min: 1, max: 3 }), padded: fc.boolean(), lens: fc.array(fc.nat(), { minLength: 4, maxLength: 4 }) }), weight: 3 },
    { arbitrary: fc.record({ op: fc.constant("filter" as const), keep: fc.array(fc.boolean(), { minLength: 4, maxLength: 4 }), order: fc.nat() }), weight: 2 },
    { arbitrary: fc.record({ op: fc.constant("extract" as const), i: fc.nat() }), weight: 1 },
    { arbitrary: fc.record({ op: fc.constant("trim" as const), n: fc.nat() }), weight: 1 },
    ...(depth > 0
      ? [{ arbitrary: fc.integer({ min: 1, max: 3 }).chain((b) => arbBuild(b, W, depth - 1)).map((other) => ({ op: "extend" as const, other })), weight: 2 }]
      : []),
  );
  return fc.record({ init, steps: fc.array(step, { minLength: 0, maxLength: depth > 0 ? 7 : 3 }) });
}

const arbProg: fc.Arbitrary<Prog> = fc
  .record({
    kind: fc.constantFrom("K" as const, "R" as const),
    W: fc.oneof({ arbitrary: fc.integer({ min: 1, max: 8 }), weight: 4 }, { arbitrary: fc.integer({ min: 9, max: 20 }), weight: 1 }),
    B: fc.integer({ min: 1, max: 4 }),
    H: fc.integer({ min: 1, max: 2 }),
    Dk: fc.integer({ min: 1, max: 3 }),
    Dv: fc.integer({ min: 1, max: 3 }),
    dtype: fc.constantFrom("float32" as const, "bfloat16" as const, "float16" as const),
    salt: fc.nat(),
    window: fc.boolean(),
  })
  .chain((h) => arbBuild(h.B, h.W, 1).map((b) => ({ ...h, ...b })));

afterAll(() => rmSync(npyDir, { recursive: true, force: true }));

describe("batch caches vs mlx-lm's BatchKVCache / BatchRotatingKVCache (every op, bit-exact)", () => {
  it("random merge/new, decode, right-padded chunked prefill, filter, extend, extract, trim programs", async () => {
    let total = 0;
    await checkProperty("oracle-batch-cache-ops", fc.asyncProperty(arbProg, async (p) => void (total += await diff(p))));
    console.log(`[batch cache ops] ${total} results compared; programs with: ${[...seen].map(([k, n]) => `${k} ${n}`).join(", ")}`);
    for (const k of ["merge", "new", "filter", "extend", "extract", "trim", "rotated", "right-padded prefill", "negative left padding", "extend into temporal order"]) expect(seen.get(k) ?? 0).toBeGreaterThan(0);
  }, propertyTimeout(120_000));
});
