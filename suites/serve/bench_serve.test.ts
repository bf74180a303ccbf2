// bench/serve.ts's measuring parts, without a model (well under a second): its flag checks
// (bad usage is refused before any server starts), and its client against a stand-in SSE server
// on loopback that streams a known number of completion chunks with known delays and a usage
// chunk, as mlx_lm.server and `npm run serve` stream them. Compared: the time to first token is
// at least the stand-in's delay before its first choice and below its total time; the
// completion tokens are the usage's; the text is the chunks' concatenation; a level of N streams
// x R rounds sends N*R requests, each with its own prompt, and sums their tokens.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { benchServePlan, cpuSeconds, promptFor, runLevel, streamCompletion } from "../../bench/serve.ts";

const FIRST_MS = 60;
const CHUNKS = 5;
let server: ReturnType<typeof Bun.serve>;
const prompts: string[] = [];

beforeAll(() => {
  server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const body = (await req.json()) as { prompt: string; max_tokens: number };
      prompts.push(body.prompt);
      const enc = new TextEncoder();
      const stream = new ReadableStream({
        async start(c) {
          // an SSE comment first, as mlx_lm.server sends keep-alives: not a token
          c.enqueue(enc.encode(": keep-alive\n\n"));
          await Bun.sleep(FIRST_MS);
          for (let i = 0; i < CHUNKS; i++) {
            c.enqueue(enc.encode(`data: ${JSON.stringify({ choices: [{ index: 0, text: `t${i} ` }] })}\n\n`));
            await Bun.sleep(5);
          }
          c.enqueue(enc.encode(`data: ${JSON.stringify({ choices: [], usage: { completion_tokens: CHUNKS } })}\n\ndata: [DONE]\n\n`));
          c.close();
        },
      });
      return new Response(stream, { headers: { "Content-Type": "text/event-stream" } });
    },
  });
});

afterAll(() => void server.stop(true));

describe("bench/serve.ts", () => {
  it("refuses bad flags with a usage error, accepts the defaults", () => {
    expect(benchServePlan([])).toMatchObject({ workload: "tiny", streams: [1, 4, 16], rounds: 3, pairs: 2 });
    expect(benchServePlan(["--help"])).toBeNull();
    for (const bad of [["--workload", "big"], ["--streams", "0"], ["--streams", "1,x"], ["--rounds", "0"], ["--e2b-dtype", "float16"]]) {
      expect(() => benchServePlan(bad), bad.join(" ")).toThrow();
    }
  });

  it("one stream: TTFT after the first choice, tokens from usage, the text", async () => {
    const t0 = performance.now();
    const r = await streamCompletion(`http://127.0.0.1:${server.port}`, "p", 8);
    const total = performance.now() - t0;
    expect(r.ttftMs).toBeGreaterThanOrEqual(FIRST_MS - 1);
    expect(r.ttftMs).toBeLessThan(total);
    expect(r.completionTokens).toBe(CHUNKS);
    expect(r.text).toBe("t0 t1 t2 t3 t4 ");
  });

  it("a level of 3 streams x 2 rounds: 6 distinct prompts, tokens summed", async () => {
    prompts.length = 0;
    const r = await runLevel(`http://127.0.0.1:${server.port}`, 3, 2, "x", { maxTokens: 8, promptWords: 4 }, process.pid);
    expect(prompts).toHaveLength(6);
    expect(new Set(prompts).size).toBe(6);
    expect(prompts).toContain(promptFor("x-c2-r1", 4));
    expect(r.tokens).toBe(6 * CHUNKS);
    expect(r.ttftP95).toBeGreaterThanOrEqual(r.ttftP50);
    expect(r.ttftP50).toBeGreaterThanOrEqual(FIRST_MS - 1);
    expect(r.texts).toHaveLength(6);
    expect(Number.isFinite(cpuSeconds(process.pid))).toBe(true);
  });
});
