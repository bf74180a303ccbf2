// Batched-generation parity: model/generate_batch.ts against mlx-lm's BatchGenerator on the
// scenarios of fixtures/batch_scenarios.json, after every next() call: every generation
// response (token, finish reason, logprobs bytes; extracted caches and all_tokens on finish), the
// prompt responses, and every batch cache of the generation and prompt batches (per-sequence
// offsets and left padding, physical index, rotation, buffer shapes and key/value bytes).
// Each scenario must also show the features it is there for (rotation, a join into a running
// batch, staggered finishes, stops, ...), read off mlx-lm's own run.
//
//   default (npm test): every scenario on the dense, E2B-like and MoE fixtures
//   BATCH_FULL=1        every scenario on every fixture checkpoint variant
//   BATCH_CKPTS=a,b BATCH_SCENARIOS=x,y   an explicit selection
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { type OracleClient, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { batchModel } from "../../model/generate_batch.ts";
import { type BatchComparison, type BatchScenario, batchParity, runFeatures } from "../../parity/batch_engine.ts";
import { freeModels, loadCheckpoints, model } from "../generation/parity.ts";
import { limit } from "../../tests/time_limit.ts";

let oracle: OracleClient;
beforeAll(async () => {
  oracle = await sharedOracle();
}, limit(120_000));

const scenarios = (JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "batch_scenarios.json"), "utf8")) as { scenarios: BatchScenario[] }).scenarios;
const DEFAULT_CKPTS = ["c1_dense/f32", "c3_e2b/bf16", "c5_moe/f32"];

function selection(): [string, BatchScenario][] {
  const envC = process.env.BATCH_CKPTS?.split(",").filter(Boolean);
  const envS = process.env.BATCH_SCENARIOS?.split(",").filter(Boolean);
  const ckpts = envC ?? (process.env.BATCH_FULL === "1" ? loadCheckpoints().map((c) => c.id) : DEFAULT_CKPTS);
  return ckpts.flatMap((c) => scenarios.filter((s) => !envS || envS.includes(s.id)).map((s) => [c, s] as [string, BatchScenario]));
}

const results: (BatchComparison & { ckpt: string })[] = [];

describe("batched generation vs mlx-lm's BatchGenerator (every next() call, bit-exact)", () => {
  it("the scenario file covers the acceptance cases", () => {
    expect(scenarios.length).toBeGreaterThanOrEqual(5);
    const all = new Set(scenarios.flatMap((s) => s.expect ?? []));
    for (const f of ["rotated", "staggered_finish", "join_while_running", "multi_chunk_prefill", "stop", "queued", "removed"]) expect(all.has(f)).toBe(true);
  });

  for (const [ck, sc] of selection()) {
    it(`${ck} × ${sc.id}`, async () => {
      const r = await batchParity(oracle, ck, batchModel(model(ck)), sc);
      results.push({ ...r, ckpt: ck });
      if (r.first) throw new Error(`${ck} × ${sc.id}: first divergence at next() call ${r.first.call}, ${r.first.what}: ${r.first.detail}`);
      expect(r.steps).toBeGreaterThan(0);
      expect(r.bitExact).toBe(r.steps);
      const seen = runFeatures(r.oracleRun);
      for (const f of sc.expect ?? []) expect(seen.has(f), `${sc.id} should show ${f}; the run showed ${[...seen].join(", ")}`).toBe(true);
      if (sc.completion_batch_size) {
        for (const c of r.oracleRun.calls) expect(c.generation_batch.uids.length).toBeLessThanOrEqual(Math.max(sc.completion_batch_size, sc.prefill_batch_size ?? 8));
      }
    }, limit(180_000));
  }
});

afterAll(() => {
  if (results.length) {
    const steps = results.reduce((a, r) => a + r.steps, 0);
    const exact = results.reduce((a, r) => a + r.bitExact, 0);
    const states = results.reduce((a, r) => a + r.cacheStates, 0);
    const ok = results.filter((r) => !r.first).length;
    console.log(`[batch parity] ${ok}/${results.length} runs bit-exact · ${steps} generation steps (${exact} bit-exact logprobs) · ${states} cache states · ${results.reduce((a, r) => a + r.calls, 0)} next() calls`);
  }
  freeModels();
});
