// Server mode of `npm run conform` (issue 24): checks an OpenAI-compatible `/v1/completions`
// endpoint against the oracle (mlx-lm's generate_step, greedy, on the same checkpoint and prompt
// ids): tokens, top-1 agreement, logprob differences, KL over the returned top-k
// (oracle/conform/server_mode.ts defines each). Stand-alone until the conform CLI dispatches here:
//   bun parity/conform_server.ts --server http://127.0.0.1:8080 --checkpoint DIR --prompt "text"
// Exit codes: 0 the server conforms (tokens equal and every logprob within --max-logprob-diff,
// default 0: bit-exact), 1 it diverges, 2 bad usage, an unreachable server, a non-2xx answer or a
// malformed body.
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { type OracleClient, OracleError, REPO_ROOT, closeSharedOracle, sharedOracle } from "../oracle/client.ts";
import { type Dialect, type PromptAs, type ServerComparison, ServerModeError, compareWithOracle, queryServer } from "../oracle/conform/server_mode.ts";
import { type FlagSpec, UsageError, helpText, parseArgs, runMain } from "./args.ts";
import { type CheckpointTokenizer, loadTokenizer, parseTokenList } from "./inputs.ts";

export const SERVER_FLAGS: readonly FlagSpec[] = [
  { name: "server", kind: "string", valueName: "url", help: "an OpenAI-compatible server (http://host:port, or its /v1/completions URL)" },
  { name: "checkpoint", kind: "string", valueName: "dir|id", help: "the checkpoint the server loaded: a folder, or a fixture id (c1_dense/f32); the oracle runs it" },
  { name: "prompt", kind: "string", valueName: "text", help: "prompt text, tokenized with the checkpoint's tokenizer.json (special tokens added, as mlx_lm.server does)" },
  { name: "tokens", kind: "string", valueName: "ids", help: "prompt token ids, comma-separated" },
  { name: "max-tokens", kind: "int", valueName: "n", default: 8, help: "greedy tokens to generate" },
  { name: "top-logprobs", kind: "int", valueName: "k", default: 5, help: "top-k logprobs asked per step (0: the chosen token's only)" },
  { name: "prompt-as", kind: "string", valueName: "ids|text|auto", default: "auto", help: "send the prompt as its id array, as text, or ids and text if the server refuses ids" },
  { name: "dialect", kind: "string", valueName: "content|legacy", default: "content", help: "logprobs request/answer layout: content (mlx_lm.server: logprobs true, top_logprobs k) or legacy (logprobs k; tokens as token_id:<n>)" },
  { name: "model", kind: "string", valueName: "name", help: "the request's model field (default: none sent)" },
  { name: "seed", kind: "int", valueName: "n", help: "send a seed (mlx_lm.server then serves the request alone through stream_generate, not its batch generator)" },
  { name: "max-logprob-diff", kind: "number", valueName: "x", default: 0, help: "largest |Δ logprob| that still conforms (0: bit-exact)" },
  { name: "json", kind: "string", valueName: "file", help: "also write the comparison as JSON here" },
  { name: "help", kind: "bool", help: "this text" },
];

export interface ServerCheckOptions {
  server: string;
  checkpoint: string;
  prompt?: string;
  tokens?: number[];
  maxTokens: number;
  topLogprobs: number;
  promptAs: PromptAs;
  dialect: Dialect;
  extraBody?: Record<string, unknown>;
}

/** The checkpoint folder the tokenizer is read from: a folder as given, or a fixture id's cache folder. */
function checkpointDir(ref: string): string {
  return existsSync(join(ref, "config.json")) ? ref : join(REPO_ROOT, ".cache", "checkpoints", ref);
}

/**
 * The checkpoint's tokenizer through @huggingface/tokenizers (parity/inputs.ts, as `npm run
 * parity -- --prompt` tokenizes): suites/tokenizer/gemma3.test.ts holds it equal to mlx-lm's
 * tokenizer wrapper (what mlx_lm.server's `tokenizer.encode(prompt)` runs) on 3,000 strings, and
 * the server's usage.prompt_tokens is checked against the ids on every answer.
 */
async function checkpointTokenizer(dir: string, why: string): Promise<CheckpointTokenizer> {
  if (!existsSync(join(dir, "tokenizer.json"))) throw new UsageError(`${why} needs the checkpoint's tokenizer (${join(dir, "tokenizer.json")} is missing)`);
  // one load per folder and process: a 262,144-piece tokenizer.json takes seconds to build
  let t = tokenizers.get(dir);
  if (!t) {
    t = loadTokenizer(dir);
    t.catch(() => tokenizers.delete(dir));
    tokenizers.set(dir, t);
  }
  return t;
}
const tokenizers = new Map<string, Promise<CheckpointTokenizer>>();

/**
 * A text whose tokenization (special tokens added, as the server does) gives exactly `ids`: the
 * ids after the tokenizer's own prefix (its BOS) decoded, checked by re-encoding.
 */
async function textFor(dir: string, ids: number[]): Promise<string> {
  const tok = await checkpointTokenizer(dir, "a server that takes text only (it refused the id array)");
  const prefix = tok.encode("", true);
  const body = prefix.length > 0 && prefix.every((t, i) => ids[i] === t) ? ids.slice(prefix.length) : ids;
  const text = tok.decode(body, false);
  const back = tok.encode(text, true);
  if (back.length !== ids.length || back.some((t, i) => t !== ids[i])) {
    throw new ServerModeError(`the server takes text only, and no text gives the ids [${ids.join(",")}]: decoding and re-encoding gives [${back.join(",")}] (give --prompt text, or a server that takes token ids)`);
  }
  return text;
}

/** Runs the server-mode comparison (errors: ServerModeError / UsageError / OracleError). */
export async function runServerCheck(oracle: OracleClient | (() => Promise<OracleClient>), o: ServerCheckOptions): Promise<ServerComparison> {
  if ((o.prompt === undefined) === (o.tokens === undefined)) throw new UsageError('give the prompt as --prompt "text" or --tokens 1,2,3 (one of them)');
  const dir = checkpointDir(o.checkpoint);
  const ids = o.tokens ?? (await checkpointTokenizer(dir, "--prompt")).encode(o.prompt!, true);
  if (ids.length === 0) throw new UsageError("the prompt has no tokens");
  const server = await queryServer({
    url: o.server,
    prompt: { ids, text: o.prompt ?? (() => textFor(dir, ids)) },
    promptAs: o.promptAs,
    maxTokens: o.maxTokens,
    topLogprobs: o.topLogprobs,
    dialect: o.dialect,
    extraBody: o.extraBody,
  });
  // the oracle starts after the server answered: an unreachable server is reported at once
  const client = typeof oracle === "function" ? await oracle() : oracle;
  const reference = await client.generate(o.checkpoint, ids, { maxTokens: o.maxTokens });
  return compareWithOracle(ids, server, reference);
}

const fmt = (x: number | null) => (x === null ? "-" : x === 0 ? "0" : x.toPrecision(3));

export function formatComparison(c: ServerComparison): string {
  const s = c.server;
  const lines = [
    `server ${s.endpoint} (${s.dialect} dialect, prompt sent as ${s.drivenBy}${s.idsRefused ? `: ids refused, ${s.idsRefused.slice(0, 120)}` : ""}; ${s.requests} requests)`,
    `prompt ${c.prompt.length} tokens (server's usage.prompt_tokens ${s.promptTokens ?? "not given"}${s.cachedTokens !== null ? `, ${s.cachedTokens} from its prompt cache` : ""}); finish_reason ${s.finishReason ?? "none"}`,
    "",
    "step  server   oracle   |Δ lp chosen|  top-k max |Δ|  top-k KL   top-1",
  ];
  for (const st of c.steps) {
    lines.push(
      `${String(st.step).padStart(4)}  ${String(st.serverToken).padStart(7)}  ${String(st.oracleToken).padStart(7)}${st.tokenEqual ? " " : "*"}  ${fmt(st.chosenAbsDiff).padStart(13)}  ${fmt(st.topMaxAbsDiff).padStart(13)}  ${fmt(st.topKl).padStart(8)}   ${st.top1Agrees ? "yes" : "NO"}`,
    );
  }
  lines.push(
    "",
    `top-1 agreement ${(c.top1Agreement * 100).toFixed(1)}% of ${c.steps.length} steps; chosen max |Δ logprob| ${fmt(c.chosenMaxAbsDiff)}; top-k (${c.topEntries} entries) max |Δ| ${fmt(c.topMaxAbsDiff)}, mean ${fmt(c.topMeanAbsDiff)}; KL over the returned top-k mean ${fmt(c.klMean)}, max ${fmt(c.klMax)} nats; returned ids outside the oracle's top-k: ${c.topOutsideOracleTopK}`,
    `verdict: ${c.verdict}`,
  );
  return lines.join("\n") + "\n";
}

/**
 * 0 conforms, 1 diverges: tokens differ, or a logprob is more than `maxDiff` off, or a returned
 * top-k id lies more than `maxDiff` below the oracle's k-th logprob (0: bit-exact, a true top-k).
 */
export function exitCodeOf(c: ServerComparison, maxDiff: number): number {
  if (c.exact) return 0;
  return c.tokensEqual && Math.max(c.chosenMaxAbsDiff, c.topMaxAbsDiff, c.topOutsideMargin) <= maxDiff ? 0 : 1;
}

function options(a: ReturnType<typeof parseArgs>): ServerCheckOptions & { maxDiff: number; json?: string } {
  if (typeof a.server !== "string") throw new UsageError("--server URL is required");
  if (typeof a.checkpoint !== "string") throw new UsageError("--checkpoint (the checkpoint the server loaded) is required: the oracle runs it");
  if (a.prompt !== undefined && a.tokens !== undefined) throw new UsageError("give either --prompt or --tokens, not both");
  const promptAs = a["prompt-as"];
  if (promptAs !== "ids" && promptAs !== "text" && promptAs !== "auto") throw new UsageError(`--prompt-as must be ids, text or auto, got '${String(promptAs)}'`);
  const dialect = a.dialect;
  if (dialect !== "content" && dialect !== "legacy") throw new UsageError(`--dialect must be content or legacy, got '${String(dialect)}'`);
  const maxTokens = a["max-tokens"] as number;
  const top = a["top-logprobs"] as number;
  if (maxTokens < 1) throw new UsageError(`--max-tokens must be at least 1, got ${maxTokens}`);
  if (top < 0) throw new UsageError(`--top-logprobs must be 0 or more, got ${top}`);
  const maxDiff = a["max-logprob-diff"] as number;
  if (!(maxDiff >= 0)) throw new UsageError(`--max-logprob-diff must be 0 or more, got ${maxDiff}`);
  const extraBody: Record<string, unknown> = {};
  if (typeof a.model === "string") extraBody.model = a.model;
  if (typeof a.seed === "number") extraBody.seed = a.seed;
  return {
    server: a.server,
    checkpoint: a.checkpoint,
    ...(typeof a.prompt === "string" ? { prompt: a.prompt } : {}),
    ...(typeof a.tokens === "string" ? { tokens: parseTokenList(a.tokens) } : {}),
    maxTokens,
    topLogprobs: top,
    promptAs,
    dialect,
    extraBody,
    maxDiff,
    ...(typeof a.json === "string" ? { json: a.json } : {}),
  };
}

/**
 * `--server` mode: argv holds its flags (SERVER_FLAGS). Returns the exit code; errors are one
 * line on stderr and exit 2. `io.oracle`: an oracle to use (default: the shared one).
 */
export async function conformServer(argv: readonly string[], io: { oracle?: OracleClient; out?: (s: string) => void; err?: (s: string) => void } = {}): Promise<number> {
  const out = io.out ?? ((s: string) => void process.stdout.write(s));
  const err = io.err ?? ((s: string) => void process.stderr.write(s));
  try {
    const a = parseArgs(argv, SERVER_FLAGS);
    if (a.help) {
      out(helpText("npm run conform -- --server URL --checkpoint DIR (--prompt TEXT | --tokens IDS) [options]", "Checks an OpenAI-compatible /v1/completions server's greedy tokens and logprobs against mlx-lm's.", SERVER_FLAGS));
      return 0;
    }
    const o = options(a);
    const c = await runServerCheck(io.oracle ?? (() => sharedOracle()), o);
    out(formatComparison(c));
    if (o.json) {
      mkdirSync(dirname(o.json), { recursive: true });
      writeFileSync(o.json, JSON.stringify(c, null, 2) + "\n");
    }
    return exitCodeOf(c, o.maxDiff);
  } catch (e) {
    if (e instanceof ServerModeError || e instanceof UsageError || e instanceof OracleError) {
      err(`error: ${e.message}\n`);
      return 2;
    }
    throw e;
  }
}

if (import.meta.main) {
  runMain(async (argv) => {
    try {
      return await conformServer(argv);
    } finally {
      await closeSharedOracle();
    }
  });
}
