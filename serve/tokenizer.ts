// The served checkpoint's tokenizer as mlx_lm.server sees it (mlx_lm/tokenizer_utils.py and
// mlx_lm.utils.load, mlx-lm 0.32.2), over @huggingface/tokenizers and @huggingface/jinja:
//  - encode (with / without the special tokens the post-processor adds), convert_ids_to_tokens;
//  - the chat template (chat_template.jinja, else tokenizer_config.json's chat_template), rendered
//    with the special tokens, `tools`, `add_generation_prompt` and `enable_thinking` (mlx-lm's
//    TokenizerWrapper passes has_thinking unless the request or --chat-template-args say);
//  - eos_token_ids: generation_config.json's eos_token_id, else config.json's, plus the
//    tokenizer's eos_token (TokenizerWrapper adds it);
//  - thinking markers inferred from the vocabulary as _infer_thinking does;
//  - the streaming detokenizer mlx-lm picks from tokenizer.json's decoder: SPM (with or without
//    the leading-space trim) or, for any other decoder, the naive one over tokenizer.decode.
//    mlx-lm's BPE (ByteLevel) detokenizer is not ported: such a checkpoint is refused at start.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

export class TokenizerLoadError extends Error {
  override readonly name = "TokenizerLoadError";
}

export interface StreamingDetokenizer {
  addToken(token: number): void;
  finalize(): void;
  /** The readable text since the last read (mlx-lm's `last_segment`). */
  lastSegment(): string;
}

export interface ServedTokenizer {
  encode(text: string, addSpecialTokens: boolean): number[];
  /** tokenizer.convert_ids_to_tokens(id): the vocabulary piece ("▁the", "<0x0A>", "<eos>"). */
  piece(id: number): string;
  hasChatTemplate: boolean;
  /** apply_chat_template(messages, add_generation_prompt=addGenerationPrompt (True), tools=tools (None), tokenize=False, **kwargs). */
  renderChat(messages: unknown[], kwargs: Record<string, unknown>, addGenerationPrompt?: boolean, tools?: unknown[] | null): string;
  /** The chat template's text (mlx-lm infers the tool parser from it), or null. */
  chatTemplate?: string | null;
  /** tokenizer_config.json's tool_parser_type, when set (it overrides the inference). */
  toolParserType?: string | null;
  eosTokenIds: ReadonlySet<number>;
  /** null when the vocabulary has no thinking markers. */
  thinking: { start: string; end: string; startTokens: number[]; endTokens: number[] } | null;
  newDetokenizer(): StreamingDetokenizer;
}

function readJson(file: string): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(readFileSync(file, "utf8"));
  } catch (e) {
    throw new TokenizerLoadError(`cannot read ${file}: ${(e as Error).message}`);
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw new TokenizerLoadError(`${file} must hold a JSON object`);
  return v as Record<string, unknown>;
}

function tokenString(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as { content?: unknown }).content === "string") return (v as { content: string }).content;
  return undefined;
}

function sameJson(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

const SPM_DECODER = [
  { type: "Replace", pattern: { String: "\u2581" }, content: " " },
  { type: "ByteFallback" },
  { type: "Fuse" },
];

/** mlx-lm's detokenizer choice from tokenizer.json's decoder. */
function detokenizerKind(decoder: unknown): "spm" | "spm-no-trim" | "bpe" | "naive" {
  const d = decoder as { type?: unknown; decoders?: unknown } | null;
  if (d && d.type === "Sequence" && sameJson(d.decoders, [...SPM_DECODER, { type: "Strip", content: " ", start: 1, stop: 0 }])) return "spm";
  if (d && d.type === "Sequence" && sameJson(d.decoders, SPM_DECODER)) return "spm-no-trim";
  if (d && d.type === "ByteLevel") return "bpe";
  return "naive";
}

/** SPMStreamingDetokenizer: pieces as UTF-8 bytes ("<0xNN>" as that byte), "▁" as a space, flushed once the bytes decode without a trailing U+FFFD. */
class SpmDetokenizer implements StreamingDetokenizer {
  private unflushed: number[] = [];
  private text = "";
  private offset = 0;
  private readonly decoder = new TextDecoder("utf-8", { fatal: false });
  constructor(
    private readonly tokenmap: (id: number) => Uint8Array,
    private readonly trimSpace: boolean,
  ) {}
  private tryFlush(force: boolean): void {
    // bytes.replace(b"\xe2\x96\x81", b" ") before decoding, as mlx-lm does
    const u = this.unflushed;
    const bytes: number[] = [];
    for (let i = 0; i < u.length; i++) {
      if (u[i] === 0xe2 && u[i + 1] === 0x96 && u[i + 2] === 0x81) {
        bytes.push(0x20);
        i += 2;
      } else bytes.push(u[i]!);
    }
    const text = this.decoder.decode(Uint8Array.from(bytes));
    if (!force && text.endsWith("\ufffd")) return;
    this.text += !this.text && this.trimSpace && text.startsWith(" ") ? text.slice(1) : text;
    this.unflushed = [];
  }
  addToken(token: number): void {
    for (const b of this.tokenmap(token)) this.unflushed.push(b);
    this.tryFlush(false);
  }
  finalize(): void {
    this.tryFlush(true);
    this.unflushed = [];
  }
  lastSegment(): string {
    const seg = this.text.slice(this.offset);
    this.offset = this.text.length;
    return seg;
  }
}

/** NaiveStreamingDetokenizer: re-decodes the tokens of the current line. */
class NaiveDetokenizer implements StreamingDetokenizer {
  private done = "";
  private current: number[] = [];
  private currentText = "";
  private offset = 0;
  constructor(
    private readonly decode: (ids: number[]) => string,
    private readonly cleanSpaces: boolean,
  ) {}
  addToken(token: number): void {
    this.current.push(token);
  }
  finalize(): void {
    this.done += this.decode(this.current);
    this.current = [];
    this.currentText = "";
  }
  private text(): string {
    if (this.current.length > 0) {
      this.currentText = this.decode(this.current);
      if (this.currentText.endsWith("\ufffd")) this.currentText = this.currentText.replace(/\ufffd+$/u, "");
      else if (this.cleanSpaces && this.currentText.endsWith(" ")) this.currentText = this.currentText.slice(0, -1);
    }
    if (this.currentText.endsWith("\n")) {
      this.done += this.currentText;
      this.current = [];
      this.currentText = "";
    }
    return this.done + this.currentText;
  }
  lastSegment(): string {
    const t = this.text();
    const seg = t.slice(this.offset);
    this.offset = t.length;
    return seg;
  }
}

const THINK_PAIRS: [string, string][] = [
  ["<think>", "</think>"],
  ["<longcat_think>", "</longcat_think>"],
  ["<|think:start|>", "<|think:end|>"],
];

export async function loadServedTokenizer(dir: string): Promise<ServedTokenizer> {
  const tokPath = join(dir, "tokenizer.json");
  if (!existsSync(tokPath)) throw new TokenizerLoadError(`${dir} has no tokenizer.json (the server needs the checkpoint's tokenizer)`);
  const tokJson = readJson(tokPath);
  const cfgPath = join(dir, "tokenizer_config.json");
  const cfg = existsSync(cfgPath) ? readJson(cfgPath) : {};
  const kind = detokenizerKind(tokJson.decoder);
  if (kind === "bpe") throw new TokenizerLoadError(`${tokPath}: a ByteLevel (BPE) decoder; mlx-lm's BPEStreamingDetokenizer is not ported to this server yet`);
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const { Template } = await import("@huggingface/jinja");
  let tok: InstanceType<typeof Tokenizer>;
  try {
    tok = new Tokenizer(tokJson, cfg);
  } catch (e) {
    throw new TokenizerLoadError(`${tokPath}: cannot build the tokenizer: ${(e as Error).message}`);
  }

  // id → piece: the model's vocabulary, then the added tokens (which win, as in HF fast tokenizers)
  const pieces = new Map<number, string>();
  const vocab = (tokJson.model as { vocab?: unknown } | undefined)?.vocab;
  if (Array.isArray(vocab)) vocab.forEach((e, id) => pieces.set(id, String((e as unknown[])[0])));
  else if (vocab && typeof vocab === "object") for (const [p, id] of Object.entries(vocab as Record<string, number>)) pieces.set(id, p);
  const added = (tokJson.added_tokens as { id: number; content: string }[] | undefined) ?? [];
  for (const a of added) pieces.set(a.id, a.content);
  const byPiece = new Map<string, number>();
  for (const [id, p] of pieces) byPiece.set(p, id);
  const piece = (id: number): string => pieces.get(id) ?? "";
  const bytesCache = new Map<number, Uint8Array>();
  const enc = new TextEncoder();
  const tokenmap = (id: number): Uint8Array => {
    let b = bytesCache.get(id);
    if (!b) {
      const p = piece(id);
      b = p.startsWith("<0x") ? Uint8Array.of(Number.parseInt(p.slice(3, 5), 16)) : enc.encode(p);
      bytesCache.set(id, b);
    }
    return b;
  };

  const encode = (text: string, addSpecialTokens: boolean): number[] => Array.from(tok.encode(text, { add_special_tokens: addSpecialTokens }).ids);
  const decode = (ids: number[]): string => tok.decode(ids, { skip_special_tokens: false });

  // special tokens for the template
  const specials: Record<string, string> = {};
  const stmPath = join(dir, "special_tokens_map.json");
  const stm = existsSync(stmPath) ? readJson(stmPath) : {};
  for (const k of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
    const s = tokenString(cfg[k]) ?? tokenString(stm[k]);
    if (s !== undefined) specials[k] = s;
  }

  // eos ids: mlx_lm.utils.load_config (generation_config.json's eos_token_id replaces config.json's) + the tokenizer's eos
  const eos = new Set<number>();
  const addIds = (v: unknown) => {
    if (typeof v === "number") eos.add(v);
    else if (Array.isArray(v)) for (const x of v) if (typeof x === "number") eos.add(x);
  };
  const genPath = join(dir, "generation_config.json");
  let genEos: unknown;
  if (existsSync(genPath)) {
    try {
      genEos = (JSON.parse(readFileSync(genPath, "utf8")) as Record<string, unknown>).eos_token_id;
    } catch {
      genEos = undefined; // mlx-lm ignores a malformed generation_config.json
    }
  }
  addIds(genEos ? genEos : readJson(join(dir, "config.json")).eos_token_id);
  if (specials.eos_token !== undefined && byPiece.has(specials.eos_token)) eos.add(byPiece.get(specials.eos_token)!);

  let thinking: ServedTokenizer["thinking"] = null;
  for (const [s, e] of THINK_PAIRS) {
    if (byPiece.has(s) && byPiece.has(e)) {
      thinking = { start: s, end: e, startTokens: [byPiece.get(s)!], endTokens: [byPiece.get(e)!] };
      break;
    }
  }
  if (!thinking && byPiece.has("<|channel>") && byPiece.has("<channel|>")) {
    const s = "<|channel>thought";
    const e = "<channel|>";
    thinking = { start: s, end: e, startTokens: encode(s, false), endTokens: encode(e, false) };
  }

  const jinjaPath = join(dir, "chat_template.jinja");
  const templateText = existsSync(jinjaPath) ? readFileSync(jinjaPath, "utf8") : typeof cfg.chat_template === "string" ? cfg.chat_template : null;
  let template: InstanceType<typeof Template> | null = null;

  let cleanSpaces = false;
  if (kind === "naive") {
    const probe = encode("a ,b", false);
    cleanSpaces = !decode(probe).includes(" ,");
  }

  return {
    encode,
    piece,
    hasChatTemplate: templateText !== null,
    renderChat(messages, kwargs, addGenerationPrompt = true, tools = null) {
      if (templateText === null) throw new Error("the checkpoint has no chat template");
      template ??= new Template(templateText);
      return template.render({ ...specials, enable_thinking: thinking !== null, ...kwargs, messages, tools, add_generation_prompt: addGenerationPrompt });
    },
    chatTemplate: templateText,
    toolParserType: typeof cfg.tool_parser_type === "string" ? cfg.tool_parser_type : null,
    eosTokenIds: eos,
    thinking,
    newDetokenizer: () => (kind === "naive" ? new NaiveDetokenizer(decode, cleanSpaces) : new SpmDetokenizer(tokenmap, kind === "spm")),
  };
}
