// SERVE_LOAD=1 only: load and faults on `npm run serve` with the official `openai` npm client
// (installed on demand in serve/load/, not a dependency of the project) on loopback, on the
// tokenizer fixture. SERVE_LOAD_CLIENTS concurrent clients (64) send SERVE_LOAD_REQUESTS requests
// (2,000), bounded by SERVE_LOAD_SECONDS (480: no request starts after it). The mix, by request
// number: 5% malformed (half as raw bodies: bad JSON, a wrong type, a missing field, an unserved
// model; half through the client: a negative temperature, top_logprobs out of range), 10%
// streams cancelled after their first chunk (max_tokens 200), the rest streaming chat and
// completions (1 in 8 not streaming), greedy or sampled, max_tokens 1..8. Checked:
//  - malformed requests get the documented status (400 or 404) and an {"error": ...} body;
//  - every accepted request completes or is cancelled: each completed one's response id has a
//    `leave` record in the server's schedule (--record-schedule), with the same finish reason and
//    token count (usage), and its text equals the detokenized recorded tokens (the stop token
//    dropped): no request is lost or answered with another's tokens; each cancelled one's record
//    says "cancelled" (or it finished first);
//  - the server process is alive and /health answers at the end; its resident memory is sampled
//    every second, and its range after warm-up (the first 10% of requests) is reported.
// The figures go to serve/LOAD.md (by hand, from the summary line this prints).
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { loadServedTokenizer } from "../../serve/tokenizer.ts";
import { freePort, startServerProcess } from "./processes.ts";
import { readSchedule, type ScheduleEvent } from "./schedule.ts";

const LOAD = process.env.SERVE_LOAD === "1";
const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const CLIENT_DIR = join(REPO_ROOT, "serve", "load");
const CLIENTS = Number(process.env.SERVE_LOAD_CLIENTS ?? 64);
const REQUESTS = Number(process.env.SERVE_LOAD_REQUESTS ?? 2000);
const SECONDS = Number(process.env.SERVE_LOAD_SECONDS ?? 480);

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : Number.NaN;
}

type Outcome =
  | { kind: "malformed"; k: number; expected: number; status: number; body: string; hasError: boolean }
  | { kind: "done"; k: number; id: string; text: string; finish: string; completionTokens: number }
  | { kind: "cancelled"; k: number; id: string | null }
  | { kind: "failed"; k: number; error: string }
  | { kind: "skipped"; k: number };

describe.skipIf(!LOAD)("SERVE_LOAD: the openai client under load, with cancellations and malformed requests (set SERVE_LOAD=1; minutes)", () => {
  it(
    `${CLIENTS} concurrent clients, ${REQUESTS} requests`,
    async () => {
      if (!existsSync(join(CLIENT_DIR, "node_modules", "openai"))) {
        const r = spawnSync("npm", ["install", "--no-audit", "--no-fund", "--no-package-lock", "--omit=peer"], { cwd: CLIENT_DIR, encoding: "utf8", timeout: 300_000 });
        expect(r.status, `npm install in serve/load failed: ${r.stderr}`).toBe(0);
      }
      const { default: OpenAI } = (await import(join(CLIENT_DIR, "node_modules", "openai", "index.js"))) as { default: new (o: Record<string, unknown>) => any };
      await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, 60_000);
      const tok = await loadServedTokenizer(DIR);
      const work = mkdtempSync(join(tmpdir(), "serve-load-"));
      const schedulePath = join(work, "schedule.jsonl");
      const port = await freePort();
      const server = await startServerProcess("npm run serve", process.execPath, ["run", "serve/cli.ts", "--model", DIR, "--port", String(port), "--record-schedule", schedulePath, "--log-level", "WARNING"], port, 60_000);
      const pid = server.proc.pid!;
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 300_000 });
      const rss: { at: number; kib: number; done: number }[] = [];
      let done = 0;
      const t0 = performance.now();
      const sampler = setInterval(() => rss.push({ at: (performance.now() - t0) / 1000, kib: rssKiB(pid), done }), 1000);
      const deadline = t0 + SECONDS * 1000;

      const raw = async (k: number, body: string, expected: number): Promise<Outcome> => {
        const r = await fetch(`${server.url}/v1/chat/completions`, { method: "POST", body, headers: { "Content-Type": "application/json" } });
        const text = await r.text();
        let hasError = false;
        try {
          hasError = typeof (JSON.parse(text) as { error?: unknown }).error === "string";
        } catch {
          hasError = false;
        }
        return { kind: "malformed", k, expected, status: r.status, body: text, hasError };
      };
      const one = async (k: number): Promise<Outcome> => {
        if (performance.now() > deadline) return { kind: "skipped", k };
        const chat = k % 2 === 0;
        const sampled = k % 3 === 0 ? { temperature: 0.7, top_p: 0.9 } : {};
        try {
          if (k % 20 === 0) {
            // malformed: documented 4xx
            switch ((k / 20) % 6) {
              case 0:
                return await raw(k, '{"messages": [', 400);
              case 1:
                return await raw(k, JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: "ten" }), 400);
              case 2:
                return await raw(k, JSON.stringify({ max_tokens: 3 }), 400);
              case 3:
                return await raw(k, JSON.stringify({ model: "/etc/passwd", messages: [{ role: "user", content: "hi" }] }), 404);
              default: {
                const bad = (k / 20) % 6 === 4 ? { temperature: -1 } : { logprobs: true, top_logprobs: 50 };
                try {
                  await client.chat.completions.create({ model: "default_model", messages: [{ role: "user", content: `bad ${k}` }], max_tokens: 2, ...bad });
                  return { kind: "malformed", k, expected: 400, status: 200, body: "", hasError: false };
                } catch (e) {
                  // the client's APIError: `error` is the body's "error" field
                  const err = e as { status?: number; error?: unknown; message: string };
                  return { kind: "malformed", k, expected: 400, status: err.status ?? -1, body: JSON.stringify(err.error ?? err.message), hasError: typeof err.error === "string" && err.error.length > 0 };
                }
              }
            }
          }
          const prompt = `Request ${k}: ${"a river and a bridge ".repeat(1 + (k % 6))}`;
          const cancel = k % 10 === 1;
          const maxTokens = cancel ? 200 : 1 + (k % 8);
          const stream = cancel || k % 8 !== 2;
          const ac = new AbortController();
          const base = { model: "default_model", max_tokens: maxTokens, ...sampled };
          if (!stream) {
            const r = chat
              ? await client.chat.completions.create({ ...base, messages: [{ role: "user", content: prompt }] })
              : await client.completions.create({ ...base, prompt });
            const c = r.choices[0];
            return { kind: "done", k, id: r.id, text: (chat ? c.message.content : c.text) ?? "", finish: c.finish_reason, completionTokens: r.usage.completion_tokens };
          }
          const s = chat
            ? await client.chat.completions.create({ ...base, messages: [{ role: "user", content: prompt }], stream: true, stream_options: { include_usage: true } }, { signal: ac.signal })
            : await client.completions.create({ ...base, prompt, stream: true, stream_options: { include_usage: true } }, { signal: ac.signal });
          let id: string | null = null;
          let text = "";
          let finish = "";
          let completionTokens = -1;
          try {
            for await (const chunk of s) {
              id ??= chunk.id;
              if (chunk.id !== id) return { kind: "failed", k, error: `stream ids differ: ${id} then ${chunk.id}` };
              const c = chunk.choices[0];
              if (c) {
                text += (chat ? c.delta?.content : c.text) ?? "";
                if (c.finish_reason) finish = c.finish_reason;
              }
              if (chunk.usage) completionTokens = chunk.usage.completion_tokens;
              if (cancel) {
                ac.abort();
                break;
              }
            }
          } catch (e) {
            if (cancel) return { kind: "cancelled", k, id };
            throw e;
          }
          if (cancel) return { kind: "cancelled", k, id };
          return { kind: "done", k, id: id!, text, finish, completionTokens };
        } catch (e) {
          return { kind: "failed", k, error: `${(e as Error).message}` };
        } finally {
          done++;
        }
      };

      let next = 0;
      const outcomes: Outcome[] = [];
      await Promise.all(
        Array.from({ length: CLIENTS }, async () => {
          while (next < REQUESTS) outcomes.push(await one(next++));
        }),
      );
      const wall = (performance.now() - t0) / 1000;
      clearInterval(sampler);
      const health = await fetch(`${server.url}/health`).then((r) => r.status, () => -1);
      const alive = server.proc.exitCode === null && server.proc.signalCode === null;
      // removals are recorded at the end of a time budget
      await Bun.sleep(1500);
      const events = readSchedule(readFileSync(schedulePath, "utf8"));
      await server.stop();
      rmSync(work, { recursive: true, force: true });

      const ends = new Map<string, ScheduleEvent>();
      for (const e of events) if ((e.event === "leave" || e.event === "single") && e.tag) ends.set(e.tag, e);
      const problems: string[] = [];
      const by = (kind: Outcome["kind"]) => outcomes.filter((o) => o.kind === kind);
      for (const o of by("malformed") as Extract<Outcome, { kind: "malformed" }>[]) {
        if (o.status !== o.expected || !o.hasError) problems.push(`request ${o.k}: malformed, status ${o.status} (expected ${o.expected}) ${o.body.slice(0, 120)}`);
      }
      for (const o of by("failed") as Extract<Outcome, { kind: "failed" }>[]) problems.push(`request ${o.k}: failed: ${o.error}`);
      let textChecked = 0;
      for (const o of by("done") as Extract<Outcome, { kind: "done" }>[]) {
        const e = ends.get(o.id);
        if (!e) {
          problems.push(`request ${o.k} (${o.id}): completed but not in the schedule`);
          continue;
        }
        if (e.reason !== o.finish) problems.push(`request ${o.k}: finish ${o.finish}, schedule ${e.reason}`);
        if (o.completionTokens !== -1 && o.completionTokens !== e.tokens!.length) problems.push(`request ${o.k}: usage ${o.completionTokens} tokens, schedule ${e.tokens!.length}`);
        const d = tok.newDetokenizer();
        const kept = e.reason === "stop" ? e.tokens!.slice(0, -1) : e.tokens!;
        for (const t of kept) d.addToken(t);
        d.finalize();
        let expected = "";
        // lastSegment after finalize gives the whole text when read once
        expected = d.lastSegment();
        if (expected !== o.text) problems.push(`request ${o.k}: text ${JSON.stringify(o.text.slice(0, 60))} is not its recorded tokens' ${JSON.stringify(expected.slice(0, 60))}`);
        else textChecked++;
      }
      let cancelledSeen = 0;
      for (const o of by("cancelled") as Extract<Outcome, { kind: "cancelled" }>[]) {
        const e = o.id ? ends.get(o.id) : undefined;
        if (o.id && !e) problems.push(`request ${o.k} (${o.id}): cancelled, no end in the schedule`);
        if (e?.reason === "cancelled") cancelledSeen++;
      }
      const after = rss.filter((r) => r.done >= REQUESTS * 0.1);
      const kib = after.map((r) => r.kib);
      const lo = Math.min(...kib);
      const hi = Math.max(...kib);
      const first = kib[0] ?? Number.NaN;
      const last = kib.at(-1) ?? Number.NaN;
      const tokens = [...ends.values()].reduce((a, e) => a + e.tokens!.length, 0);
      console.log(
        `SERVE_LOAD: ${CLIENTS} clients, ${outcomes.length} requests in ${wall.toFixed(0)} s (${by("skipped").length} not started: time bound ${SECONDS} s): ` +
          `${by("done").length} completed (${textChecked} texts equal to their recorded tokens), ${by("cancelled").length} cancelled (${cancelledSeen} removed mid-generation), ` +
          `${by("malformed").length} malformed (all with the documented status: ${by("malformed").every((o) => (o as { status: number; expected: number }).status === (o as { expected: number }).expected)}), ${by("failed").length} failed; ` +
          `${tokens} tokens generated (${(tokens / wall).toFixed(1)} tok/s aggregate); server alive ${alive}, /health ${health}; ` +
          `RSS after warm-up ${(lo / 1024).toFixed(0)}..${(hi / 1024).toFixed(0)} MiB (first ${(first / 1024).toFixed(0)}, last ${(last / 1024).toFixed(0)}, range ${(((hi - lo) / lo) * 100).toFixed(1)}% of the low)`,
      );
      if (problems.length) console.log(problems.slice(0, 30).join("\n"));
      expect(problems).toEqual([]);
      expect(alive).toBe(true);
      expect(health).toBe(200);
      expect(outcomes).toHaveLength(REQUESTS);
      expect(by("done").length).toBeGreaterThan(0);
    },
    (SECONDS + 600) * 1000,
  );
});
