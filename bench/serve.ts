// `npm run bench:serve`: `npm run serve` (serve/) against mlx_lm.server 0.32.2 under the same
// load, on the same checkpoint, both started here on loopback with their defaults (mlx_lm.server
// from the project's venv, unmodified; both keep a prompt cache of 10 entries: every prompt here
// is new, so neither gets a hit, both pay the insert).
//
// A level of N concurrent streams: N clients start together, each sends --rounds streaming
// /v1/completions requests one after the other (greedy, max_tokens --max-tokens,
// stream_options.include_usage), each prompt distinct (its level, pair, client and round in its
// first words) and the same for both servers. Measured per level and server:
//  - aggregate decode tok/s: completion tokens of all requests (their usage) / the level's wall
//    time (first request sent to last stream closed);
//  - time to first token (TTFT): request sent to the first SSE event carrying a choice, p50/p95
//    over all requests of the level.
// Both servers are up throughout; one is loaded at a time. Per level: one warm-up run on each
// (excluded), then --pairs pairs alternating the order (TS first, then mlx-lm first, ...).
// Ratios are TS / mlx-lm per pair (tok/s: higher is better; TTFT: lower is better).
// Results: bench/SERVE.md and bench/serve_results.json (rows of one workload replace that
// workload's earlier rows).
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, renameSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { cpus, loadavg, totalmem } from "node:os";
import { join } from "node:path";
import { helpText, parseArgs, UsageError, type FlagSpec } from "../parity/args.ts";
import { REPO_ROOT } from "../oracle/client.ts";

const PY = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
// mlx_lm.server's own main, unmodified, after the oracle's device switch (MLX_DEVICE)
const LAUNCH = "import sys; sys.path.insert(0, 'oracle/python'); import device_env; from mlx_lm.server import main; sys.argv[0] = 'mlx_lm.server'; main()";
const TOKENIZER_SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const TINY_DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");

export const FLAGS: FlagSpec[] = [
  { name: "workload", kind: "string", valueName: "name", help: "tiny (the tokenizer fixture: tiny bfloat16 Gemma 4 over the real 262,144-piece tokenizer), tiny-vocab (the same tiny model over a 1,024-piece byte-fallback BPE tokenizer: bench/serve_tiny_vocab.py) or e2b (full-width E2B-shaped, random 4-bit weights, the same tokenizer)", default: "tiny" },
  { name: "streams", kind: "string", valueName: "list", help: "comma-separated concurrency levels", default: "1,4,16" },
  { name: "rounds", kind: "int", help: "requests each client sends one after the other", default: 3 },
  { name: "pairs", kind: "int", help: "measured pairs per level (after one warm-up run per server)", default: 2 },
  { name: "max-tokens", kind: "int", help: "max_tokens of every request", default: 32 },
  { name: "prompt-words", kind: "int", help: "filler words per prompt (after its distinct head)", default: 24 },
  { name: "e2b-layers", kind: "int", help: "layers of the full-width E2B (35 = the real model)", default: 6 },
  { name: "e2b-dtype", kind: "string", valueName: "dtype", help: "float32 or bfloat16 (libmlx's CPU quantized matmul runs ~10x faster in float32)", default: "float32" },
  { name: "no-write", kind: "bool", help: "print the table only (no bench/SERVE.md, no JSON)" },
  { name: "help", kind: "bool", help: "show this help" },
];

export interface BenchServePlan {
  workload: "tiny" | "tiny-vocab" | "e2b";
  streams: number[];
  rounds: number;
  pairs: number;
  maxTokens: number;
  promptWords: number;
  e2bLayers: number;
  e2bDtype: string;
  write: boolean;
}

/** Every check before work starts; null for --help. */
export function benchServePlan(argv: readonly string[]): BenchServePlan | null {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  const workload = String(a.workload);
  if (workload !== "tiny" && workload !== "tiny-vocab" && workload !== "e2b") throw new UsageError(`--workload must be tiny, tiny-vocab or e2b, not ${workload}`);
  const streams = String(a.streams).split(",").map(Number);
  if (streams.some((n) => !Number.isInteger(n) || n < 1 || n > 64)) throw new UsageError("--streams needs integers in 1..64");
  const ints = ["rounds", "pairs", "max-tokens", "prompt-words", "e2b-layers"].map((k) => Number(a[k]));
  if (ints.some((n) => !Number.isInteger(n) || n < 1)) throw new UsageError("--rounds, --pairs, --max-tokens, --prompt-words and --e2b-layers need positive integers");
  const e2bDtype = String(a["e2b-dtype"]);
  if (e2bDtype !== "float32" && e2bDtype !== "bfloat16") throw new UsageError("--e2b-dtype must be float32 or bfloat16");
  const [rounds, pairs, maxTokens, promptWords, e2bLayers] = ints as [number, number, number, number, number];
  return { workload, streams, rounds, pairs, maxTokens, promptWords, e2bLayers, e2bDtype, write: !a["no-write"] };
}

// ------------------------------------------------------------------ checkpoints

function run(cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { cwd: REPO_ROOT, stdio: ["ignore", "inherit", "inherit"] });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} failed (${r.status ?? r.signal})`);
}

/** The checkpoint directory served, built when missing (in .cache/, never committed). */
function checkpoint(p: BenchServePlan): { dir: string; what: string } {
  run(PY, ["oracle/python/make_checkpoints.py", "--tokenizer-from", TOKENIZER_SOURCE, "--out", TINY_DIR]);
  if (p.workload === "tiny") return { dir: TINY_DIR, what: "tokenizer fixture: tiny Gemma 4 (2 layers, hidden 16, sliding window 8), bfloat16, over the real 262,144-piece tokenizer" };
  if (p.workload === "tiny-vocab") {
    // the same tiny model over a small vocabulary: the output layer no longer dominates a step
    const dir = join(REPO_ROOT, ".cache", "bench", "tiny-vocab");
    run(PY, ["bench/serve_tiny_vocab.py", "--out", dir, "--vocab", "1024", "--template-from", join(TINY_DIR, "tokenizer_config.json")]);
    return { dir, what: "tiny Gemma 4 (2 layers, hidden 16, sliding window 8), bfloat16, seeded weights, over a 1,024-piece byte-fallback BPE tokenizer (Gemma special tokens and turn markers, 256 byte pieces, merges trained on a seeded word corpus; bench/serve_tiny_vocab.py --vocab 1024 --seed 0)" };
  }
  const weights = join(REPO_ROOT, ".cache", "bench", `e2b-${p.e2bLayers}l${p.e2bDtype === "bfloat16" ? "" : `-${p.e2bDtype}`}`);
  if (!existsSync(join(weights, "config.json"))) run(PY, ["oracle/python/make_checkpoints.py", "--shape", "e2b", "--layers", String(p.e2bLayers), "--dtype", p.e2bDtype, "--out", weights]);
  // the servers need a tokenizer: the fixture's (same 262,144-entry vocabulary), weights linked
  const dir = `${weights}-served`;
  mkdirSync(dir, { recursive: true });
  const links: [string, string][] = [
    ...["config.json", "model.safetensors", "model.safetensors.index.json"].map((f): [string, string] => [weights, f]),
    ...["tokenizer.json", "tokenizer_config.json"].map((f): [string, string] => [TINY_DIR, f]),
  ];
  for (const [from, f] of links) if (!existsSync(join(dir, f))) symlinkSync(join(from, f), join(dir, f));
  return { dir, what: `E2B-shaped, full width (hidden 1536, 262,144 vocabulary, per-layer inputs), ${p.e2bLayers} layers, 4-bit g64, ${p.e2bDtype}, random weights (oracle/python/make_checkpoints.py --shape e2b), the fixture's tokenizer` };
}

// ------------------------------------------------------------------ servers

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

interface Server {
  name: string;
  url: string;
  proc: ChildProcess;
  log: () => string;
}

async function start(name: string, cmd: string, args: string[], port: number): Promise<Server> {
  const proc = spawn(cmd, args, { cwd: REPO_ROOT, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, PYTHONUNBUFFERED: "1" } });
  let out = "";
  const keep = (b: Buffer) => void (out = (out + b.toString()).slice(-20_000));
  proc.stdout?.on("data", keep);
  proc.stderr?.on("data", keep);
  // no server outlives the bench, also when it is interrupted
  process.once("exit", () => proc.kill("SIGKILL"));
  for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => process.exit(130));
  const url = `http://127.0.0.1:${port}`;
  const until = Date.now() + 300_000;
  while (Date.now() < until) {
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`${name} exited before answering /health:\n${out.slice(-3000)}`);
    if (await fetch(`${url}/health`, { signal: AbortSignal.timeout(1000) }).then((r) => r.ok, () => false)) return { name, url, proc, log: () => out };
    await Bun.sleep(200);
  }
  proc.kill("SIGKILL");
  throw new Error(`${name} did not answer /health in 300 s:\n${out.slice(-3000)}`);
}

async function stop(s: Server): Promise<void> {
  if (s.proc.exitCode !== null || s.proc.signalCode !== null) return;
  const exited = new Promise<void>((r) => s.proc.once("exit", () => r()));
  s.proc.kill("SIGTERM");
  if (!(await Promise.race([exited.then(() => true), Bun.sleep(5000).then(() => false)]))) s.proc.kill("SIGKILL");
}

// ------------------------------------------------------------------ load

export interface StreamResult {
  ttftMs: number;
  completionTokens: number;
  text: string;
}

/** One streaming completion: time to the first event with a choice, the usage's completion tokens and the text. */
export async function streamCompletion(url: string, prompt: string, maxTokens: number): Promise<StreamResult> {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (r.status !== 200 || !r.body) throw new Error(`${url}: status ${r.status}: ${await r.text()}`);
  let ttftMs = -1;
  let completionTokens = -1;
  let text = "";
  let buf = "";
  const dec = new TextDecoder();
  for await (const part of r.body) {
    buf += dec.decode(part as Uint8Array, { stream: true });
    let i: number;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of ev.split("\n")) {
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const j = JSON.parse(line.slice(6)) as { choices?: { text?: string }[]; usage?: { completion_tokens: number } };
        if (j.choices && j.choices.length > 0) {
          if (ttftMs < 0) ttftMs = performance.now() - t0;
          text += j.choices[0]!.text ?? "";
        }
        if (j.usage) completionTokens = j.usage.completion_tokens;
      }
    }
  }
  if (ttftMs < 0 || completionTokens < 0) throw new Error(`${url}: a stream without a choice or usage`);
  return { ttftMs, completionTokens, text };
}

const FILLER = "the river runs past the mill and under the old stone bridge toward the sea".split(" ");

export function promptFor(tag: string, words: number): string {
  return `Request ${tag}: ${Array.from({ length: words }, (_, i) => FILLER[i % FILLER.length]).join(" ")}`;
}

interface LevelRun {
  wallS: number;
  /** The server process's CPU time (user + system, all its threads) during the run, in seconds. */
  serverCpuS: number;
  tokens: number;
  tokPerS: number;
  ttftP50: number;
  ttftP95: number;
  /** The responses' texts in request order (both servers get the same requests). */
  texts: string[];
}

const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  // nearest rank
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
};

/** utime + stime of a process in seconds (Linux /proc; NaN elsewhere). */
export function cpuSeconds(pid: number | undefined): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // fields after the parenthesized command name; utime and stime are fields 14 and 15
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(rest[11]) + Number(rest[12])) / CLOCK_TICKS;
  } catch {
    return Number.NaN;
  }
}
// sysconf(_SC_CLK_TCK) is 100 on every Linux this runs on
const CLOCK_TICKS = 100;

export async function runLevel(url: string, streams: number, rounds: number, tag: string, p: Pick<BenchServePlan, "maxTokens" | "promptWords">, pid?: number): Promise<LevelRun> {
  const cpu0 = cpuSeconds(pid);
  const t0 = performance.now();
  const results = await Promise.all(
    Array.from({ length: streams }, async (_, c) => {
      const mine: StreamResult[] = [];
      for (let r = 0; r < rounds; r++) mine.push(await streamCompletion(url, promptFor(`${tag}-c${c}-r${r}`, p.promptWords), p.maxTokens));
      return mine;
    }),
  );
  const wallS = (performance.now() - t0) / 1000;
  const all = results.flat();
  const tokens = all.reduce((a, r) => a + r.completionTokens, 0);
  const ttft = all.map((r) => r.ttftMs);
  return { wallS, serverCpuS: cpuSeconds(pid) - cpu0, tokens, tokPerS: tokens / wallS, ttftP50: quantile(ttft, 0.5), ttftP95: quantile(ttft, 0.95), texts: all.map((r) => r.text) };
}

// ------------------------------------------------------------------ main

interface Row {
  workload: string;
  streams: number;
  requests: number;
  ts: LevelRun[];
  mlxLm: LevelRun[];
  load: number[];
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return (s[(s.length - 1) >> 1]! + s[s.length >> 1]!) / 2;
};

async function main(): Promise<void> {
  const plan = benchServePlan(process.argv.slice(2));
  if (plan === null) {
    process.stdout.write(helpText("npm run bench:serve -- [options]", "npm run serve vs mlx_lm.server under the same load: aggregate decode tok/s, p50/p95 time to first token.", FLAGS));
    return;
  }
  const { dir, what } = checkpoint(plan);
  const [p1, p2] = [await freePort(), await freePort()];
  const started = new Date().toISOString();
  const log = (s: string) => console.error(`[bench:serve] ${s}`);
  log(`starting both servers on ${dir}`);
  const ts = await start("npm run serve", process.execPath, ["run", "serve/cli.ts", "--model", dir, "--port", String(p1), "--log-level", "WARNING"], p1);
  const py = await start("mlx_lm.server", PY, ["-c", LAUNCH, "--model", dir, "--host", "127.0.0.1", "--port", String(p2), "--log-level", "WARNING"], p2);
  const rows: Row[] = [];
  try {
    for (const n of plan.streams) {
      const row: Row = { workload: plan.workload, streams: n, requests: n * plan.rounds, ts: [], mlxLm: [], load: [] };
      for (const s of [ts, py]) {
        log(`${n} streams: warm-up on ${s.name}`);
        await runLevel(s.url, n, 1, `w${n}`, plan);
      }
      for (let i = 0; i < plan.pairs; i++) {
        const order = i % 2 === 0 ? [ts, py] : [py, ts];
        for (const s of order) {
          row.load.push(loadavg()[0]!);
          const r = await runLevel(s.url, n, plan.rounds, `s${n}-p${i}`, plan, s.proc.pid);
          log(`${n} streams, pair ${i + 1}/${plan.pairs}, ${s.name}: ${r.tokens} tokens in ${r.wallS.toFixed(1)} s = ${r.tokPerS.toFixed(1)} tok/s, TTFT p50 ${r.ttftP50.toFixed(0)} ms p95 ${r.ttftP95.toFixed(0)} ms, server CPU ${((r.serverCpuS / r.tokens) * 1000).toFixed(1)} ms/token (load ${loadavg()[0]!.toFixed(1)})`);
          (s === ts ? row.ts : row.mlxLm).push(r);
        }
      }
      rows.push(row);
    }
  } finally {
    await Promise.all([stop(ts), stop(py)]);
  }
  const meta = {
    date: started,
    machine: `${cpus()[0]?.model ?? "unknown CPU"}, ${cpus().length} cores, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, ${process.platform}-${process.arch}; device ${process.env.MLX_DEVICE ?? "cpu (MLX_DEVICE unset)"}`,
    workload: what,
    load: `${plan.rounds} streaming /v1/completions requests per client, greedy, max_tokens ${plan.maxTokens}, prompts of ${plan.promptWords} filler words after a distinct head; one warm-up run per server and level, then ${plan.pairs} pairs alternating the order`,
  };
  const md = render(meta, rows);
  process.stdout.write(md);
  if (plan.write) {
    const jsonPath = join(REPO_ROOT, "bench", "serve_results.json");
    const old = existsSync(jsonPath) ? (JSON.parse(readFileSync(jsonPath, "utf8")) as { runs: { meta: typeof meta; workload: string; rows: unknown[] }[] }).runs : [];
    const runs = [...old.filter((r) => r.workload !== plan.workload), { workload: plan.workload, meta, rows: rows.map((r) => ({ ...r, ts: r.ts.map(({ texts: _, ...x }) => x), mlxLm: r.mlxLm.map(({ texts: _, ...x }) => x), sameTexts: sameTexts(r) })) }];
    for (const [f, text] of [["serve_results.json", `${JSON.stringify({ runs }, null, 2)}\n`]] as const) {
      writeFileSync(join(REPO_ROOT, "bench", `${f}.tmp`), text);
      renameSync(join(REPO_ROOT, "bench", `${f}.tmp`), join(REPO_ROOT, "bench", f));
    }
    const mdPath = join(REPO_ROOT, "bench", "SERVE.md");
    writeFileSync(mdPath, renderAll(runs as unknown as SavedRun[], existsSync(mdPath) ? readFileSync(mdPath, "utf8") : ""));
  }
}

const sameTexts = (r: Row) => r.ts.every((t, i) => JSON.stringify(t.texts) === JSON.stringify(r.mlxLm[i]!.texts));

export interface SavedRun {
  workload: string;
  meta: Record<string, string>;
  rows: (Omit<Row, "ts" | "mlxLm"> & { ts: Omit<LevelRun, "texts">[]; mlxLm: Omit<LevelRun, "texts">[]; sameTexts: boolean })[];
}

function render(meta: Record<string, string>, rows: Row[]): string {
  return renderRun({ workload: rows[0]?.workload ?? "", meta, rows: rows.map((r) => ({ ...r, sameTexts: sameTexts(r) })) });
}

const f = (x: number, d = 1) => x.toFixed(d);
const span = (xs: number[], d = 1) => (xs.length > 1 ? `${f(median(xs), d)} (${f(Math.min(...xs), d)}–${f(Math.max(...xs), d)})` : f(xs[0]!, d));

function renderRun(run: SavedRun): string {
  const out = [`## ${run.workload}`, ""];
  for (const [k, v] of Object.entries(run.meta)) out.push(`- **${k}**: ${v}`);
  out.push("", "| streams | requests | TS tok/s | mlx_lm.server tok/s | **ratio tok/s** (per pair) | TS TTFT p50 / p95 ms | mlx_lm.server TTFT p50 / p95 ms | **ratio p95 TTFT** (per pair) | server CPU ms/token TS / mlx_lm.server | same texts | load avg |", "|---|---|---|---|---|---|---|---|---|---|---|");
  for (const r of run.rows) {
    const rt = r.ts.map((t, i) => t.tokPerS / r.mlxLm[i]!.tokPerS);
    const rp = r.ts.map((t, i) => t.ttftP95 / r.mlxLm[i]!.ttftP95);
    out.push(
      `| ${r.streams} | ${r.requests} | ${span(r.ts.map((t) => t.tokPerS))} | ${span(r.mlxLm.map((t) => t.tokPerS))} | **${f(median(rt), 2)}** (${rt.map((x) => f(x, 2)).join(" ")}) | ${span(r.ts.map((t) => t.ttftP50), 0)} / ${span(r.ts.map((t) => t.ttftP95), 0)} | ${span(r.mlxLm.map((t) => t.ttftP50), 0)} / ${span(r.mlxLm.map((t) => t.ttftP95), 0)} | **${f(median(rp), 2)}** (${rp.map((x) => f(x, 2)).join(" ")}) | ${span(r.ts.map((t) => (t.serverCpuS / t.tokens) * 1000))} / ${span(r.mlxLm.map((t) => (t.serverCpuS / t.tokens) * 1000))} | ${r.sameTexts ? "yes" : "no"} | ${f(Math.min(...r.load))}–${f(Math.max(...r.load))} |`,
    );
  }
  return out.join("\n") + "\n";
}

const FINDINGS = "## Findings";

/** The page: method, one section per workload (tiny first), then the hand-written findings of the previous page, kept. */
export function renderAll(runs: SavedRun[], previous = ""): string {
  const order = ["tiny", "tiny-vocab", "e2b"];
  runs = [...runs].sort((a, b) => order.indexOf(a.workload) - order.indexOf(b.workload));
  const at = previous.indexOf(FINDINGS);
  const kept = at >= 0 ? ["", previous.slice(at).trimEnd(), ""] : [];
  const head = [
    "# Serving: `npm run serve` vs mlx_lm.server 0.32.2 under the same load",
    "",
    "`npm run bench:serve -- --workload tiny|tiny-vocab|e2b` (bench/serve.ts). Both servers run on loopback on the same checkpoint with their defaults (mlx_lm.server from the project's venv, unmodified; decode/prompt concurrency 32/8, prefill step 2048, a prompt cache of 10 entries on both: every prompt is new, so neither gets a hit and both pay the insert). A level of N streams: N clients start together, each sends its requests one after the other. Aggregate decode tok/s = completion tokens of all requests (usage) / the level's wall time; TTFT = request sent to the first SSE event with a choice (nearest-rank p50/p95 over the level's requests). One warm-up run per server and level (excluded), then pairs alternating which server goes first; ratio = TS / mlx_lm.server per pair, the median in bold (tok/s: higher is better; TTFT: lower is better). \"same texts\": every request's streamed text equal between the servers in every pair (greedy; batch composition can change bits once a sliding window rotates, so this is reported, not required). Server CPU ms/token: the server process's user + system CPU time (all its threads, /proc) during the run / its completion tokens: a figure the other jobs on a shared host change less than wall time. Load avg: the host's 1-minute load average when each run started (the host is shared; the servers' own work counts in it).",
    "",
  ];
  return [...head, ...runs.map(renderRun), ...kept].join("\n");
}

if (import.meta.main) {
  main().catch((e) => {
    console.error(e instanceof UsageError ? `error: ${e.message}` : e);
    process.exit(e instanceof UsageError ? 2 : 1);
  });
}
