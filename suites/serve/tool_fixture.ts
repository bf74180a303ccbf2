// The tool-calling fixture for the serving tests: the tokenizer fixture (a tiny bfloat16 Gemma 4
// over a real 262,144-piece Gemma tokenizer, oracle/python/make_checkpoints.py) with Gemma 4's
// tool-call and thinking markers in its vocabulary and a chat template of this repository's own
// that renders `tools`, assistant tool calls and tool results in Gemma 4's call syntax.
//  - five unused added tokens (<unused0>..<unused4>, ids 6..10, never produced by encoding
//    ordinary text) are renamed "<|tool_call>", "<tool_call|>", "<|\"|>", "<|channel>",
//    "<channel|>": mlx-lm then infers its gemma4 tool parser (the template names both tool-call
//    markers) and the "<|channel>thought" ... "<channel|>" thinking markers (from the vocabulary),
//    as it does for a real Gemma 4 checkpoint;
//  - the weights and config are the tokenizer fixture's (linked, not copied).
// The template is not Google's Gemma 4 template: it is small, written here, and uses only Jinja
// that Python's jinja2 and @huggingface/jinja render alike (explicit whitespace control, no
// tojson), since the point is the server's handling of tools, not template features.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";

export const RENAMED: [string, string][] = [
  ["<unused0>", "<|tool_call>"],
  ["<unused1>", "<tool_call|>"],
  ["<unused2>", '<|"|>'],
  ["<unused3>", "<|channel>"],
  ["<unused4>", "<channel|>"],
];

const NL = "{{ '\\n' }}";
export const TOOL_TEMPLATE = [
  "{{- bos_token -}}",
  "{%- if tools -%}",
  `{{- '<start_of_turn>system' -}}${NL}{{- 'You can call these functions:' -}}`,
  "{%- for tool in tools -%}",
  "{%- set fn = tool['function'] -%}",
  `${NL}{{- '<|tool>declaration:' + fn['name'] + '{description:<|\"|>' + fn['description'] + '<|\"|>,parameters:{' -}}`,
  "{%- for pname in fn['parameters']['properties'] -%}",
  "{{- pname + ':' + fn['parameters']['properties'][pname]['type'] -}}{%- if not loop.last -%}{{- ',' -}}{%- endif -%}",
  "{%- endfor -%}",
  "{{- '}}<tool|>' -}}",
  "{%- endfor -%}",
  `{{- '<end_of_turn>' -}}${NL}`,
  "{%- endif -%}",
  "{%- for message in messages -%}",
  "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}",
  `{{- '<start_of_turn>' + role -}}${NL}`,
  "{%- if message['content'] is string -%}{{- message['content'] | trim -}}{%- endif -%}",
  "{%- if message['tool_calls'] -%}",
  "{%- for call in message['tool_calls'] -%}",
  "{{- '<|tool_call>call:' + call['function']['name'] + '{' -}}",
  "{%- for key in call['function']['arguments'] -%}",
  "{%- set value = call['function']['arguments'][key] -%}",
  "{{- key + ':' -}}{%- if value is string -%}{{- '<|\"|>' + value + '<|\"|>' -}}{%- else -%}{{- value -}}{%- endif -%}",
  "{%- if not loop.last -%}{{- ',' -}}{%- endif -%}",
  "{%- endfor -%}",
  "{{- '}<tool_call|>' -}}",
  "{%- endfor -%}",
  "{%- endif -%}",
  `{{- '<end_of_turn>' -}}${NL}`,
  "{%- endfor -%}",
  `{%- if add_generation_prompt -%}{{- '<start_of_turn>model' -}}${NL}{%- endif -%}`,
].join("");

/** What the fixture is built from: the template, the renames and the source files' sizes and times. */
function stampOf(from: string): string {
  const h = createHash("sha256").update(TOOL_TEMPLATE).update(JSON.stringify(RENAMED));
  for (const f of ["tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"]) {
    const st = statSync(join(from, f));
    h.update(`${f}:${st.size}:${st.mtimeMs}`);
  }
  return h.digest("hex");
}

/** Writes the tool fixture into `out` from the tokenizer fixture in `from` (kept while its stamp matches). */
export function buildToolFixture(from: string, out: string): void {
  const stamp = stampOf(from);
  if (existsSync(join(out, "stamp")) && readFileSync(join(out, "stamp"), "utf8") === stamp) return;
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  const rename = new Map(RENAMED);
  const tok = JSON.parse(readFileSync(join(from, "tokenizer.json"), "utf8")) as { added_tokens: { id: number; content: string }[]; model: { vocab: Record<string, number> } };
  let renamed = 0;
  for (const a of tok.added_tokens) {
    const to = rename.get(a.content);
    if (to === undefined) continue;
    const id = tok.model.vocab[a.content];
    if (id !== a.id) throw new Error(`${a.content}: vocabulary id ${id} differs from the added token's ${a.id}`);
    delete tok.model.vocab[a.content];
    tok.model.vocab[to] = a.id;
    a.content = to;
    renamed++;
  }
  if (renamed !== RENAMED.length) throw new Error(`renamed ${renamed} of ${RENAMED.length} tokens: the tokenizer fixture has changed`);
  writeFileSync(join(out, "tokenizer.json"), JSON.stringify(tok));
  const cfg = JSON.parse(readFileSync(join(from, "tokenizer_config.json"), "utf8")) as { added_tokens_decoder?: Record<string, { content: string }>; chat_template?: string };
  for (const entry of Object.values(cfg.added_tokens_decoder ?? {})) {
    const to = rename.get(entry.content);
    if (to !== undefined) entry.content = to;
  }
  cfg.chat_template = TOOL_TEMPLATE;
  writeFileSync(join(out, "tokenizer_config.json"), JSON.stringify(cfg, null, 2));
  writeFileSync(join(out, "config.json"), readFileSync(join(from, "config.json")));
  for (const f of ["model.safetensors", "model.safetensors.index.json"]) {
    if (existsSync(join(from, f))) symlinkSync(resolve(from, f), join(out, f));
  }
  writeFileSync(join(out, "stamp"), stamp);
}
