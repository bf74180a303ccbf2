// Differential checks (used by oracle-diff.test.ts and suites/mutations) against the live oracle (mlx-lm's own KVCache / RotatingKVCache and
// mask functions in oracle/python/server.py): random chunk-size sequences (S ∈ 1..3W), random
// trims, random dtypes and head shapes give byte-identical returned keys/values, masks, cache
// scalars (offset/keep/max_size/_idx) and buffer shapes after every op, and identical state
// buffers at the end; random window sizes / offsets / prompt lengths give identical masks.
import fc from "fast-check";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type CacheOp, type CacheOpResult, type MaskResult, OracleClient, sharedOracle } from "../../oracle/client.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { KVCache, RotatingKVCache, type KVCacheLike } from "../../model/cache/index.ts";
import { createAttentionMask, createCausalMask, type Mask } from "../../model/mask.ts";
import { compareRaw, formatDiff, rawOf, rawOfNpy } from "../../oracle/compare.ts";

let oracle: OracleClient;
/** Starts (or reuses) the shared oracle; call before the properties run. */
export async function useOracle(): Promise<OracleClient> {
  oracle = await sharedOracle();
  return oracle;
}

type Dt = "float32" | "bfloat16" | "float16";

export interface Scn {
  type: "KVCache" | "RotatingKVCache";
  W: number;
  B: number;
  H: number;
  Dk: number;
  Dv: number;
  dtype: Dt;
  salt: number;
  /** RotatingKVCache keep (tokens pinned at the start), < W. */
  keep?: number;
  /** chunk S, or trim -n (n taken mod offset+1 when trimmable). */
  ops: ({ kind: "chunk"; S: number } | { kind: "trim"; n: number })[];
}

/** Deterministic pseudo-random keys/values for one chunk (values depend on position and salt). */
export function chunkData(s: Scn, start: number, S: number, D: number, which: number): { arr: MlxArray; rec: NpyRecord } {
  const n = s.B * s.H * S * D;
  const f = new Float32Array(n);
  let x = (s.salt ^ (start * 2654435761) ^ (which * 40503)) >>> 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x297a2d39) >>> 0;
    f[i] = ((x >>> 8) / 2 ** 24) * 4 - 2;
  }
  using a32 = mx.array(f, [s.B, s.H, S, D]);
  const arr = mx.astype(a32, s.dtype);
  return { arr, rec: { dtype: s.dtype, shape: [s.B, s.H, S, D], data: arr.toBytes() } };
}

export function maskEq(ts: Mask, py: MaskResult, where: string): void {
  const kind = ts === null ? "none" : ts === "causal" ? "causal" : "array";
  if (kind !== py.kind) throw new Error(`${where}: mask kind ${kind} vs oracle ${py.kind}`);
  if (kind === "array") {
    const d = compareRaw("mask", rawOf(ts as MlxArray), rawOfNpy(py.array!));
    if (!d.equal) throw new Error(`${where}: ${formatDiff(d)}`);
  }
}

function metaEq(c: KVCacheLike, py: Record<string, unknown> | null, where: string): void {
  if (py === null) throw new Error(`${where}: oracle has no cache meta`);
  const k = (c as KVCache).keys;
  const ts: Record<string, unknown> = { type: c instanceof KVCache ? "KVCache" : "RotatingKVCache", offset: c.offset };
  if (c instanceof RotatingKVCache) Object.assign(ts, { keep: c.keep, max_size: c.maxSize, idx: c.idx });
  ts.keys_shape = k ? k.shape : null;
  ts.values_shape = (c as KVCache).values ? (c as KVCache).values!.shape : null;
  const pyS: Record<string, unknown> = {};
  for (const key of Object.keys(ts)) pyS[key] = py[key];
  if (JSON.stringify(ts) !== JSON.stringify(pyS)) throw new Error(`${where}: cache ${JSON.stringify(ts)} vs oracle ${JSON.stringify(pyS)}`);
}

/** Runs the scenario on both sides and compares after every op. */
export async function runDiff(s: Scn): Promise<number> {
  const ops: CacheOp[] = [
    s.type === "KVCache" ? { op: "new", type: "KVCache" } : { op: "new", type: "RotatingKVCache", max_size: s.W, keep: s.keep ?? 0 },
  ];
  const c: KVCacheLike = s.type === "KVCache" ? new KVCache() : new RotatingKVCache(s.W, s.keep ?? 0);
  // TS side first, recording what to ask the oracle (trims need the TS offset to pick n).
  type Rec = { kind: "mask"; m: Mask } | { kind: "upd"; k: MlxArray; v: MlxArray } | { kind: "trim"; n: number } | { kind: "none" };
  const recs: Rec[] = [{ kind: "none" }];
  const inputs: MlxArray[] = [];
  const win = s.type === "KVCache" ? null : s.W;
  try {
    for (const op of s.ops) {
      if (op.kind === "trim") {
        if (!c.isTrimmable()) continue;
        const n = op.n % (c.offset + 1);
        c.trim(n);
        ops.push({ op: "trim", n });
        recs.push({ kind: "trim", n });
        continue;
      }
      const off = c.offset;
      recs.push({ kind: "mask", m: c.makeMask(op.S, { windowSize: win }) });
      ops.push({ op: "make_mask", N: op.S, window_size: win });
      const k = chunkData(s, off, op.S, s.Dk, 1);
      const v = chunkData(s, off, op.S, s.Dv, 2);
      inputs.push(k.arr, v.arr);
      const [rk, rv] = c.updateAndFetch(k.arr, v.arr);
      recs.push({ kind: "upd", k: rk, v: rv });
      ops.push({ op: "update_and_fetch", keys: k.rec, values: v.rec });
    }
    ops.push({ op: "state" });
    const py = await oracle.cacheOps(ops);
    if (py.length !== recs.length + 1) throw new Error(`oracle returned ${py.length} results for ${recs.length + 1} ops`);
    let compared = 0;
    for (let i = 0; i < recs.length; i++) {
      const r = recs[i]!;
      const p = py[i] as CacheOpResult;
      const where = `${s.type} W=${s.W} op #${i} (${p.op})`;
      if (r.kind === "mask") maskEq(r.m, p.mask!, where);
      else if (r.kind === "upd") {
        for (const [name, a, e] of [["keys", r.k, p.keys!], ["values", r.v, p.values!]] as const) {
          const d = compareRaw(name, rawOf(a), rawOfNpy(e));
          if (!d.equal) throw new Error(`${where}: returned ${formatDiff(d)}`);
          compared++;
        }
      } else if (r.kind === "trim") {
        if (p.trimmed !== r.n) throw new Error(`${where}: trimmed ${r.n} vs oracle ${p.trimmed}`);
      }
      // Cache scalars and buffer shapes after each op: only meaningful for ops up to now, so
      // replay our cache's history is not possible; compare at the ops where we still hold it.
      if (i === recs.length - 1) metaEq(c, p.meta, where);
    }
    // Per-op metas were compared against a replay below; final state buffers byte for byte.
    const st = py[py.length - 1]!.state!;
    const tsState = c.state;
    try {
      const bufs = st.filter((x): x is NpyRecord => x !== null && typeof x === "object");
      if (bufs.length !== tsState.length) throw new Error(`state arity ${tsState.length} vs oracle ${bufs.length}`);
      for (let j = 0; j < bufs.length; j++) {
        const d = compareRaw(j === 0 ? "state keys" : "state values", rawOf(tsState[j]!), rawOfNpy(bufs[j]!));
        if (!d.equal) throw new Error(`${s.type} W=${s.W} final ${formatDiff(d)}`);
      }
      const ints = st.filter((x): x is number => typeof x === "number");
      const want = c instanceof RotatingKVCache ? [c.offset, c.keep, c.maxSize, c.idx] : [c.offset];
      if (JSON.stringify(ints) !== JSON.stringify(want)) throw new Error(`state scalars ${want} vs oracle ${ints}`);
    } finally {
      for (const a of tsState) a.dispose();
    }
    return compared;
  } finally {
    for (const r of recs) {
      if (r.kind === "mask" && r.m !== null && r.m !== "causal") r.m.dispose();
      if (r.kind === "upd") {
        r.k.dispose();
        r.v.dispose();
      }
    }
    for (const a of inputs) a.dispose();
    c.dispose();
  }
}

/** Per-op meta check: replays the TS cache op by op and compares with the oracle's meta after each. */
export async function runMetaDiff(s: Scn): Promise<void> {
  const ops: CacheOp[] = [s.type === "KVCache" ? { op: "new", type: "KVCache" } : { op: "new", type: "RotatingKVCache", max_size: s.W, keep: s.keep ?? 0 }];
  const c: KVCacheLike = s.type === "KVCache" ? new KVCache() : new RotatingKVCache(s.W, s.keep ?? 0);
  const metas: { where: string; ts: string }[] = [];
  const snap = (where: string) => {
    const k = (c as KVCache).keys;
    const o: Record<string, unknown> = { offset: c.offset };
    if (c instanceof RotatingKVCache) Object.assign(o, { keep: c.keep, max_size: c.maxSize, idx: c.idx });
    o.keys_shape = k ? k.shape : null;
    metas.push({ where, ts: JSON.stringify(o) });
  };
  snap("new");
  try {
    for (const op of s.ops) {
      if (op.kind === "trim") {
        if (!c.isTrimmable()) continue;
        const n = op.n % (c.offset + 1);
        c.trim(n);
        ops.push({ op: "trim", n });
        snap(`trim ${n}`);
        continue;
      }
      const k = chunkData(s, c.offset, op.S, s.Dk, 1);
      const v = chunkData(s, c.offset, op.S, s.Dv, 2);
      const [rk, rv] = c.updateAndFetch(k.arr, v.arr);
      rk.dispose();
      rv.dispose();
      k.arr.dispose();
      v.arr.dispose();
      ops.push({ op: "update_and_fetch", keys: k.rec, values: v.rec });
      snap(`update S=${op.S}`);
    }
    const py = await oracle.cacheOps(ops);
    for (let i = 0; i < metas.length; i++) {
      const m = py[i]!.meta!;
      const o: Record<string, unknown> = { offset: m.offset };
      if (s.type === "RotatingKVCache") Object.assign(o, { keep: m.keep, max_size: m.max_size, idx: m.idx });
      o.keys_shape = m.keys_shape;
      if (JSON.stringify(o) !== metas[i]!.ts) throw new Error(`${s.type} W=${s.W} after op #${i} (${metas[i]!.where}): TS ${metas[i]!.ts} vs oracle ${JSON.stringify(o)}`);
    }
  } finally {
    c.dispose();
  }
}

export const arbDt = fc.constantFrom("float32", "bfloat16", "float16") as fc.Arbitrary<Dt>;

export const arbRot: fc.Arbitrary<Scn> = fc
  .record({ W: fc.oneof({ arbitrary: fc.integer({ min: 1, max: 12 }), weight: 5 }, { arbitrary: fc.integer({ min: 13, max: 40 }), weight: 1 }), B: fc.integer({ min: 1, max: 2 }), H: fc.integer({ min: 1, max: 2 }), Dk: fc.integer({ min: 1, max: 4 }), Dv: fc.integer({ min: 1, max: 4 }), dtype: arbDt, salt: fc.nat(), keepRaw: fc.oneof({ arbitrary: fc.constant(0), weight: 3 }, { arbitrary: fc.nat(), weight: 1 }) })
  .map(({ keepRaw, ...b }) => ({ ...b, keep: keepRaw % b.W }))
  .chain((b) =>
    fc
      .array(
        fc.oneof(
          { arbitrary: fc.constant({ kind: "chunk" as const, S: 1 }), weight: 3 },
          { arbitrary: fc.integer({ min: 2, max: Math.max(2, 3 * b.W) }).map((S) => ({ kind: "chunk" as const, S })), weight: 3 },
          { arbitrary: fc.integer({ min: 0, max: 3 * b.W }).map((n) => ({ kind: "trim" as const, n })), weight: 1 },
        ),
        { minLength: 1, maxLength: 12 },
      )
      .map((ops) => ({ ...b, type: "RotatingKVCache" as const, ops })),
  );

export const arbKV: fc.Arbitrary<Scn> = fc
  .record({ B: fc.integer({ min: 1, max: 2 }), H: fc.integer({ min: 1, max: 2 }), Dk: fc.integer({ min: 1, max: 3 }), Dv: fc.integer({ min: 1, max: 3 }), dtype: arbDt, salt: fc.nat() })
  .chain((b) =>
    fc
      .array(
        fc.oneof(
          { arbitrary: fc.constant({ kind: "chunk" as const, S: 1 }), weight: 3 },
          { arbitrary: fc.integer({ min: 2, max: 600 }).map((S) => ({ kind: "chunk" as const, S })), weight: 3 },
          { arbitrary: fc.integer({ min: 0, max: 300 }).map((n) => ({ kind: "trim" as const, n })), weight: 1 },
        ),
        { minLength: 1, maxLength: 8 },
      )
      .map((ops) => ({ ...b, W: 0, type: "KVCache" as const, ops })),
  );


export const arbMask = fc.record({
    fn: fc.constantFrom("create_attention_mask", "create_causal_mask") as fc.Arbitrary<"create_attention_mask" | "create_causal_mask">,
    N: fc.integer({ min: 1, max: 48 }),
    offset: fc.integer({ min: 0, max: 80 }),
    window: fc.option(fc.integer({ min: 1, max: 40 }), { nil: null }),
    returnArray: fc.boolean(),
    cache: fc.constantFrom("none", "KVCache", "RotatingKVCache") as fc.Arbitrary<"none" | "KVCache" | "RotatingKVCache">,
    maxSize: fc.integer({ min: 1, max: 40 }),
    idx: fc.integer({ min: 0, max: 45 }),
  });


export async function maskCase(m: typeof arbMask extends fc.Arbitrary<infer T> ? T : never): Promise<void> {
        let ts: Mask;
        let py: MaskResult;
        if (m.fn === "create_causal_mask") {
          ts = createCausalMask(m.N, m.offset, m.window);
          py = await oracle.makeMask({ fn: m.fn, N: m.N, offset: m.offset, window_size: m.window });
        } else {
          let c: KVCacheLike | null = null;
          let spec: Parameters<OracleClient["makeMask"]>[0]["cache"] = null;
          if (m.cache === "KVCache") {
            c = new KVCache();
            c.metaState = [String(m.offset)];
            spec = { type: "KVCache", offset: m.offset };
          } else if (m.cache === "RotatingKVCache") {
            c = new RotatingKVCache(m.maxSize, 0);
            c.metaState = ["0", String(m.maxSize), String(m.offset), String(m.idx)];
            spec = { type: "RotatingKVCache", offset: m.offset, max_size: m.maxSize, keep: 0, idx: m.idx };
          }
          ts = createAttentionMask([1, m.N, 1], c, { windowSize: m.window, returnArray: m.returnArray });
          py = await oracle.makeMask({ fn: m.fn, N: m.N, window_size: m.window, return_array: m.returnArray, cache: spec });
          c?.dispose();
        }
        try {
          maskEq(ts, py, JSON.stringify(m));
        } finally {
          if (ts !== null && ts !== "causal") ts.dispose();
        }
}
