// Cache/mask mutation checks: each switch in model/cache's cacheMutations re-introduces one known
// port bug (gemma4-port-bugs.md: sliding window / ring buffer / masks), and the check passes only
// if the cache property suites CATCH it: the pure-reference invariants (no oracle) and the
// differential properties against the live oracle must both report a counterexample.
//
//   trimOffByOne        RotatingKVCache.trim drops n+1 tokens
//   temporalOrder       in-place path returns the ring buffer in temporal, not physical, order
//   maskAfterUpdate     the mask is built as if the cache update had already happened
//   slidingUsesFullMask sliding layers get the full-attention (KVCache) mask
//   growthNoPreSlice    KVCache 256-step growth without slicing to prev when prev % 256 != 0
import { beforeAll, describe, expect, it } from "vitest";
import fc from "fast-check";
import { type CacheMutation, KVCache, RotatingKVCache, type KVCacheLike, withCacheMutationAsync } from "../../model/cache/index.ts";
import { arbOps, arbRotatingScenario, bufferSlots, drive, type Op } from "../properties/drive.ts";
import { attended, RefKVCache, RefRotatingKVCache, windowSet } from "../properties/reference.ts";
import { arbKV, arbMask, arbRot, maskCase, runDiff, useOracle } from "../properties/oracle-diff-lib.ts";
import { seedFor } from "../properties/harness.ts";
import { sharedOracle } from "../../oracle/client.ts";
import { loadScenarios, parityCapture, parityRun, type Scenario } from "../generation/parity.ts";
import { limit } from "../../tests/time_limit.ts";

beforeAll(async () => {
  await useOracle();
}, limit(120_000));

const RUNS = 200;

/** Pure reference check: window exactness + reference slot order + trim equivalence, rotating and full. */
function pureCheck(): fc.IProperty<[{ W: number; ops: Op[] }, boolean]> {
  return fc.property(arbRotatingScenario(), fc.boolean(), ({ W, ops }, full) => {
    const c: KVCacheLike = full ? new KVCache() : new RotatingKVCache(W, 0);
    const ref = full ? new RefKVCache() : new RefRotatingKVCache(W, 0);
    try {
      for (const op of ops) {
        if (op.kind === "trim") {
          if (!c.isTrimmable()) continue;
          const n = op.n % (c.offset + 1);
          c.trim(n);
          ref.trim(n);
          if (c.offset !== ref.offset) throw new Error(`offset ${c.offset} vs reference ${ref.offset} after trim ${n}`);
          continue;
        }
        const [r] = drive(c, [op], full ? null : W);
        const want = ref.update(op.S).returned;
        if (JSON.stringify(r!.returnedK) !== JSON.stringify(want)) throw new Error(`returned [${r!.returnedK}] vs reference [${want}]`);
        if (JSON.stringify(bufferSlots(c)) !== JSON.stringify(ref.buf)) throw new Error("buffer slots differ from the reference");
        for (let i = 0; i < op.S; i++) {
          const p = r!.offsetBefore + i;
          const got = attended(r!.returnedK!, op.S, i, r!.mask!);
          const wantSet = full ? Array.from({ length: p + 1 }, (_, q) => q) : windowSet(p, W);
          if (JSON.stringify(got) !== JSON.stringify(wantSet)) throw new Error(`query at ${p} attends [${got}], want [${wantSet}]`);
        }
      }
    } finally {
      c.dispose();
    }
  });
}

/** KVCache-heavy pure check (chunks up to 600 so growth past 256 happens with prev % 256 != 0). */
function pureKVCheck(): fc.IProperty<[Op[]]> {
  return fc.property(
    fc.array(fc.integer({ min: 1, max: 600 }).map((S): Op => ({ kind: "chunk", S })), { minLength: 2, maxLength: 6 }),
    (ops) => {
      const c = new KVCache();
      const ref = new RefKVCache();
      try {
        for (const op of ops) {
          if (op.kind !== "chunk") continue;
          drive(c, [op], null);
          ref.update(op.S);
          if (JSON.stringify(bufferSlots(c)) !== JSON.stringify(ref.buf)) throw new Error(`KVCache buffer (cap ${bufferSlots(c).length}) differs from the reference (cap ${ref.buf!.length})`);
        }
      } finally {
        c.dispose();
      }
    },
  );
}

type Details = { failed: boolean; numRuns: number; seed: number; counterexample: unknown; errorInstance: unknown };
async function caught(check: () => unknown): Promise<Details> {
  return (await check()) as Details;
}

const MUTATIONS: CacheMutation[] = ["trimOffByOne", "temporalOrder", "maskAfterUpdate", "slidingUsesFullMask", "growthNoPreSlice"];

describe("cache/mask mutations are caught", () => {
  for (const m of MUTATIONS) {
    it(`${m}: caught by the pure-reference properties and by the oracle differential`, async () => {
      const seed = seedFor(`mutation-${m}`);
      const pure = await withCacheMutationAsync(m, async () => {
        const a = await caught(() => fc.check(pureCheck(), { seed, numRuns: RUNS }));
        return a.failed ? a : await caught(() => fc.check(pureKVCheck(), { seed, numRuns: RUNS }));
      });
      const oracle = await withCacheMutationAsync(m, async () => {
        const props = [
          fc.asyncProperty(arbRot, async (s) => void (await runDiff(s))),
          fc.asyncProperty(arbKV, async (s) => void (await runDiff(s))),
          fc.asyncProperty(arbMask, maskCase),
        ];
        for (const p of props) {
          const r = (await fc.check(p as fc.IAsyncProperty<[unknown]>, { seed, numRuns: RUNS })) as Details;
          if (r.failed) return r;
        }
        return null;
      });
      const show = (r: Details | null) =>
        r && r.failed ? `caught after ${r.numRuns} runs (seed ${r.seed}); counterexample ${JSON.stringify(r.counterexample)?.slice(0, 300)}; ${String((r.errorInstance as Error)?.message ?? "").split("\n")[0]}` : "NOT caught";
      console.log(`[mutation ${m}] pure: ${show(pure)}\n[mutation ${m}] oracle: ${show(oracle)}`);
      expect(pure.failed, `${m} not caught by the pure-reference properties`).toBe(true);
      expect(oracle?.failed ?? false, `${m} not caught by the oracle differential`).toBe(true);
    }, limit(300_000));
  }

  it("with no mutation switched on, the same checks pass", async () => {
    const seed = seedFor("mutation-none");
    expect(fc.check(pureCheck(), { seed, numRuns: 50 }).failed).toBe(false);
    expect(fc.check(pureKVCheck(), { seed, numRuns: 20 }).failed).toBe(false);
  }, limit(120_000));
});

// The same mutations through the generation parity suite (model + caches + generate vs the
// oracle's generate_step): each must diverge, first at the call and tap where the bug lives.
// trimOffByOne is not reachable from generate_step (it never trims) and is covered above.
describe("cache/mask mutations are caught by generation parity at the right call and tap", () => {
  const scn = (id: string): Scenario => loadScenarios().find((s) => s.id === id)!;
  const p300 = scn("gen_P300_S128").prompt!;
  const growth: Scenario = { id: "gen_P300_S100_inline", kind: "generate", applies_to: "all", prompt: p300, prefill_step_size: 100, max_tokens: 3, inline: true };
  const cases: { m: CacheMutation; ckpt: string; sc: Scenario; first: RegExp }[] = [
    { m: "temporalOrder", ckpt: "c1_dense/f32", sc: scn("gen_P21_S3"), first: /^step\d+\/layers\.0\/self_attn\/cache_keys$/ },
    { m: "maskAfterUpdate", ckpt: "c1_dense/f32", sc: scn("gen_P21_S3"), first: /^prefill\d+\/mask\/sliding_attention$/ },
    { m: "slidingUsesFullMask", ckpt: "c3_e2b/bf16", sc: scn("gen_P21_S3"), first: /^prefill\d+\/mask\/sliding_attention$/ },
    // chunks 100, 100, 99: growth at prev = 200 (200 % 256 != 0) needs the pre-slice; only the
    // buffer capacity shows it (returned keys are sliced to the offset either way).
    { m: "growthNoPreSlice", ckpt: "c4_e4b/f32", sc: growth, first: /^cache_after$/ },
  ];
  for (const c of cases) {
    it(`${c.m}: ${c.ckpt} × ${c.sc.id} diverges first at ${c.first}`, async () => {
      const oracle = await sharedOracle();
      // one capture for both runs: the mutation is on the TS side only
      const capture = parityCapture(oracle, c.ckpt, c.sc);
      const control = await parityRun(oracle, c.ckpt, c.sc, capture);
      expect(control.first, "unmutated control must be bit-exact").toBeNull();
      const r = await withCacheMutationAsync(c.m, () => parityRun(oracle, c.ckpt, c.sc, capture));
      console.log(`[mutation ${c.m}] generation parity: ${r.first ? `caught at ${r.first.call} ${r.first.tap}: ${r.first.detail.slice(0, 200)}` : "NOT caught"}`);
      expect(r.first, `${c.m} not caught by generation parity`).not.toBeNull();
      expect(r.first!.tap).toMatch(c.first);
    }, limit(300_000));
  }
});
