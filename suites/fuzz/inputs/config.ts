// Malformed config.json files (flat gemma4_text and the gemma4 wrapper): a valid fixture config
// with one or two values replaced or removed anywhere in the tree (wrong types, zero, negative and
// huge dimensions, inconsistent head counts, bad layer_types and rope_parameters, quantization
// entries), extra fields, or broken JSON text.
import { readFileSync } from "node:fs";
import fc from "fast-check";
import type { Json } from "./safetensors.ts";

export type ConfigSpec = { json: Json } | { text: string };

export function configText(s: ConfigSpec): string {
  return "json" in s ? JSON.stringify(s.json) : s.text;
}

type Obj = { [k: string]: Json };
const isObj = (v: Json | undefined): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

/** Every path (list of keys/indices) to a value in the tree. */
export function paths(v: Json, prefix: (string | number)[] = [], out: (string | number)[][] = []): (string | number)[][] {
  if (prefix.length) out.push(prefix);
  if (Array.isArray(v)) v.forEach((x, i) => paths(x, [...prefix, i], out));
  else if (isObj(v)) for (const k of Object.keys(v)) paths(v[k]!, [...prefix, k], out);
  return out;
}

export function setAt(root: Json, path: (string | number)[], value: Json | undefined): Json {
  const out = JSON.parse(JSON.stringify(root)) as Json;
  let cur = out as Obj | Json[];
  for (const k of path.slice(0, -1)) {
    const next = (cur as Obj)[k as string];
    if (next === null || typeof next !== "object") return out; // an earlier mutation replaced the parent
    cur = next;
  }
  const last = path[path.length - 1]!;
  if (value === undefined) {
    if (Array.isArray(cur)) cur.splice(last as number, 1);
    else delete cur[last as string];
  } else (cur as Obj)[last as string] = value;
  return out;
}

const HUGE: Json[] = [2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53, 1e308, 1e30];
export const value: fc.Arbitrary<Json> = fc.oneof(
  { weight: 3, arbitrary: fc.integer({ min: -3, max: 9 }) },
  { weight: 2, arbitrary: fc.constantFrom<Json>(...HUGE, -(2 ** 31), 0.5, 1.5, -0.0, 1e-300) },
  { weight: 2, arbitrary: fc.constantFrom<Json>(null, true, false, "", "8", "full_attention", "sliding_attention", "gemma4", "proportional", "linear", "yarn") },
  { weight: 1, arbitrary: fc.constantFrom<Json>([], [1], ["full_attention"], {}, { rope_type: "default" }, { __float__: "NaN" }, { __float__: "Infinity" }) },
);

/** Values a config key is known to take, so mutations also make plausible-but-inconsistent configs. */
const KEYS = [
  "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "head_dim", "global_head_dim", "vocab_size",
  "vocab_size_per_layer_input", "num_key_value_heads", "num_global_key_value_heads", "num_kv_shared_layers",
  "hidden_size_per_layer_input", "sliding_window", "sliding_window_pattern", "max_position_embeddings", "rms_norm_eps",
  "final_logit_softcapping", "attention_k_eq_v", "use_double_wide_mlp", "enable_moe_block", "num_experts", "top_k_experts",
  "moe_intermediate_size", "tie_word_embeddings", "layer_types", "rope_parameters", "model_type", "quantization",
  "quantization_config", "text_config", "rope_traditional",
];

const QUANT: fc.Arbitrary<Json> = fc.oneof(
  fc.record({ group_size: value, bits: value }),
  fc.record({ group_size: fc.constantFrom(32, 64, 128, 37), bits: fc.constantFrom(2, 3, 4, 5, 6, 8, 7), mode: fc.constantFrom<Json>("affine", "mxfp4", "nvfp4", "mxfp8", "int3", 4) }),
  fc.record({ group_size: fc.constant(64), bits: fc.constant(4), "model.layers.0.self_attn.q_proj": fc.oneof(value, fc.record({ group_size: value, bits: value })) }),
  fc.record({ group_size: fc.constant(64), bits: fc.constant(4), "model.layers.0.input_layernorm": fc.constant(true) }),
  value,
);
const QUANT_CONFIG: fc.Arbitrary<Json> = fc.oneof(fc.record({ quant_method: fc.constantFrom<Json>("mxfp4", "mxfp8", "gptq", "awq", null, 3) }), value);

/** The object that holds the text model's keys (text_config for the wrapper). */
const textPath = (base: Obj): string[] => (isObj(base.text_config) ? ["text_config"] : []);

export function arbConfig(file: string): fc.Arbitrary<ConfigSpec> {
  const base = JSON.parse(readFileSync(file, "utf8")) as Obj;
  const all = paths(base);
  const tp = textPath(base);
  const replaceAny = fc.tuple(fc.constantFrom(...all), fc.oneof({ weight: 4, arbitrary: value }, { weight: 1, arbitrary: fc.constant(undefined) }));
  const setKey = fc.tuple(fc.constantFrom(...KEYS), value);
  const mutate = fc.oneof(
    { weight: 5, arbitrary: replaceAny.map(([p, v]) => (j: Json) => setAt(j, p, v)) },
    { weight: 3, arbitrary: setKey.map(([k, v]) => (j: Json) => setAt(j, [...tp, k], v)) },
    { weight: 1, arbitrary: fc.tuple(fc.constantFrom("quantization", "quantization_config"), QUANT, QUANT_CONFIG).map(([k, q, qc]) => (j: Json) => setAt(j, [k], k === "quantization" ? q : qc)) },
    { weight: 1, arbitrary: fc.array(fc.constantFrom<Json>("sliding_attention", "full_attention", "sliding", 1), { maxLength: 9 }).map((lt) => (j: Json) => setAt(j, [...tp, "layer_types"], lt)) },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.constantFrom("full_attention", "sliding_attention", "chunked_attention"), fc.record({ rope_type: value, rope_theta: value, partial_rotary_factor: value, factor: value }, { requiredKeys: [] }))
        .map(([t, rp]) => (j: Json) => setAt(j, [...tp, "rope_parameters", t], rp)),
    },
    // heads that do not divide
    { weight: 1, arbitrary: fc.tuple(fc.integer({ min: 1, max: 7 }), fc.integer({ min: 1, max: 7 })).map(([h, kv]) => (j: Json) => setAt(setAt(j, [...tp, "num_attention_heads"], h), [...tp, "num_key_value_heads"], kv)) },
    { weight: 1, arbitrary: fc.string({ maxLength: 12 }).map((k) => (j: Json) => setAt(j, [k || "extra"], 1)) },
  );
  return fc.oneof(
    { weight: 1, arbitrary: fc.constant<ConfigSpec>({ json: base }) },
    { weight: 10, arbitrary: mutate.map((f) => ({ json: f(base) })) },
    { weight: 3, arbitrary: fc.tuple(mutate, mutate).map(([f, g]) => ({ json: g(f(base)) })) },
    { weight: 1, arbitrary: fc.integer({ min: 0, max: JSON.stringify(base).length - 1 }).map((n) => ({ text: JSON.stringify(base).slice(0, n) })) },
    { weight: 1, arbitrary: fc.constantFrom<ConfigSpec>({ text: "" }, { text: "[]" }, { text: "null" }, { text: "42" }, { text: '"gemma4"' }, { text: "{}" }, { text: "\ufeff{}" }, { text: '{"model_type": "gemma4_text"' }) },
  );
}
