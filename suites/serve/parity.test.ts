// `npm run serve` (serve/) against mlx_lm.server 0.32.2, both started here on 127.0.0.1 on the
// tool fixture (suites/serve/tool_fixture.ts: the tokenizer fixture, a tiny bfloat16 Gemma 4 over
// a real 262,144-piece tokenizer built by oracle/python/make_checkpoints.py, with Gemma 4's
// tool-call and thinking markers and a chat template that renders `tools`), one pair of servers
// for the whole file. A fixed list of
// requests is sent to both, one at a time, and compared:
//  - the raw response bodies, byte for byte, once the three fields that must differ are blanked:
//    `id` (a fresh uuid), `created` (a clock) and `system_fingerprint` (mlx-lm's names its
//    versions and platform; this server names itself). So token ids, text, every logprob (as
//    Python's json.dumps prints the double), finish reasons, usage counts, field order and the
//    JSON layout are equal;
//  - the same bodies parsed, field by field (the check that names the first differing field);
//  - streams: every SSE `data:` event, in order, the same way (comments such as mlx_lm.server's
//    ": keepalive" lines are not compared: SSE clients ignore them);
//  - errors: the status and the {"error": ...} body of malformed requests, fixed ones and 20
//    random ones (fields of the validation set to literals of every JSON type, floats apart from
//    ints): where mlx_lm.server answers 4xx, the same status and body; where it serves the
//    request, the same body (greedy or seeded), or the same status (unseeded sampling), or one of
//    this server's documented 400s (a feature not ported, a seed it cannot take).
// Cases: completions and chat, streaming and not, greedy (mlx_lm.server's batched path) and
// seeded sampling (its sequential path, which a seed selects), logprobs and top_logprobs (with
// mlx_lm.server's layout: a step's `id`/`logprob` are the first entry of an unsorted top-k, not
// the sampled token), stop words (chosen from a greedy run so that they do stop it), `tools`
// (rendered by each server's chat template: the prompt token counts show them; an assistant turn
// with tool_calls whose arguments come as a JSON string, a tool result). The tiny model writes no
// tool calls itself: suites/serve/tools.test.ts compares the tool-call responses.
// Both servers run with --prompt-cache-size 0, so that every request here is prefilled from its
// start; prefix reuse is compared in prefix_parity.test.ts.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";
import { freePort, type ServerProcess, startServerProcess } from "./processes.ts";
import { buildToolFixture } from "./tool_fixture.ts";

const TOKENIZER_FIXTURE = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const DIR = join(REPO_ROOT, ".cache", "serve-parity-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
// mlx_lm.server's own main, unmodified, after the oracle's device switch (MLX_DEVICE)
const LAUNCH = "import sys; sys.path.insert(0, 'oracle/python'); import device_env; from mlx_lm.server import main; sys.argv[0] = 'mlx_lm.server'; main()";
const START = limit(60_000);
const CASE = limit(30_000);

let ref: ServerProcess;
let ts: ServerProcess;

interface Reply {
  status: number;
  body: string;
}

async function post(s: ServerProcess, path: string, body: string): Promise<Reply> {
  const r = await fetch(`${s.url}${path}`, { method: "POST", body, headers: { "Content-Type": "application/json" }, signal: AbortSignal.timeout(CASE) });
  return { status: r.status, body: await r.text() };
}

/** The body with id, created and system_fingerprint blanked (their values differ by design). */
function blank(text: string): string {
  return text
    .replace(/"id": "(chatcmpl|cmpl)-[0-9a-f-]{36}"/g, '"id": "$1-ID"')
    .replace(/"created": \d+/g, '"created": 0')
    .replace(/"system_fingerprint": "[^"]*"/g, '"system_fingerprint": ""');
}

/** SSE data events (comments and blank lines dropped). */
function events(stream: string): string[] {
  return stream
    .split("\n\n")
    .map((e) => e.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n"))
    .filter((e) => e.length > 0);
}

/** Both servers answer `body` at `path` the same; returns the reference's parsed body (or events). */
async function same(path: string, req: Record<string, unknown>): Promise<unknown> {
  const text = JSON.stringify(req);
  const [a, b] = await Promise.all([post(ref, path, text), post(ts, path, text)]);
  expect(b.status).toBe(a.status);
  if (req.stream === true && a.status === 200) {
    const [ea, eb] = [events(a.body), events(b.body)];
    expect(ea.at(-1)).toBe("[DONE]");
    expect(eb.map(blank)).toEqual(ea.map(blank));
    const parsed = ea.slice(0, -1).map((e) => JSON.parse(blank(e)));
    expect(eb.slice(0, -1).map((e) => JSON.parse(blank(e)))).toEqual(parsed);
    return parsed;
  }
  expect(JSON.parse(blank(b.body))).toEqual(JSON.parse(blank(a.body)));
  expect(blank(b.body)).toBe(blank(a.body));
  return JSON.parse(a.body);
}

type Choice = { finish_reason: string; text?: string; message?: { content: string | null }; logprobs?: { content: { id: number; logprob: number; top_logprobs?: { id: number }[] }[] } };
type Body = { choices: Choice[]; usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details: { cached_tokens: number } } };

beforeAll(async () => {
  const t0 = performance.now();
  const since = () => `${((performance.now() - t0) / 1000).toFixed(1)} s`;
  await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: TOKENIZER_FIXTURE }, START);
  buildToolFixture(TOKENIZER_FIXTURE, DIR);
  const phases = [`fixture ready ${since()}`];
  const [p1, p2] = [await freePort(), await freePort()];
  const started = await Promise.allSettled([
    startServerProcess("mlx_lm.server", PYTHON, ["-c", LAUNCH, "--model", DIR, "--host", "127.0.0.1", "--port", String(p1), "--prompt-cache-size", "0"], p1, START),
    startServerProcess("npm run serve", process.execPath, ["run", "serve/cli.ts", "--model", DIR, "--port", String(p2), "--prompt-cache-size", "0"], p2, START),
  ]);
  for (const s of started) if (s.status === "fulfilled") (s.value.name === "mlx_lm.server" ? (ref = s.value) : (ts = s.value));
  const failed = started.find((s) => s.status === "rejected");
  if (failed) throw (failed as PromiseRejectedResult).reason;
  phases.push(`both answer /health ${since()}`);
  // mlx_lm.server loads the model in its generation thread after /health answers: one throw-away request to each
  await Promise.all([ref, ts].map((s) => post(s, "/v1/completions", JSON.stringify({ prompt: "warm up", max_tokens: 1 }))));
  phases.push(`both served a first request ${since()}`);
  console.log(`serve parity start-up: ${phases.join(", ")}`);
}, 3 * START);

afterAll(async () => {
  await Promise.all([ref?.stop(), ts?.stop()]);
}, 15_000);

describe("npm run serve = mlx_lm.server, body for body", () => {
  let ran = 0;

  it("completions, greedy: tokens, text, logprobs, finish reason and usage (non-streaming)", async () => {
    const b = (await same("/v1/completions", { prompt: "The quick brown fox jumps over the lazy dog, then rests by the river.", max_tokens: 10, logprobs: true })) as Body;
    const c = b.choices[0]!;
    expect(c.finish_reason).toBe("length");
    expect(c.logprobs!.content).toHaveLength(10);
    expect(b.usage.completion_tokens).toBe(10);
    expect(b.usage.prompt_tokens).toBeGreaterThan(8); // past the fixture's sliding window
    expect(b.usage.prompt_tokens_details.cached_tokens).toBe(0);
    ran++;
  }, CASE);

  it("completions with top_logprobs 5: mlx_lm.server's layout (first top-k entry per step), values bit-equal", async () => {
    const b = (await same("/v1/completions", { prompt: "def square(x):\n    return x * x  # the square", max_tokens: 6, top_logprobs: 5 })) as Body;
    const content = b.choices[0]!.logprobs!.content;
    expect(content).toHaveLength(6);
    for (const step of content) {
      expect(step.top_logprobs).toHaveLength(5);
      expect(step.id).toBe(step.top_logprobs![0]!.id);
    }
    ran++;
  }, CASE);

  it("completions, streaming, with stream_options.include_usage", async () => {
    const ev = (await same("/v1/completions", { prompt: "Once upon a time in a small village by the sea", max_tokens: 7, stream: true, stream_options: { include_usage: true } })) as Body[];
    expect(ev.length).toBeGreaterThanOrEqual(3);
    expect(ev.at(-2)!.choices[0]!.finish_reason).toBe("length");
    expect(ev.at(-1)!.usage.completion_tokens).toBe(7);
    ran++;
  }, CASE);

  it("chat completions through the chat template, greedy, logprobs (non-streaming), and content given as text parts", async () => {
    const b = (await same("/v1/chat/completions", { messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "Name three rivers in Europe." }], max_tokens: 8, logprobs: true })) as Body;
    expect(b.choices[0]!.logprobs!.content).toHaveLength(8);
    expect(b.usage.prompt_tokens).toBeGreaterThan(10);
    await same("/v1/chat/completions", { messages: [{ role: "user", content: [{ type: "text", text: "Write a haiku " }, { type: "text", text: "about snow." }] }], max_completion_tokens: 5 });
    ran++;
  }, CASE);

  it("chat completions, streaming", async () => {
    const ev = (await same("/v1/chat/completions", { messages: [{ role: "user", content: "Count from one to ten in French." }], max_tokens: 6, stream: true })) as Body[];
    expect(ev.at(-1)!.choices[0]!.finish_reason).toBe("length");
    ran++;
  }, CASE);

  it("stop words (taken from a greedy run, so that they stop it): finish_reason stop, the word and what follows cut, tokens counted", async () => {
    const prompt = "Alice was beginning to get very tired of sitting by her sister on the bank.";
    const full = (await same("/v1/completions", { prompt, max_tokens: 12, logprobs: true })) as Body;
    const text = full.choices[0]!.text!;
    // a word from the middle of the greedy text, with its leading space: stop words are matched on
    // their token ids (encoded without special tokens), and " word" is the piece "▁word"
    const words = text.split(" ").slice(1).filter((w) => w.length >= 3);
    expect(words.length).toBeGreaterThanOrEqual(2);
    const stop = ` ${words[Math.floor(words.length / 2)]!}`;
    for (const stream of [false, true]) {
      const r = await same("/v1/completions", { prompt, max_tokens: 12, logprobs: true, stop: [stop, "zzzz-never"], stream });
      if (!stream) {
        const c = (r as Body).choices[0]!;
        expect(c.finish_reason).toBe("stop");
        expect(c.text!.includes(stop)).toBe(false);
        expect((r as Body).usage.completion_tokens).toBeLessThan(12);
      } else expect((r as Body[]).at(-1)!.choices[0]!.finish_reason).toBe("stop");
    }
    ran++;
  }, CASE);

  it("seeded sampling (mlx_lm.server's sequential path): temperature, top_p, top_k, min_p, seed", async () => {
    const req = { prompt: "A list of fruits: apples, pears,", max_tokens: 5, logprobs: true, temperature: 1.3, top_p: 0.9, top_k: 40, min_p: 0.02, seed: 7 };
    const b = (await same("/v1/completions", req)) as Body;
    expect(b.choices[0]!.logprobs!.content).toHaveLength(5);
    // the same seed again (this server reuses its compiled sampler): the same tokens again
    const again = (await same("/v1/completions", req)) as Body;
    expect(again.choices).toEqual(b.choices);
    const ev = (await same("/v1/chat/completions", { messages: [{ role: "user", content: "Say something random." }], max_tokens: 4, temperature: 1.0, seed: 3, stream: true })) as Body[];
    expect(ev.length).toBeGreaterThanOrEqual(2);
    ran++;
  }, CASE);

  it("malformed requests: same status and error body", async () => {
    const cases: [string, unknown][] = [
      ["/v1/completions", { prompt: "x", max_tokens: 0 }],
      ["/v1/completions", { prompt: "x", max_tokens: 2.5 }],
      ["/v1/completions", { prompt: "x", temperature: "hot" }],
      ["/v1/completions", { prompt: "x", top_p: 1.5 }],
      ["/v1/completions", { prompt: "x", top_logprobs: 12 }],
      ["/v1/completions", { prompt: "x", logprobs: 1 }],
      ["/v1/completions", { prompt: "x", stream: "yes" }],
      ["/v1/completions", { prompt: "x", seed: "s" }],
      ["/v1/completions", { prompt: "x", model: 5 }],
      ["/v1/completions", { max_tokens: 3 }],
      ["/v1/chat/completions", { prompt: "x" }],
      ["/v1/completions", [1, 2]],
      ["/v1/nothing", { prompt: "x" }],
    ];
    let checked = 0;
    for (const [path, body] of cases) {
      const text = JSON.stringify(body);
      const [a, b] = await Promise.all([post(ref, path, text), post(ts, path, text)]);
      expect([path, text, b.status]).toEqual([path, text, a.status]);
      expect([path, text, b.body]).toEqual([path, text, a.body]);
      expect(a.status).toBeGreaterThanOrEqual(400);
      checked++;
    }
    // the xtc_probability float rule needs a literal 0 (an int) in the body text
    const xtc = '{"prompt": "x", "xtc_probability": 0}';
    const [a, b] = [await post(ref, "/v1/completions", xtc), await post(ts, "/v1/completions", xtc)];
    expect(b).toEqual(a);
    expect(a.body).toBe('{"error": "xtc_probability must be of type float"}');
    // malformed JSON: same status and prefix (the parser's own words differ: Python's json vs this server's)
    const [ja, jb] = [await post(ref, "/v1/completions", "{nope"), await post(ts, "/v1/completions", "{nope")];
    expect(jb.status).toBe(400);
    expect(ja.status).toBe(400);
    for (const r of [ja, jb]) expect(JSON.parse(r.body).error).toMatch(/^Invalid JSON in request body: /);
    expect(checked).toBe(cases.length);
    ran++;
  }, CASE);

  it("20 random requests with mutated fields (types and bounds of mlx_lm.server's validation): same status and body", async () => {
    // Literals as Python reads them: "0.0" is a float, "0" an int, "true" also an int to Python.
    const LITERALS = ["0", "1", "-1", "12", "5000", "0.0", "2.5", "1e-3", "1.0", "true", "false", "null", '"x"', "[]", "{}", '["a"]'];
    const FIELDS = ["stream", "max_tokens", "temperature", "top_p", "top_k", "min_p", "logprobs", "top_logprobs", "xtc_probability", "xtc_threshold", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "num_draft_tokens", "logit_bias", "max_completion_tokens"];
    // this server's own 400s where mlx_lm.server answers (or fails later): documented in the README
    const OWN = /is not supported by this server yet|must be a finite number|^seed must be a non-negative integer|^max_tokens is \d+, more than this server's limit|^`top_k` has to be an integer/;
    let seed = 2024;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
    const pick = <T>(xs: readonly T[]) => xs[Math.floor(rand() * xs.length)]!;
    const tally = { sameError: 0, sameBody: 0, sameStatus: 0, own: 0 };
    for (let i = 0; i < 20; i++) {
      const fields = new Map<string, string>([["prompt", JSON.stringify(`case ${i}: the mutated request`)], ["max_tokens", "2"]]);
      for (let k = 0; k < 1 + Math.floor(rand() * 3); k++) fields.set(pick(FIELDS), pick(LITERALS));
      if (fields.get("max_tokens") === "5000" || fields.get("max_completion_tokens") === "5000") fields.set("max_tokens", "3"), fields.delete("max_completion_tokens");
      const text = `{${[...fields].map(([k, v]) => `"${k}": ${v}`).join(", ")}}`;
      const [a, b] = await Promise.all([post(ref, "/v1/completions", text).catch((e: Error) => ({ status: 0, body: String(e) })), post(ts, "/v1/completions", text)]);
      if (a.status >= 400) {
        expect([text, b]).toEqual([text, a]);
        tally.sameError++;
      } else if (b.status === 400) {
        // mlx_lm.server served it (or dropped the connection later: status 0, or 200 with no body)
        expect([text, JSON.parse(b.body).error]).toEqual([text, expect.stringMatching(OWN)]);
        tally.own++;
      } else {
        expect([text, b.status]).toEqual([text, a.status]);
        const temp = fields.get("temperature");
        const greedy = temp === undefined || ["0", "0.0", "false"].includes(temp);
        if (greedy || fields.has("seed")) {
          const norm = (x: string) => (fields.get("stream") === "true" ? events(x).map(blank) : [blank(x)]);
          expect([text, norm(b.body)]).toEqual([text, norm(a.body)]);
          tally.sameBody++;
        } else tally.sameStatus++; // unseeded sampling: tokens differ by design
      }
    }
    expect(tally.sameError + tally.own + tally.sameBody + tally.sameStatus).toBe(20);
    expect(tally.sameError).toBeGreaterThan(8);
    expect(tally.sameBody).toBeGreaterThan(2);
    console.log(`mutated requests: ${JSON.stringify(tally)}`);
    ran++;
  }, 3 * CASE);

  it("chat with tools (greedy, logprobs; streaming and not): the tools reach the prompt, bodies equal", async () => {
    const tools = [
      { type: "function", function: { name: "get_weather", description: "The weather of a city", parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } } } } },
      { type: "function", function: { name: "search", description: "Searches the web", parameters: { type: "object", properties: { q: { type: "string" } } } } },
    ];
    const messages = [{ role: "system", content: "Use the tools." }, { role: "user", content: "What is the weather in Paris?" }];
    const plainChat = (await same("/v1/chat/completions", { messages, max_tokens: 4 })) as Body;
    const withTools = (await same("/v1/chat/completions", { messages, tools, max_tokens: 6, logprobs: true })) as Body;
    // the declarations are in the prompt, on both sides (the token counts are compared equal above)
    expect(withTools.usage.prompt_tokens).toBeGreaterThan(plainChat.usage.prompt_tokens + 20);
    expect(withTools.choices[0]!.logprobs!.content).toHaveLength(6);
    await same("/v1/chat/completions", { messages, tools, max_tokens: 5, stream: true });
    // a turn after a tool call: the assistant's call (arguments as a JSON string, parsed by both) and the tool's result
    const history = [
      ...messages,
      { role: "assistant", content: null, tool_calls: [{ id: "call-1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris", "days": 2}' } }] },
      { role: "tool", tool_call_id: "call-1", content: "Sunny, 24 C" },
      { role: "user", content: "And tomorrow?" },
    ];
    const after = (await same("/v1/chat/completions", { messages: history, tools, max_tokens: 5, logprobs: true })) as Body;
    expect(after.usage.prompt_tokens).toBeGreaterThan(withTools.usage.prompt_tokens + 15);
    // an empty tools list is no tools (body.get("tools") or None)
    const empty = (await same("/v1/chat/completions", { messages, tools: [], max_tokens: 4 })) as Body;
    expect(empty.usage.prompt_tokens).toBe(plainChat.usage.prompt_tokens);
    ran++;
  }, 3 * CASE);

  it("GET /health and /v1/models (the served model's entry)", async () => {
    const [ha, hb] = await Promise.all([ref, ts].map((s) => fetch(`${s.url}/health`).then(async (r) => [r.status, await r.text()])));
    expect(hb).toEqual(ha);
    const [ma, mb] = await Promise.all([ref, ts].map((s) => fetch(`${s.url}/v1/models`).then(async (r) => ({ status: r.status, body: await r.text() }))));
    expect(mb!.status).toBe(ma!.status);
    const list = JSON.parse(mb!.body) as { object: string; data: { id: string; object: string; created: number }[] };
    expect(list.object).toBe("list");
    expect(list.data.map((m) => ({ id: m.id, object: m.object }))).toEqual([{ id: DIR, object: "model" }]);
    if (ma!.body === "") {
      // mlx_lm.server lists the Hugging Face cache first (scan_cache_dir), which raises where there
      // is none (as on a machine that never downloaded a model): it has sent "200" and its headers
      // already, and the body stays empty. Its entry for the served model is then not comparable.
      expect(ref.log()).toContain("scan_cache_dir");
    } else {
      const ref_ = JSON.parse(ma!.body) as typeof list;
      expect(ref_.object).toBe("list");
      // mlx_lm.server appends the served model after the cached repositories; this server lists only the served one
      expect(ref_.data.filter((m) => m.id === DIR).map((m) => ({ id: m.id, object: m.object }))).toEqual([{ id: DIR, object: "model" }]);
    }
    ran++;
  }, CASE);

  it("ran every case", () => {
    expect(ran).toBe(11);
  });
});
