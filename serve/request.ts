// A completion request's parameters, read and validated as mlx_lm.server 0.32.2 reads them
// (APIHandler.do_POST, _validate, validate_model_parameters): the same defaults (the command's
// --max-tokens, --temp, --top-p, --top-k, --min-p), the same order of checks and the same
// messages ("max_tokens must be of type int", "top_p must be at most 1", ...), with Python's
// types: a JSON float literal ("0.5", "1e-3") is a float, an integer literal an int, and a
// bool is also an int (bool subclasses int in Python), so `"max_tokens": true` asks for 1 token.
//
// After mlx-lm's own checks, this server's (each a 400 with {"error": ...}): features not ported
// yet (logits processors, XTC, per-request adapters and draft models), `stop` and `stream_options` of a
// wrong type (mlx_lm.server fails later on them), and the --max-tokens-limit bound.
import { PyFloat, type PyJson } from "./json.ts";

export class RequestError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = "RequestError";
  }
}

/** The command-line defaults a request falls back on (mlx_lm.server's argparse defaults). */
export interface RequestDefaults {
  maxTokens: number;
  temp: number;
  topP: number;
  topK: number;
  minP: number;
  numDraftTokens: number;
}

export interface GenerationArgs {
  stream: boolean;
  includeUsage: boolean;
  /** The request's `model` field as given ("default_model" when absent): echoed in responses. */
  model: string;
  maxTokens: number;
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  logprobs: boolean;
  topLogprobs: number;
  seed: number | null;
  /** num_draft_tokens (used only when the server has a draft model). */
  numDraftTokens: number;
  stopWords: string[];
  chatTemplateKwargs: Record<string, unknown> | null;
}

type PyType = "bool" | "int" | "float" | "str" | "dict";

function isType(v: PyJson | undefined, t: PyType): boolean {
  switch (t) {
    case "bool":
      return typeof v === "boolean";
    case "int":
      return typeof v === "number" || typeof v === "boolean";
    case "float":
      return v instanceof PyFloat;
    case "str":
      return typeof v === "string";
    case "dict":
      return v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof PyFloat);
  }
}

/** The numeric value Python compares (True == 1). */
function num(v: PyJson | undefined): number {
  if (v instanceof PyFloat) return v.value;
  if (typeof v === "boolean") return v ? 1 : 0;
  return v as number;
}

interface Check {
  name: string;
  value: PyJson | undefined;
  types: PyType[];
  min?: number;
  max?: number;
  optional?: boolean;
  whitelist?: number[];
}

/** APIHandler._validate. */
function validate(c: Check): void {
  if (c.optional && (c.value === null || c.value === undefined)) return;
  if (!c.types.some((t) => isType(c.value, t))) {
    const allowed = c.types.length === 1 ? c.types[0] : `(${c.types.map((t) => `'${t}'`).join(", ")})`;
    throw new RequestError(400, `${c.name} must be of type ${allowed}`);
  }
  if (c.types.includes("dict") || c.types.includes("str") || c.types.includes("bool")) {
    if (c.min === undefined && c.max === undefined) return;
  }
  const x = num(c.value);
  if (c.whitelist?.includes(x) && typeof c.value === "number") return;
  if (c.min !== undefined && x < c.min) throw new RequestError(400, `${c.name} must be at least ${c.min}`);
  if (c.max !== undefined && x > c.max) throw new RequestError(400, `${c.name} must be at most ${c.max}`);
}

/** body.get(key, default): an explicit null stays null. */
function get(body: Record<string, PyJson>, key: string, dflt: PyJson): PyJson {
  return Object.hasOwn(body, key) ? body[key]! : dflt;
}

const f = (x: number) => new PyFloat(x);

export function readGenerationArgs(body: Record<string, PyJson>, d: RequestDefaults, limits: { maxTokensLimit: number; vocabSize: number; hasDraft?: boolean }): GenerationArgs {
  const stream = get(body, "stream", false);
  const streamOptions = get(body, "stream_options", null);
  const model = get(body, "model", "default_model");
  const draftModel = get(body, "draft_model", "default_model");
  const numDraft = get(body, "num_draft_tokens", d.numDraftTokens);
  const adapter = get(body, "adapters", null);
  let maxTokens = get(body, "max_completion_tokens", null);
  if (maxTokens === null) maxTokens = get(body, "max_tokens", d.maxTokens);
  const temperature = get(body, "temperature", f(d.temp));
  const topP = get(body, "top_p", f(d.topP));
  const topK = get(body, "top_k", d.topK);
  const minP = get(body, "min_p", f(d.minP));
  const repetitionPenalty = get(body, "repetition_penalty", f(0));
  const repetitionContext = get(body, "repetition_context_size", 20);
  const presencePenalty = get(body, "presence_penalty", f(0));
  const presenceContext = get(body, "presence_context_size", 20);
  const frequencyPenalty = get(body, "frequency_penalty", f(0));
  const frequencyContext = get(body, "frequency_context_size", 20);
  const xtcProbability = get(body, "xtc_probability", f(0));
  const xtcThreshold = get(body, "xtc_threshold", f(0.1));
  const logitBias = get(body, "logit_bias", null);
  const logprobs = get(body, "logprobs", false);
  const topLogprobs = get(body, "top_logprobs", -1);
  const seed = get(body, "seed", null);
  const chatTemplateKwargs = get(body, "chat_template_kwargs", null);

  const checks: Check[] = [
    { name: "stream", value: stream, types: ["bool"] },
    { name: "max_tokens", value: maxTokens, types: ["int"], min: 1 },
    { name: "temperature", value: temperature, types: ["float", "int"], min: 0 },
    { name: "top_p", value: topP, types: ["float", "int"], min: 0, max: 1 },
    { name: "top_k", value: topK, types: ["int"], min: 0 },
    { name: "min_p", value: minP, types: ["float", "int"], min: 0, max: 1 },
    { name: "num_draft_tokens", value: numDraft, types: ["int"], min: 0 },
    { name: "repetition_penalty", value: repetitionPenalty, types: ["float", "int"], min: 0 },
    { name: "repetition_context_size", value: repetitionContext, types: ["int"], min: 0 },
    { name: "presence_penalty", value: presencePenalty, types: ["float", "int"] },
    { name: "presence_context_size", value: presenceContext, types: ["int"], min: 0 },
    { name: "frequency_penalty", value: frequencyPenalty, types: ["float", "int"] },
    { name: "frequency_context_size", value: frequencyContext, types: ["int"], min: 0 },
    { name: "logprobs", value: logprobs, types: ["bool"] },
    { name: "top_logprobs", value: topLogprobs, types: ["int"], min: 0, max: 11, whitelist: [-1] },
    { name: "xtc_probability", value: xtcProbability, types: ["float"], min: 0, max: 1 },
    { name: "xtc_threshold", value: xtcThreshold, types: ["float"], min: 0, max: 1 },
    { name: "requested_model", value: model, types: ["str"] },
    { name: "adapter", value: adapter, types: ["str"], optional: true },
    { name: "seed", value: seed, types: ["int"], optional: true },
    { name: "logit_bias", value: logitBias, types: ["dict"], optional: true },
  ];
  for (const c of checks) validate(c);
  if (logitBias !== null) {
    for (const [k, v] of Object.entries(logitBias as Record<string, PyJson>)) {
      // {int(k): float(v)}: int("12") and float(1), float("0.5") succeed in Python
      const keyOk = /^\s*[+-]?\d+\s*$/.test(k);
      const valOk = typeof v === "number" || typeof v === "boolean" || v instanceof PyFloat || (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v)));
      if (!keyOk || !valOk) throw new RequestError(400, "logit_bias must be a dict of int to float");
    }
  }

  // ---- this server's own checks, after mlx-lm's
  const unsupported = (what: string): never => {
    throw new RequestError(400, `${what} is not supported by this server yet`);
  };
  if (logitBias !== null && Object.keys(logitBias as object).length > 0) unsupported("logit_bias");
  if (num(repetitionPenalty) !== 0) unsupported("repetition_penalty");
  if (num(presencePenalty) !== 0) unsupported("presence_penalty");
  if (num(frequencyPenalty) !== 0) unsupported("frequency_penalty");
  if (num(xtcProbability) > 0 && num(temperature) !== 0) unsupported("xtc_probability (XTC sampling)");
  // a request cannot make this server load adapters or a draft model from a path (--adapter-path / --draft-model do, at start)
  if (adapter !== null) throw new RequestError(400, "adapters: a request cannot name adapters here (this server never loads a path a request names); start the server with --adapter-path");
  if (draftModel !== "default_model") throw new RequestError(400, "draft_model: a request cannot name a draft model here (this server never loads a path a request names); start the server with --draft-model");
  if (limits.hasDraft && num(numDraft) < 1) throw new RequestError(400, "num_draft_tokens must be at least 1 with a draft model (this server)");
  if (streamOptions !== null && !isType(streamOptions, "dict")) throw new RequestError(400, "stream_options must be of type dict");
  if (chatTemplateKwargs !== null && !isType(chatTemplateKwargs, "dict")) throw new RequestError(400, "chat_template_kwargs must be of type dict");
  const rawStop = get(body, "stop", null);
  let stopWords: string[];
  if (rawStop === null || rawStop === "" || rawStop === false || (Array.isArray(rawStop) && rawStop.length === 0)) stopWords = [];
  else if (typeof rawStop === "string") stopWords = [rawStop];
  else if (Array.isArray(rawStop) && rawStop.every((w) => typeof w === "string")) stopWords = rawStop as string[];
  else throw new RequestError(400, "stop must be a string or a list of strings");
  for (const [name, v] of [["temperature", temperature], ["top_p", topP], ["min_p", minP]] as const) {
    if (!Number.isFinite(num(v))) throw new RequestError(400, `${name} must be a finite number`);
  }
  if (seed !== null && !(Number.isSafeInteger(num(seed)) && num(seed) >= 0)) throw new RequestError(400, "seed must be a non-negative integer below 2**53");
  const n = num(maxTokens);
  if (n > limits.maxTokensLimit) throw new RequestError(400, `max_tokens is ${n}, more than this server's limit of ${limits.maxTokensLimit} (--max-tokens-limit)`);
  const k = num(topK);
  if (num(temperature) !== 0 && k >= limits.vocabSize) throw new RequestError(400, `\`top_k\` has to be an integer in the (0, ${limits.vocabSize}) interval, but is ${k}.`);
  const so = streamOptions as Record<string, PyJson> | null;
  return {
    stream: stream === true,
    includeUsage: so !== null && !!so.include_usage,
    model: model as string,
    maxTokens: n,
    temperature: num(temperature),
    topP: num(topP),
    topK: k,
    minP: num(minP),
    logprobs: logprobs === true,
    topLogprobs: num(topLogprobs),
    seed: seed === null ? null : num(seed),
    numDraftTokens: num(numDraft),
    stopWords,
    chatTemplateKwargs: chatTemplateKwargs as Record<string, unknown> | null,
  };
}
