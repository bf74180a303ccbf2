// mlx_lm/tuner/datasets.py (mlx-lm 0.32.2): TextDataset, ChatDataset, CompletionsDataset,
// CacheDataset, create_dataset, load_local_dataset; and the slice of the tokenizer they use
// (mlx_lm.tokenizer_utils.load → a Hugging Face tokenizer): encode with special tokens,
// eos_token_id, apply_chat_template (rendered with the checkpoint's Jinja template, trim_blocks
// and lstrip_blocks as transformers renders it, then encoded without special tokens).
//
// A record is processed lazily by CacheDataset on first access, as in Python. CacheDataset's
// itemlen is len() of the raw record, i.e. its key count: iterate_batches sorts by it, which
// keeps the file order (mlx-lm's behaviour, kept).

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { Dataset, Example } from "./trainer.ts";

export type Message = { role: string; content: string; [k: string]: unknown };
export type DataRecord = Record<string, unknown>;

/** What the datasets call on a tokenizer. */
export interface TrainTokenizer {
  readonly eos_token_id: number | null;
  /** tokenizer.encode(text): with the special tokens the post-processor adds (BOS). */
  encode(text: string): number[];
  /** tokenizer.apply_chat_template(messages, tools=, add_generation_prompt=, return_dict=False). */
  apply_chat_template(messages: readonly Message[], opts?: { tools?: unknown; add_generation_prompt?: boolean }): number[];
}

/** A problem with a dataset (file and line named where known). */
export class DatasetError extends Error {
  override readonly name = "DatasetError";
}

interface RawDataset {
  readonly length: number;
  raw(i: number): DataRecord;
  process(d: DataRecord): Example;
}

function str(d: DataRecord, key: string): string {
  const v = d[key];
  if (typeof v !== "string") throw new DatasetError(`record field "${key}" must be a string, got ${JSON.stringify(v)}`);
  return v;
}

export class TextDataset implements RawDataset {
  constructor(
    private readonly data: DataRecord[],
    private readonly tokenizer: TrainTokenizer,
    private readonly text_key = "text",
  ) {}
  get length(): number {
    return this.data.length;
  }
  raw(i: number): DataRecord {
    return this.data[i]!;
  }
  process(d: DataRecord): Example {
    const t = this.tokenizer.encode(str(d, this.text_key));
    const eos = this.tokenizer.eos_token_id;
    if (t[t.length - 1] !== eos) t.push(eos as number);
    return [t, 0];
  }
}

export class ChatDataset implements RawDataset {
  constructor(
    private readonly data: DataRecord[],
    private readonly tokenizer: TrainTokenizer,
    private readonly chat_key = "messages",
    private readonly mask_prompt = false,
  ) {}
  get length(): number {
    return this.data.length;
  }
  raw(i: number): DataRecord {
    return this.data[i]!;
  }
  process(d: DataRecord): Example {
    const messages = d[this.chat_key] as Message[];
    if (!Array.isArray(messages)) throw new DatasetError(`record field "${this.chat_key}" must be a list of messages`);
    const tools = d.tools ?? null;
    const tokens = this.tokenizer.apply_chat_template(messages, { tools });
    if (!this.mask_prompt) return [tokens, 0];
    const add_generation_prompt = messages[messages.length - 1]?.role === "assistant";
    return [tokens, this.tokenizer.apply_chat_template(messages.slice(0, -1), { tools, add_generation_prompt }).length];
  }
}

export class CompletionsDataset implements RawDataset {
  constructor(
    private readonly data: DataRecord[],
    private readonly tokenizer: TrainTokenizer,
    private readonly prompt_key: string,
    private readonly completion_key: string,
    private readonly mask_prompt: boolean,
  ) {}
  get length(): number {
    return this.data.length;
  }
  raw(i: number): DataRecord {
    return this.data[i]!;
  }
  process(d: DataRecord): Example {
    const tools = d.tools ?? null;
    const messages: Message[] = [
      { role: "user", content: str(d, this.prompt_key) },
      { role: "assistant", content: str(d, this.completion_key) },
    ];
    const tokens = this.tokenizer.apply_chat_template(messages, { tools });
    if (!this.mask_prompt) return [tokens, 0];
    return [tokens, this.tokenizer.apply_chat_template(messages.slice(0, -1), { tools, add_generation_prompt: true }).length];
  }
}

/** CacheDataset: processes each record on first access and keeps the result. */
export class CacheDataset implements Dataset {
  private readonly proc: (Example | undefined)[];
  constructor(private readonly data: RawDataset) {
    this.proc = new Array(data.length);
  }
  get length(): number {
    return this.data.length;
  }
  /** len(self._data[idx]): the raw record's key count. */
  itemlen(i: number): number {
    return Object.keys(this.data.raw(i)).length;
  }
  get(i: number): Example {
    return (this.proc[i] ??= this.data.process(this.data.raw(i)));
  }
}

/** The dataset options of the mlx_lm.lora namespace create_dataset reads. */
export interface DatasetConfig {
  mask_prompt?: boolean;
  prompt_feature?: string;
  text_feature?: string;
  completion_feature?: string;
  chat_feature?: string;
}

/** create_dataset: completions if the first record has prompt+completion, chat if messages, text if text. */
export function create_dataset(data: DataRecord[], tokenizer: TrainTokenizer, config: DatasetConfig = {}): RawDataset {
  const mask_prompt = config.mask_prompt ?? false;
  const prompt = config.prompt_feature ?? "prompt";
  const text = config.text_feature ?? "text";
  const completion = config.completion_feature ?? "completion";
  const chat = config.chat_feature ?? "messages";
  const sample = data[0]!;
  if (prompt in sample && completion in sample) return new CompletionsDataset(data, tokenizer, prompt, completion, mask_prompt);
  if (chat in sample) return new ChatDataset(data, tokenizer, chat, mask_prompt);
  if (text in sample) {
    if (mask_prompt) throw new DatasetError("Prompt masking not supported for text dataset.");
    return new TextDataset(data, tokenizer, text);
  }
  throw new DatasetError("Unsupported data format, check the supported formats here:\nhttps://github.com/ml-explore/mlx-lm/blob/main/mlx_lm/LORA.md#Data.");
}

const EMPTY: RawDataset = { length: 0, raw: () => ({}), process: () => [[], 0] };

/** load_local_dataset(data_path, tokenizer, config): {train, valid, test}.jsonl (a missing file is empty). */
export function load_local_dataset(data_path: string, tokenizer: TrainTokenizer, config: DatasetConfig = {}): [RawDataset, RawDataset, RawDataset] {
  const load = (name: string): RawDataset => {
    const file = join(data_path, `${name}.jsonl`);
    if (!existsSync(file)) return EMPTY;
    const lines = readFileSync(file, "utf8").split("\n");
    const data: DataRecord[] = [];
    lines.forEach((l, i) => {
      if (l.trim() === "" && i === lines.length - 1) return;
      try {
        data.push(JSON.parse(l) as DataRecord);
      } catch (e) {
        throw new DatasetError(`${file}:${i + 1}: invalid JSON: ${(e as Error).message}`);
      }
    });
    if (data.length === 0) return EMPTY;
    try {
      return create_dataset(data, tokenizer, config);
    } catch (e) {
      if (e instanceof DatasetError) throw new DatasetError(`${file}: ${e.message}`);
      throw e;
    }
  };
  return [load("train"), load("valid"), load("test")];
}

// ------------------------------------------------------------------ tokenizer

function tokenString(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as { content?: unknown }).content === "string") return (v as { content: string }).content;
  return undefined;
}

/**
 * The checkpoint's tokenizer (tokenizer.json + tokenizer_config.json [+ special_tokens_map.json,
 * chat_template.jinja]) through @huggingface/tokenizers and @huggingface/jinja.
 */
export async function loadTokenizer(dir: string): Promise<TrainTokenizer> {
  const tokPath = join(dir, "tokenizer.json");
  if (!existsSync(tokPath)) throw new DatasetError(`${tokPath}: no tokenizer.json in the model directory (training needs the tokenizer)`);
  const read = (f: string): Record<string, unknown> => (existsSync(join(dir, f)) ? (JSON.parse(readFileSync(join(dir, f), "utf8")) as Record<string, unknown>) : {});
  const cfg = read("tokenizer_config.json");
  const special = { ...read("special_tokens_map.json"), ...cfg };
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const { Template } = await import("@huggingface/jinja");
  const json = JSON.parse(readFileSync(tokPath, "utf8")) as { added_tokens?: { id: number; content: string }[]; model?: { vocab?: unknown } };
  const tok = new Tokenizer(json, cfg);
  const tplFile = join(dir, "chat_template.jinja");
  const template = existsSync(tplFile) ? readFileSync(tplFile, "utf8") : typeof cfg.chat_template === "string" ? cfg.chat_template : null;
  const compiled = template === null ? null : new Template(template);
  const idOf = (t: string | undefined): number | null => {
    if (t === undefined) return null;
    const added = json.added_tokens?.find((a) => a.content === t);
    if (added) return added.id;
    const ids = tok.encode(t, { add_special_tokens: false }).ids;
    return ids.length === 1 ? ids[0]! : null;
  };
  const specials: Record<string, string> = {};
  for (const k of ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]) {
    const s = tokenString(special[k]);
    if (s !== undefined) specials[k] = s;
  }
  return {
    eos_token_id: idOf(specials.eos_token),
    encode: (text) => Array.from(tok.encode(text, { add_special_tokens: true }).ids),
    apply_chat_template(messages, { tools = null, add_generation_prompt = false } = {}) {
      if (messages.length === 0) throw new DatasetError("Cannot apply chat template to an empty conversation. Provide at least one message.");
      if (compiled === null) throw new DatasetError(`${dir}: the tokenizer has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)`);
      // mlx-lm's TokenizerWrapper passes enable_thinking (False without thinking tokens)
      const text = compiled.render({ messages, tools, add_generation_prompt, enable_thinking: false, ...specials });
      return Array.from(tok.encode(text, { add_special_tokens: false }).ids);
    },
  };
}
