// SERVE_FULL=1 only: the serving engine's continuous batching (serve/engine.ts, in this process,
// without HTTP) on the dense, E2B-like and MoE fixtures (c1_dense/f32, c3_e2b/f32, c5_moe/f32:
// 256-token vocabularies, no tokenizer, so a stub names the pieces), 16 clients at once per
// fixture (half arriving while earlier ones generate), prompt lengths (past the sliding window of 8), samplers
// (greedy, temperature with top-p/top-k/min-p, two seeded requests that drain the batch) and
// token budgets, two clients that stop reading after 2 of 32 tokens (both removed from the batch);
// at least one request joins a running batch; the recorded schedule is replayed
// through mlx-lm's BatchGenerator (oracle/python/serve_replay.py) and every request's tokens,
// logprobs and per-step logprobs-row sha256 must be equal. Results: serve/CONCURRENCY.md.
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { batchModel } from "../../model/generate_batch.ts";
import { loadGenerationModel } from "../../model/runtime.ts";
import { Engine } from "../../serve/engine.ts";
import { StopSequences } from "../../serve/text_state.ts";
import type { ServedTokenizer } from "../../serve/tokenizer.ts";
import { limit } from "../../tests/time_limit.ts";
import { checkReplay, readSchedule } from "./schedule.ts";

const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
const FULL = process.env.SERVE_FULL === "1";
const FIXTURES = ["c1_dense/f32", "c3_e2b/f32", "c5_moe/f32"];

/** Pieces as "<id>": the replay compares token ids and logprobs, never text. */
const stubTokenizer: ServedTokenizer = {
  encode: () => [],
  piece: (id) => `<${id}>`,
  hasChatTemplate: false,
  renderChat: () => "",
  eosTokenIds: new Set([1]),
  thinking: null,
  newDetokenizer() {
    let pending = "";
    return {
      addToken: (t: number) => void (pending += `<${t}>`),
      finalize: () => undefined,
      lastSegment() {
        const s = pending;
        pending = "";
        return s;
      },
    };
  },
};

/** A small deterministic PRNG (mulberry32), so that a run's client mix is reproducible from its seed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe.skipIf(!FULL)("SERVE_FULL: 16 concurrent clients per fixture, replayed through mlx-lm (set SERVE_FULL=1; minutes of CPU)", () => {
  for (const fixture of FIXTURES) {
    it(
      fixture,
      async () => {
        const dir = join(REPO_ROOT, ".cache", "checkpoints", fixture);
        const work = mkdtempSync(join(tmpdir(), "serve-full-"));
        const schedulePath = join(work, "schedule.jsonl");
        const { loaded, model } = loadGenerationModel(dir);
        const engine = new Engine(model, { ...batchModel(loaded), maxPositions: undefined }, stubTokenizer, { prefillStepSize: 16, prefillBatchSize: 4, completionBatchSize: 8, recordSchedule: schedulePath, timeBudgetMs: 50 });
        const rand = rng(FIXTURES.indexOf(fixture) + 28);
        const t0 = performance.now();
        try {
          // clients 8..15 arrive once client i-8 has its first token: while a batch is running
          const firstToken = Array.from({ length: 16 }, () => Promise.withResolvers<void>());
          const clients = Array.from({ length: 16 }, async (_, i) => {
            if (i >= 8) await firstToken[i - 8]!.promise;
            await Bun.sleep(Math.floor(rand() * 100));
            const len = 3 + Math.floor(rand() * 40);
            const prompt = [2, ...Array.from({ length: len }, () => 3 + Math.floor(rand() * 250))];
            const kind = i % 4;
            const sampler = kind === 0 ? { temp: 0 } : kind === 1 ? { temp: 0.7, topP: 0.9 } : kind === 2 ? { temp: 1.0, topK: 20 } : { temp: 0.8, minP: 0.05 };
            const stopAfter = i === 5 || i === 11 ? 2 : Infinity;
            let got = 0;
            const gen = engine.run({
              prompt,
              maxTokens: stopAfter === Infinity ? 2 + Math.floor(rand() * 14) : 32,
              sampler,
              seed: i === 3 || i === 13 ? 100 + i : null,
              topLogprobs: 0,
              stop: new StopSequences([[1]]),
              cancelled: () => got >= stopAfter,
            });
            for await (const _t of gen) {
              got++;
              firstToken[i]!.resolve();
              if (got >= stopAfter) break;
            }
            firstToken[i]!.resolve();
            return got;
          });
          const counts = await Promise.all(clients);
          // removals are recorded at the end of a time budget: let the loop reach it
          for (let t = 0; t < 50 && readSchedule(readFileSync(schedulePath, "utf8")).filter((e) => e.event === "leave" || e.event === "single").length < 16; t++) await Bun.sleep(50);
          const wall = (performance.now() - t0) / 1000;
          const events = readSchedule(readFileSync(schedulePath, "utf8"));
          expect(counts).toHaveLength(16);
          const outPath = join(work, "replay.json");
          const py = spawnSync(PYTHON, ["oracle/python/serve_replay.py", "--model", dir, "--schedule", schedulePath, "--out", outPath], { cwd: REPO_ROOT, encoding: "utf8", timeout: limit(300_000) });
          expect(py.status, py.stderr).toBe(0);
          const r = checkReplay(events, JSON.parse(readFileSync(outPath, "utf8")));
          expect(r.mismatches).toEqual([]);
          expect(r.checked).toBe(16);
          const inserts = events.filter((e) => e.event === "insert");
          const late = inserts.filter((e) => e.step! > 0).length;
          const removed = events.filter((e) => e.event === "remove").reduce((a, e) => a + ((e as { uids?: number[] }).uids?.length ?? 0), 0);
          expect(late).toBeGreaterThan(0);
          expect(removed).toBe(2);
          const reasons = events.filter((e) => e.event === "leave" || e.event === "single").map((e) => e.reason);
          console.log(
            `SERVE_FULL ${fixture}: 16 requests (${inserts.length} batched in ${r.sessions} generator sessions, ${late} joined a running batch, ${events.filter((e) => e.event === "single").length} seeded alone, ${removed} removed on disconnect), ${r.tokens} tokens, ${r.mismatches.length} mismatches, ` +
              `finish reasons ${JSON.stringify(Object.fromEntries([...new Set(reasons)].map((k) => [k, reasons.filter((x) => x === k).length])))}, engine ${wall.toFixed(1)} s`,
          );
        } finally {
          engine.close();
          rmSync(work, { recursive: true, force: true });
        }
      },
      limit(600_000),
    );
  }
});
