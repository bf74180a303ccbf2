// Server mode of the conformance check (issue 24), end to end. Compared here:
//  - mlx_lm.server 0.32.2, started by this file on 127.0.0.1 with the tokenizer fixture (a tiny
//    bfloat16 model over a real 262,144-piece tokenizer: the server needs one), against mlx-lm's
//    own generate_step on the same prompt ids (the oracle's `generate`): every greedy token equal,
//    every chosen-token logprob and every returned top-5 logprob equal. Equality is exact: the
//    server prints each bfloat16 logprob's Python float with json (repr, the shortest text that
//    round-trips the double), the test parses it to the same double, and the oracle's bfloat16
//    value widened to a double is compared with ===. Both of the server's paths: the default
//    batched one (BatchGenerator, with the server's prompt cache on as by default: the cached
//    token count of the answer is printed; also three requests sent at once) and the one a
//    `seed` forces (stream_generate, one request at a time). mlx_lm.server tokenizes
//    `prompt` as a string and refuses an id array, so it is driven by text, checked to tokenize
//    to the ids (its usage.prompt_tokens is checked too).
//  - planted defects, caught: a fake server (Bun.serve on 127.0.0.1) that answers with the
//    oracle's own generation is first shown exact (content and legacy layouts), then with one
//    top-k logprob moved by one float32 step, then with one token swapped;
//  - the errors of the face (exit 2, one line): an unreachable server, a non-2xx answer, a
//    malformed body, an answer whose usage.prompt_tokens says another prompt was read.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:net";
import { join } from "node:path";
import { type OracleClient, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { type OracleGeneration, compareWithOracle, klOverSet, queryServer } from "../../oracle/conform/server_mode.ts";
import { reader } from "../../oracle/tensor_diff.ts";
import { conformServer, exitCodeOf, runServerCheck } from "../../parity/conform_server.ts";
import { limit } from "../../tests/time_limit.ts";

const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
// mlx_lm.server's own main, unmodified, after the oracle's device switch (MLX_DEVICE), so that the
// server computes on the device the oracle does
const LAUNCH = "import sys; sys.path.insert(0, 'oracle/python'); import device_env; from mlx_lm.server import main; sys.argv[0] = 'mlx_lm.server'; main()";
const START = limit(60_000);
const CASE = limit(30_000);
// longer than the fixture's sliding window (8), so the rotating cache wraps during prefill
const PROMPT_A = "The quick brown fox jumps over the lazy dog, then rests by the river bank.";
const PROMPT_B = "def f(x):\n    return x ** 2  # squares";
const STEPS = 8;
const TOP = 5;

let oracle: OracleClient;
let server: ChildProcess | undefined;
let serverLog = "";
let serverUrl = "";

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

async function waitForHealth(url: string, proc: ChildProcess, ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`mlx_lm.server exited (${proc.exitCode ?? proc.signalCode}) before answering /health:\n${serverLog.slice(-2000)}`);
    const ok = await fetch(`${url}/health`, { signal: AbortSignal.timeout(1000) }).then((r) => r.ok, () => false);
    if (ok) return;
    await Bun.sleep(100);
  }
  throw new Error(`mlx_lm.server did not answer /health within ${ms / 1000} s:\n${serverLog.slice(-2000)}`);
}

async function stopServer(): Promise<void> {
  const p = server;
  server = undefined;
  if (!p || p.exitCode !== null || p.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => p.once("exit", () => resolve()));
  p.kill("SIGTERM");
  const done = await Promise.race([exited.then(() => true), Bun.sleep(5000).then(() => false)]);
  if (!done) {
    p.kill("SIGKILL");
    await Promise.race([exited, Bun.sleep(5000)]);
  }
}

beforeAll(async () => {
  oracle = await sharedOracle();
  await oracle.request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, START);
  const port = await freePort();
  serverUrl = `http://127.0.0.1:${port}`;
  server = spawn(PYTHON, ["-c", LAUNCH, "--model", DIR, "--host", "127.0.0.1", "--port", String(port)], {
    cwd: REPO_ROOT,
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, PYTHONUNBUFFERED: "1" },
  });
  const keep = (b: Buffer) => void (serverLog = (serverLog + b.toString()).slice(-20_000));
  server.stdout?.on("data", keep);
  server.stderr?.on("data", keep);
  process.once("exit", () => server?.kill("SIGKILL"));
  const proc = server;
  // mlx_lm.server answers /health before its generation thread has loaded the model: one
  // throw-away request loads it, while the oracle loads its copy
  await Promise.all([
    waitForHealth(serverUrl, proc, START).then(() => queryServer({ url: serverUrl, prompt: { ids: [2], text: "" }, promptAs: "text", maxTokens: 1, topLogprobs: 0, dialect: "content", timeoutMs: START })),
    oracle.generate(DIR, [2], { maxTokens: 1 }),
  ]);
}, 2 * START);

afterAll(async () => {
  await stopServer();
}, 15_000);

/** Every logprob the server returned equals the oracle's value at that id (counted). */
function assertBitEqual(c: Awaited<ReturnType<typeof runServerCheck>>, reference: OracleGeneration): number {
  let checked = 0;
  c.server.tokens.forEach((t, s) => {
    const row = reference.logprobs[s]!;
    expect(row.dtype).toBe("bfloat16");
    const at = reader(row).num;
    expect(t).toBe(reference.tokens[s]!);
    expect(c.server.tokenLogprobs[s]).toBe(at(t));
    checked++;
    for (const e of c.server.top[s]!) {
      expect(e.logprob).toBe(at(e.id));
      checked++;
    }
  });
  return checked;
}

describe("mlx_lm.server = mlx-lm's own generation, bit for bit", () => {
  it("batched path (the default): tokens, chosen logprobs and top-5 logprobs equal", async () => {
    const c = await runServerCheck(oracle, { server: serverUrl, checkpoint: DIR, prompt: PROMPT_A, maxTokens: STEPS, topLogprobs: TOP, promptAs: "auto", dialect: "content" });
    expect(c.server.drivenBy).toBe("text");
    expect(c.server.idsRefused).toMatch(/^HTTP 404: .*text input must be of type `str`/);
    expect(c.prompt.length).toBeGreaterThan(8);
    expect(c.server.promptTokens).toBe(c.prompt.length);
    expect(c.steps).toHaveLength(STEPS);
    expect(c.server.top.every((t) => t.length === TOP)).toBe(true);
    expect(c.verdict).toBe("EXACT");
    expect(c.topOutsideOracleTopK).toBe(0);
    expect(exitCodeOf(c, 0)).toBe(0);
    // the same equality, checked here against a second oracle run rather than through compareWithOracle
    const reference = await oracle.generate(DIR, c.prompt, { maxTokens: STEPS });
    expect(assertBitEqual(c, reference)).toBe(STEPS * (1 + TOP));
    console.log(`mlx_lm.server batched: ${c.prompt.length} prompt tokens (${c.server.cachedTokens} from its prompt cache on the first request), ${STEPS} tokens, ${c.topEntries} top-k logprobs: ${c.verdict}`);
  }, CASE);

  it("non-batched path (a seed sends the request through stream_generate): equal too", async () => {
    const c = await runServerCheck(oracle, { server: serverUrl, checkpoint: DIR, prompt: PROMPT_B, maxTokens: STEPS, topLogprobs: TOP, promptAs: "text", dialect: "content", extraBody: { seed: 7 } });
    expect(c.server.drivenBy).toBe("text");
    expect(c.server.promptTokens).toBe(c.prompt.length);
    expect(c.steps).toHaveLength(STEPS);
    expect(c.verdict).toBe("EXACT");
    const reference = await oracle.generate(DIR, c.prompt, { maxTokens: STEPS });
    expect(assertBitEqual(c, reference)).toBe(STEPS * (1 + TOP));
  }, CASE);

  it("three requests at once (joining one running batch): each equal to its own generate_step", async () => {
    const prompts = ["Hello", "a b c d e f g h i j k l m n o p", "日本語のテキストです。日本語のテキストです。"];
    const runs = await Promise.all(prompts.map((prompt) => runServerCheck(oracle, { server: serverUrl, checkpoint: DIR, prompt, maxTokens: STEPS, topLogprobs: TOP, promptAs: "text", dialect: "content" })));
    let checked = 0;
    for (const c of runs) {
      expect(c.server.promptTokens).toBe(c.prompt.length);
      expect(c.verdict).toBe("EXACT");
      checked += assertBitEqual(c, await oracle.generate(DIR, c.prompt, { maxTokens: STEPS }));
    }
    expect(checked).toBe(prompts.length * STEPS * (1 + TOP));
  }, CASE);
});

// ------------------------------------------------------------------ a fake server

type Defect = { kind: "logprob"; step: number; rank: number } | { kind: "token"; step: number } | { kind: "outsider"; step: number } | { kind: "status" } | { kind: "body" } | { kind: "no-choices" } | { kind: "prompt-tokens" } | null;

interface Fake {
  url: string;
  stop(): void;
  defect: Defect;
  planted: number;
}

/** One float32 step away from x (the smallest change a float32 engine could show). */
function nudge(x: number): number {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer);
  u[0] = u[0]! + 1;
  return f[0]!;
}

/** An OpenAI-compatible server answering with the oracle's generation of `ids`, with one planted defect. */
function fakeServer(ids: number[], gen: OracleGeneration): Fake {
  const rows = gen.logprobs.map((r) => {
    const num = reader(r).num;
    return Array.from({ length: r.shape[r.shape.length - 1]! }, (_, i) => num(i));
  });
  // each step's 11 best (mlx_lm.server's largest top_logprobs), highest first, the lower id on a tie
  const best = rows.map((row) => row.map((lp, id) => ({ id, lp })).sort((a, b) => b.lp - a.lp || a.id - b.id).slice(0, 11));
  const topOf = (s: number, k: number) => best[s]!.slice(0, k).map((e) => ({ ...e }));
  const fake: Fake = { url: "", stop: () => {}, defect: null, planted: 0 };
  const srv = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      const body = (await req.json()) as { prompt: unknown; max_tokens: number; logprobs: unknown; top_logprobs?: number };
      const d = fake.defect;
      if (d?.kind === "status") return new Response(JSON.stringify({ error: "overloaded" }), { status: 503 });
      if (d?.kind === "body") return new Response("<html>not json</html>", { status: 200 });
      if (d?.kind === "no-choices") return Response.json({ object: "text_completion", choices: [] });
      expect(body.prompt).toEqual(ids);
      const n = Math.min(body.max_tokens, gen.tokens.length);
      const tokens = gen.tokens.slice(0, n);
      if (d?.kind === "token") {
        tokens[d.step] = topOf(d.step, 2)[1]!.id; // the runner-up instead of the greedy token
        fake.planted++;
      }
      const k = typeof body.logprobs === "number" ? body.logprobs : (body.top_logprobs ?? 0);
      const tops = tokens.map((_, s) => topOf(s, k));
      if (d?.kind === "outsider" && k > 0) {
        // the last top-k entry replaced by the step's least likely id, with its true logprob
        const row = rows[d.step]!;
        const worst = row.reduce((w, lp, id) => (lp < row[w]! ? id : w), 0);
        tops[d.step]![k - 1] = { id: worst, lp: row[worst]! };
        fake.planted++;
      }
      if (d?.kind === "logprob" && k > 0) {
        tops[d.step]![d.rank]!.lp = nudge(tops[d.step]![d.rank]!.lp);
        fake.planted++;
      }
      const usage = { prompt_tokens: d?.kind === "prompt-tokens" ? ids.length + 1 : ids.length, completion_tokens: n, total_tokens: ids.length + n };
      const logprobs =
        typeof body.logprobs === "number"
          ? {
              tokens: tokens.map((t) => `token_id:${t}`),
              token_logprobs: tokens.map((t, s) => rows[s]![t]!),
              top_logprobs: tops.map((ts) => Object.fromEntries(ts.map((e) => [`token_id:${e.id}`, e.lp]))),
            }
          : { content: tokens.map((t, s) => (k > 0 ? { id: t, logprob: rows[s]![t]!, top_logprobs: tops[s]!.map((e) => ({ id: e.id, logprob: e.lp })) } : { id: t, logprob: rows[s]![t]! })) };
      return Response.json({ object: "text_completion", choices: [{ index: 0, finish_reason: "length", text: "", logprobs }], usage });
    },
  });
  fake.url = `http://127.0.0.1:${srv.port}`;
  fake.stop = () => void srv.stop(true);
  return fake;
}

describe("planted defects and errors (a fake server answering with the oracle's generation)", () => {
  const IDS = [2, 818, 3823, 8864, 37423, 1024, 7, 99, 5000, 12];
  let fake: Fake;
  let gen: OracleGeneration;
  beforeAll(async () => {
    gen = await oracle.generate(DIR, IDS, { maxTokens: 6 });
    fake = fakeServer(IDS, gen);
  }, CASE);
  afterAll(() => fake?.stop());

  const query = (dialect: "content" | "legacy") =>
    queryServer({ url: fake.url, prompt: { ids: IDS }, promptAs: "ids", maxTokens: 6, topLogprobs: TOP, dialect });

  it("the honest fake is exact, in both layouts (so the defects below are what is caught)", async () => {
    fake.defect = null;
    for (const dialect of ["content", "legacy"] as const) {
      const s = await query(dialect);
      expect(s.drivenBy).toBe("ids");
      expect(s.requests).toBe(dialect === "content" ? 2 : 1);
      const c = compareWithOracle(IDS, s, gen);
      expect(c.steps).toHaveLength(6);
      expect(c.topEntries).toBe(6 * TOP);
      expect(c.verdict).toBe("EXACT");
      expect(c.klMax).toBe(0);
      expect(c.topOutsideOracleTopK).toBe(0);
    }
  }, CASE);

  it("one top-k logprob moved by one float32 step is caught at its step", async () => {
    fake.defect = { kind: "logprob", step: 3, rank: 2 };
    fake.planted = 0;
    const c = compareWithOracle(IDS, await query("content"), gen);
    expect(fake.planted).toBe(1);
    expect(c.tokensEqual).toBe(true);
    expect(c.exact).toBe(false);
    expect(c.steps.map((s) => s.exact)).toEqual([true, true, true, false, true, true]);
    const orig = topValue(gen, 3, 2);
    expect(c.topMaxAbsDiff).toBe(Math.abs(nudge(orig) - orig));
    expect(c.topMaxAbsDiff).toBeGreaterThan(0);
    expect(c.steps[3]!.topKl).toBeGreaterThan(0);
    expect(c.verdict).toMatch(/^TOKENS MATCH, max \|Δ logprob\| = /);
    expect(exitCodeOf(c, 0)).toBe(1);
    expect(exitCodeOf(c, 1e-3)).toBe(0); // a bound the user gives explicitly
  }, CASE);

  it("a top-k entry outside the oracle's top-k (its logprob true) is caught at its step", async () => {
    fake.defect = { kind: "outsider", step: 4 };
    fake.planted = 0;
    const c = compareWithOracle(IDS, await query("content"), gen);
    expect(fake.planted).toBe(1);
    expect(c.topMaxAbsDiff).toBe(0); // every value true: only the set is wrong
    expect(c.topOutsideOracleTopK).toBe(1);
    expect(c.steps.map((s) => s.exact)).toEqual([true, true, true, true, false, true]);
    expect(c.exact).toBe(false);
    expect(c.verdict).toMatch(/^TOP-K DIFFERS from step 4 /);
    expect(c.topOutsideMargin).toBeGreaterThan(0);
    expect(exitCodeOf(c, 0)).toBe(1);
    expect(exitCodeOf(c, c.topOutsideMargin)).toBe(0); // a bound the user gives explicitly
  }, CASE);

  it("KL over the returned top-k: its definition on fixed numbers", () => {
    // P = (1/2, 1/2), Q = (1/4, 3/4): KL = ½ ln 2 + ½ ln(2/3); both renormalized over the set, so shifts do not matter
    const want = 0.5 * Math.log(2) + 0.5 * Math.log(2 / 3);
    expect(klOverSet([Math.log(0.5), Math.log(0.5)], [Math.log(0.25), Math.log(0.75)])).toBeCloseTo(want, 15);
    expect(klOverSet([-3, -3], [Math.log(0.25) - 7, Math.log(0.75) - 7])).toBeCloseTo(want, 14);
    expect(klOverSet([-1.5, -2, -9], [-1.5, -2, -9])).toBe(0);
  });

  it("one token swapped is caught at its step", async () => {
    fake.defect = { kind: "token", step: 2 };
    fake.planted = 0;
    for (const dialect of ["content", "legacy"] as const) {
      const c = compareWithOracle(IDS, await query(dialect), gen);
      expect(c.firstDifferingStep).toBe(2);
      expect(c.steps).toHaveLength(3); // later steps follow another prefix: not compared
      expect(c.tokensEqual).toBe(false);
      expect(c.verdict).toMatch(/^DIVERGES at step 2 /);
      expect(exitCodeOf(c, Infinity)).toBe(1);
    }
    expect(fake.planted).toBe(3); // content: two requests, legacy: one
  }, CASE);

  it("errors: one line and exit 2 (unreachable, non-2xx, malformed body, another prompt read)", async () => {
    const closed = `http://127.0.0.1:${await freePort()}`;
    const argv = (url: string) => ["--server", url, "--checkpoint", DIR, "--tokens", IDS.join(","), "--prompt-as", "ids", "--max-tokens", "6"];
    const cases: [string, Defect, RegExp][] = [
      [closed, null, /^error: server http:\/\/127\.0\.0\.1:\d+\/v1\/completions unreachable: /],
      [fake.url, { kind: "status" }, /^error: server .* answered HTTP 503: \{"error": ?"overloaded"\}/],
      [fake.url, { kind: "body" }, /^error: server .*: malformed body \(not JSON\)/],
      [fake.url, { kind: "no-choices" }, /^error: server .*: malformed body: choices must be a non-empty array of objects/],
      [fake.url, { kind: "prompt-tokens" }, /^error: server .*: usage\.prompt_tokens is 11 for a prompt of 10 tokens/],
    ];
    let ran = 0;
    for (const [url, defect, want] of cases) {
      fake.defect = defect;
      const err: string[] = [];
      const code = await conformServer(argv(url), { oracle, out: () => {}, err: (s) => void err.push(s) });
      expect(code).toBe(2);
      expect(err).toHaveLength(1);
      expect(err[0]).toMatch(want);
      expect(err[0]!.trimEnd().includes("\n")).toBe(false);
      ran++;
    }
    expect(ran).toBe(cases.length);
    // and the face's exit 0 on the honest fake, with its table
    fake.defect = null;
    const out: string[] = [];
    expect(await conformServer(argv(fake.url), { oracle, out: (s) => void out.push(s), err: () => {} })).toBe(0);
    expect(out.join("")).toContain("verdict: EXACT");
  }, CASE);
});

function topValue(gen: OracleGeneration, step: number, rank: number): number {
  const r = gen.logprobs[step]!;
  const num = reader(r).num;
  const row = Array.from({ length: r.shape[r.shape.length - 1]! }, (_, i) => ({ id: i, lp: num(i) }));
  return row.sort((a, b) => b.lp - a.lp || a.id - b.id)[rank]!.lp;
}
