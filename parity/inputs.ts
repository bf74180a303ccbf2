// User inputs of the parity and generate commands: the checkpoint directory and the prompt.
// Every problem becomes one UsageError with a message a user can act on.
import { accessSync, constants, existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { UsageError } from "./args.ts";

const GEMMA4_TYPES = new Set(["gemma4", "gemma4_text", "gemma4_unified"]);

export interface CheckpointInfo {
  dir: string;
  modelType: string;
  /** The text config (text_config for wrappers). */
  text: Record<string, unknown>;
  maxPositions: number;
}

export function inspectCheckpoint(dir: string): CheckpointInfo {
  if (!existsSync(dir)) throw new UsageError(`checkpoint directory not found: ${dir}`);
  if (!statSync(dir).isDirectory()) throw new UsageError(`not a directory: ${dir}`);
  try {
    accessSync(dir, constants.R_OK | constants.X_OK);
    readdirSync(dir);
  } catch {
    throw new UsageError(`cannot read the checkpoint directory ${dir} (permission denied)`);
  }
  const cfgPath = join(dir, "config.json");
  if (!existsSync(cfgPath)) throw new UsageError(`${dir} has no config.json, so it is not a Hugging Face / MLX checkpoint`);
  const parsed = readJson(cfgPath);
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new UsageError(`${cfgPath} must hold a JSON object`);
  const cfg = parsed as Record<string, unknown>;
  const modelType = String(cfg.model_type ?? "");
  if (!GEMMA4_TYPES.has(modelType)) {
    throw new UsageError(`${dir} is not a Gemma 4 checkpoint: config.json has model_type '${modelType || "(missing)"}', expected one of ${[...GEMMA4_TYPES].join(", ")}`);
  }
  const tc = cfg.text_config;
  if (modelType !== "gemma4_text" && (tc === null || typeof tc !== "object" || Array.isArray(tc))) throw new UsageError(`${cfgPath}: a ${modelType} checkpoint needs a text_config object`);
  const text = (modelType === "gemma4_text" ? cfg : (tc as Record<string, unknown>));
  if (!readdirSync(dir).some((f) => /^model.*\.safetensors$/.test(f))) throw new UsageError(`${dir} has no model*.safetensors weights`);
  // mlx-lm's default when the key is absent.
  const maxPositions = Number(text.max_position_embeddings ?? 131072);
  return { dir, modelType, text, maxPositions };
}

export function parseTokenList(s: string): number[] {
  const ids = s.split(",").map((t) => t.trim()).filter((t) => t.length > 0).map(Number);
  if (ids.length === 0 || ids.some((n) => !Number.isInteger(n) || n < 0)) throw new UsageError(`--tokens needs comma-separated non-negative integers, got '${s}'`);
  return ids;
}

/** The special-token names transformers passes to a chat template (PreTrainedTokenizerBase.special_tokens_map). */
const SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

export interface ChatMessage {
  role: string;
  content: unknown;
  [k: string]: unknown;
}

export interface CheckpointTokenizer {
  encode(text: string, addSpecialTokens: boolean): number[];
  decode(ids: number[], skipSpecialTokens: boolean): string;
  /** tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...) */
  renderChat(messages: ChatMessage[], addGenerationPrompt: boolean): string;
  /** The chat template's file, or null when the checkpoint has none. */
  templateFile: string | null;
}

function readJson(file: string): unknown {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new UsageError(`cannot read ${file}: ${(e as Error).message}`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new UsageError(`${file} is not valid JSON: ${(e as Error).message}`);
  }
}

/**
 * The checkpoint's tokenizer (tokenizer.json + tokenizer_config.json) and chat template
 * (chat_template.jinja, else tokenizer_config.json's chat_template), as transformers reads them.
 * A file that cannot be read, parsed or used is one UsageError naming it.
 */
export async function loadTokenizer(dir: string): Promise<CheckpointTokenizer> {
  const tokPath = join(dir, "tokenizer.json");
  if (!existsSync(tokPath)) throw new UsageError(`--prompt needs ${tokPath}, which is missing (use --tokens 1,2,3 to pass token ids instead)`);
  const cfgPath = join(dir, "tokenizer_config.json");
  const tokJson = readJson(tokPath);
  const cfgJson = existsSync(cfgPath) ? readJson(cfgPath) : {};
  if (tokJson === null || typeof tokJson !== "object" || Array.isArray(tokJson)) throw new UsageError(`${tokPath} must hold a JSON object`);
  if (cfgJson === null || typeof cfgJson !== "object" || Array.isArray(cfgJson)) throw new UsageError(`${cfgPath} must hold a JSON object`);
  const tokCfg = cfgJson as Record<string, unknown>;
  const { Tokenizer } = await import("@huggingface/tokenizers");
  let tokenizer: InstanceType<typeof Tokenizer>;
  try {
    tokenizer = new Tokenizer(tokJson as Record<string, unknown>, tokCfg);
  } catch (e) {
    throw new UsageError(`${tokPath}: cannot build the tokenizer: ${(e as Error).message}`);
  }
  const jinjaFile = join(dir, "chat_template.jinja");
  const templateFile = existsSync(jinjaFile) ? jinjaFile : typeof tokCfg.chat_template === "string" ? cfgPath : null;
  const templateText = templateFile === jinjaFile ? readFileSync(jinjaFile, "utf8") : (tokCfg.chat_template as string | undefined);
  // special tokens as strings (an AddedToken dict gives its content)
  const specials: Record<string, string> = {};
  for (const k of SPECIAL_TOKENS) {
    const v = tokCfg[k];
    if (typeof v === "string") specials[k] = v;
    else if (v && typeof v === "object" && typeof (v as { content?: unknown }).content === "string") specials[k] = (v as { content: string }).content;
  }
  const { Template } = await import("@huggingface/jinja");
  let template: InstanceType<typeof Template> | null = null;
  return {
    templateFile,
    encode(text, addSpecialTokens) {
      let ids: ArrayLike<number>;
      try {
        ids = tokenizer.encode(text, { add_special_tokens: addSpecialTokens }).ids;
      } catch (e) {
        throw new UsageError(`${tokPath}: tokenizing failed: ${(e as Error).message}`);
      }
      const out = Array.from(ids);
      const bad = out.find((t) => !Number.isSafeInteger(t) || t < 0);
      if (bad !== undefined) throw new UsageError(`${tokPath}: the tokenizer produced an invalid token id ${String(bad)} (is a piece missing from the vocabulary?)`);
      return out;
    },
    decode(ids, skipSpecialTokens) {
      try {
        return tokenizer.decode(ids, { skip_special_tokens: skipSpecialTokens });
      } catch (e) {
        throw new UsageError(`${tokPath}: decoding failed: ${(e as Error).message}`);
      }
    },
    renderChat(messages, addGenerationPrompt) {
      if (templateFile === null || templateText === undefined) throw new UsageError(`--chat needs a chat template (chat_template.jinja or tokenizer_config.json's chat_template) in ${dir}`);
      try {
        template ??= new Template(templateText);
        // @huggingface/jinja defines the globals transformers adds (raise_exception, strftime_now, namespace)
        return template.render({ ...specials, messages, add_generation_prompt: addGenerationPrompt });
      } catch (e) {
        throw new UsageError(`${templateFile}: chat template: ${(e as Error).message}`);
      }
    },
  };
}

/** Tokenizes a prompt with the checkpoint's tokenizer.json, optionally through its chat template. */
export async function tokenizePrompt(dir: string, prompt: string, chat: boolean): Promise<number[]> {
  const tok = await loadTokenizer(dir);
  // The chat template writes the BOS token itself.
  if (chat) return tok.encode(tok.renderChat([{ role: "user", content: prompt }], true), false);
  return tok.encode(prompt, true);
}

export function checkPromptLength(ids: readonly number[], steps: number, info: CheckpointInfo): void {
  if (ids.length + steps > info.maxPositions) {
    throw new UsageError(`the prompt (${ids.length} tokens) plus ${steps} decode steps exceeds the model's max_position_embeddings (${info.maxPositions})`);
  }
}

/** The prompt of a --model command from --tokens, or --prompt (with --chat): token ids. */
export async function resolvePrompt(dir: string, a: { prompt?: unknown; tokens?: unknown; chat?: unknown }): Promise<number[]> {
  if (a.prompt !== undefined && a.tokens !== undefined) throw new UsageError("give either --prompt or --tokens, not both");
  if (a.chat && a.prompt === undefined) throw new UsageError("--chat needs --prompt");
  if (typeof a.tokens === "string") return parseTokenList(a.tokens);
  if (typeof a.prompt === "string") return tokenizePrompt(dir, a.prompt, a.chat === true);
  throw new UsageError('give a prompt: --prompt "text" or --tokens 1,2,3');
}
