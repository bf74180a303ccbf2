// The HTTP face of `npm run serve`: mlx_lm.server 0.32.2's API (APIHandler) on Bun.serve.
//   POST /v1/completions, /v1/chat/completions (and /chat/completions, as mlx_lm.server routes it)
//   GET  /v1/models (any path starting so), /health; OPTIONS (CORS preflight)
// Bodies and errors as mlx_lm.server writes them: json.dumps layout, {"error": "..."} with its
// status codes (400 bad parameters or JSON, 404 unknown path or a prompt that cannot be built,
// 411 no Content-Length), response ids "cmpl-<uuid>" / "chatcmpl-<uuid>", SSE chunks
// ("data: {...}\n\n", then "data: [DONE]\n\n"); the response logic of handle_completion ported
// step for step (text state machine, stop handling, logprobs layout, usage).
//
// Safety (this server's, documented in the README's "Serving" section): an optional bearer key
// (401), only the model named at start (404 for another `model`), a body limit (413), a prompt
// limit and a max_tokens limit (400), no CORS header unless --allowed-origins is given, images
// and audio only as inline base64 (never fetched, no path read; serve/media.ts), and a client
// that goes away stops its generation.
import { timingSafeEqual } from "node:crypto";
import type { Engine, TokenResponse } from "./engine.ts";
import { dumps, loads, type Out, plain, PyFloat, type PyJson } from "./json.ts";
import { type GenerationArgs, readGenerationArgs, RequestError, type RequestDefaults } from "./request.ts";
import { makeStopSequences } from "./text_state.ts";
import type { ServedTokenizer } from "./tokenizer.ts";
import type { CacheType } from "./prompt_cache.ts";
import { makeServedTextStateMachine, ToolCallFormatter, toolCallingFor } from "./tools.ts";
import { hasMedia, MediaRequestError, type MediaRun, mediaPrompt, prepareMediaRun, type ServedMedia } from "./media.ts";

export interface ServerConfig {
  host: string;
  port: number;
  /** The --model argument as given. */
  modelArg: string;
  /** Its absolute path: the id /v1/models lists, as mlx_lm.server lists str(Path.resolve()). */
  modelId: string;
  apiKey: string | null;
  /** Empty: no CORS headers (this server's default); ["*"]: any origin. */
  allowedOrigins: string[];
  maxBodyBytes: number;
  maxPromptTokens: number;
  maxTokensLimit: number;
  vocabSize: number;
  defaults: RequestDefaults;
  /** --draft-model given: num_draft_tokens must then be at least 1. */
  hasDraft?: boolean;
  chatTemplateArgs: Record<string, unknown>;
  /** The checkpoint's towers (serve/media.ts), when it has one and media are served; else image and audio parts are refused. */
  media?: ServedMedia | null;
  systemFingerprint: string;
  log: (line: string) => void;
}

const POST_PATHS = new Map<string, "text" | "chat">([
  ["/v1/completions", "text"],
  ["/v1/chat/completions", "chat"],
  ["/chat/completions", "chat"],
]);

/** A tokenized request: the prompt, _tokenize's segments and segment_types, and (once known) how many prompt tokens came from the prompt cache. */
interface Built {
  prompt: number[];
  initialState: string;
  segments: number[][];
  segmentTypes: CacheType[];
  cached?: number;
  /** A request with images or audio: its own prefill (the engine disposes it). */
  media?: MediaRun;
}

interface Ctx {
  id: string;
  objectType: "text_completion" | "chat.completion" | "chat.completion.chunk";
  created: number;
  args: GenerationArgs;
}

export function corsHeaders(cfg: Pick<ServerConfig, "allowedOrigins">, origin: string | null): Record<string, string> {
  const h: Record<string, string> = {};
  if (cfg.allowedOrigins.includes("*")) h["Access-Control-Allow-Origin"] = "*";
  else if (origin !== null && cfg.allowedOrigins.includes(origin)) {
    h["Access-Control-Allow-Origin"] = origin;
    h.Vary = "Origin";
  } else return h;
  h["Access-Control-Allow-Methods"] = "*";
  h["Access-Control-Allow-Headers"] = "*";
  return h;
}

function json(status: number, body: string, extra: Record<string, string> = {}): Response {
  return new Response(body, { status, headers: { "Content-type": "application/json", ...extra } });
}

/** body.get("tools") or None: any falsy value is no tools. */
function toolsOf(body: Record<string, PyJson>): unknown[] | null {
  const t = body.tools;
  if (t === undefined || t === null || t === false || t === 0 || t === "" || (Array.isArray(t) && t.length === 0) || (isDict(t) && Object.keys(t).length === 0)) return null;
  return plain(t) as unknown[];
}

function isDict(v: PyJson): boolean {
  return v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof PyFloat);
}

function errorBody(message: string): string {
  return dumps({ error: message });
}

/** The text of a chat request's messages, as process_message_content makes it (text parts joined; images refused; tool-call arguments parsed). */
function chatMessages(raw: PyJson): unknown[] {
  if (!Array.isArray(raw)) throw new Error("messages must be a list of messages");
  return raw.map((m) => {
    if (m === null || typeof m !== "object" || Array.isArray(m) || m instanceof PyFloat) throw new Error("each message must be an object");
    const msg = plain(m) as Record<string, unknown>;
    const content = msg.content;
    if (Array.isArray(content)) {
      const texts = content.map((p) => {
        const part = p as Record<string, unknown> | null;
        if (part === null || typeof part !== "object" || !("type" in part)) throw new Error("'type'");
        return part.type === "text" ? part.text : undefined;
      });
      if (texts.some((t) => t === undefined)) throw new Error("Only 'text' content type is supported.");
      if (texts.some((t) => typeof t !== "string")) throw new Error("a text content part needs a string 'text'");
      msg.content = texts.join("");
    } else if (content === null || content === undefined) msg.content = "";
    const calls = msg.tool_calls;
    if (Array.isArray(calls)) {
      for (const c of calls) {
        const fn = (c as { function?: { arguments?: unknown } } | null)?.function;
        if (fn && typeof fn.arguments === "string" && fn.arguments) fn.arguments = JSON.parse(fn.arguments);
      }
    }
    return msg;
  });
}

export interface RunningServer {
  url: string;
  port: number;
  stop(): Promise<void>;
}

export function startServer(cfg: ServerConfig, engine: Pick<Engine, "run"> & Partial<Pick<Engine, "prefixStats">>, tok: ServedTokenizer): RunningServer {
  // mlx-lm gives the text machine a "tool" state whenever the tokenizer has tool calling (serve/tools.ts)
  const toolCalling = toolCallingFor(tok);
  const keyBytes = cfg.apiKey === null ? null : Buffer.from(`Bearer ${cfg.apiKey}`);
  const authorized = (req: Request): boolean => {
    if (keyBytes === null) return true;
    const got = Buffer.from(req.headers.get("authorization") ?? "");
    return got.length === keyBytes.length && timingSafeEqual(got, keyBytes);
  };

  /** The prompt ids of a request (ResponseGenerator._tokenize); an Error here is mlx_lm.server's 404. */
  const tokenize = (kind: "text" | "chat", body: Record<string, PyJson>, args: GenerationArgs): Built => {
    if (kind === "text") {
      const p = body.prompt;
      if (typeof p !== "string") throw new Error("text input must be of type `str` (this server takes `prompt` as a string only)");
      const prompt = tok.encode(p, true);
      return { prompt, initialState: "normal", segments: [prompt], segmentTypes: ["assistant"] };
    }
    const messages = chatMessages(body.messages!);
    if (!tok.hasChatTemplate) throw new Error("the checkpoint has no chat template (mlx_lm.server's role_mapping fallback is not ported)");
    const kwargs = { ...cfg.chatTemplateArgs, ...(args.chatTemplateKwargs ?? {}) };
    const tools = toolsOf(body);
    const text = tok.renderChat(messages, kwargs, true, tools);
    const prompt = tok.encode(text, false);
    let initialState = "normal";
    const th = tok.thinking;
    if (th && rfind(prompt, th.startTokens) > rfind(prompt, th.endTokens)) initialState = "reasoning";
    return { prompt, initialState, ...chatSegments(messages, prompt, kwargs, tools) };
  };

  /** A chat request with images or audio, as mlx-vlm's server builds its prompt (serve/media.ts); bad media are a 400. */
  const tokenizeMedia = async (body: Record<string, PyJson>, args: GenerationArgs): Promise<Built> => {
    let mp;
    try {
      mp = mediaPrompt(plain(body.messages!) as unknown[]);
    } catch (e) {
      if (e instanceof MediaRequestError) throw new RequestError(400, e.message);
      throw e;
    }
    // mlx-vlm's server renders with enable_thinking off unless asked
    const kwargs = { enable_thinking: false, ...cfg.chatTemplateArgs, ...(args.chatTemplateKwargs ?? {}) };
    let ids: number[];
    try {
      ids = tok.encode(tok.renderChat(mp.messages, kwargs, true, toolsOf(body)), false);
    } catch (e) {
      throw new RequestError(404, (e as Error).message);
    }
    let prepared;
    try {
      prepared = await prepareMediaRun(cfg.media!, ids, mp);
    } catch (e) {
      if (e instanceof MediaRequestError) throw new RequestError(400, e.message);
      throw e;
    }
    let initialState = "normal";
    const th = tok.thinking;
    if (th && rfind(prepared.ids, th.startTokens) > rfind(prepared.ids, th.endTokens)) initialState = "reasoning";
    return { prompt: prepared.ids, initialState, segments: [prepared.ids], segmentTypes: ["assistant"], media: prepared.run };
  };

  /**
   * _tokenize's segments of a chat prompt whose last message is the user's: the system prompt
   * (where the prompt stops agreeing with the system messages followed by an empty user turn,
   * rendered without a generation prompt), the rest, and a thinking tail (from the last think-start
   * marker among the last 11 tokens). BatchGenerator prefills each segment separately.
   */
  const chatSegments = (messages: unknown[], prompt: number[], kwargs: Record<string, unknown>, tools: unknown[] | null): { segments: number[][]; segmentTypes: CacheType[] } => {
    if ((messages.at(-1) as { role?: unknown } | undefined)?.role !== "user") return { segments: [prompt], segmentTypes: ["assistant"] };
    const segments: number[][] = [];
    // segment_types: the kind each segment's cache is stored as in the prompt cache
    const segmentTypes: CacheType[] = [];
    let numSystem = 0;
    while (numSystem < messages.length && (messages[numSystem] as { role?: unknown }).role === "system") numSystem++;
    let sysEnd = 0;
    if (numSystem > 0) {
      const sys = tok.encode(tok.renderChat([...messages.slice(0, numSystem), { role: "user", content: "" }], kwargs, false, tools), false);
      for (let i = 0; i < Math.min(sys.length, prompt.length); i++) {
        if (sys[i] !== prompt[i]) {
          sysEnd = i;
          break;
        }
      }
      if (sysEnd > 0 && sysEnd < prompt.length) {
        segments.push(prompt.slice(0, sysEnd));
        segmentTypes.push("system");
      }
    }
    let tailStart = prompt.length;
    const th = tok.thinking;
    if (th) {
      const at = rfind(prompt, th.startTokens, Math.max(tailStart - 11, 0));
      if (at >= 0) tailStart = at;
    }
    if (sysEnd < tailStart) {
      segments.push(prompt.slice(sysEnd, tailStart));
      segmentTypes.push("user");
    }
    if (tailStart < prompt.length) {
      segments.push(prompt.slice(tailStart));
      segmentTypes.push("assistant");
    }
    return segments.length ? { segments, segmentTypes } : { segments: [prompt], segmentTypes: ["assistant"] };
  };

  const server = Bun.serve({
    hostname: cfg.host,
    port: cfg.port,
    // Bun answers an empty 413 itself above this size, before fetch() runs; the Content-Length
    // check in handlePost answers first (with the documented body) for anything between
    maxRequestBodySize: Math.max(cfg.maxBodyBytes + 1, 256 * 1024 * 1024),
    // a connection that sends nothing for this long is closed; a request that reaches generation
    // lifts it (handlePost), since a long prefill or a non-streaming answer is silent for a while
    idleTimeout: 30,
    async fetch(req, srv) {
      const url = new URL(req.url);
      const path = url.pathname + url.search; // BaseHTTPRequestHandler's self.path
      const cors = corsHeaders(cfg, req.headers.get("origin"));
      if (req.method === "OPTIONS") return new Response(null, { status: 204, headers: { "Content-type": "application/json", ...cors } });
      if (path !== "/health" && !authorized(req)) {
        return json(401, errorBody("a valid API key is required: send the header 'Authorization: Bearer <key>' (the server was started with --api-key)"), { ...cors, "WWW-Authenticate": "Bearer" });
      }
      if (req.method === "GET") {
        if (path.startsWith("/v1/models")) {
          const created = Math.floor(Date.now() / 1000);
          return json(200, dumps({ object: "list", data: [{ id: cfg.modelId, object: "model", created }] }), cors);
        }
        if (path === "/health") return json(200, dumps({ status: "ok" }), cors);
        // this server's: the prompt cache's counters (hits, cached tokens, entries, bytes, snapshots)
        if (path === "/v1/prompt_cache") return json(200, dumps({ object: "prompt_cache.stats", ...(engine.prefixStats?.() ?? {}) }), cors);
        return json(404, "Not Found", cors);
      }
      if (req.method !== "POST") return json(501, errorBody(`Unsupported method ('${req.method}')`), cors);
      const kind = POST_PATHS.get(path);
      if (kind === undefined) return json(404, "Not Found", cors);
      try {
        return await handlePost(req, kind, cors, () => srv.timeout(req, 0));
      } catch (e) {
        if (e instanceof RequestError) return json(e.status, errorBody(e.message), cors);
        cfg.log(`error: ${(e as Error).stack ?? e}`);
        return json(500, errorBody(`internal error: ${(e as Error).message}`), cors);
      }
    },
    error(e) {
      cfg.log(`error: ${e.stack ?? e}`);
      return json(500, errorBody(`internal error: ${e.message}`));
    },
  });

  async function handlePost(req: Request, kind: "text" | "chat", cors: Record<string, string>, noIdleTimeout: () => void): Promise<Response> {
    const created = Math.floor(Date.now() / 1000);
    const lenHeader = req.headers.get("content-length");
    if (lenHeader === null) return json(411, errorBody("Content-Length header is required"), cors);
    const length = /^\d+$/.test(lenHeader.trim()) ? Number(lenHeader.trim()) : Number.NaN;
    if (!Number.isSafeInteger(length)) return json(400, errorBody("Invalid Content-Length header"), cors);
    if (length > cfg.maxBodyBytes) return json(413, errorBody(`the request body (${length} bytes) is larger than this server's limit of ${cfg.maxBodyBytes} bytes (--max-body-bytes)`), cors);
    const raw = new Uint8Array(await req.arrayBuffer());
    let body: PyJson;
    try {
      body = loads(new TextDecoder("utf-8", { fatal: true }).decode(raw));
    } catch (e) {
      return json(400, errorBody(`Invalid JSON in request body: ${(e as Error).message}`), cors);
    }
    if (body === null || typeof body !== "object" || Array.isArray(body) || body instanceof PyFloat) return json(400, errorBody("Request should be a JSON dictionary"), cors);
    const args = readGenerationArgs(body, cfg.defaults, { maxTokensLimit: cfg.maxTokensLimit, vocabSize: cfg.vocabSize, hasDraft: cfg.hasDraft === true });
    if (kind === "chat" && !Object.hasOwn(body, "messages")) throw new RequestError(400, "Request did not contain messages");
    if (kind === "text" && !Object.hasOwn(body, "prompt")) throw new RequestError(400, "Request did not contain a prompt");
    if (args.model !== "default_model" && args.model !== cfg.modelArg && args.model !== cfg.modelId) {
      throw new RequestError(404, `model '${args.model}' is not served here: this server serves only the model it was started with (use "default_model", "${cfg.modelArg}" or "${cfg.modelId}", or leave 'model' out); it never loads another path`);
    }
    let built: Built;
    if (kind === "chat" && cfg.media && hasMedia(body.messages)) built = await tokenizeMedia(body, args);
    else {
      try {
        built = tokenize(kind, body, args);
      } catch (e) {
        throw new RequestError(404, (e as Error).message);
      }
    }
    if (built.prompt.length > cfg.maxPromptTokens) {
      built.media?.dispose();
      throw new RequestError(400, `the prompt has ${built.prompt.length} tokens, more than this server's limit of ${cfg.maxPromptTokens} (--max-prompt-tokens)`);
    }
    const ctx: Ctx = {
      id: `${kind === "chat" ? "chatcmpl" : "cmpl"}-${crypto.randomUUID()}`,
      objectType: kind === "text" ? "text_completion" : args.stream ? "chat.completion.chunk" : "chat.completion",
      created,
      args,
    };
    noIdleTimeout();
    let gone = false;
    req.signal.addEventListener("abort", () => void (gone = true), { once: true });
    const tokens = engine.run({
      prompt: built.prompt,
      maxTokens: args.maxTokens,
      sampler: { temp: args.temperature, topP: args.topP, topK: args.topK, minP: args.minP },
      seed: args.seed,
      numDraftTokens: args.numDraftTokens,
      topLogprobs: args.topLogprobs,
      stop: makeStopSequences(tok.eosTokenIds, args.stopWords, (w) => tok.encode(w, false)),
      cancelled: () => gone || req.signal.aborted,
      tag: ctx.id,
      segments: built.segments,
      ...(built.media ? { media: built.media } : {}),
      segmentTypes: built.segmentTypes,
      onCached: (n) => void (built.cached = n),
    });
    const respond = complete(ctx, built, tokens);
    if (!args.stream) {
      let last = "";
      for await (const chunk of respond) last = chunk;
      if (gone) return new Response(null, { status: 499 });
      return json(200, last, cors);
    }
    // The generation runs to its end whether or not the client reads (chunks are buffered, at most
    // max_tokens of them): a client that stops reading cannot hold the one generation slot.
    const enc = new TextEncoder();
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        void (async () => {
          try {
            for await (const chunk of respond) {
              if (gone) break;
              controller.enqueue(enc.encode(chunk));
            }
            if (!gone) controller.close();
          } catch (e) {
            cfg.log(`error: ${(e as Error).stack ?? e}`);
            if (!gone) controller.error(e);
          }
        })();
      },
      cancel() {
        gone = true;
      },
    });
    return new Response(stream, { status: 200, headers: { "Content-type": "text/event-stream", "Cache-Control": "no-cache", ...cors } });
  }

  /** generate_response: one response object (a whole completion, or one stream chunk). */
  function responseObject(
    ctx: Ctx,
    text: string,
    finishReason: string | null,
    o: { promptTokens?: number; completionTokens?: number; cachedTokens?: number; tokenLogprobs?: number[]; topTokens?: { id: number; token: string; logprob: number }[][]; tokens?: number[]; reasoning?: string; toolCalls?: Out[] } = {},
  ): Out {
    const choice: { [k: string]: Out | undefined } = { index: 0, finish_reason: finishReason };
    const response: { [k: string]: Out | undefined } = {
      id: ctx.id,
      system_fingerprint: cfg.systemFingerprint,
      object: ctx.objectType,
      model: ctx.args.model,
      created: ctx.created,
      choices: [choice],
    };
    const top = o.topTokens ?? [];
    const lps = o.tokenLogprobs ?? [];
    const entry = (e: { id: number; token: string; logprob: number }) => ({ id: e.id, token: e.token, logprob: new PyFloat(e.logprob) });
    if (top.length > 0) {
      // dict(i[0], top_logprobs=i): the step's entry is the FIRST top-k entry (argpartition order), not the sampled token
      choice.logprobs = { content: top.map((t) => (t.length > 0 ? { ...entry(t[0]!), top_logprobs: t.map(entry) } : {})) };
    } else if (lps.length > 0) {
      choice.logprobs = { content: lps.map((g, i) => ({ id: o.tokens![i]!, logprob: new PyFloat(g) })) };
    }
    if (!ctx.args.stream) {
      const usage: { [k: string]: Out } = { prompt_tokens: o.promptTokens!, completion_tokens: o.completionTokens!, total_tokens: o.promptTokens! + o.completionTokens! };
      if (o.cachedTokens !== undefined && o.cachedTokens >= 0) usage.prompt_tokens_details = { cached_tokens: o.cachedTokens };
      response.usage = usage;
    }
    if (ctx.objectType.startsWith("chat.completion")) {
      const key = ctx.args.stream ? "delta" : "message";
      const m: { [k: string]: Out } = { role: "assistant" };
      if (!ctx.args.stream) m.content = text ? text : null;
      else if (text) m.content = text;
      if (o.reasoning) m.reasoning = o.reasoning;
      if (o.toolCalls?.length) m.tool_calls = o.toolCalls;
      choice[key] = m;
    } else choice.text = text;
    return response;
  }

  /** handle_completion: the JSON body (non-streaming) or the SSE chunks, from the request's tokens. */
  async function* complete(ctx: Ctx, built: Pick<Built, "prompt" | "initialState" | "cached">, gen: AsyncGenerator<TokenResponse>): AsyncGenerator<string> {
    const { args } = ctx;
    const sm = makeServedTextStateMachine(tok.thinking, toolCalling, args.stopWords);
    let st = sm.start(built.initialState);
    const toolFormatter = new ToolCallFormatter(args.stream, cfg.log);
    let prevState = built.initialState;
    let madeToolCall = false;
    let toolText = "";
    let toolCalls: string[] = [];
    let finishReason = "stop";
    let reasoning = "";
    let text = "";
    const tokens: number[] = [];
    const tokenLogprobs: number[] = [];
    const top: TokenResponse["topTokens"][] = [];
    let currentState = built.initialState;
    let finished = false;
    const t0 = performance.now();
    let tFirst = 0;
    const what = () => {
      const decodeS = (performance.now() - tFirst) / 1000;
      const timing = tokens.length === 0 ? "" : ` (first token after ${((tFirst - t0) / 1000).toFixed(3)} s incl. queue, then ${tokens.length > 1 && decodeS > 0 ? ((tokens.length - 1) / decodeS).toFixed(1) : "-"} tok/s)`;
      return `${ctx.objectType.startsWith("chat") ? "chat" : "completion"} ${ctx.id}: ${built.prompt.length} prompt tokens, ${tokens.length} generated${timing}`;
    };
    let ended = false;
    try {
      for await (const g of gen) {
        if (tokens.length === 0) tFirst = performance.now();
        let segments: [string, string][];
        if (g.finishReason === "stop") {
          st = sm.discard(st);
          segments = [[st.name, ""]];
        } else if (g.finishReason === "length") {
          [st, segments] = sm.split(st, g.text);
          let flushed: string;
          [st, flushed] = sm.flush(st);
          segments.push([st.name, flushed]);
        } else [st, segments] = sm.split(st, g.text);
        for (const [state, clean] of segments) {
          if (state === "reasoning") reasoning += clean;
          else if (state === "tool") toolText += clean;
          else if (state === "normal") {
            if (prevState === "tool") {
              toolCalls.push(toolText);
              toolText = "";
              madeToolCall = true;
            }
            text += clean;
          }
          currentState = state;
          prevState = state;
        }
        tokens.push(g.token);
        if (args.logprobs) tokenLogprobs.push(g.logprob);
        if (args.topLogprobs > 0) top.push(g.topTokens);
        if (args.stream && currentState !== "tool" && (text || toolCalls.length > 0 || reasoning)) {
          yield `data: ${dumps(responseObject(ctx, text, null, { reasoning, toolCalls: toolFormatter.format(toolCalls) }))}\n\n`;
          reasoning = "";
          text = "";
          toolCalls = [];
        }
        if (g.finishReason !== null) {
          finishReason = g.finishReason;
          finished = true;
        }
      }
      ended = true;
    } catch (e) {
      ended = true; // a failure, not a disconnect: the caller logs it
      throw e;
    } finally {
      await gen.return(undefined);
      // the consumer stopped reading before the end (a stream whose client went away): cancelled too
      if (!ended && !finished) cfg.log(`${what()}, cancelled (client disconnected)`);
    }
    if (!finished) {
      // the client went away: nothing more is sent
      cfg.log(`${what()}, cancelled (client disconnected)`);
      return;
    }
    if (prevState === "tool" && toolText) {
      toolCalls.push(toolText);
      madeToolCall = true;
    }
    if (finishReason === "stop" && madeToolCall) finishReason = "tool_calls";
    cfg.log(`${what()}, finish_reason ${finishReason}`);
    if (args.stream) {
      yield `data: ${dumps(responseObject(ctx, text, finishReason, { reasoning, toolCalls: toolFormatter.format(toolCalls) }))}\n\n`;
      if (args.includeUsage) {
        const usage = { id: ctx.id, system_fingerprint: cfg.systemFingerprint, object: "chat.completion", model: args.model, created: ctx.created, choices: [], usage: { prompt_tokens: built.prompt.length, completion_tokens: tokens.length, total_tokens: built.prompt.length + tokens.length, prompt_tokens_details: { cached_tokens: built.cached ?? 0 } } };
        yield `data: ${dumps(usage)}\n\n`;
      }
      yield "data: [DONE]\n\n";
    } else {
      yield dumps(responseObject(ctx, text, finishReason, { promptTokens: built.prompt.length, completionTokens: tokens.length, cachedTokens: built.cached ?? 0, tokenLogprobs, topTokens: top, tokens, reasoning, toolCalls: toolFormatter.format(toolCalls) }));
    }
  }

  return {
    url: `http://${cfg.host.includes(":") ? `[${cfg.host}]` : cfg.host}:${server.port}`,
    port: server.port!,
    async stop() {
      await server.stop(true);
    },
  };
}

/** TokenizerWrapper._find(reverse=True): the last start of `seq` in `tokens` at or after `start`, or -1. */
function rfind(tokens: readonly number[], seq: readonly number[], start = 0): number {
  for (let i = tokens.length - seq.length; i >= start; i--) {
    let ok = true;
    for (let j = 0; j < seq.length; j++) if (tokens[i + j] !== seq[j]) ok = false;
    if (ok) return i;
  }
  return -1;
}
