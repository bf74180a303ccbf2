// The safety defaults of `npm run serve` (serve/), on the TS server alone (one process for the
// file, started with an API key and small limits on the tokenizer fixture; no --host):
//  - it binds to loopback: 127.0.0.1 answers, this machine's other addresses refuse;
//  - no CORS header by default;
//  - the bearer key: no header or a wrong key → 401 with {"error": ...} and WWW-Authenticate;
//    the right key → 200; /health stays open (for health checks);
//  - only the model named at start: another `model` (a name, a path on disk) → 404, nothing loaded;
//  - limits: a body over --max-body-bytes → 413, max_tokens over --max-tokens-limit → 400, a
//    prompt over --max-prompt-tokens → 400, a body without Content-Length → 411;
//  - malformed JSON → 400 "Invalid JSON in request body: ...", a non-object body → 400;
//  - requests sent at once are batched together; on these short prompts each answer equals its answer alone;
//  - a client that disconnects mid-stream (and one that gives up on a non-streaming request)
//    stops its generation: the server logs it cancelled well before its max_tokens, and the
//    next request is served;
//  - the command's own errors: exit 2 and one line.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { networkInterfaces } from "node:os";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";
import { corsHeaders } from "../../serve/server.ts";
import { freePort, type ServerProcess, startServerProcess } from "./processes.ts";

const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const START = limit(60_000);
const CASE = limit(20_000);
const KEY = "test-key-0123456789";
const AUTH = { Authorization: `Bearer ${KEY}` };

let server: ServerProcess;
let port = 0;

beforeAll(async () => {
  const oracle = await sharedOracle();
  await oracle.request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, START);
  port = await freePort();
  server = await startServerProcess("npm run serve", process.execPath, ["run", "serve/cli.ts", "--model", DIR, "--port", String(port), "--api-key", KEY, "--max-body-bytes", "4096", "--max-prompt-tokens", "64", "--max-tokens-limit", "4096", "--prompt-cache-size", "0"], port, START);
}, 2 * START);

afterAll(async () => {
  await server?.stop();
}, 15_000);

async function call(path: string, init: RequestInit & { json?: unknown } = {}): Promise<{ status: number; body: string; headers: Headers }> {
  const { json, ...rest } = init;
  const r = await fetch(`${server.url}${path}`, {
    method: json !== undefined || rest.body !== undefined ? "POST" : "GET",
    ...rest,
    ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
    headers: { ...AUTH, ...(rest.headers as Record<string, string> | undefined) },
    signal: rest.signal ?? AbortSignal.timeout(CASE),
  });
  return { status: r.status, body: await r.text(), headers: r.headers };
}

const errorOf = (body: string) => (JSON.parse(body) as { error: string }).error;

describe("npm run serve: safe by default", () => {
  it("binds to loopback unless --host is given", async () => {
    expect(server.log()).toMatch(new RegExp(`serving .* at http://127\\.0\\.0\\.1:${port} `));
    expect((await call("/health")).status).toBe(200);
    const others = Object.values(networkInterfaces()).flat().filter((a) => a && !a.internal && a.family === "IPv4").map((a) => a!.address);
    let refused = 0;
    for (const addr of others) {
      const ok = await fetch(`http://${addr}:${port}/health`, { signal: AbortSignal.timeout(3000) }).then(() => true, () => false);
      expect([addr, ok]).toEqual([addr, false]);
      refused++;
    }
    expect(refused).toBe(others.length); // 0 on a machine with loopback only: the printed address is the check then
  }, CASE);

  it("the bearer key: 401 without it or with a wrong one, 200 with it; /health open", async () => {
    const prompt = { prompt: "hello", max_tokens: 1 };
    for (const headers of [{ Authorization: "" }, { Authorization: "Bearer wrong-key-0123456789" }, { Authorization: KEY }]) {
      const r = await call("/v1/completions", { json: prompt, headers });
      expect(r.status).toBe(401);
      expect(r.headers.get("www-authenticate")).toBe("Bearer");
      expect(errorOf(r.body)).toMatch(/API key is required.*Authorization: Bearer/);
    }
    for (const path of ["/v1/models", "/v1/chat/completions"]) expect((await call(path, { headers: { Authorization: "" }, ...(path.includes("chat") ? { json: { messages: [] } } : {}) })).status).toBe(401);
    expect((await call("/health", { headers: { Authorization: "" } })).status).toBe(200);
    const ok = await call("/v1/completions", { json: prompt });
    expect(ok.status).toBe(200);
    expect(JSON.parse(ok.body).usage.completion_tokens).toBe(1);
  }, CASE);

  it("no CORS header unless --allowed-origins is given (mlx_lm.server answers '*')", async () => {
    const origin = { Origin: "http://evil.example" };
    const pre = await fetch(`${server.url}/v1/completions`, { method: "OPTIONS", headers: origin });
    expect(pre.status).toBe(204);
    const got = await call("/v1/completions", { json: { prompt: "hi", max_tokens: 1 }, headers: origin });
    expect(got.status).toBe(200);
    for (const h of [pre.headers, got.headers]) expect(h.get("access-control-allow-origin")).toBeNull();
    // with --allowed-origins: mlx_lm.server's rule ("*" for any; a listed origin echoed, with Vary)
    expect(corsHeaders({ allowedOrigins: ["*"] }, "http://a.example")["Access-Control-Allow-Origin"]).toBe("*");
    expect(corsHeaders({ allowedOrigins: ["http://a.example"] }, "http://a.example")).toEqual({ "Access-Control-Allow-Origin": "http://a.example", Vary: "Origin", "Access-Control-Allow-Methods": "*", "Access-Control-Allow-Headers": "*" });
    expect(corsHeaders({ allowedOrigins: ["http://a.example"] }, "http://evil.example")).toEqual({});
    expect(corsHeaders({ allowedOrigins: [] }, "http://a.example")).toEqual({});
  }, CASE);

  it("only the model named at start: another name or a path on disk → 404, nothing loaded", async () => {
    for (const model of ["gpt-4", "/etc", join(REPO_ROOT, ".cache", "checkpoints")]) {
      const r = await call("/v1/completions", { json: { prompt: "hi", max_tokens: 1, model } });
      expect(r.status).toBe(404);
      expect(errorOf(r.body)).toContain(`model '${model}' is not served here`);
    }
    for (const model of ["default_model", DIR]) expect((await call("/v1/completions", { json: { prompt: "hi", max_tokens: 1, model } })).status).toBe(200);
    // adapters and draft models would be paths too
    expect(errorOf((await call("/v1/completions", { json: { prompt: "hi", adapters: "/tmp" } })).body)).toMatch(/^adapters: a request cannot name adapters here \(this server never loads a path a request names\)/);
    expect(errorOf((await call("/v1/completions", { json: { prompt: "hi", draft_model: "/tmp" } })).body)).toMatch(/^draft_model: a request cannot name a draft model here \(this server never loads a path a request names\)/);
  }, CASE);

  it("limits: body size 413, max_tokens 400, prompt length 400, no Content-Length 411", async () => {
    const big = await call("/v1/completions", { json: { prompt: "a".repeat(5000) } });
    expect(big.status).toBe(413);
    expect(errorOf(big.body)).toMatch(/^the request body \(\d+ bytes\) is larger than this server's limit of 4096 bytes \(--max-body-bytes\)$/);
    const many = await call("/v1/completions", { json: { prompt: "hi", max_tokens: 5000 } });
    expect(many.status).toBe(400);
    expect(errorOf(many.body)).toBe("max_tokens is 5000, more than this server's limit of 4096 (--max-tokens-limit)");
    const long = await call("/v1/completions", { json: { prompt: "word ".repeat(100), max_tokens: 1 } });
    expect(long.status).toBe(400);
    expect(errorOf(long.body)).toMatch(/^the prompt has \d+ tokens, more than this server's limit of 64 \(--max-prompt-tokens\)$/);
    const chunked = await call("/v1/completions", {
      body: new ReadableStream({
        start(c) {
          c.enqueue(new TextEncoder().encode('{"prompt": "hi"}'));
          c.close();
        },
      }),
    });
    expect(chunked.status).toBe(411);
    expect(errorOf(chunked.body)).toBe("Content-Length header is required");
  }, CASE);

  it("malformed bodies: 400 with the error", async () => {
    const cases: [string, RegExp][] = [
      ["{nope", /^Invalid JSON in request body: /],
      ["\"just a string\"", /^Request should be a JSON dictionary$/],
      ['{"prompt": "x", "max_tokens": "many"}', /^max_tokens must be of type int$/],
      ['{"prompt": "x", "stop": 5}', /^stop must be a string or a list of strings$/],
      ['{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}]}]}', /^Only 'text' content type is supported\.$/],
    ];
    let ran = 0;
    for (const [body, want] of cases) {
      const r = await call(body.includes("messages") ? "/v1/chat/completions" : "/v1/completions", { body, headers: { "Content-Type": "application/json" } });
      expect([body, r.status]).toEqual([body, body.includes("image_url") ? 404 : 400]);
      expect(errorOf(r.body)).toMatch(want);
      ran++;
    }
    expect(ran).toBe(cases.length);
  }, CASE);

  it("requests sent at once (batched together now): each answer equals the same request's answer alone on these short prompts", async () => {
    // the server runs with --prompt-cache-size 0 (beforeAll): a repeated prompt would otherwise be served from its cached prefix (cached_tokens > 0)
    const reqs = ["The first prompt", "A second, different prompt", "third"].map((prompt, i) => ({ prompt, max_tokens: 4 + i, logprobs: true, stream: i === 1 }));
    const strip = (body: string) => body.replace(/"id": "cmpl-[0-9a-f-]+"/g, "").replace(/"created": \d+/g, "");
    const alone: string[] = [];
    for (const r of reqs) alone.push(strip((await call("/v1/completions", { json: r })).body));
    const together = await Promise.all(reqs.map((r) => call("/v1/completions", { json: r })));
    expect(together.map((r) => r.status)).toEqual([200, 200, 200]);
    expect(together.map((r) => strip(r.body))).toEqual(alone);
    expect(alone[1]).toMatch(/^data: /);
    expect(alone[0]).toContain('"completion_tokens": 4');
  }, CASE);

  it("a client that disconnects mid-stream stops its generation; the next request is served", async () => {
    const ac = new AbortController();
    const r = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: AUTH, body: JSON.stringify({ prompt: "Tell me a long story.", max_tokens: 4000, stream: true }), signal: ac.signal });
    expect(r.status).toBe(200);
    const reader = r.body!.getReader();
    const first = await reader.read();
    expect(new TextDecoder().decode(first.value)).toMatch(/^data: \{/);
    ac.abort();
    await reader.cancel().catch(() => {});
    const next = await call("/v1/completions", { json: { prompt: "and then?", max_tokens: 2 } });
    expect(next.status).toBe(200);
    expect(JSON.parse(next.body).usage.completion_tokens).toBe(2);
    const find = () => server.log().match(/completion cmpl-[0-9a-f-]+: \d+ prompt tokens, (\d+) generated(?: \([^)]*\))?, cancelled \(client disconnected\)/);
    // logged when the stream's reader stops or the sequence leaves the batch (end of a time budget, <= 0.5 s)
    for (let t = 0; t < 50 && find() === null; t++) await Bun.sleep(100);
    const line = find();
    expect(line).not.toBeNull();
    expect(Number(line![1])).toBeLessThan(4000);
  }, CASE);

  it("the command's errors: one line and exit 2 (no checkpoint, an mlx_lm.server flag not ported, a port in use)", async () => {
    const run = (...args: string[]) =>
      new Promise<{ status: number | null; stderr: string }>((resolve) => {
        const p = spawn(process.execPath, ["run", "serve/cli.ts", ...args], { cwd: REPO_ROOT, stdio: ["ignore", "ignore", "pipe"], timeout: CASE });
        let stderr = "";
        p.stderr.on("data", (b: Buffer) => void (stderr += b.toString()));
        p.on("close", (status) => resolve({ status, stderr }));
      });
    const cases: [string[], RegExp][] = [
      [["--model", join(REPO_ROOT, "no-such-checkpoint")], /^error: checkpoint directory not found: /],
      [["--model", DIR, "--trust-remote-code"], /^error: --trust-remote-code \(an mlx_lm\.server flag\) is not supported by this server yet$/],
      [["--model", DIR, "--port", String(port)], new RegExp(`^error: cannot listen on 127\\.0\\.0\\.1:${port}: port ${port} is in use$`)],
    ];
    let ran = 0;
    const results = await Promise.all(cases.map(([args]) => run(...args)));
    for (const [i, [args, want]] of cases.entries()) {
      const r = results[i]!;
      expect([args, r.status]).toEqual([args, 2]);
      expect(r.stderr.trimEnd()).toMatch(want);
      expect(r.stderr.trimEnd().includes("\n")).toBe(false);
      ran++;
    }
    expect(ran).toBe(cases.length);
  }, CASE);

  it("a client that gives up on a non-streaming request stops it too", async () => {
    const before = (server.log().match(/cancelled \(client disconnected\)/g) ?? []).length;
    const ac = new AbortController();
    const pending = fetch(`${server.url}/v1/completions`, { method: "POST", headers: AUTH, body: JSON.stringify({ prompt: "Another long story, please.", max_tokens: 4000 }), signal: ac.signal }).catch((e: Error) => e);
    await Bun.sleep(500);
    ac.abort();
    expect(await pending).toBeInstanceOf(Error);
    const next = await call("/v1/completions", { json: { prompt: "ok?", max_tokens: 1 } });
    expect(next.status).toBe(200);
    // a batched sequence leaves at the end of the time budget in which its disconnect is seen (<= 0.5 s), possibly after `next` is answered
    const cancelledLines = () => server.log().match(/completion cmpl-[0-9a-f-]+: \d+ prompt tokens, (\d+) generated(?: \([^)]*\))?, cancelled \(client disconnected\)/g) ?? [];
    for (let t = 0; t < 50 && cancelledLines().length < before + 1; t++) await Bun.sleep(100);
    expect(cancelledLines().length).toBe(before + 1);
  }, CASE);
});
