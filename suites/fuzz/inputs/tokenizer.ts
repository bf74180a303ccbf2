// Malformed tokenizer files and chat templates: a tiny tokenizer.json of the Gemma layout (BPE
// with byte fallback, the normalizer, post-processor and decoder of Google's Gemma 3 file) and a
// Gemma-style chat template, each with values replaced or removed anywhere in the tree, broken
// JSON text, or template text cut, spliced or given failing expressions; and odd prompts.
import fc from "fast-check";
import { paths, setAt, value } from "./config.ts";
import type { Json } from "./safetensors.ts";

const special = (id: number, content: string): Json => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"];
const vocab: Record<string, number> = {};
SPECIALS.forEach((t, i) => (vocab[t] = i));
for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = SPECIALS.length + b;
for (const p of ["▁", "a", "b", "c", "h", "e", "l", "o", "▁a", "ab", "he", "ll", "hell", "hello", "▁hello"]) vocab[p] = Object.keys(vocab).length;

export const TINY_TOKENIZER: Json = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: SPECIALS.map((t, i) => special(i, t)),
  normalizer: { type: "Replace", pattern: { String: " " }, content: "▁" },
  pre_tokenizer: { type: "Split", pattern: { String: " " }, behavior: "MergedWithPrevious", invert: false },
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<bos>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ SpecialToken: { id: "<bos>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { "<bos>": { id: "<bos>", ids: [2], tokens: ["<bos>"] } },
  },
  decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" }] },
  model: {
    type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
    vocab,
    merges: [["▁", "a"], ["a", "b"], ["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"], ["▁", "hello"]],
  },
};

export const TEMPLATE = `{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}`;
const CONFIG: Json = { add_bos_token: true, bos_token: "<bos>", eos_token: "<end_of_turn>", pad_token: "<pad>", unk_token: "<unk>", tokenizer_class: "GemmaTokenizer", chat_template: TEMPLATE };

export interface TokenizerSpec {
  tokenizer: { json: Json } | { text: string } | null;
  config: { json: Json } | { text: string } | null;
  /** chat_template.jinja (takes precedence over the config's chat_template). */
  jinja: string | null;
  prompt: string;
  chat: boolean;
}

function mutateJson(base: Json, extraValues: fc.Arbitrary<Json>): fc.Arbitrary<{ json: Json } | { text: string }> {
  const all = paths(base);
  const v = fc.oneof(value, extraValues);
  const one = fc.tuple(fc.constantFrom(...all), fc.oneof({ weight: 4, arbitrary: v }, { weight: 1, arbitrary: fc.constant(undefined) })).map(([p, x]) => (j: Json) => setAt(j, p, x));
  const text = JSON.stringify(base);
  return fc.oneof(
    { weight: 2, arbitrary: fc.constant({ json: base }) },
    { weight: 8, arbitrary: one.map((f) => ({ json: f(base) })) },
    { weight: 3, arbitrary: fc.tuple(one, one).map(([f, g]) => ({ json: g(f(base)) })) },
    { weight: 1, arbitrary: fc.integer({ min: 0, max: text.length - 1 }).map((n) => ({ text: text.slice(0, n) })) },
    { weight: 1, arbitrary: fc.constantFrom({ text: "" }, { text: "[]" }, { text: "null" }, { text: "\ufeff{}" }) },
  );
}

const FRAGMENTS = ["{{", "}}", "{%", "%}", "{% if %}", "{% endfor %}", "{% for x in %}", "{{ undefined_name.attr }}", "{{ messages[99]['content'] }}", "{{ raise_exception('bad template') }}", "{{ 1 / 0 }}", "{{ bos_token | no_such_filter }}", "{{ strftime_now('%Y') }}", "{% set x = namespace(a=1) %}{{ x.a }}", "{{ messages | tojson }}", "{% macro m() %}", "{{ 'a' ~ 1 }}", "{#", "{% raw %}", "{{ ''.join(['a']) }}", "{% for i in range(3) %}{{ i }}{% endfor %}", "{{ messages[0]['content'][0]['text'] }}"];
const template: fc.Arbitrary<string> = fc.oneof(
  { weight: 2, arbitrary: fc.constant(TEMPLATE) },
  { weight: 3, arbitrary: fc.tuple(fc.integer({ min: 0, max: TEMPLATE.length }), fc.constantFrom(...FRAGMENTS)).map(([i, f]) => TEMPLATE.slice(0, i) + f + TEMPLATE.slice(i)) },
  { weight: 2, arbitrary: fc.integer({ min: 0, max: TEMPLATE.length - 1 }).map((n) => TEMPLATE.slice(0, n)) },
  { weight: 1, arbitrary: fc.constantFrom(...FRAGMENTS) },
  { weight: 1, arbitrary: fc.string({ maxLength: 30 }) },
);
const prompt = fc.oneof(
  fc.constantFrom("hello", "", " ", "a b  c", "<bos>", "<start_of_turn>user", "日本語 😀", "\u0000\u0001", "\ud800", "x".repeat(2000)),
  fc.string({ maxLength: 40, unit: "binary" }),
);

export function arbTokenizer(): fc.Arbitrary<TokenizerSpec> {
  return fc.record({
    tokenizer: fc.oneof({ weight: 12, arbitrary: mutateJson(TINY_TOKENIZER, fc.constantFrom<Json>({ type: "WordPiece" }, { type: "Unigram", vocab: [] }, { "▁": -1 }, [["a"]], { type: "BPE" })) }, { weight: 1, arbitrary: fc.constant(null) }),
    config: fc.oneof({ weight: 8, arbitrary: mutateJson(CONFIG, template) }, { weight: 1, arbitrary: fc.constant(null) }),
    jinja: fc.oneof({ weight: 3, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: template }),
    prompt,
    chat: fc.boolean(),
  });
}
