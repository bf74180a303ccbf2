// The 12 cache/mask invariants of gemma4-spec.md §5.4 as seeded properties, checked against a
// pure reference model of absolute positions (reference.ts). No oracle needed.
// PROPERTY_RUNS (default 100) scales every property; failures print seed + shrunk counterexample.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import * as mx from "@mlx-bun/mlx";
import { KVCache, RotatingKVCache, type KVCacheLike } from "../../model/cache/index.ts";
import { createAttentionMask, createCausalMask, describeMask } from "../../model/mask.ts";
import { arbOps, arbRotatingScenario, arbWindow, bufferSlots, bufLen, drive, keysFor, type Op, valuesFor } from "./drive.ts";
import { attended, RefKVCache, RefRotatingKVCache, windowSet } from "./reference.ts";
import { checkProperty, propertyTimeout } from "./harness.ts";

const eq = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

function assert(cond: boolean, msg: () => string): void {
  if (!cond) throw new Error(msg());
}

/** Feeds `ops` to a fresh rotating cache and to the reference; checks buffers slot by slot. */
function withRef(W: number, ops: readonly Op[]) {
  const c = new RotatingKVCache(W, 0);
  const ref = new RefRotatingKVCache(W, 0);
  try {
    const recs = drive(c, ops, W);
    return { recs, c, ref };
  } catch (e) {
    c.dispose();
    throw e;
  }
}

describe("RotatingKVCache invariants (pure reference model, §5.4)", () => {
  it("1. window exactness: every query attends exactly {max(0,p-W+1)..p}", () => {
    checkProperty(
      "inv1-window-exactness",
      fc.property(arbRotatingScenario(), ({ W, ops }) => {
        const { recs, c } = withRef(W, ops);
        c.dispose();
        for (const r of recs) {
          if (r.op.kind !== "chunk") continue;
          const S = r.op.S;
          for (let i = 0; i < S; i++) {
            const p = r.offsetBefore + i;
            const got = attended(r.returnedK!, S, i, r.mask!);
            const want = windowSet(p, W);
            assert(eq(got, want), () => `W=${W} S=${S} offset=${r.offsetBefore} query ${i} (pos ${p}): attends [${got}], want [${want}]`);
          }
        }
      }),
    );
  }, propertyTimeout());

  it("2. mask/key-length agreement: array mask (N, min(W-1,offset)+N) = returned length; causal iff ≤ W; N==1 ⇒ None", () => {
    checkProperty(
      "inv2-mask-key-length",
      fc.property(arbRotatingScenario(), ({ W, ops }) => {
        const { recs, c } = withRef(W, ops);
        c.dispose();
        for (const r of recs) {
          if (r.op.kind !== "chunk") continue;
          const S = r.op.S;
          const o = Math.min(W - 1, r.offsetBefore);
          const kL = r.returnedK!.length;
          if (S === 1) {
            assert(r.mask!.kind === "none", () => `S=1 mask is ${r.mask!.kind}, want None`);
            continue;
          }
          if (o + S <= W) assert(r.mask!.kind === "causal", () => `W=${W} S=${S} off=${r.offsetBefore}: mask ${r.mask!.kind}, want causal`);
          else {
            assert(r.mask!.kind === "array", () => `W=${W} S=${S} off=${r.offsetBefore}: mask ${r.mask!.kind}, want array`);
            assert(eq(r.maskShape, [S, o + S]), () => `mask shape [${r.maskShape}] want [${S},${o + S}]`);
            assert(r.maskShape![1] === kL, () => `mask width ${r.maskShape![1]} != returned key length ${kL}`);
          }
        }
      }),
    );
  }, propertyTimeout());

  it("3. returned length: S==1 ⇒ min(offset,W); S>1 ⇒ S first, else min(valid_before, W-1)+S", () => {
    checkProperty(
      "inv3-returned-length",
      fc.property(arbRotatingScenario(), ({ W, ops }) => {
        const { recs, c } = withRef(W, ops);
        c.dispose();
        let stored = 0; // tokens physically held (valid rows), tracked abstractly
        let first = true;
        for (const r of recs) {
          if (r.op.kind === "trim") {
            stored = Math.min(stored, r.offsetAfter);
            continue;
          }
          const S = r.op.S;
          const kL = r.returnedK!.length;
          let want: number;
          if (S === 1) want = Math.min(r.offsetAfter, W);
          else if (first) want = S;
          else want = Math.min(Math.min(r.offsetBefore, stored), W - 1) + S;
          assert(kL === want, () => `W=${W} S=${S} off=${r.offsetBefore} stored=${stored}: returned ${kL}, want ${want}`);
          stored = kL;
          first = false;
        }
      }),
    );
  }, propertyTimeout());

  it("4. physical order: S>1 ⇒ consecutive increasing; S==1 ⇒ rotation of consecutive positions; matches the reference slot by slot", () => {
    checkProperty(
      "inv4-physical-order",
      fc.property(arbRotatingScenario(), ({ W, ops }) => {
        const c = new RotatingKVCache(W, 0);
        const ref = new RefRotatingKVCache(W, 0);
        try {
          for (const op of ops) {
            if (op.kind === "trim") {
              if (c.isTrimmable()) {
                const n = op.n % (c.offset + 1);
                c.trim(n);
                ref.trim(n);
              }
              continue;
            }
            const [r] = drive(c, [op], W);
            const want = ref.update(op.S).returned;
            const got = r!.returnedK!;
            assert(eq(got, want), () => `W=${W} S=${op.S}: returned [${got}], reference [${want}]`);
            assert(eq(bufferSlots(c), ref.buf), () => `buffer slots [${bufferSlots(c)}] != reference [${ref.buf}]`);
            assert(eq(c.metaState, ref.metaState()), () => `meta ${c.metaState} != reference ${ref.metaState()}`);
            const lo = Math.min(...got);
            const sorted = [...got].sort((a, b) => a - b);
            assert(sorted.every((p, i) => p === lo + i), () => `returned positions not consecutive: [${got}]`);
            if (op.S > 1) assert(eq(got, sorted), () => `S>1 returned not increasing: [${got}]`);
            else {
              const k = got.indexOf(Math.max(...got)) + 1;
              const rot = [...got.slice(k), ...got.slice(0, k)];
              assert(eq(rot, sorted), () => `S=1 returned is not a rotation of consecutive positions: [${got}]`);
            }
          }
        } finally {
          c.dispose();
        }
      }),
    );
  }, propertyTimeout());

  it("5. offsets: offset == tokens fed minus trims; chunk rope offset == offset before update (unclamped)", () => {
    checkProperty(
      "inv5-offsets",
      fc.property(arbRotatingScenario(), ({ W, ops }) => {
        const { recs, c } = withRef(W, ops);
        c.dispose();
        let total = 0;
        for (const r of recs) {
          assert(r.offsetBefore === total, () => `offset before ${r.offsetBefore}, fed ${total}`);
          const op = r.op;
          if (op.kind === "chunk") {
            total += op.S;
            // The newest returned key is the last token of this chunk, at absolute position offset_before+S-1.
            assert(Math.max(...r.returnedK!) === r.offsetBefore + op.S - 1, () => `newest position ${Math.max(...r.returnedK!)} != ${r.offsetBefore + op.S - 1}`);
          } else total -= r.trimmed ?? 0;
          assert(r.offsetAfter === total, () => `offset after ${r.offsetAfter}, fed ${total}`);
        }
      }),
    );
  }, propertyTimeout());

  it("6. capacity: after S==1 buffer ≤ W; growth blocks min(256, W-prev); zero rows never returned", () => {
    const big = fc.integer({ min: 257, max: 700 }).chain((W) =>
      fc.tuple(fc.constant(W), fc.integer({ min: 200, max: W + 20 }), fc.array(fc.oneof(fc.constant(1), fc.integer({ min: 2, max: 5 })), { minLength: 1, maxLength: 8 })),
    ).map(([W, pre, rest]) => ({ W, ops: [{ kind: "chunk", S: pre } as Op, ...rest.map((S): Op => ({ kind: "chunk", S }))] }));
    checkProperty(
      "inv6-capacity",
      fc.property(fc.oneof(arbRotatingScenario(), big), ({ W, ops }) => {
        const c = new RotatingKVCache(W, 0);
        try {
          for (const op of ops) {
            const before = bufLen(c);
            const offBefore = c.offset;
            if (op.kind === "trim") {
              if (c.isTrimmable()) c.trim(op.n % (c.offset + 1));
              continue;
            }
            const [r] = drive(c, [op], W);
            assert(!r!.returnedK!.includes(-1), () => `zero row returned: [${r!.returnedK}]`);
            if (op.S === 1) {
              assert(bufLen(c) <= W, () => `buffer ${bufLen(c)} > W=${W} after S=1`);
              if (bufLen(c) > before && before < W) {
                const grew = bufLen(c) - before;
                assert(grew === Math.min(256, W - offBefore), () => `grew by ${grew}, want min(256, ${W}-${offBefore})`);
              }
            }
          }
        } finally {
          c.dispose();
        }
      }),
    );
  }, propertyTimeout());

  it("7. state round-trip: fromState(state, metaState) continues identically", () => {
    checkProperty(
      "inv7-state-roundtrip",
      fc.property(arbRotatingScenario(), fc.nat(), fc.boolean(), ({ W, ops }, cut, rotating) => {
        const k = ops.length ? cut % (ops.length + 1) : 0;
        const a: KVCacheLike = rotating ? new RotatingKVCache(W, 0) : new KVCache();
        let b: KVCacheLike | null = null;
        try {
          drive(a, ops.slice(0, k), rotating ? W : null);
          const st = a.state;
          try {
            b = rotating ? RotatingKVCache.fromState(st, a.metaState) : KVCache.fromState(st, a.metaState);
          } finally {
            for (const s of st) s.dispose();
          }
          assert(eq(b.metaState, a.metaState), () => `meta after fromState ${b!.metaState} != ${a.metaState}`);
          const ra = drive(a, ops.slice(k), rotating ? W : null);
          const rb = drive(b, ops.slice(k), rotating ? W : null);
          assert(eq(ra, rb), () => `continuations differ:\n${JSON.stringify(ra)}\n${JSON.stringify(rb)}`);
          assert(eq(bufferSlots(a), bufferSlots(b)), () => "buffers differ after continuation");
        } finally {
          a.dispose();
          b?.dispose();
        }
      }),
    );
  }, propertyTimeout());

  it("8. trim: isTrimmable ⇔ offset < W; a trimmed cache behaves like a fresh one fed the first offset-n tokens", () => {
    checkProperty(
      "inv8-trim",
      fc.property(arbRotatingScenario({ trims: false, maxLen: 6 }), fc.nat(), arbOps(4, { trims: false, maxLen: 5 }), ({ W, ops }, nRaw, tail) => {
        const a = new RotatingKVCache(W, 0);
        const fresh = new RotatingKVCache(W, 0);
        try {
          drive(a, ops, W);
          assert(a.isTrimmable() === a.offset < W, () => `isTrimmable ${a.isTrimmable()} at offset ${a.offset}, W=${W}`);
          if (!a.isTrimmable()) return;
          const n = nRaw % (a.offset + 1);
          const kept = a.offset - n;
          expect(a.trim(n)).toBe(n);
          const prefix: Op[] = kept === 0 ? [] : [{ kind: "chunk", S: kept }];
          drive(fresh, prefix, W);
          assert(a.offset === fresh.offset, () => `offset ${a.offset} vs fresh ${fresh.offset}`);
          const ra = drive(a, tail, W).map((r) => [r.returnedK, r.returnedV, r.mask, r.offsetAfter]);
          const rf = drive(fresh, tail, W).map((r) => [r.returnedK, r.returnedV, r.mask, r.offsetAfter]);
          assert(eq(ra, rf), () => `W=${W} trim ${n} (kept ${kept}) then [${tail.map((o) => (o.kind === "chunk" ? o.S : "t"))}]:\n trimmed ${JSON.stringify(ra)}\n fresh   ${JSON.stringify(rf)}`);
        } finally {
          a.dispose();
          fresh.dispose();
        }
      }),
    );
  }, propertyTimeout());

  it("9. same-type lock-step: caches of one type fed the same chunks share metaState and buffer length (any dtype/head dims)", () => {
    checkProperty(
      "inv9-lockstep",
      fc.property(arbRotatingScenario(), fc.constantFrom("float32", "bfloat16", "float16") as fc.Arbitrary<"float32" | "bfloat16" | "float16">, ({ W, ops }, dt) => {
        const caches = [new RotatingKVCache(W, 0), new RotatingKVCache(W, 0)];
        const full = [new KVCache(), new KVCache()];
        try {
          for (const op of ops) {
            const r0 = drive(caches[0]!, [op], W, "float32");
            const r1 = drive(caches[1]!, [op], W, dt);
            drive(full[0]!, [op], null, "float32");
            drive(full[1]!, [op], null, dt);
            assert(eq(r0[0]!.meta, r1[0]!.meta) && bufLen(caches[0]!) === bufLen(caches[1]!), () => `sliding caches diverged: ${r0[0]!.meta} vs ${r1[0]!.meta}`);
            assert(eq(full[0]!.metaState, full[1]!.metaState) && bufLen(full[0]!) === bufLen(full[1]!), () => "full caches diverged");
          }
        } finally {
          for (const c of [...caches, ...full]) c.dispose();
        }
      }),
    );
  }, propertyTimeout());
});

describe("KVCache invariants (pure reference model, §5.4)", () => {
  const arbKV = fc.array(
    fc.oneof(
      { arbitrary: fc.constant(1).map((S): Op => ({ kind: "chunk", S })), weight: 3 },
      { arbitrary: fc.integer({ min: 2, max: 600 }).map((S): Op => ({ kind: "chunk", S })), weight: 3 },
      { arbitrary: fc.integer({ min: 0, max: 300 }).map((n): Op => ({ kind: "trim", n })), weight: 1 },
    ),
    { minLength: 1, maxLength: 10 },
  );

  it("10. KVCache: positions 0..offset-1 in order; growth = (prev%256 ? prev : cap) + 256·ceil(S/256); masks None/causal", () => {
    checkProperty(
      "inv10-kvcache",
      fc.property(arbKV, fc.integer({ min: 1, max: 16 }), (ops, win) => {
        const c = new KVCache();
        const ref = new RefKVCache();
        try {
          for (const op of ops) {
            if (op.kind === "trim") {
              const n = op.n % (c.offset + 1);
              c.trim(n);
              ref.trim(n);
              continue;
            }
            const capBefore = bufLen(c);
            const prev = c.offset;
            // Windowed mask on a KVCache (test_window_mask_with_full_kv_cache): always an array (N, offset+N).
            {
              const m = c.makeMask(op.S, { windowSize: win });
              try {
                if (m === null || m === "causal" || !eq(m.shape, [op.S, prev + op.S])) throw new Error(`windowed KVCache mask ${describeMask(m)}`);
                using want = createCausalMask(op.S, prev, win);
                using eqm = mx.equal(m, want);
                using same = mx.all(eqm);
                assert(same.item() === true, () => "windowed KVCache mask values");
              } finally {
                if (m !== null && m !== "causal") m.dispose();
              }
            }
            const [r] = drive(c, [op], null);
            const want = ref.update(op.S).returned;
            assert(eq(r!.returnedK, want), () => `returned [${r!.returnedK}] != reference`);
            assert(eq(r!.returnedK, Array.from({ length: c.offset }, (_, i) => i)), () => `KVCache returned [${r!.returnedK}] is not 0..${c.offset - 1}`);
            assert(r!.mask!.kind === (op.S === 1 ? "none" : "causal"), () => `KVCache mask ${r!.mask!.kind} for N=${op.S}`);
            assert(eq(bufferSlots(c), ref.buf), () => "KVCache buffer slots differ from the reference");
            if (prev + op.S > capBefore) {
              const base = capBefore === 0 ? 0 : prev % 256 !== 0 ? prev : capBefore;
              const want = base + 256 * Math.ceil(op.S / 256);
              assert(bufLen(c) === want, () => `capacity ${bufLen(c)} after growth from cap ${capBefore} at prev ${prev} with S ${op.S}, want ${want}`);
            } else assert(bufLen(c) === capBefore, () => "capacity changed without growth");
          }
        } finally {
          c.dispose();
        }
      }),
    );
  }, propertyTimeout());

  it("10b. (recorded) the spec's shorthand 'capacity = prev + 256·ceil(S/256)' does not hold when prev % 256 == 0 < cap - prev", () => {
    // feed 300 → cap 512; feed 300 → pre-slice to 300, cap 812; feed 168 → offset 768 (cap 812);
    // feed 100 → 868 > 812 and 768 % 256 == 0 ⇒ no pre-slice ⇒ cap 812 + 256 = 1068 (not 768 + 256).
    const c = new KVCache();
    try {
      drive(c, [300, 300, 168, 100].map((S): Op => ({ kind: "chunk", S })), null);
      expect(bufLen(c)).toBe(1068);
    } finally {
      c.dispose();
    }
  });

  it("11. keys and values stay paired and keep the input dtype", () => {
    checkProperty(
      "inv11-pairing-dtype",
      fc.property(arbRotatingScenario(), fc.constantFrom("float32", "float16", "bfloat16") as fc.Arbitrary<"float32" | "float16" | "bfloat16">, fc.boolean(), ({ W, ops }, dt, rotating) => {
        const c: KVCacheLike = rotating ? new RotatingKVCache(W, 0) : new KVCache();
        try {
          for (const r of drive(c, ops, rotating ? W : null, dt)) {
            if (r.op.kind !== "chunk") continue;
            assert(eq(r.returnedK, r.returnedV), () => `keys [${r.returnedK}] and values [${r.returnedV}] unpaired`);
            assert(r.kDtype === dt && r.vDtype === dt, () => `dtype ${r.kDtype}/${r.vDtype}, want ${dt}`);
          }
        } finally {
          c.dispose();
        }
      }),
    );
  }, propertyTimeout());
});

describe("12. mlx-lm's own example cases", () => {
  it("test_rotating_cache_updates: W=8, feed 10,1,1,1,3 ⇒ returned lengths 10,8,8,8,10", () => {
    const c = new RotatingKVCache(8, 0);
    try {
      const recs = drive(c, [10, 1, 1, 1, 3].map((S): Op => ({ kind: "chunk", S })), 8);
      expect(recs.map((r) => r.returnedK!.length)).toEqual([10, 8, 8, 8, 10]);
      // After the 3-token chunk the window is re-linearised: 7 old + 3 new, in order.
      expect(recs[4]!.returnedK).toEqual([6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
    } finally {
      c.dispose();
    }
  });

  it("test_make_mask_with_cache: KVCache N=1 ⇒ None, N>1 ⇒ causal, return_array ⇒ (N, offset+N)", () => {
    const c = new KVCache();
    try {
      expect(c.makeMask(1)).toBeNull();
      expect(c.makeMask(4)).toBe("causal");
      drive(c, [{ kind: "chunk", S: 5 }], null);
      using m = c.makeMask(3, { returnArray: true }) as import("@mlx-bun/mlx").MlxArray;
      expect(m.shape).toEqual([3, 8]);
      expect(m.dtype).toBe("bool");
      expect(createAttentionMask([1, 1, 64], c)).toBeNull();
      expect(createAttentionMask([1, 2, 64], c)).toBe("causal");
    } finally {
      c.dispose();
    }
  });

  it("test_rotating_cache_mask: kinds and shapes along a W=8 run", () => {
    const c = new RotatingKVCache(8, 0);
    try {
      expect(c.makeMask(1, { windowSize: 8 })).toBeNull();
      expect(c.makeMask(8, { windowSize: 8 })).toBe("causal");
      using a = c.makeMask(9, { windowSize: 8 }) as import("@mlx-bun/mlx").MlxArray;
      expect(a.shape).toEqual([9, 9]);
      drive(c, [{ kind: "chunk", S: 6 }], 8);
      expect(c.makeMask(2, { windowSize: 8 })).toBe("causal");
      using b = c.makeMask(3, { windowSize: 8 }) as import("@mlx-bun/mlx").MlxArray;
      expect(b.shape).toEqual([3, 9]);
      drive(c, [{ kind: "chunk", S: 20 }], 8);
      using d = c.makeMask(2, { windowSize: 8 }) as import("@mlx-bun/mlx").MlxArray;
      expect(d.shape).toEqual([2, 9]); // min(W-1, 26) + 2
      // window_size < max_size on a single token: rolled 1-D bool mask.
      using e = c.makeMask(1, { windowSize: 4 }) as import("@mlx-bun/mlx").MlxArray;
      expect(e.shape).toEqual([8]);
      expect(e.toNumbers().filter((x) => x).length).toBe(4);
    } finally {
      c.dispose();
    }
  });

  it("test_window_mask_with_full_kv_cache: windowed mask on a KVCache is an array even for N==1", () => {
    const c = new KVCache();
    try {
      drive(c, [{ kind: "chunk", S: 10 }], null);
      using m = c.makeMask(1, { windowSize: 4 }) as import("@mlx-bun/mlx").MlxArray;
      expect(m.shape).toEqual([1, 11]);
      expect(m.toNumbers()).toEqual([0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]);
    } finally {
      c.dispose();
    }
  });

  it("no cache: create_attention_mask(h) None / causal / windowed array", () => {
    expect(createAttentionMask([1, 1, 4])).toBeNull();
    expect(createAttentionMask([1, 5, 4])).toBe("causal");
    expect(createAttentionMask([1, 8, 4], null, { windowSize: 8 })).toBe("causal");
    using m = createAttentionMask([1, 13, 4], null, { windowSize: 8 }) as import("@mlx-bun/mlx").MlxArray;
    expect(m.shape).toEqual([13, 13]);
  });
});

describe("bad input: clear error, cache unchanged", () => {
  it("keys/values of different length or dtype; trim beyond offset; unparsable metaState", () => {
    for (const c of [new RotatingKVCache(8, 0), new KVCache()] as KVCacheLike[]) {
      try {
        drive(c, [{ kind: "chunk", S: 3 }], null);
        const meta = c.metaState;
        const slots = bufferSlots(c);
        using k = keysFor(3, 2);
        using v = valuesFor(3, 1);
        expect(() => c.updateAndFetch(k, v)).toThrow(/different lengths/);
        using k16 = keysFor(3, 1, "float16");
        using v32 = valuesFor(3, 1);
        expect(() => c.updateAndFetch(k16, v32)).toThrow(/different dtypes/);
        using k16b = keysFor(3, 1, "float16");
        using v16b = valuesFor(3, 1, "float16");
        expect(() => c.updateAndFetch(k16b, v16b)).toThrow(/dtype/);
        expect(() => c.trim(4)).toThrow(/cannot trim 4/);
        expect(() => c.trim(-1)).toThrow(/non-negative/);
        expect(() => (c.metaState = ["x", "8", "3", "3"])).toThrow(/metaState/);
        expect(() => (c.metaState = ["1.5"])).toThrow(/metaState/);
        expect(c.metaState).toEqual(meta);
        expect(bufferSlots(c)).toEqual(slots);
        expect(c.offset).toBe(3);
      } finally {
        c.dispose();
      }
    }
  });
});
