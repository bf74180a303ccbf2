// Properties of the multimodal prompt handling (seeded, PROPERTY_RUNS cases each):
// - the media masks (language.makeMediaMasks) against mlx-vlm's own _make_masks on random
//   layouts of text / image / audio spans, windows, layer-type orders, batch rows and cache
//   prefixes: identical mask kinds and bytes; and against a plain reference of the rule: a query
//   sees the keys at or before it (within the window on sliding layers) and, when the overlay
//   applies, every key of its own image block;
// - the merge (gemma4.masked_scatter): the i-th placeholder row gets the i-th feature row, in
//   flattened (batch, position) order, and every other row keeps its embedding.
import { beforeAll, describe, expect, it } from "vitest";
import fc from "fast-check";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type MmMaskCase, type OracleClient, sharedOracle } from "../../oracle/client.ts";
import { KVCache, type KVCacheLike, RotatingKVCache } from "../../model/cache/index.ts";
import { disposeMask, type Mask } from "../../model/mask.ts";
import { masked_scatter } from "../../model/gemma4/gemma4.ts";
import { makeMediaMasks } from "../../model/gemma4/language.ts";
import { checkProperty, propertyTimeout } from "./harness.ts";
import { maskEq } from "./oracle-diff-lib.ts";
import { limit } from "../../tests/time_limit.ts";

let oracle: OracleClient;
beforeAll(async () => {
  oracle = await sharedOracle();
}, limit(120_000));

const SPAN = fc.record({ kind: fc.constantFrom(0, 0, 1, 3), len: fc.integer({ min: 1, max: 11 }) });

/** Token types of one row: spans of text (0), image (1) and audio (3), cut or text-padded to N. */
function rowOf(spans: { kind: number; len: number }[], N: number): number[] {
  const row = spans.flatMap((s) => Array<number>(s.len).fill(s.kind)).slice(0, N);
  while (row.length < N) row.push(0);
  return row;
}

const arbCase = fc
  .record({
    N: fc.integer({ min: 1, max: 40 }),
    B: fc.constantFrom(1, 1, 2),
    rows: fc.array(fc.array(SPAN, { minLength: 1, maxLength: 7 }), { minLength: 2, maxLength: 2 }),
    window: fc.integer({ min: 1, max: 16 }),
    order: fc.constantFrom(["sliding_attention", "full_attention"], ["full_attention", "sliding_attention"], ["sliding_attention"], ["full_attention"]),
    bidirectional: fc.constantFrom("vision", "vision", null),
    withTypes: fc.constantFrom(true, true, true, false),
    offset: fc.option(fc.integer({ min: 0, max: 20 }), { nil: null, freq: 3 }),
  })
  .map(
    (c): MmMaskCase => ({
      layer_types: [...c.order, ...c.order],
      window: c.window,
      bidirectional: c.bidirectional,
      B: c.B,
      N: c.N,
      types: c.withTypes ? c.rows.slice(0, c.B).map((r) => rowOf(r, c.N)) : null,
      offset: c.offset,
    }),
  );

/** The TS masks for a case: caches with the case's offset, as the server builds mlx-vlm's. */
function tsMasks(c: MmMaskCase): { byType: Map<string, Mask>; dispose(): void } {
  const caches: (KVCacheLike | null)[] = c.layer_types.map((t) => {
    if (c.offset === null) return null;
    if (t === "full_attention") {
      const k = new KVCache();
      k.metaState = [String(c.offset)];
      return k;
    }
    const r = new RotatingKVCache(c.window, 0);
    r.metaState = ["0", String(c.window), String(c.offset), String(Math.min(c.offset, c.window))];
    return r;
  });
  using mm = c.types ? mx.array(Int32Array.from(c.types.flat()), [c.B, c.N], "int32") : null;
  const masks = makeMediaMasks(c.layer_types, c.window, c.bidirectional, [c.B, c.N, 1], caches, mm);
  const byType = new Map<string, Mask>();
  c.layer_types.forEach((t, i) => byType.has(t) || byType.set(t, masks[i]!));
  return {
    byType,
    dispose: () => {
      for (const m of new Set(masks)) disposeMask(m);
      for (const k of caches) k?.dispose();
    },
  };
}

/** The rule in plain JS: may query q (of the call) see key k (absolute position)? */
function allowed(c: MmMaskCase, t: string, b: number, q: number, k: number): boolean {
  const offset = c.offset ?? 0;
  const sliding = t === "sliding_attention";
  // a rotating cache holds at most window-1 earlier keys; the mask's columns start there
  const start = sliding ? offset - Math.min(c.window - 1, offset) : 0;

  const qa = offset + q;
  const ka = start + k;
  let ok = ka <= qa && (!sliding || qa - ka < c.window);
  const types = c.types;
  const overlay = c.bidirectional === "vision" && types !== null && types.flat().some((x) => x === 1 || x === 2) && c.N > 1;
  // mlx-vlm overlays only a square mask over the call's own tokens (no cache prefix columns;
  // a window of 1 leaves none, so the overlay applies there even after a prefix)
  const cols = (sliding ? Math.min(c.window - 1, offset) : offset) + c.N;
  if (overlay && cols === c.N) {
    // same contiguous run of image tokens
    const row = types![b]!;
    const block = (i: number) => {
      if (row[i] !== 1 && row[i] !== 2) return -1;
      let j = i;
      while (j > 0 && (row[j - 1] === 1 || row[j - 1] === 2)) j--;
      return j;
    };
    const bq = block(q);
    ok ||= bq !== -1 && bq === block(k);
  }
  return ok;
}

function checkReference(c: MmMaskCase, t: string, m: Mask): void {
  const offset = c.offset ?? 0;
  const sliding = t === "sliding_attention";
  const cols = sliding && c.offset !== null ? Math.min(c.window - 1, offset) + c.N : offset + c.N;
  let bits: boolean[] | null = null;
  let shape: number[] = [];
  if (m !== null && m !== "causal") {
    bits = Array.from((m as MlxArray).toBytes(), (x) => x !== 0);
    shape = (m as MlxArray).shape;
  }
  for (let b = 0; b < c.B; b++) {
    for (let q = 0; q < c.N; q++) {
      for (let k = 0; k < cols; k++) {
        const want = allowed(c, t, b, q, k);
        let got: boolean;
        if (m === null) got = true; // a single query sees every key
        else if (m === "causal") got = (sliding ? Math.min(c.window - 1, offset) : offset) + q >= k; // SDPA's causal mode: aligned at the end
        else {
          const bb = shape.length === 4 ? b : 0; // (B, 1, N, K) with the overlay, else (N, K)
          got = bits![(bb * c.N + q) * shape[shape.length - 1]! + k]!;
        }
        if (got !== want) throw new Error(`${t} b=${b} q=${q} k=${k}: mask ${got}, rule ${want} (${JSON.stringify(c)})`);
      }
    }
  }
}

describe("media masks vs mlx-vlm's _make_masks (language.py)", () => {
  it("random text/image/audio layouts, windows, layer orders, rows and cache prefixes → identical kinds and bytes, and the block rule", async () => {
    await checkProperty(
      "media-masks-vs-mlx-vlm",
      fc.asyncProperty(arbCase, async (c) => {
        const [py] = await oracle.mmMasks([c]);
        const ts = tsMasks(c);
        try {
          for (const [t, m] of ts.byType) {
            maskEq(m, py![t]!, `${t} ${JSON.stringify(c)}`);
            checkReference(c, t, m);
          }
        } finally {
          ts.dispose();
        }
      }),
    );
  }, propertyTimeout(120_000));
});

describe("the merge (masked_scatter)", () => {
  const arbMerge = fc.record({
    B: fc.integer({ min: 1, max: 3 }),
    L: fc.integer({ min: 1, max: 24 }),
    D: fc.integer({ min: 1, max: 6 }),
    density: fc.double({ min: 0, max: 1, noNaN: true }),
    seed: fc.integer({ min: 0, max: 2 ** 31 - 1 }),
  });
  it("the i-th placeholder row (batch-major) gets the i-th feature row; other rows keep theirs", () => {
    checkProperty(
      "merge-places-features-in-order",
      fc.property(arbMerge, ({ B, L, D, density, seed }) => {
        let x = seed >>> 0;
        const rnd = () => ((x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x297a2d39) >>> 0) / 2 ** 32);
        const place = Array.from({ length: B * L }, () => rnd() < density);
        const n = place.filter(Boolean).length;
        const emb = Float32Array.from({ length: B * L * D }, () => rnd() * 2 - 1);
        const feat = Float32Array.from({ length: Math.max(n, 1) * D }, () => rnd() * 10 + 5);
        using e = mx.array(emb, [B, L, D]);
        using f = mx.array(feat, [1, Math.max(n, 1), D]);
        using pm = mx.array(Uint8Array.from(place, (p) => (p ? 1 : 0)), [B, L, 1], "bool");
        using mask = mx.broadcastTo(pm, [B, L, D]);
        using out = masked_scatter(e, mask, f);
        const got = out.toNumbers();
        let j = 0;
        for (let r = 0; r < B * L; r++) {
          const src = place[r] ? feat.subarray(j * D, (j + 1) * D) : emb.subarray(r * D, (r + 1) * D);
          if (place[r]) j++;
          for (let d = 0; d < D; d++) if (got[r * D + d] !== src[d]!) throw new Error(`row ${r} dim ${d}: ${got[r * D + d]} vs ${src[d]}`);
        }
        expect(j).toBe(n);
      }),
    );
  });
});
