// make_sampler parity: the TS samplers (top-p, min-p, top-k filters and the categorical draw under
// the global random key sequence) against mlx-lm's own, bit for bit, on seeded random logits.
// Runs mlx-lm in a subprocess (suites/generation/sampler_ref.py); no oracle server needed.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import * as mx from "@mlx-bun/mlx";
import { applyMinP, applyTopK, applyTopP, makeSampler } from "../../model/sample.ts";
import { propertyRuns, seedFor } from "../properties/harness.ts";
import { limit } from "../../tests/time_limit.ts";

interface Cfg { temp: number; top_p: number; min_p: number; min_tokens_to_keep: number; top_k: number }
interface Case { logits: number[][]; dtype: "float32" | "bfloat16" | "float16"; seed: number; draws: number; configs: Cfg[] }
interface Res { tokens: number[][]; top_p: string | null; min_p: string | null; top_k: string | null }

const PY = ".venv/bin/python";

function pythonRef(cases: Case[]): Res[][] {
  const p = Bun.spawnSync([PY, "-I", "suites/generation/sampler_ref.py"], { stdin: Buffer.from(JSON.stringify({ cases })), stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`sampler_ref.py failed: ${p.stderr.toString()}`);
  return JSON.parse(p.stdout.toString()).cases;
}

const hex = (a: mx.MlxArray): string => {
  using f = a.dtype === "bfloat16" ? mx.astype(a, "float32") : mx.alias(a);
  return Buffer.from(f.toBytes()).toString("hex");
};

const arbCfg: fc.Arbitrary<Cfg> = fc.record({
  temp: fc.constantFrom(0.3, 0.7, 1.0, 1.5),
  top_p: fc.constantFrom(0, 0.5, 0.9, 0.95),
  min_p: fc.constantFrom(0, 0.05, 0.1, 0.5),
  min_tokens_to_keep: fc.constantFrom(1, 1, 3),
  top_k: fc.constantFrom(0, 1, 5, 20),
});

const arbCase = (V: number): fc.Arbitrary<Case> =>
  fc.record({
    logits: fc.array(fc.float({ min: -8, max: 8, noNaN: true, noDefaultInfinity: true }), { minLength: V, maxLength: V }).map((r) => [r]),
    dtype: fc.constantFrom("float32", "bfloat16", "float16") as fc.Arbitrary<Case["dtype"]>,
    seed: fc.integer({ min: 0, max: 2 ** 31 - 1 }),
    draws: fc.constant(4),
    configs: fc.array(arbCfg, { minLength: 1, maxLength: 3 }),
  });

describe("make_sampler parity with mlx-lm (bit-exact, same seed)", () => {
  it("filters and draws match on seeded random logits", () => {
    const seed = seedFor("sampler-parity");
    // One Python process for the whole batch; scale with PROPERTY_RUNS / 10 (≥ 24 cases).
    const n = Math.max(24, Math.floor(propertyRuns() / 8));
    const cases = fc.sample(fc.constantFrom(32, 64, 256).chain(arbCase), { seed, numRuns: n });
    const ref = pythonRef(cases);
    let draws = 0;
    for (let ci = 0; ci < cases.length; ci++) {
      const c = cases[ci]!;
      using lf = mx.array(new Float32Array(c.logits.flat()), [1, c.logits[0]!.length]);
      using logits = mx.astype(lf, c.dtype);
      using lse = mx.logsumexp(logits, null, true);
      using logprobs = mx.subtract(logits, lse);
      for (let k = 0; k < c.configs.length; k++) {
        const cfg = c.configs[k]!;
        const r = ref[ci]![k]!;
        const where = `case ${ci} (seed ${seed}) config ${JSON.stringify(cfg)} dtype ${c.dtype}`;
        if (r.top_p !== null) {
          using f = applyTopP(logprobs, cfg.top_p);
          expect(hex(f), `${where}: top_p`).toBe(r.top_p);
        }
        if (r.min_p !== null) {
          using f = applyMinP(logprobs, cfg.min_p, cfg.min_tokens_to_keep);
          expect(hex(f), `${where}: min_p`).toBe(r.min_p);
        }
        if (r.top_k !== null) {
          using f = applyTopK(logprobs, cfg.top_k);
          expect(hex(f), `${where}: top_k`).toBe(r.top_k);
        }
        mx.random.seed(c.seed);
        const s = makeSampler({ temp: cfg.temp, topP: cfg.top_p, minP: cfg.min_p, minTokensToKeep: cfg.min_tokens_to_keep, topK: cfg.top_k });
        try {
          const toks: number[][] = [];
          for (let d = 0; d < c.draws; d++) {
            using t = s(logprobs);
            toks.push(t.toNumbers());
          }
          expect(toks, `${where}: sampled tokens`).toEqual(r.tokens);
          draws += c.draws;
        } finally {
          s.dispose?.();
        }
      }
    }
    console.log(`[sampler-parity] ${cases.length} cases, ${draws} draws bit-exact vs mlx-lm (seed ${seed})`);
  }, limit(300_000));
});
