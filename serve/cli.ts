// `npm run serve -- --model DIR [flags]`: an OpenAI-compatible HTTP server over the TypeScript
// Gemma 4 port, with mlx_lm.server 0.32.2's API and flag names (see serve/server.ts and the
// README's "Serving" section). Unseeded requests are batched continuously (serve/engine.ts).
// Exit codes: 0 after SIGINT/SIGTERM, 2 bad usage or input (flags, checkpoint, port in use).
import { realpathSync } from "node:fs";
import { createServer } from "node:net";
import * as mx from "@mlx-bun/mlx";
import { batchModel } from "../model/generate_batch.ts";
import { generationModel, loadGenerationModel } from "../model/runtime.ts";
import { loadWithAdapters } from "../model/fuse.ts";
import { AdapterError } from "../model/tuner/utils.ts";
import { checkCheckpoint, loadMultimodalModel } from "../model/gemma4/index.ts";
import { checkpointTowers } from "../parity/media.ts";
import type { ServedMedia } from "./media.ts";
import { type FlagSpec, helpText, parseArgs, runMain, UsageError } from "../parity/args.ts";
import { applyDeviceFlag, DEVICE_FLAG } from "../parity/device.ts";
import { inspectCheckpoint } from "../parity/inputs.ts";
import { Engine } from "./engine.ts";
import { PrefixReuse } from "./prefix_cache.ts";
import { startServer } from "./server.ts";
import { loadServedTokenizer, TokenizerLoadError } from "./tokenizer.ts";
import { toolCallingFor, ToolParserError } from "./tools.ts";

export const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "the local Gemma 4 checkpoint to serve (required; the only model this server serves)" },
  { name: "host", kind: "string", valueName: "addr", help: "address to bind (loopback unless you say otherwise)", default: "127.0.0.1" },
  { name: "port", kind: "int", valueName: "N", help: "port (0: any free port, printed at start)", default: 8080 },
  { name: "api-key", kind: "string", valueName: "key", help: "require 'Authorization: Bearer <key>' on every endpoint but /health (401 otherwise); default: MLX_SERVE_API_KEY if set, else no key" },
  { name: "allowed-origins", kind: "string", valueName: "a,b", help: "CORS origins answered with Access-Control-Allow-Origin ('*' for any); default: none (mlx_lm.server's default is '*')" },
  { name: "temp", kind: "number", valueName: "T", help: "default sampling temperature", default: 0 },
  { name: "top-p", kind: "number", valueName: "P", help: "default nucleus sampling top-p", default: 1 },
  { name: "top-k", kind: "int", valueName: "K", help: "default top-k sampling (0 disables)", default: 0 },
  { name: "min-p", kind: "number", valueName: "P", help: "default min-p sampling (0 disables)", default: 0 },
  { name: "adapter-path", kind: "string", valueName: "dir", help: "LoRA / DoRA / full fine-tuned adapters (adapter_config.json + adapters.safetensors, as mlx_lm.lora writes them) applied to the model for every request" },
  { name: "draft-model", kind: "string", valueName: "dir", help: "a draft Gemma 4 checkpoint with the model's vocabulary for speculative decoding (every request then runs alone, as in mlx_lm.server)" },
  { name: "num-draft-tokens", kind: "int", valueName: "N", help: "default number of draft tokens per round (a request's num_draft_tokens overrides it)", default: 3 },
  { name: "max-tokens", kind: "int", valueName: "N", help: "default maximum number of tokens to generate", default: 512 },
  { name: "chat-template-args", kind: "string", valueName: "json", help: "JSON object of arguments for the chat template, e.g. '{\"enable_thinking\":false}'", default: "{}" },
  { name: "prefill-step-size", kind: "int", valueName: "N", help: "step size for prefill processing", default: 2048 },
  { name: "decode-concurrency", kind: "int", valueName: "N", help: "when a request is batchable, decode that many requests in parallel (BatchGenerator's completion_batch_size)", default: 32 },
  { name: "prompt-concurrency", kind: "int", valueName: "N", help: "when a request is batchable, process that many prompts in parallel (BatchGenerator's prefill_batch_size)", default: 8 },
  { name: "prompt-cache-size", kind: "int", valueName: "N", help: "maximum number of distinct KV caches to hold in the prompt cache (mlx_lm.server's LRUPromptCache)", default: 10 },
  { name: "prompt-cache-bytes", kind: "string", valueName: "size", help: "maximum size in bytes of the KV caches (prompt cache, snapshots and the running batch), e.g. 4GB, 500M; default: no limit" },
  { name: "prompt-cache-snapshots", kind: "int", valueName: "N", help: "beyond mlx_lm.server: keep up to N snapshots of the caches at prefill chunk boundaries, so that a prompt sharing a long prefix past the sliding window is not prefilled again (serve/PREFIX.md)", default: 0 },
  { name: "record-schedule", kind: "string", valueName: "file", help: "write the batch schedule (inserts, removals, each sequence's tokens and logprobs) to this JSON-lines file, for oracle/python/serve_replay.py; seeds unseeded sampling per generator" },
  { name: "max-body-bytes", kind: "int", valueName: "N", help: "largest request body accepted (413 above)", default: 1048576 },
  { name: "max-prompt-tokens", kind: "int", valueName: "N", help: "longest prompt accepted, in tokens (400 above); default: the model's max_position_embeddings" },
  { name: "max-tokens-limit", kind: "int", valueName: "N", help: "largest max_tokens a request may ask for (400 above)", default: 8192 },
  { name: "log-level", kind: "string", valueName: "level", help: "INFO (one line per request) or WARNING/ERROR (errors only)", default: "INFO" },
  DEVICE_FLAG,
  { name: "help", kind: "bool", help: "show this help" },
];

/** mlx_lm.server flags this server does not have yet: named, so that the error says so. */
const NOT_YET = ["trust-remote-code", "chat-template", "use-default-chat-template", "kv-bits", "kv-group-size", "quantized-kv-start", "pipeline"];

function positiveInt(a: Record<string, unknown>, name: string, min = 1): number {
  const v = Number(a[name]);
  if (!Number.isSafeInteger(v) || v < min) throw new UsageError(`--${name} must be an integer >= ${min}, got ${a[name]}`);
  return v;
}

/** mlx_lm.utils._parse_size: digits (and dots), then "", M, MB, G or GB (any case; powers of 10). */
export function parseSize(x: string): number {
  const m = /^([0-9.]*)(.*)$/.exec(x)!;
  const units: Record<string, number> = { "": 1, M: 1e6, MB: 1e6, G: 1e9, GB: 1e9 };
  const unit = units[m[2]!.trim().toUpperCase()];
  const digits = m[1]!;
  if (unit === undefined || !/^(\d+\.?\d*|\.\d+)$/.test(digits)) throw new UsageError(`--prompt-cache-bytes: '${x}' is not a size (digits, then nothing, M, MB, G or GB)`);
  return Math.trunc(Number(digits) * unit);
}

async function checkPortFree(host: string, port: number): Promise<void> {
  if (port === 0) return;
  await new Promise<void>((resolve, reject) => {
    const probe = createServer();
    probe.once("error", (e: NodeJS.ErrnoException) => reject(new UsageError(`cannot listen on ${host}:${port}: ${e.code === "EADDRINUSE" ? `port ${port} is in use` : e.message}`)));
    probe.listen(port, host, () => probe.close(() => resolve()));
  });
}

async function main(argv: string[]): Promise<number> {
  for (const arg of argv) {
    const name = arg.startsWith("--") ? arg.slice(2).split("=")[0]! : "";
    if (NOT_YET.includes(name)) throw new UsageError(`--${name} (an mlx_lm.server flag) is not supported by this server yet`);
  }
  const a = parseArgs(argv, FLAGS);
  if (a.help) {
    process.stdout.write(
      helpText(
        "npm run serve -- --model <dir> [options]",
        "Serves the TypeScript Gemma 4 port over HTTP with mlx_lm.server's API (POST /v1/completions, /v1/chat/completions; GET /v1/models, /health), with continuous batching.",
        FLAGS,
      ),
    );
    return 0;
  }
  if (typeof a.model !== "string") throw new UsageError("--model <dir> is required");
  const dev = applyDeviceFlag(a.device);
  const info = inspectCheckpoint(a.model);
  checkCheckpoint(a.model);
  const port = Number(a.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new UsageError(`--port must be between 0 and 65535, got ${a.port}`);
  const temp = Number(a.temp);
  const topP = Number(a["top-p"]);
  const minP = Number(a["min-p"]);
  if (temp < 0) throw new UsageError("--temp must be >= 0");
  if (topP < 0 || topP > 1) throw new UsageError("--top-p must be between 0 and 1");
  if (minP < 0 || minP > 1) throw new UsageError("--min-p must be between 0 and 1");
  let chatTemplateArgs: unknown;
  try {
    chatTemplateArgs = JSON.parse(String(a["chat-template-args"]));
  } catch (e) {
    throw new UsageError(`--chat-template-args is not valid JSON: ${(e as Error).message}`);
  }
  if (chatTemplateArgs === null || typeof chatTemplateArgs !== "object" || Array.isArray(chatTemplateArgs)) throw new UsageError("--chat-template-args must be a JSON object");
  const level = String(a["log-level"]).toUpperCase();
  if (!["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"].includes(level)) throw new UsageError(`--log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got '${a["log-level"]}'`);
  const verbose = level === "DEBUG" || level === "INFO";
  const apiKey = typeof a["api-key"] === "string" ? a["api-key"] : process.env.MLX_SERVE_API_KEY || null;
  if (apiKey !== null && apiKey.length === 0) throw new UsageError("--api-key must not be empty");
  const maxPromptTokens = a["max-prompt-tokens"] === undefined ? info.maxPositions : positiveInt(a, "max-prompt-tokens");

  const snapshots = positiveInt(a, "prompt-cache-snapshots", 0);
  const prefixOptions = { size: positiveInt(a, "prompt-cache-size", 0), bytes: a["prompt-cache-bytes"] === undefined ? null : parseSize(String(a["prompt-cache-bytes"])), snapshots };

  // a port in use is found before the slow part (tokenizer and weights)
  await checkPortFree(String(a.host), port);
  let tokenizer;
  try {
    tokenizer = await loadServedTokenizer(a.model);
  } catch (e) {
    if (e instanceof TokenizerLoadError) throw new UsageError(e.message);
    throw e;
  }
  try {
    toolCallingFor(tokenizer);
  } catch (e) {
    if (e instanceof ToolParserError) throw new UsageError(`${a.model}: ${e.message}`);
    throw e;
  }
  const adapterPath = typeof a["adapter-path"] === "string" ? a["adapter-path"] : null;
  const draftDir = typeof a["draft-model"] === "string" ? a["draft-model"] : null;
  const numDraftTokens = positiveInt(a, "num-draft-tokens");
  for (const [flag, v] of [["adapter-path", adapterPath], ["draft-model", draftDir]] as const) {
    if (v !== null && typeof a["record-schedule"] === "string") throw new UsageError(`--${flag} cannot be combined with --record-schedule: the replay (oracle/python/serve_replay.py) loads the plain model`);
  }
  let draft = null;
  if (draftDir !== null) {
    const draftInfo = inspectCheckpoint(draftDir);
    checkCheckpoint(draftDir);
    // mlx_lm.server only warns; speculative decoding over two vocabularies is refused here
    if (Number(draftInfo.text.vocab_size) !== Number(info.text.vocab_size)) throw new UsageError(`--draft-model ${draftDir}: vocabulary of ${draftInfo.text.vocab_size} tokens, the model's has ${info.text.vocab_size}`);
  }
  // mlx_lm.utils.load(model, adapter_path=...): the adapters are loaded once, for every request
  let loaded;
  try {
    loaded = adapterPath === null ? loadGenerationModel(a.model).loaded : loadWithAdapters(a.model, adapterPath);
  } catch (e) {
    if (e instanceof AdapterError) throw new UsageError(`--adapter-path ${adapterPath}: ${e.message}`);
    throw e;
  }
  const model = generationModel(loaded);
  if (draftDir !== null) draft = loadGenerationModel(draftDir).model;
  // images and audio in messages (serve/media.ts) when the checkpoint has a tower: its multimodal
  // model is loaded beside the text model (their weights are not shared); not with
  // --record-schedule (the replay has no media) nor with --adapter-path (the towers' model would
  // lack the adapters)
  let media: ServedMedia | null = null;
  if (info.modelType === "gemma4" && typeof a["record-schedule"] !== "string" && adapterPath === null) {
    const towers = checkpointTowers(a.model);
    if (towers.vision || towers.audio) media = { dir: a.model, model: loadMultimodalModel(a.model).model, config: towers.config, towers: { vision: towers.vision, audio: towers.audio } };
  }
  const log = (line: string) => process.stderr.write(`${new Date().toISOString()} ${line}\n`);
  // no max_position_embeddings refusal at insert: mlx_lm.server's BatchGenerator has none (the prompt limit is --max-prompt-tokens)
  const batched = { ...batchModel(loaded), maxPositions: undefined };
  const prefix = new PrefixReuse(prefixOptions);
  const engine = new Engine(model, batched, tokenizer, {
    prefix,
    prefillStepSize: positiveInt(a, "prefill-step-size"),
    prefillBatchSize: positiveInt(a, "prompt-concurrency"),
    completionBatchSize: positiveInt(a, "decode-concurrency"),
    recordSchedule: typeof a["record-schedule"] === "string" ? a["record-schedule"] : null,
    draft,
    log,
    logInfo: verbose ? log : undefined,
  });
  let server;
  try {
    server = startServer(
      {
        host: String(a.host),
        port,
        modelArg: a.model,
        modelId: realpathSync(a.model),
        apiKey,
        allowedOrigins: typeof a["allowed-origins"] === "string" ? a["allowed-origins"].split(",") : [],
        maxBodyBytes: positiveInt(a, "max-body-bytes"),
        maxPromptTokens,
        maxTokensLimit: positiveInt(a, "max-tokens-limit"),
        vocabSize: Number(info.text.vocab_size ?? 262144),
        defaults: { maxTokens: Number(a["max-tokens"]), temp, topP, topK: Number(a["top-k"]), minP, numDraftTokens },
        hasDraft: draft !== null,
        media,
        chatTemplateArgs: chatTemplateArgs as Record<string, unknown>,
        systemFingerprint: `gemma4-parity-serve-${process.platform}-${process.arch}-${dev.device}${dev.gpu ? `-${dev.gpu}` : ""}`,
        log: (line) => (verbose || line.startsWith("error") ? log(line) : undefined),
      },
      engine,
      tokenizer,
    );
  } catch (e) {
    throw new UsageError(`cannot listen on ${a.host}:${port}: ${(e as Error).message}`);
  }
  // The line a caller (or a test) waits for: the address actually bound.
  process.stdout.write(`serving ${realpathSync(a.model)} at ${server.url} (device ${dev.device}${apiKey ? ", API key required" : ""})\n`);
  if (!["127.0.0.1", "localhost", "::1"].includes(String(a.host))) log(`warning: listening on ${a.host}, reachable from other machines${apiKey ? "" : " without an API key"}`);
  await new Promise<void>((done) => {
    const stop = () => {
      engine.close();
      void server.stop().then(done, done);
    };
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
  mx.clearCache();
  return 0;
}

if (import.meta.main) runMain(main);
