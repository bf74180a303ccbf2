// Generation parity: model/generate.ts + model/cache + model/gemma4 against mlx-lm's
// generate_step, per call (prefill chunks and decode steps): masks, every layer's cached
// keys/values, logits, logprobs, token and the cache state after the call, bit for bit.
//
//   default (npm test): 9 fixed representative pairs (every fixture family; the count is asserted)
//   GEN_FULL=1          every checkpoint variant × every generate scenario of fixtures/scenarios.json
//   GEN_CKPTS=a,b GEN_SCENARIOS=x,y   an explicit selection
// Sampled runs (temperature/top-p/top-k/min-p, fixed seeds) go through suites/generation/gen_ref.py:
// tokens, per-step logprobs bytes, and the final caches (every layer's offsets and buffer shapes,
// and its key and value bytes by sha256, suites/generation/cache_sha256.ts).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { type OracleClient, sharedOracle } from "../../oracle/client.ts";
import { KVCache, RotatingKVCache } from "../../model/cache/index.ts";
import { generateStep } from "../../model/generate.ts";
import { atMlxBug, keepMlxBugNote, onCudaGpu, reachableMlxBug } from "../../oracle/mlx_bugs.ts";
import { cacheSha256, firstCacheDifference } from "./cache_sha256.ts";
import { CKPT_ROOT, explain, firstDivergentTapOfCall, generateModel, isMoe, loadCheckpoints, loadScenarios, model, parityRun, type ParityRun, type Scenario } from "./parity.ts";
import { limit } from "../../tests/time_limit.ts";

let oracle: OracleClient;
beforeAll(async () => {
  oracle = await sharedOracle();
}, limit(120_000));

const fileScenarios = loadScenarios().filter((s) => s.kind === "generate");
// gen_P300_S128 grows the KVCache at prev = 256 (256 % 256 == 0: no pre-slice); this inline
// scenario (chunks 100, 100, 99) grows it at prev = 200, the path with the pre-slice.
const extra: Scenario = {
  id: "gen_P300_S100_inline",
  kind: "generate",
  applies_to: "all",
  prompt: fileScenarios.find((s) => s.id === "gen_P300_S128")!.prompt,
  prefill_step_size: 100,
  max_tokens: 20,
  inline: true,
};
const scenarios = [...fileScenarios, extra];
const ckpts = loadCheckpoints();
/** How many pairs the default selection names (each must be found: asserted below). */
let defaultPicks: number | null = null;

function selection(): [string, Scenario][] {
  const envC = process.env.GEN_CKPTS?.split(",").filter(Boolean);
  const envS = process.env.GEN_SCENARIOS?.split(",").filter(Boolean);
  const full = process.env.GEN_FULL === "1";
  const out: [string, Scenario][] = [];
  if (full || envC || envS) {
    for (const c of ckpts) {
      if (envC && !envC.includes(c.id)) continue;
      for (const s of scenarios) {
        if (envS && !envS.includes(s.id)) continue;
        if (s.applies_to === "moe" && !isMoe(c)) continue;
        out.push([c.id, s]);
      }
    }
    return out;
  }
  // Default: fixed representative pairs (every fixture family, float/bf16/f16/quantized/wrapper
  // layouts; wraps, chunk re-linearisation, KVCache growth past 256, MoE sorted gather).
  const pick: [string, string][] = [
    ["c1_dense/f32", "gen_P40_S3"],
    ["c2_keqv/bf16", "gen_P21_S5"],
    ["c3_e2b/q4g32", "gen_P9_S8"],
    ["c3_e2b/f16", "gen_P300_S128"],
    ["c4_e4b/mixed", "gen_P40_S2048"],
    ["c5_moe/q8g64", "gen_P40_S36"],
    ["c6_sink/wrap_f32", "gen_P8_S3"],
    ["c7_defaults/bf16", "gen_P1_S2048"],
    ["c3_e2b/bf16", "gen_P300_S100_inline"],
  ];
  defaultPicks = pick.length;
  for (const [c, s] of pick) {
    const sc = scenarios.find((x) => x.id === s);
    if (sc && ckpts.some((x) => x.id === c)) out.push([c, sc]);
  }
  return out;
}

const results: ParityRun[] = [];
/** Divergent runs on a path of MLX's own proven broken on this backend (oracle/mlx_bugs.ts): counted apart. */
const atMlxBugs: string[] = [];

const selected = selection();

describe("generation parity vs mlx-lm generate_step (greedy, per call, bit-exact)", () => {
  it("the selection is not empty; the default one finds all its pairs", () => {
    expect(selected.length).toBeGreaterThan(0);
    if (defaultPicks !== null) expect(selected.length).toBe(defaultPicks);
  });
  for (const [ck, sc] of selected) {
    it(`${ck} × ${sc.id}`, async () => {
      const r = await parityRun(oracle, ck, sc);
      results.push(r);
      if (r.first) {
        const where = `${ck} × ${sc.id}: first divergence at ${r.first.call} tap ${r.first.tap}: ${r.first.detail}`;
        // counted apart only when the call's first divergent tap (re-captured with every tap) is
        // produced by an op on a recorded MLX bug's path, on the backend where it lives
        const tap = onCudaGpu() ? await firstDivergentTapOfCall(oracle, ck, sc, r.first.call) : null;
        const note = atMlxBug(join(CKPT_ROOT, ck), where, tap);
        if (note) {
          keepMlxBugNote(atMlxBugs, "generation parity", note);
          return;
        }
        const why = await explain(oracle, ck, sc, r.first.call).catch((e) => `(explain failed: ${e})`);
        throw new Error(`${where}\n${why}`);
      }
      expect(r.steps).toBe((sc.max_tokens ?? 20) + 1);
      expect(r.tensors, "tensors compared").toBeGreaterThan(0);
    }, limit(180_000));
  }
  it("every selected pair ran", () => expect(results.length).toBe(selected.length));
});

afterAll(() => {
  if (!results.length) return;
  const ok = results.filter((r) => !r.first);
  const steps = ok.reduce((a, r) => a + r.steps, 0);
  const calls = ok.reduce((a, r) => a + r.calls, 0);
  const tensors = ok.reduce((a, r) => a + r.tensors, 0);
  const msO = results.reduce((a, r) => a + r.ms.oracle, 0);
  const msT = results.reduce((a, r) => a + r.ms.ts, 0);
  console.log(
    `[generation parity] ${ok.length}/${results.length} runs bit-exact${atMlxBugs.length ? `, ${atMlxBugs.length} diverging at recorded MLX bugs (named above)` : ""}; ${calls} model calls, ${steps} decode steps ` +
      `(${ok.reduce((a, r) => a + r.tokens.length, 0)} yielded tokens), ${tensors} tensors compared; oracle ${(msO / 1000).toFixed(1)} s, TS ${(msT / 1000).toFixed(1)} s`,
  );
});

// ------------------------------------------------------------------------------- sampled runs

interface SampledRun {
  checkpoint: string;
  prompt: number[];
  prefill_step_size: number;
  max_tokens: number;
  seed: number;
  temp: number;
  top_p: number;
  min_p: number;
  min_tokens_to_keep: number;
  top_k: number;
}

describe("sampled generation parity (fixed seeds, make_sampler)", () => {
  it("temperature / top-p / top-k / min-p runs: tokens, per-step logprobs bytes and final caches (offsets, shapes, key/value bytes) identical", async () => {
    const prompt21 = scenarios.find((s) => s.id === "gen_P21_S5")!.prompt!;
    const prompt40 = scenarios.find((s) => s.id === "gen_P40_S8")!.prompt!;
    const cfgs = [
      { temp: 0.7, top_p: 0.9, min_p: 0, min_tokens_to_keep: 1, top_k: 0 },
      { temp: 1.0, top_p: 0, min_p: 0, min_tokens_to_keep: 1, top_k: 20 },
      { temp: 0.8, top_p: 0, min_p: 0.1, min_tokens_to_keep: 3, top_k: 0 },
      { temp: 1.3, top_p: 0.95, min_p: 0.05, min_tokens_to_keep: 1, top_k: 50 },
    ];
    const runs: SampledRun[] = [];
    // Only the logprobs are compared here: a divergence cannot be located at a tap, so none can be
    // attributed to an MLX bug. A checkpoint with a layer on a recorded bug's path on this backend
    // leaves the pool before it runs, said aloud (oracle/mlx_bugs.ts reachableMlxBug).
    const allIds = process.env.GEN_FULL === "1" ? ["c1_dense/f32", "c3_e2b/bf16", "c5_moe/q4g32", "c6_sink/q4g64", "c4_e4b/f32"] : ["c1_dense/f32", "c5_moe/q4g32"];
    const maxKeys = Math.max(prompt21.length, prompt40.length) + 20;
    const ids = allIds.filter((id) => {
      const bug = reachableMlxBug(join(CKPT_ROOT, id), maxKeys);
      if (bug) console.log(`[sampled parity] ${id} left out on this backend: it has a layer on the path of MLX bug ${bug.id} (${bug.reproducer}), and logprobs alone cannot tell a port bug from it`);
      return bug === null;
    });
    let seed = 1234;
    for (const id of ids) {
      for (const [i, c] of cfgs.entries()) {
        runs.push({ checkpoint: join(CKPT_ROOT, id), prompt: i % 2 ? prompt40 : prompt21, prefill_step_size: i % 2 ? 8 : 5, max_tokens: 20, seed: seed++, ...c });
      }
    }
    // mlx-lm's runs go on in their own process (stdin read from a file, so it starts at once)
    // while TS does the same runs; the two are compared once both are done
    const dir = mkdtempSync(join(tmpdir(), "gen-ref-"));
    writeFileSync(join(dir, "runs.json"), JSON.stringify({ runs }));
    const p = Bun.spawn([".venv/bin/python", "-I", "suites/generation/gen_ref.py"], { stdin: Bun.file(join(dir, "runs.json")), stdout: "pipe", stderr: "pipe" });
    const pending = Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
    pending.catch(() => {}); // surfaces at the await below
    const ours: { toks: number[]; lps: string[]; metas: Record<string, unknown>[]; contents: ReturnType<typeof cacheSha256> }[] = [];
    try {
      for (const r of runs) {
        const id = r.checkpoint.slice(CKPT_ROOT.length + 1);
        const gm = generateModel(model(id));
        const cache = gm.makeCache();
        const toks: number[] = [];
        const lps: string[] = [];
        try {
          for await (const t of generateStep(gm, r.prompt, {
            maxTokens: r.max_tokens,
            prefillStepSize: r.prefill_step_size,
            promptCache: cache,
            seed: r.seed,
            samplerOptions: { temp: r.temp, topP: r.top_p, minP: r.min_p, minTokensToKeep: r.min_tokens_to_keep, topK: r.top_k },
          })) {
            toks.push(t.token);
            lps.push(Buffer.from(t.logprobs.toBytes()).toString("hex"));
          }
          const metas = cache.map((c) => {
            const o: Record<string, unknown> = { type: c instanceof KVCache ? "KVCache" : "RotatingKVCache", offset: c.offset };
            if (c instanceof RotatingKVCache) Object.assign(o, { keep: c.keep, max_size: c.maxSize, idx: c.idx });
            o.keys_shape = (c as KVCache).keys?.shape ?? null;
            o.values_shape = (c as KVCache).values?.shape ?? null;
            return o;
          });
          ours.push({ toks, lps, metas, contents: cacheSha256(cache) });
        } finally {
          for (const c of cache) c.dispose();
        }
      }
    } finally {
      await pending.catch(() => {}); // the process is done before its input goes
      rmSync(dir, { recursive: true, force: true });
    }
    const [out, err, code] = await pending;
    if (code !== 0) throw new Error(`gen_ref.py failed: ${err.slice(-2000)}`);
    const ref = JSON.parse(out).runs as { tokens: number[]; logprobs: string[]; dtype: string; cache: Record<string, unknown>[]; cache_sha256: ReturnType<typeof cacheSha256> }[];
    expect(ref.length, "runs answered by gen_ref.py").toBe(runs.length);
    expect(runs.length, "sampled runs").toBeGreaterThan(0);
    let steps = 0;
    for (let i = 0; i < runs.length; i++) {
      const r = runs[i]!;
      const id = r.checkpoint.slice(CKPT_ROOT.length + 1);
      const { toks, lps, metas, contents } = ours[i]!;
      const where = `${id} seed ${r.seed} ${JSON.stringify({ temp: r.temp, top_p: r.top_p, min_p: r.min_p, top_k: r.top_k })}`;
      const firstLp = lps.findIndex((h, k) => h !== ref[i]!.logprobs[k]);
      expect(firstLp, `${where}: first step with different logprobs`).toBe(-1);
      expect(toks, `${where}: tokens`).toEqual(ref[i]!.tokens);
      expect(JSON.stringify(metas), `${where}: final caches`).toBe(JSON.stringify(ref[i]!.cache));
      expect(firstCacheDifference(contents, ref[i]!.cache_sha256), `${where}: final caches' key/value bytes`).toBeNull();
      expect(contents.some((c) => c.keys !== null), `${where}: a cache layer holds keys`).toBe(true);
      steps += toks.length;
    }
    console.log(`[sampled parity] ${runs.length} sampled runs, ${steps} sampled steps bit-exact (tokens + logprobs; final caches: offsets, shapes, key/value bytes) vs mlx-lm`);
    mx.clearCache();
  }, limit(600_000));
});
