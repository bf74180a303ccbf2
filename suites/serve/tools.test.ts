// Tool calls: `npm run serve`'s response assembly against mlx_lm.server 0.32.2's, over HTTP, on
// scripted generations. The tiny random fixtures never write tool-call syntax on their own, so the
// model's token choice is the one thing replaced, on both sides alike: each request is answered
// with the next of a fixed list of token-id scripts (the tool fixture's tokenizer encodes the
// script texts below). Everything else is each server's own:
//  - mlx_lm.server: its APIHandler and handle_completion behind its own HTTP server, with
//    ResponseGenerator._tokenize and _make_state_machine on the checkpoint's tokenizer
//    (suites/serve/scripted_mlx_server.py: only generate() is replaced, by the script);
//  - this server: serve/server.ts's startServer (request parsing, chat template with `tools`,
//    text state machine with the tool state, the gemma4 parser, ToolCallFormatter, bodies and SSE
//    chunks), with an engine stand-in that yields the script (text from the port's detokenizer).
// Compared: raw response bodies (and every SSE data event) byte for byte once `id`, `created`,
// `system_fingerprint` and the tool-call ids (uuid4 on both sides) are blanked. So the
// usage counts (prompt tokens from each side's own template rendering with `tools`), content,
// reasoning, tool_calls (name, arguments as json.dumps writes them, index when streaming) and
// finish_reason ("tool_calls" after a call) are equal, for well-formed calls, several calls in one
// block, two blocks, a call inside reasoning, a call cut off by max_tokens, arguments that do not
// parse (dropped by both), non-ASCII and odd number literals, and a text completion.
// The real model with `tools` (template rendering, prompt tokens, generated bodies) is compared in
// suites/serve/parity.test.ts.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdirSync, realpathSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import type { TokenResponse } from "../../serve/engine.ts";
import { type RunningServer, startServer } from "../../serve/server.ts";
import { loadServedTokenizer, type ServedTokenizer } from "../../serve/tokenizer.ts";
import { limit } from "../../tests/time_limit.ts";
import { freePort, type ServerProcess, startServerProcess } from "./processes.ts";
import { buildToolFixture } from "./tool_fixture.ts";

const SOURCE_FIXTURE = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const DIR = join(REPO_ROOT, ".cache", "serve-tools-fixture");
const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
const START = limit(60_000);
const CASE = limit(20_000);

const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "The weather of a city", parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } } } } },
  { type: "function", function: { name: "search", description: "Searches the web", parameters: { type: "object", properties: { q: { type: "string" } } } } },
];
const USER = [{ role: "user", content: "What is the weather in Paris?" }];
const Q = '<|"|>';

interface Case {
  name: string;
  path: "/v1/chat/completions" | "/v1/completions";
  body: Record<string, unknown>;
  script: string;
  finish: "stop" | "length";
  /** What the reference itself must show, so that the case tests what its name says. */
  expect: { finish: string; calls: number };
}

const CASES: Case[] = [
  { name: "one call after text", path: "/v1/chat/completions", body: { messages: USER, tools: TOOLS }, script: `Let me check.<|tool_call>call:get_weather{city:${Q}Paris${Q},days:3}<tool_call|>`, finish: "stop", expect: { finish: "tool_calls", calls: 1 } },
  { name: "two calls in one block, a second block, text between", path: "/v1/chat/completions", body: { messages: USER, tools: TOOLS }, script: `<|tool_call>call:get_weather{city:${Q}Oslo${Q}}call:search{q:${Q}a, {b}: c${Q}}<tool_call|> and <|tool_call>call:search{}<tool_call|>`, finish: "stop", expect: { finish: "tool_calls", calls: 3 } },
  { name: "a call inside reasoning", path: "/v1/chat/completions", body: { messages: USER, tools: TOOLS }, script: `<|channel>thought I should look it up<|tool_call>call:search{q:${Q}Paris weather${Q}}<tool_call|>Done.`, finish: "stop", expect: { finish: "tool_calls", calls: 1 } },
  { name: "cut off by max_tokens inside the call", path: "/v1/chat/completions", body: { messages: USER, tools: TOOLS }, script: `Sure.<|tool_call>call:get_weather{city:${Q}Par`, finish: "length", expect: { finish: "length", calls: 0 } },
  { name: "arguments that do not parse (a space before a bare key)", path: "/v1/chat/completions", body: { messages: USER, tools: TOOLS }, script: "<|tool_call>call:get_weather{days:1, city:2}<tool_call|>", finish: "stop", expect: { finish: "tool_calls", calls: 0 } },
  { name: "non-ASCII strings, nested values and number literals", path: "/v1/chat/completions", body: { messages: USER, tools: TOOLS }, script: `<|tool_call>call:search{q:${Q}naïve 漢字 "quoted" \\ tab\t${Q},n:-0,f:1.50,e:1e400,big:123456789012345678901234567890,l:[1,2.0,null],o:{k:true,j:false}}<tool_call|>`, finish: "stop", expect: { finish: "tool_calls", calls: 1 } },
  { name: "no tools in the request (mlx-lm collects calls all the same)", path: "/v1/chat/completions", body: { messages: USER }, script: "<|tool_call>call:search{q:1}<tool_call|>", finish: "stop", expect: { finish: "tool_calls", calls: 1 } },
  { name: "a text completion (the call text is hidden, no tool_calls field)", path: "/v1/completions", body: { prompt: "Call a tool:" }, script: "Ok <|tool_call>call:search{q:1}<tool_call|> done", finish: "stop", expect: { finish: "tool_calls", calls: 0 } },
];

let ref: ServerProcess;
let ts: RunningServer;
let tok: ServedTokenizer;
const tsLog: string[] = [];

/** id, created, system_fingerprint and tool-call ids blanked. */
function blank(text: string): string {
  return text
    .replace(/"id": "(chatcmpl|cmpl)-[0-9a-f-]{36}"/g, '"id": "$1-ID"')
    .replace(/"id": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"/g, '"id": "CALL-ID"')
    .replace(/"created": \d+/g, '"created": 0')
    .replace(/"system_fingerprint": "[^"]*"/g, '"system_fingerprint": ""');
}

function events(stream: string): string[] {
  return stream
    .split("\n\n")
    .map((e) => e.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n"))
    .filter((e) => e.length > 0);
}

async function post(url: string, path: string, body: string): Promise<{ status: number; body: string }> {
  const r = await fetch(`${url}${path}`, { method: "POST", body, headers: { "Content-Type": "application/json" }, signal: AbortSignal.timeout(CASE) });
  return { status: r.status, body: await r.text() };
}

beforeAll(async () => {
  const t0 = performance.now();
  await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: SOURCE_FIXTURE }, START);
  const tOracle = performance.now();
  buildToolFixture(SOURCE_FIXTURE, DIR);
  tok = await loadServedTokenizer(DIR);
  const tTok = performance.now();
  // every case twice (non-streaming, then streaming): one script per request, in order, on both sides
  const scripts = CASES.flatMap((c) => [0, 1].map(() => ({ ids: tok.encode(c.script, false), finish: c.finish })));
  const scriptsFile = join(REPO_ROOT, ".cache", "serve-tools-scripts.json");
  mkdirSync(join(REPO_ROOT, ".cache"), { recursive: true });
  writeFileSync(scriptsFile, JSON.stringify(scripts));
  const port = await freePort();
  const refStarting = startServerProcess("scripted mlx_lm.server", PYTHON, [join("suites", "serve", "scripted_mlx_server.py"), DIR, String(port), scriptsFile], port, START);
  const queue = [...scripts];
  const eos = Math.min(...tok.eosTokenIds);
  const engine = {
    async *run(): AsyncGenerator<TokenResponse> {
      const s = queue.shift()!;
      const ids = s.finish === "stop" ? [...s.ids, eos] : s.ids;
      const detok = tok.newDetokenizer();
      for (let i = 0; i < ids.length; i++) {
        const finish = i === ids.length - 1 ? s.finish : null;
        if (finish !== "stop") detok.addToken(ids[i]!);
        if (finish !== null) detok.finalize();
        yield { text: detok.lastSegment(), token: ids[i]!, logprob: 0, finishReason: finish, topTokens: [] };
      }
    },
  };
  ts = startServer(
    {
      host: "127.0.0.1",
      port: 0,
      modelArg: DIR,
      modelId: realpathSync(DIR),
      apiKey: null,
      allowedOrigins: [],
      maxBodyBytes: 1 << 20,
      maxPromptTokens: 1 << 20,
      maxTokensLimit: 8192,
      vocabSize: 262144,
      defaults: { maxTokens: 512, temp: 0, topP: 1, topK: 0, minP: 0, numDraftTokens: 3 },
      chatTemplateArgs: {},
      systemFingerprint: "scripted",
      log: (l) => void tsLog.push(l),
    },
    engine,
    tok,
  );
  ref = await refStarting;
  const s = (a: number, b: number) => ((b - a) / 1000).toFixed(1);
  console.log(`tools start-up: ${s(t0, performance.now())} s (oracle fixture check ${s(t0, tOracle)} s, tool fixture and tokenizer ${s(tOracle, tTok)} s, scripted mlx_lm.server ${s(tTok, performance.now())} s)`);
}, 2 * START);

afterAll(async () => {
  await Promise.all([ref?.stop(), ts?.stop()]);
}, 15_000);

describe("tool calls: this server's response assembly = mlx_lm.server's, on the same scripted tokens", () => {
  let ran = 0;
  for (const c of CASES) {
    it(c.name, async () => {
      for (const stream of [false, true]) {
        const text = JSON.stringify({ ...c.body, max_tokens: 64, stream });
        const a = await post(ref.url, c.path, text);
        const b = await post(ts.url, c.path, text);
        expect([stream, b.status]).toEqual([stream, a.status]);
        expect(a.status).toBe(200);
        if (!stream) {
          expect(blank(b.body)).toBe(blank(a.body));
          const body = JSON.parse(a.body) as { choices: { finish_reason: string; message?: { tool_calls?: unknown[] } }[] };
          expect(body.choices[0]!.finish_reason).toBe(c.expect.finish);
          expect(body.choices[0]!.message?.tool_calls?.length ?? 0).toBe(c.expect.calls);
        } else {
          const [ea, eb] = [events(a.body), events(b.body)];
          expect(eb.map(blank)).toEqual(ea.map(blank));
          const chunks = ea.slice(0, -1).map((e) => JSON.parse(e) as { choices: { finish_reason: string | null; delta?: { tool_calls?: { index: number }[] } }[] });
          expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe(c.expect.finish);
          const indexes = chunks.flatMap((ch) => ch.choices[0]!.delta?.tool_calls ?? []).map((t) => t.index);
          expect(indexes).toEqual([...Array(c.expect.calls).keys()]);
        }
      }
      ran++;
    }, 2 * CASE);
  }

  it("a call that does not parse is logged by both and dropped", () => {
    // the cut-off call and the unparsable one, each asked twice (non-streaming, streaming)
    expect(tsLog.filter((l) => l.startsWith("warning: Failed to parse tool call")).length).toBe(4);
    expect(ref.log()).toContain("Failed to parse tool call");
  });

  it("ran every case", () => {
    expect(ran).toBe(CASES.length);
  });
});
