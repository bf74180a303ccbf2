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
  let cfg: Record<string, unknown>;
  try {
    cfg = JSON.parse(readFileSync(cfgPath, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new UsageError(`${cfgPath} is not valid JSON: ${(e as Error).message}`);
  }
  const modelType = String(cfg.model_type ?? "");
  if (!GEMMA4_TYPES.has(modelType)) {
    throw new UsageError(`${dir} is not a Gemma 4 checkpoint: config.json has model_type '${modelType || "(missing)"}', expected one of ${[...GEMMA4_TYPES].join(", ")}`);
  }
  const text = (modelType === "gemma4_text" ? cfg : (cfg.text_config as Record<string, unknown> | undefined)) ?? {};
  if (modelType !== "gemma4_text" && cfg.text_config === undefined) throw new UsageError(`${cfgPath}: a ${modelType} checkpoint needs a text_config`);
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

/** Tokenizes a prompt with the checkpoint's tokenizer.json, optionally through its chat template. */
/**
 * `media` (with `chat`): the user turn as mlx-vlm's prompt_utils builds it for gemma4
 * (LIST_WITH_IMAGE_TYPE_TEXT): one {type: image} per image, the text, one {type: audio} per clip.
 */
export async function tokenizePrompt(dir: string, prompt: string, chat: boolean, media?: { images: number; audio: number }): Promise<number[]> {
  const tokPath = join(dir, "tokenizer.json");
  if (!existsSync(tokPath)) throw new UsageError(`--prompt needs ${tokPath}, which is missing (use --tokens 1,2,3 to pass token ids instead)`);
  const cfgPath = join(dir, "tokenizer_config.json");
  const tokCfg = existsSync(cfgPath) ? (JSON.parse(readFileSync(cfgPath, "utf8")) as Record<string, unknown>) : {};
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokPath, "utf8")), tokCfg);
  let text = prompt;
  let addSpecial = true;
  if (chat) {
    const file = join(dir, "chat_template.jinja");
    const template = existsSync(file) ? readFileSync(file, "utf8") : typeof tokCfg.chat_template === "string" ? tokCfg.chat_template : null;
    if (template === null) throw new UsageError(`--chat needs a chat template (chat_template.jinja or tokenizer_config.json's chat_template) in ${dir}`);
    const { Template } = await import("@huggingface/jinja");
    text = new Template(template).render({
      messages: [
        {
          role: "user",
          content: media
            ? [...Array.from({ length: media.images }, () => ({ type: "image" })), { type: "text", text: prompt }, ...Array.from({ length: media.audio }, () => ({ type: "audio" }))]
            : prompt,
        },
      ],
      add_generation_prompt: true,
      bos_token: tokCfg.bos_token ?? "<bos>",
      eos_token: tokCfg.eos_token ?? "<eos>",
    });
    // The template already writes the BOS token.
    addSpecial = false;
  }
  const { ids } = tokenizer.encode(text, { add_special_tokens: addSpecial });
  return Array.from(ids);
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
