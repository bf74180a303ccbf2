// Concurrent serving checked against mlx-lm: `npm run serve` (started here with
// --record-schedule on the tokenizer fixture, a tiny bfloat16 Gemma 4 with a sliding window of 8
// over the real 262,144-piece tokenizer) answers 16 clients at once: completions and chat,
// streaming and not (4 chats with a system message: two prompt segments), greedy and sampled (temperature with top-p, top-k or min-p), one seeded
// request (mlx_lm.server runs those alone: the batch drains first), a stop word (in the
// recorded stop sequences; whether the tiny model writes it is not asserted), clients
// arriving while the batch runs, and one client that goes away mid-stream. Then:
//  - the schedule holds what the clients received: each non-streaming response's token ids and
//    logprobs (logprobs: true) equal its `leave` record's;
//  - oracle/python/serve_replay.py replays the schedule through mlx-lm 0.32.2's own
//    BatchGenerator (and generate_step for the seeded request): every request's tokens, the
//    logprob of each, and the sha256 of every step's whole logprobs row are equal, the cancelled
//    request's tokens up to its removal included;
//  - the schedule really is concurrent: sequences joined a running batch (an insert after the
//    generator's first next() call), several decoded together, one was removed on disconnect;
//  - /health answered while the batch was generating.
// SERVE_FULL=1: the same on c1_dense/f32, c3_e2b/f32 and c5_moe/f32 at the engine level
// (concurrency_full.ts; results in serve/CONCURRENCY.md).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";
import { freePort, type ServerProcess, startServerProcess } from "./processes.ts";
import { checkReplay, readSchedule, type ScheduleEvent } from "./schedule.ts";

const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
const START = limit(60_000);
const RUN = limit(120_000);

let ts: ServerProcess;
let work: string;
let schedulePath: string;

beforeAll(async () => {
  await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, START);
  work = mkdtempSync(join(tmpdir(), "serve-conc-"));
  schedulePath = join(work, "schedule.jsonl");
  const port = await freePort();
  ts = await startServerProcess("npm run serve", process.execPath, ["run", "serve/cli.ts", "--model", DIR, "--port", String(port), "--record-schedule", schedulePath, "--log-level", "WARNING"], port, START);
}, 2 * START);

afterAll(async () => {
  await ts?.stop();
  if (work) rmSync(work, { recursive: true, force: true });
}, 15_000);

interface Sent {
  path: string;
  body: Record<string, unknown>;
  delayMs: number;
  cancelAfterChunks?: number;
}

/** The 16 clients: varied kinds, lengths, samplers, arrival times. */
function clients(): Sent[] {
  const out: Sent[] = [];
  for (let i = 0; i < 16; i++) {
    const chat = i % 2 === 0;
    const body: Record<string, unknown> = chat
      ? { messages: [...(i % 4 === 2 ? [{ role: "system", content: `You are client ${i}'s terse guide.` }] : []), { role: "user", content: `Client ${i}: ${"tell me about the sea ".repeat(1 + (i % 4))}` }] }
      : { prompt: `Client ${i} writes: ${"the river runs on ".repeat(1 + (i % 5))}` };
    body.max_tokens = 3 + (i % 5);
    if (i % 4 === 1) Object.assign(body, { temperature: 0.7, top_p: 0.9 });
    if (i % 4 === 3) Object.assign(body, { temperature: 1.0, top_k: 20 });
    if (i === 6) Object.assign(body, { temperature: 0.8, min_p: 0.05 });
    if (i === 9) Object.assign(body, { temperature: 0.6, seed: 1234 });
    if (i === 10) body.stop = ["the"];
    if (i % 3 === 0) body.stream = true;
    else body.logprobs = true;
    const sent: Sent = { path: chat ? "/v1/chat/completions" : "/v1/completions", body, delayMs: i < 8 ? 0 : 150 * (i - 7) };
    if (i === 12) {
      body.max_tokens = 64;
      sent.cancelAfterChunks = 1;
    }
    out.push(sent);
  }
  return out;
}

interface Received {
  status: number;
  text: string;
  cancelled: boolean;
  doneAt: number;
}

async function send(s: Sent): Promise<Received> {
  await Bun.sleep(s.delayMs);
  const ac = new AbortController();
  const r = await fetch(`${ts.url}${s.path}`, { method: "POST", body: JSON.stringify(s.body), headers: { "Content-Type": "application/json" }, signal: ac.signal });
  if (s.cancelAfterChunks === undefined) return { status: r.status, text: await r.text(), cancelled: false, doneAt: performance.now() };
  const reader = r.body!.getReader();
  let chunks = 0;
  while (chunks < s.cancelAfterChunks) {
    const { done } = await reader.read();
    if (done) break;
    chunks++;
  }
  ac.abort();
  await reader.cancel().catch(() => undefined);
  return { status: r.status, text: "", cancelled: true, doneAt: performance.now() };
}

describe("16 concurrent clients, replayed through mlx-lm's BatchGenerator", () => {
  it(
    "every response reproduced bit for bit by the replay of the recorded schedule",
    async () => {
      const sent = clients();
      const pending = sent.map(send);
      // a health check while the batch generates
      await Bun.sleep(300);
      const h0 = performance.now();
      const health = await fetch(`${ts.url}/health`, { signal: AbortSignal.timeout(10_000) });
      const healthAt = performance.now();
      expect(health.status).toBe(200);
      const got = await Promise.all(pending);
      expect(got.filter((g) => !g.cancelled).every((g) => g.status === 200)).toBe(true);
      expect(Math.max(...got.map((g) => g.doneAt))).toBeGreaterThan(healthAt);
      // the cancelled sequence is removed at the end of its time budget: wait for the record
      let events: ScheduleEvent[] = [];
      for (let t = 0; t < 100; t++) {
        events = readSchedule(readFileSync(schedulePath, "utf8"));
        if (events.filter((e) => e.event === "leave" || e.event === "single").length >= 16) break;
        await Bun.sleep(100);
      }
      const ends = events.filter((e) => e.event === "leave" || e.event === "single");
      expect(ends).toHaveLength(16);

      // what clients received is what the schedule holds (non-streaming ones with logprobs)
      const byRequest = new Map<number, ScheduleEvent>(ends.map((e) => [e.request!, e]));
      const inserts = events.filter((e) => e.event === "insert");
      const singles = events.filter((e) => e.event === "single");
      const checkedBodies = got.map((g, i) => {
        if (g.cancelled || sent[i]!.body.stream || !sent[i]!.body.logprobs) return 0;
        const body = JSON.parse(g.text) as { choices: { logprobs: { content: { id: number; logprob: number }[] } }[]; usage: { prompt_tokens: number } };
        const content = body.choices[0]!.logprobs.content;
        // requests are numbered in arrival order, which is not send order: find this one by its prompt length and tokens
        const match = ends.find((e) => e.tokens!.length >= content.length && content.every((c, j) => c.id === e.tokens![j] && c.logprob === e.logprobs![j]) && (e.prompt ?? inserts.find((x) => x.request === e.request)!.prompt!).length === body.usage.prompt_tokens);
        expect(match, `client ${i}'s tokens and logprobs are in the schedule`).toBeDefined();
        return 1;
      });
      expect(checkedBodies.reduce((a: number, b) => a + b, 0)).toBeGreaterThanOrEqual(8);

      // the schedule is concurrent
      expect(inserts.length).toBe(15);
      expect(singles).toHaveLength(1);
      expect(inserts.some((e) => e.step! > 0)).toBe(true);
      // chat prompts with a system message are inserted in two segments, as mlx_lm.server's _tokenize splits them
      expect(inserts.filter((e) => (e as { segments?: number[][] }).segments?.length === 2)).toHaveLength(4);
      expect(events.filter((e) => e.event === "remove")).toHaveLength(1);
      expect(ends.filter((e) => e.reason === "cancelled")).toHaveLength(1);

      // the replay through mlx-lm
      const outPath = join(work, "replay.json");
      const py = spawnSync(PYTHON, ["oracle/python/serve_replay.py", "--model", DIR, "--schedule", schedulePath, "--out", outPath], { cwd: REPO_ROOT, encoding: "utf8", timeout: RUN });
      expect(py.status, py.stderr).toBe(0);
      const replay = JSON.parse(readFileSync(outPath, "utf8"));
      const r = checkReplay(events, replay);
      expect(r.mismatches).toEqual([]);
      expect(r.checked).toBe(16);
      expect(r.tokens).toBeGreaterThan(50);
      expect(byRequest.size).toBe(16);
      console.log(`concurrency: 16 requests in ${r.sessions} generator session(s), ${r.tokens} tokens; health answered after ${(healthAt - h0).toFixed(0)} ms; replay equal`);
    },
    2 * RUN,
  );
});
