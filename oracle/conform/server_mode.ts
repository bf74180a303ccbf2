// Server mode of the conformance check (issue 24): the HTTP client of an OpenAI-compatible
// `/v1/completions` endpoint, and the comparison of its greedy answer with the oracle's
// (mlx-lm's generate_step on the same checkpoint and prompt ids).
//
// What a server is asked: the prompt (token ids, or a text whose tokenization by the server's
// tokenizer gives exactly those ids), `max_tokens`, `temperature: 0` (greedy), and logprobs.
// Two request dialects, both read back as { chosen token, its logprob, top-k (id, logprob) }:
//  - "content" (mlx_lm.server, and the chat-style layout): `logprobs: true`, `top_logprobs: k`;
//    answer `choices[0].logprobs.content[i] = { id, logprob, top_logprobs: [{ id, logprob }] }`.
//    mlx_lm.server 0.32.2 fills an entry's own `id`/`logprob` with the first of its top-k, which
//    comes from an unordered `argpartition` (not the sampled token: measured, step 0 of the
//    tokenizer fixture gave id 62047 at -11.625 while the sampled token was 29977 at -11.5). So
//    with k > 0 this dialect sends two requests: one without top_logprobs (each entry is then the
//    sampled token and its logprob) and one with them (the top-k lists only).
//  - "legacy" (the original OpenAI completions layout, e.g. vLLM): `logprobs: k`; answer
//    `choices[0].logprobs = { tokens, token_logprobs, top_logprobs: [{ "<token>": logprob }] }`.
//    Token ids are needed, so tokens must be spelled "token_id:<n>" (vLLM's
//    --return-tokens-as-token-ids), or the entries must carry numeric ids.
//
// The metrics (per comparable step; steps after the first differing token are conditioned on
// different prefixes and are not compared, the differing step itself still is):
//  - tokens: equality per step, the first differing step, lengths (a server that stopped at an
//    end-of-sequence token returns fewer tokens: its tokens must still equal the oracle's prefix);
//  - chosen logprob: |lp_server(t) − lp_oracle(t)| for t the server's token;
//  - top-k: for each returned (id, lp), |lp − lp_oracle(id)| (max and mean over all entries), and
//    whether the returned ids are a top-k of the oracle's distribution (each returned id's oracle
//    logprob ≥ the oracle's k-th largest logprob: with ties at the boundary any of the tied ids is
//    a valid member, so the set itself is not compared);
//  - top-1 agreement: the server's top-1 (its highest returned logprob, the lowest id on a tie;
//    the chosen token without top-k) is an argmax of the oracle's logprobs (its oracle logprob
//    equals the oracle's maximum: ties count as agreement);
//  - KL over the returned top-k, defined exactly: T = the ids the server returned at that step;
//    P(i) = exp(lp_oracle(i)) / Σ_{j∈T} exp(lp_oracle(j)) and Q(i) = exp(lp_server(i)) /
//    Σ_{j∈T} exp(lp_server(j)) for i ∈ T; KL(P ‖ Q) = Σ_{i∈T} P(i) (log P(i) − log Q(i)) in nats,
//    computed in float64 with log-sum-exp. The oracle has the whole vocabulary, so both are
//    defined on the server's set; no id outside T enters.
// Equality is exact: JSON numbers parse to float64; Python's json prints a float with repr (the
// shortest text that round-trips the double), and a bfloat16/float32 logprob widened to a double
// is exact, so "equal" means the server's value is bit for bit the oracle's value of its dtype.
import { reader } from "../tensor_diff.ts";
import type { NpyRecord } from "../npy.ts";

/** Bad usage, an unreachable server, a non-2xx answer or a malformed body: exit code 2. */
export class ServerModeError extends Error {
  override name = "ServerModeError";
}

export type Dialect = "content" | "legacy";
export type PromptAs = "ids" | "text" | "auto";

export interface ServerQuery {
  /** Base URL (http://host:port) or the full `/v1/completions` URL. */
  url: string;
  /**
   * The prompt's token ids; `text`: a text the server's tokenizer turns into exactly `ids`, or a
   * function giving it (called only when the text is needed: a tokenizer can take seconds to load).
   */
  prompt: { ids: number[]; text?: string | (() => Promise<string>) };
  /** ids: send the id array; text: send the text; auto: ids, and the text if the server refuses ids. */
  promptAs: PromptAs;
  maxTokens: number;
  /** Top-k logprobs asked per step (0: none). */
  topLogprobs: number;
  dialect: Dialect;
  /** Extra request fields (e.g. `model`, or `seed` to force mlx_lm.server's non-batched path). */
  extraBody?: Record<string, unknown>;
  /** Per request (default 120 s). */
  timeoutMs?: number;
}

export interface TopEntry {
  id: number;
  logprob: number;
}

export interface ServerGeneration {
  endpoint: string;
  dialect: Dialect;
  /** How the prompt was sent, and why text was used where ids were refused. */
  drivenBy: "ids" | "text";
  idsRefused?: string;
  requests: number;
  /** usage.prompt_tokens of the answer (null if the server gives none). */
  promptTokens: number | null;
  /** usage.prompt_tokens_details.cached_tokens (mlx_lm.server's prompt cache), null if absent. */
  cachedTokens: number | null;
  finishReason: string | null;
  tokens: number[];
  /** Logprob of each chosen token (null where the server gave none). */
  tokenLogprobs: (number | null)[];
  /** Top-k per step ([] per step when not asked). */
  top: TopEntry[][];
}

function completionsUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new ServerModeError(`--server ${url}: not a URL (expected e.g. http://127.0.0.1:8080)`);
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") throw new ServerModeError(`--server ${url}: only http and https URLs are supported`);
  if (u.pathname.endsWith("/v1/completions")) return u.toString();
  u.pathname = `${u.pathname.replace(/\/+$/, "")}/v1/completions`;
  return u.toString();
}

/** A non-2xx answer, kept apart so "auto" can tell a refusal of ids from a dead server. */
class HttpStatusError extends ServerModeError {
  constructor(
    message: string,
    readonly status: number,
    readonly body: string,
  ) {
    super(message);
  }
}

async function post(endpoint: string, body: Record<string, unknown>, timeoutMs: number): Promise<unknown> {
  let res: Response;
  try {
    res = await fetch(endpoint, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (e) {
    const err = e as Error & { code?: string };
    const code = err.code && !err.message.includes(err.code) ? ` (${err.code})` : "";
    const why = err.name === "TimeoutError" ? `no answer within ${timeoutMs / 1000} s` : `${err.message}${code}`;
    throw new ServerModeError(`server ${endpoint} unreachable: ${why}`);
  }
  const text = await res.text().catch((e: Error) => {
    throw new ServerModeError(`server ${endpoint}: reading the answer failed: ${e.message}`);
  });
  if (!res.ok) throw new HttpStatusError(`server ${endpoint} answered HTTP ${res.status}: ${text.slice(0, 300)}`, res.status, text);
  try {
    return JSON.parse(text);
  } catch {
    throw new ServerModeError(`server ${endpoint}: malformed body (not JSON): ${JSON.stringify(text.slice(0, 200))}`);
  }
}

const isObj = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);

function malformed(endpoint: string, what: string, v: unknown): ServerModeError {
  return new ServerModeError(`server ${endpoint}: malformed body: ${what}, got ${JSON.stringify(v)?.slice(0, 200) ?? "nothing"}`);
}

function tokenId(endpoint: string, where: string, v: unknown): number {
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return v;
  if (typeof v === "string") {
    const m = /^token_id:(\d+)$/.exec(v);
    if (m) return Number(m[1]);
  }
  throw malformed(endpoint, `${where} must be a token id (a non-negative integer, or "token_id:<n>"; start the server so that it returns ids)`, v);
}

function logprob(endpoint: string, where: string, v: unknown): number {
  if (typeof v === "number" && Number.isFinite(v) && v <= 0) return v;
  // -Infinity is not JSON; a server printing it is malformed, as is any positive logprob
  throw malformed(endpoint, `${where} must be a finite logprob ≤ 0`, v);
}

interface Parsed {
  choice: Record<string, unknown>;
  usage: Record<string, unknown> | null;
  steps: { id: number | null; logprob: number | null; top: TopEntry[] }[];
}

function parseAnswer(endpoint: string, r: unknown, dialect: Dialect, wantTop: boolean): Parsed {
  if (!isObj(r)) throw malformed(endpoint, "the answer must be a JSON object", r);
  const choices = r.choices;
  if (!Array.isArray(choices) || choices.length < 1 || !isObj(choices[0])) throw malformed(endpoint, "choices must be a non-empty array of objects", choices);
  const choice = choices[0];
  const usage = isObj(r.usage) ? r.usage : null;
  const lp = choice.logprobs;
  if (!isObj(lp)) throw malformed(endpoint, "choices[0].logprobs must be an object (does the server return logprobs?)", lp);
  const steps: Parsed["steps"] = [];
  if (dialect === "content") {
    const content = lp.content;
    if (!Array.isArray(content)) throw malformed(endpoint, "choices[0].logprobs.content must be an array", content);
    content.forEach((e, i) => {
      const at = `choices[0].logprobs.content[${i}]`;
      if (!isObj(e)) throw malformed(endpoint, `${at} must be an object`, e);
      const top: TopEntry[] = [];
      if (wantTop) {
        if (!Array.isArray(e.top_logprobs) || e.top_logprobs.length === 0) throw malformed(endpoint, `${at}.top_logprobs must be a non-empty array`, e.top_logprobs);
        e.top_logprobs.forEach((t, j) => {
          if (!isObj(t)) throw malformed(endpoint, `${at}.top_logprobs[${j}] must be an object`, t);
          top.push({ id: tokenId(endpoint, `${at}.top_logprobs[${j}].id`, t.id ?? t.token), logprob: logprob(endpoint, `${at}.top_logprobs[${j}].logprob`, t.logprob) });
        });
      }
      steps.push({ id: wantTop ? null : tokenId(endpoint, `${at}.id`, e.id ?? e.token), logprob: wantTop ? null : logprob(endpoint, `${at}.logprob`, e.logprob), top });
    });
  } else {
    const { tokens, token_logprobs: tlp, top_logprobs: tops } = lp;
    if (!Array.isArray(tokens)) throw malformed(endpoint, "choices[0].logprobs.tokens must be an array", tokens);
    if (!Array.isArray(tlp) || tlp.length !== tokens.length) throw malformed(endpoint, `choices[0].logprobs.token_logprobs must be an array of ${tokens.length} numbers`, tlp);
    if (wantTop && (!Array.isArray(tops) || tops.length !== tokens.length)) throw malformed(endpoint, `choices[0].logprobs.top_logprobs must be an array of ${tokens.length} objects`, tops);
    tokens.forEach((t, i) => {
      const top: TopEntry[] = [];
      if (wantTop) {
        const m = (tops as unknown[])[i];
        if (!isObj(m) || Object.keys(m).length === 0) throw malformed(endpoint, `choices[0].logprobs.top_logprobs[${i}] must be a non-empty object`, m);
        for (const [k, v] of Object.entries(m)) top.push({ id: tokenId(endpoint, `choices[0].logprobs.top_logprobs[${i}] key`, k), logprob: logprob(endpoint, `choices[0].logprobs.top_logprobs[${i}]["${k}"]`, v) });
      }
      steps.push({ id: tokenId(endpoint, `choices[0].logprobs.tokens[${i}]`, t), logprob: logprob(endpoint, `choices[0].logprobs.token_logprobs[${i}]`, tlp[i]), top });
    });
  }
  return { choice, usage, steps };
}

function intOrNull(v: unknown): number | null {
  return typeof v === "number" && Number.isSafeInteger(v) ? v : null;
}

/** Asks the server for its greedy continuation of the prompt, with logprobs; one clear ServerModeError on any failure. */
export async function queryServer(q: ServerQuery): Promise<ServerGeneration> {
  const endpoint = completionsUrl(q.url);
  if (!Number.isSafeInteger(q.maxTokens) || q.maxTokens < 1) throw new ServerModeError(`--max-tokens must be a positive integer, got ${q.maxTokens}`);
  if (!Number.isSafeInteger(q.topLogprobs) || q.topLogprobs < 0) throw new ServerModeError(`--top-logprobs must be a non-negative integer, got ${q.topLogprobs}`);
  if (q.prompt.ids.length === 0) throw new ServerModeError("the prompt has no tokens");
  if (q.promptAs === "text" && q.prompt.text === undefined) throw new ServerModeError("--prompt-as text needs a text for the prompt ids");
  const timeoutMs = q.timeoutMs ?? 120_000;
  let requests = 0;
  let drivenBy: "ids" | "text" = q.promptAs === "text" ? "text" : "ids";
  let idsRefused: string | undefined;

  let text: string | undefined;
  const promptText = async (): Promise<string> => (text ??= typeof q.prompt.text === "function" ? await q.prompt.text() : (q.prompt.text as string));
  const ask = async (logprobs: Record<string, unknown>): Promise<unknown> => {
    const body = (prompt: unknown) => ({ ...q.extraBody, prompt, max_tokens: q.maxTokens, temperature: 0, stream: false, ...logprobs });
    requests++;
    if (drivenBy === "text") return post(endpoint, body(await promptText()), timeoutMs);
    try {
      return await post(endpoint, body(q.prompt.ids), timeoutMs);
    } catch (e) {
      // a refusal of the id array (mlx_lm.server tokenizes `prompt` as a string and answers 404
      // with transformers' message): drive the server by text from here on, said in the result
      if (!(e instanceof HttpStatusError) || q.promptAs !== "auto" || q.prompt.text === undefined) throw e;
      drivenBy = "text";
      idsRefused = `HTTP ${e.status}: ${e.body.slice(0, 200)}`;
      requests++;
      return post(endpoint, body(await promptText()), timeoutMs);
    }
  };

  const wantTop = q.topLogprobs > 0;
  let chosen: Parsed;
  let tops: Parsed | null = null;
  if (q.dialect === "content") {
    chosen = parseAnswer(endpoint, await ask({ logprobs: true }), "content", false);
    if (wantTop) tops = parseAnswer(endpoint, await ask({ logprobs: true, top_logprobs: q.topLogprobs }), "content", true);
  } else {
    chosen = parseAnswer(endpoint, await ask({ logprobs: q.topLogprobs }), "legacy", wantTop);
    tops = wantTop ? chosen : null;
  }
  if (tops && tops.steps.length !== chosen.steps.length) {
    throw new ServerModeError(`server ${endpoint}: the request with top_logprobs gave ${tops.steps.length} steps, the one without ${chosen.steps.length} (a greedy answer must not change)`);
  }
  if (chosen.steps.length === 0) throw new ServerModeError(`server ${endpoint}: the answer has no generated tokens`);
  if (chosen.steps.length > q.maxTokens) throw new ServerModeError(`server ${endpoint}: ${chosen.steps.length} tokens returned for max_tokens ${q.maxTokens}`);
  const promptTokens = intOrNull(chosen.usage?.prompt_tokens);
  if (promptTokens !== null && promptTokens !== q.prompt.ids.length) {
    throw new ServerModeError(`server ${endpoint}: usage.prompt_tokens is ${promptTokens} for a prompt of ${q.prompt.ids.length} tokens (sent as ${drivenBy}): the server did not read the prompt as these ids, so nothing can be compared`);
  }
  const details = chosen.usage && isObj(chosen.usage.prompt_tokens_details) ? chosen.usage.prompt_tokens_details : null;
  const finish = chosen.choice.finish_reason;
  return {
    endpoint,
    dialect: q.dialect,
    drivenBy,
    ...(idsRefused !== undefined ? { idsRefused } : {}),
    requests,
    promptTokens,
    cachedTokens: intOrNull(details?.cached_tokens),
    finishReason: typeof finish === "string" ? finish : null,
    tokens: chosen.steps.map((s) => s.id as number),
    tokenLogprobs: chosen.steps.map((s) => s.logprob),
    top: chosen.steps.map((_, i) => tops?.steps[i]?.top ?? []),
  };
}

// ------------------------------------------------------------------ comparison

/** The oracle's greedy generation: tokens and the full-vocabulary logprobs of each step. */
export interface OracleGeneration {
  tokens: number[];
  logprobs: NpyRecord[];
}

export interface StepComparison {
  step: number;
  serverToken: number;
  oracleToken: number;
  tokenEqual: boolean;
  /** |lp_server(t) − lp_oracle(t)|, t = the server's token (null: the server gave no logprob). */
  chosenAbsDiff: number | null;
  /** Over the returned top-k: max and mean |Δ logprob|, KL(P ‖ Q) as defined in the header. */
  topMaxAbsDiff: number | null;
  topMeanAbsDiff: number | null;
  topKl: number | null;
  /** Returned ids that are not a top-k of the oracle's distribution, and how far the furthest is below the oracle's k-th logprob. */
  topOutsideOracleTopK: number;
  topOutsideMargin: number;
  top1Agrees: boolean;
  /** The token equal, every logprob the server returned at this step equal to the oracle's, and its ids a top-k of the oracle's. */
  exact: boolean;
}

export interface ServerComparison {
  prompt: number[];
  server: ServerGeneration;
  oracleTokens: number[];
  steps: StepComparison[];
  tokensEqual: boolean;
  /** First step whose token differs (null: none within the compared length). */
  firstDifferingStep: number | null;
  /** The server returned fewer tokens than asked: where and why (finish reason). */
  shorter: string | null;
  top1Agreement: number;
  chosenMaxAbsDiff: number;
  topMaxAbsDiff: number;
  topMeanAbsDiff: number;
  klMean: number;
  klMax: number;
  topEntries: number;
  topOutsideOracleTopK: number;
  /** Largest step topOutsideMargin: an outsider this far below the oracle's k-th logprob. */
  topOutsideMargin: number;
  /** Tokens equal and every returned logprob bit-equal to the oracle's (a server that stopped early: over its tokens). */
  exact: boolean;
  /** "EXACT" | "TOKENS MATCH, max |Δ logprob| = x" | "TOP-K DIFFERS from step n (...)" | "DIVERGES at step n (...)". */
  verdict: string;
}

function values(r: NpyRecord, step: number): Float64Array {
  const n = r.shape.reduce((a, b) => a * b, 1);
  if (r.shape.length === 0 || r.shape[r.shape.length - 1] !== n) throw new ServerModeError(`oracle logprobs of step ${step}: expected one row over the vocabulary, got shape [${r.shape}]`);
  const read = reader(r);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = read.num(i);
  return out;
}

function logSumExp(xs: number[]): number {
  const m = Math.max(...xs);
  let s = 0;
  for (const x of xs) s += Math.exp(x - m);
  return m + Math.log(s);
}

/** KL(P ‖ Q) over one id set, P from the oracle's logprobs, Q from the server's (header: exact definition). */
export function klOverSet(oracleLp: number[], serverLp: number[]): number {
  const zp = logSumExp(oracleLp);
  const zq = logSumExp(serverLp);
  let kl = 0;
  for (let i = 0; i < oracleLp.length; i++) {
    const lp = oracleLp[i]! - zp;
    kl += Math.exp(lp) * (lp - (serverLp[i]! - zq));
  }
  return Math.max(0, kl); // rounding can leave a tiny negative for equal distributions
}

/** The k-th largest value (k ≥ 1) of a row. */
function kthLargest(row: Float64Array, k: number): number {
  if (k === 1) return row.reduce((a, b) => (b > a ? b : a), -Infinity);
  return Float64Array.from(row).sort()[row.length - Math.min(k, row.length)]!;
}

export function compareWithOracle(prompt: number[], server: ServerGeneration, oracle: OracleGeneration): ServerComparison {
  const n = Math.min(server.tokens.length, oracle.tokens.length);
  if (oracle.logprobs.length < n) throw new ServerModeError(`the oracle gave ${oracle.logprobs.length} logprob rows for ${oracle.tokens.length} tokens`);
  const steps: StepComparison[] = [];
  let firstDiff: number | null = null;
  for (let s = 0; s < n && firstDiff === null; s++) {
    const row = values(oracle.logprobs[s]!, s);
    const tok = server.tokens[s]!;
    if (tok >= row.length) throw new ServerModeError(`server token ${tok} at step ${s} is outside the checkpoint's vocabulary (${row.length})`);
    const lp = server.tokenLogprobs[s] ?? null;
    const top = server.top[s] ?? [];
    for (const t of top) if (t.id >= row.length) throw new ServerModeError(`server top-k id ${t.id} at step ${s} is outside the checkpoint's vocabulary (${row.length})`);
    const oracleMax = kthLargest(row, 1);
    const kth = top.length > 0 ? kthLargest(row, top.length) : oracleMax;
    const diffs = top.map((t) => Math.abs(t.logprob - row[t.id]!));
    const server1 = top.length > 0 ? top.reduce((a, b) => (b.logprob > a.logprob || (b.logprob === a.logprob && b.id < a.id) ? b : a)).id : tok;
    const chosenAbsDiff = lp === null ? null : Math.abs(lp - row[tok]!);
    const step: StepComparison = {
      step: s,
      serverToken: tok,
      oracleToken: oracle.tokens[s]!,
      tokenEqual: tok === oracle.tokens[s],
      chosenAbsDiff,
      topMaxAbsDiff: top.length ? Math.max(...diffs) : null,
      topMeanAbsDiff: top.length ? diffs.reduce((a, b) => a + b, 0) / diffs.length : null,
      topKl: top.length ? klOverSet(top.map((t) => row[t.id]!), top.map((t) => t.logprob)) : null,
      topOutsideOracleTopK: 0,
      topOutsideMargin: 0,
      top1Agrees: row[server1] === oracleMax,
      exact: false,
    };
    const outsiders = top.filter((t) => row[t.id]! < kth);
    step.topOutsideOracleTopK = outsiders.length;
    step.topOutsideMargin = Math.max(0, ...outsiders.map((t) => kth - row[t.id]!));
    // exact: the token, every value, and a returned set that is a top-k of the oracle's
    step.exact = step.tokenEqual && (chosenAbsDiff ?? 0) === 0 && diffs.every((d) => d === 0) && step.topOutsideOracleTopK === 0;
    steps.push(step);
    if (!step.tokenEqual) firstDiff = s;
  }
  const lengthsDiffer = server.tokens.length !== oracle.tokens.length;
  const shorter = server.tokens.length < oracle.tokens.length ? `the server returned ${server.tokens.length} of ${oracle.tokens.length} tokens (finish_reason ${server.finishReason ?? "none"})` : null;
  const all = <T>(f: (s: StepComparison) => T | null) => steps.map(f).filter((x): x is T => x !== null);
  const entries = steps.reduce((a, s) => a + (server.top[s.step]?.length ?? 0), 0);
  const meanNum = steps.reduce((a, s) => a + (s.topMeanAbsDiff ?? 0) * (server.top[s.step]?.length ?? 0), 0);
  const kls = all((s) => s.topKl);
  const chosenMax = Math.max(0, ...all((s) => s.chosenAbsDiff));
  const topMax = Math.max(0, ...all((s) => s.topMaxAbsDiff));
  // fewer tokens are equal tokens only when the server says it stopped (an end-of-sequence token:
  // mlx_lm.server stops there, the oracle's generate_step does not)
  const tokensEqual = firstDiff === null && !(lengthsDiffer && server.finishReason !== "stop");
  const exact = tokensEqual && steps.every((s) => s.exact);
  const outsideStep = steps.find((s) => s.topOutsideOracleTopK > 0);
  const outsideCount = steps.reduce((a, s) => a + s.topOutsideOracleTopK, 0);
  const outsideMargin = Math.max(0, ...steps.map((s) => s.topOutsideMargin));
  const verdict = firstDiff !== null
    ? `DIVERGES at step ${firstDiff} (server token ${steps[firstDiff]!.serverToken}, oracle ${steps[firstDiff]!.oracleToken})`
    : !tokensEqual
      ? `DIVERGES: ${shorter ?? `the server returned ${server.tokens.length} tokens, the oracle ${oracle.tokens.length}`}`
      : exact
        ? "EXACT"
        : outsideStep !== undefined
          ? `TOP-K DIFFERS from step ${outsideStep.step} (${outsideCount} returned ids outside the oracle's top-k, up to ${outsideMargin} below its k-th logprob), max |Δ logprob| = ${Math.max(chosenMax, topMax)}`
          : `TOKENS MATCH, max |Δ logprob| = ${Math.max(chosenMax, topMax)}${shorter ? ` (${shorter})` : ""}`;
  return {
    prompt,
    server,
    oracleTokens: oracle.tokens,
    steps,
    tokensEqual,
    firstDifferingStep: firstDiff,
    shorter,
    top1Agreement: steps.length ? steps.filter((s) => s.top1Agrees).length / steps.length : 0,
    chosenMaxAbsDiff: chosenMax,
    topMaxAbsDiff: topMax,
    topMeanAbsDiff: entries ? meanNum / entries : 0,
    klMean: kls.length ? kls.reduce((a, b) => a + b, 0) / kls.length : 0,
    klMax: Math.max(0, ...kls),
    topEntries: entries,
    topOutsideOracleTopK: outsideCount,
    topOutsideMargin: outsideMargin,
    exact,
    verdict,
  };
}
