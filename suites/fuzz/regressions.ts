// What the fuzz suite found, kept as fixed inputs (each run in the worker process, so a
// regression that aborts again is counted, not fatal): the input, the target that reads it, the
// verdict it must now get, and what it did before the fix.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Verdict } from "./runner.ts";
import { FIXTURE, WRAP_FIXTURE } from "./targets.ts";

export interface Regression {
  was: string;
  target: string;
  input: unknown;
  expect: Extract<Verdict, "ok" | "clear">;
}

const config = (dir: string) => JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
const arr = (shape: number[], dtype: string, seed: number) => ({ arr: { shape, dtype, seed } });

export function regressions(): Regression[] {
  const c1 = config(FIXTURE);
  const wrap = config(WRAP_FIXTURE);
  const { layer_types: _drop, ...noLayerTypes } = c1;
  return [
    { was: "SIGSEGV: mx.depends with no inputs (Python's mx.depends([], deps) segfaults too)", target: "ops/binding", expect: "clear", input: { op: "depends", args: [{ arrs: [] }, { arrs: [arr([3], "float32", 52).arr] }] } },
    { was: "SIGFPE: group_size -0.5 reached MLX as 0", target: "ops/binding", expect: "clear", input: { op: "quantizeRoundTrip", args: [arr([4, 128], "bfloat16", 359), { obj: { groupSize: { num: -0.5 }, bits: { num: 4 }, mode: { str: "mxfp4" } } }, { obj: { groupSize: { num: 16 }, bits: { num: 8 }, mode: { str: "mxfp8" } } }, arr([3, 32], "float32", 984)] } },
    { was: "SIGSEGV: take with out-of-range (negative-as-uint32) indices read outside the array", target: "ops/binding", expect: "clear", input: { op: "take", args: [arr([4], "bool", 171), arr([4, 4, 3], "uint32", 673), { num: -1 }] } },
    { was: "a half-written file: save_safetensors met a float64 array after writing the header", target: "ops/binding", expect: "clear", input: { op: "saveSafetensors", args: [{ str: "ok.safetensors" }, { obj: { κ: arr([3], "float64", 278) } }, { obj: { "": { str: "mlx" } } }] } },
    { was: "the range check must not refuse a valid dynamic slice update (start 1 of room 2)", target: "ops/binding", expect: "ok", input: { op: "sliceUpdateDynamic", args: [arr([4, 4], "float32", 1), arr([2, 4], "float32", 2), arr([1], "int32", 5), { nums: [0] }] } },
    { was: "(guard) a dynamic slice update past the end (start 3 of room 2)", target: "ops/binding", expect: "clear", input: { op: "sliceUpdateDynamic", args: [arr([4, 4], "float32", 1), arr([2, 4], "float32", 2), arr([1], "int32", 7), { nums: [0] }] } },
    { was: "the range check must not refuse a valid dynamic slice", target: "ops/binding", expect: "ok", input: { op: "sliceDynamic", args: [arr([4, 4], "float32", 1), arr([1], "int32", 5), { nums: [0] }, { nums: [2, 4] }] } },
    { was: "a leaked handle and silent data loss: tensor names 'a' and 'a\\0b' read back as the same key", target: "safetensors/binding", expect: "clear", input: { header: { json: { __metadata__: { format: "mlx" }, a: { dtype: "F32", shape: [2, 3], data_offsets: [0, 24] }, "a\u0000b": { dtype: "I32", shape: [4], data_offsets: [24, 40] } } }, body: { bytes: 48 } } },
    { was: "TypeError: a header [null] reached Object.entries", target: "checkpoint/safetensors", expect: "clear", input: { fixture: FIXTURE, safetensors: { header: { json: [null] }, body: { file: join(FIXTURE, "model.safetensors") } } } },
    { was: "176 leaked handles: the loader did not free the model it built when the weights did not match", target: "checkpoint/config", expect: "clear", input: { fixture: FIXTURE, config: { json: { ...c1, intermediate_size: 96 } } } },
    { was: "2 leaked handles per load: Model.dispose left the RoPE frequencies", target: "checkpoint/config", expect: "ok", input: { fixture: FIXTURE, config: { json: c1 } } },
    { was: "MlxError from deep in the model and leaked handles: num_attention_heads 1e308 passed as an integer", target: "checkpoint/config", expect: "clear", input: { fixture: WRAP_FIXTURE, config: { json: { ...wrap, text_config: { ...(wrap.text_config as object), num_attention_heads: 1e308 } } } } },
    { was: "a hang: num_hidden_layers 1e308 without layer_types looped deriving them", target: "checkpoint/config", expect: "clear", input: { fixture: FIXTURE, config: { json: { ...noLayerTypes, num_hidden_layers: 1e308 } } } },
    { was: "TypeError in the parity pre-flight: a config.json holding null", target: "checkpoint/config", expect: "clear", input: { fixture: FIXTURE, config: { text: "null" } } },
    { was: "SyntaxError: an invalid tokenizer.json", target: "tokenizer/prompt", expect: "clear", input: { tokenizer: { text: "{" }, config: null, jinja: null, prompt: "hello", chat: false } },
    { was: "TypeError: an op reply without outputs", target: "oracle/replies", expect: "clear", input: { ready: "ok", command: "op", reply: { fields: {} } } },
    { was: "exit 1 (not 2) for an unknown flag of golden:regen", target: "cli/process", expect: "clear", input: { command: "golden:regen", argv: ["--frobnicate"] } },
    { was: "exit 0 after starting the oracle for an op with no cases (parity:ops)", target: "cli/process", expect: "clear", input: { command: "parity:ops", argv: ["no_such_op"] } },
  ];
}
