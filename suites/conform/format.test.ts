// The conformance dump's reader, writer and validator (oracle/conform/dump.ts, spec
// oracle/conform/FORMAT.md) on the c1_dense/f32 checkpoint:
//   * two valid dumps written by writeDump (a level-1 forward, a level-0 generate) validate, and
//     read back byte for byte; writeDump is atomic (a failed write leaves the old dump and no
//     temporary folder) and refuses to replace a folder that is not a dump;
//   * every malformed case of the contract is rejected with ONE DumpError whose file and field
//     are the ones at fault and whose message names them (the list is counted);
//   * a seeded fuzz (120 cases, ~1 s) of random byte and field corruptions of the manifest and the
//     safetensors file: validateDump either accepts the dump or throws a DumpError, never
//     anything else; truncations (always malformed) must be DumpErrors.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { checkpointHashes, DumpError, type DumpManifest, type DumpManifestInput, readDump, validateDump, writeDump } from "../../oracle/conform/dump.ts";
import type { RawTensor } from "../../oracle/tensor_diff.ts";
import { limit } from "../../tests/time_limit.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");
const OTHER_CKPT = join(REPO_ROOT, ".cache", "checkpoints", "c2_keqv", "f32");
const HIDDEN = 64;
const VOCAB = 256;
const LAYERS = 6;

let tmp: string;
let seq = 0;

function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function f32(shape: number[], rand: () => number): RawTensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const v = new Float32Array(n);
  for (let i = 0; i < n; i++) v[i] = rand() * 2 - 1;
  return { dtype: "float32", shape, data: new Uint8Array(v.buffer) };
}

function u32(values: number[]): RawTensor {
  return { dtype: "uint32", shape: [values.length], data: new Uint8Array(Uint32Array.from(values).buffer) };
}

const PROMPT = [2, 17, 93, 4, 250];

/** A level-1 forward dump: logits, scaled embeddings, every layer's output, the final norm. */
function forwardL1(): [DumpManifestInput, Map<string, RawTensor>] {
  const r = mulberry32(1);
  const L = PROMPT.length;
  const t = new Map<string, RawTensor>([["embed_scaled", f32([1, L, HIDDEN], r)]]);
  for (let i = 0; i < LAYERS; i++) t.set(`layers.${i}/output`, f32([1, L, HIDDEN], r));
  t.set("norm", f32([1, L, HIDDEN], r));
  t.set("logits", f32([1, L, VOCAB], r));
  const m: DumpManifestInput = {
    engine: { name: "synthetic", version: "1", device: "cpu", dtype: "float32" },
    checkpoint: { files: checkpointHashes(CKPT) },
    prompt: PROMPT,
    schedule: { kind: "forward" },
    level: 1,
  };
  return [m, t];
}

/** A level-0 generate dump: prompt 5, prefill_step_size 2 (chunks 2, 2), max_tokens 2 (steps 0, 1; step2 omitted). */
function generateL0(): [DumpManifestInput, Map<string, RawTensor>] {
  const r = mulberry32(2);
  const generated = [42, 7];
  const t = new Map<string, RawTensor>([
    ["prefill0/logits", f32([1, 2, VOCAB], r)],
    ["prefill1/logits", f32([1, 2, VOCAB], r)],
    ["step0/logits", f32([1, 1, VOCAB], r)],
    ["step0/token", u32([generated[0]!])],
    ["step1/logits", f32([1, 1, VOCAB], r)],
    ["step1/token", u32([generated[1]!])],
  ]);
  const m: DumpManifestInput = {
    engine: { name: "synthetic", version: "1", device: "cpu", dtype: "float32" },
    checkpoint: { files: checkpointHashes(CKPT) },
    prompt: PROMPT,
    schedule: { kind: "generate", prefill_step_size: 2, max_tokens: 2 },
    level: 0,
    generated,
  };
  return [m, t];
}

let FWD: string;
let GEN: string;

beforeAll(() => {
  tmp = mkdtempSync(join(tmpdir(), "conform-format-"));
  const [fm, ft] = forwardL1();
  FWD = join(tmp, "base-forward");
  writeDump(FWD, fm, ft);
  const [gm, gt] = generateL0();
  GEN = join(tmp, "base-generate");
  writeDump(GEN, gm, gt);
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function copyOf(base: string): string {
  const d = join(tmp, `case-${seq++}`);
  cpSync(base, d, { recursive: true });
  return d;
}

const ST = "tensors.safetensors";

function editManifest(dir: string, f: (m: Record<string, any>) => void): void {
  const p = join(dir, "manifest.json");
  const m = JSON.parse(readFileSync(p, "utf8"));
  f(m);
  writeFileSync(p, JSON.stringify(m));
}

/** Rewrites a safetensors header (JSON edited by `f`), keeping the data section's bytes. */
function editHeader(path: string, f: (h: Record<string, any>) => void, dataEdit?: (d: Uint8Array) => Uint8Array): void {
  const b = readFileSync(path);
  const n = Number(b.readBigUInt64LE(0));
  const h = JSON.parse(b.subarray(8, 8 + n).toString("utf8"));
  f(h);
  const hb = Buffer.from(JSON.stringify(h), "utf8");
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(hb.length));
  const data = new Uint8Array(b.subarray(8 + n));
  writeFileSync(path, Buffer.concat([len, hb, dataEdit ? dataEdit(data) : data]));
}

/** Moves one tensor into a second file (its own header and data). */
function splitInto(dir: string, name: string, second: string): void {
  const b = readFileSync(join(dir, ST));
  const n = Number(b.readBigUInt64LE(0));
  const h = JSON.parse(b.subarray(8, 8 + n).toString("utf8"));
  const e = h[name];
  const bytes = b.subarray(8 + n + e.data_offsets[0], 8 + n + e.data_offsets[1]);
  const hb = Buffer.from(JSON.stringify({ [name]: { dtype: e.dtype, shape: e.shape, data_offsets: [0, bytes.length] } }));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(hb.length));
  writeFileSync(join(dir, second), Buffer.concat([len, hb, bytes]));
}

interface Case {
  what: string;
  base: "fwd" | "gen";
  edit: (dir: string) => void;
  /** The DumpError's file and field (a pattern where the writer's byte order decides which tensor). */
  file: string;
  field: string | RegExp;
  /** Also in the message. */
  says?: string;
  /** Validate against this checkpoint instead. */
  checkpoint?: string;
}

const M = "manifest.json";
const CASES: Case[] = [
  { what: "missing manifest", base: "fwd", edit: (d) => rmSync(join(d, M)), file: M, field: "(file)", says: "missing" },
  { what: "unparsable JSON", base: "fwd", edit: (d) => writeFileSync(join(d, M), '{"format": "gemma4-conform-dump",'), file: M, field: "(json)", says: "not valid JSON" },
  { what: "manifest not UTF-8", base: "fwd", edit: (d) => writeFileSync(join(d, M), Buffer.from([0x7b, 0xff, 0x7d])), file: M, field: "(file)", says: "UTF-8" },
  { what: "manifest an array", base: "fwd", edit: (d) => writeFileSync(join(d, M), "[]"), file: M, field: "(root)" },
  { what: "wrong format", base: "fwd", edit: (d) => editManifest(d, (m) => (m.format = "gguf")), file: M, field: "format" },
  { what: "missing format", base: "fwd", edit: (d) => editManifest(d, (m) => delete m.format), file: M, field: "format", says: "missing" },
  { what: "newer format version", base: "fwd", edit: (d) => editManifest(d, (m) => (m.format_version = 2)), file: M, field: "format_version" },
  { what: "format version as a string", base: "fwd", edit: (d) => editManifest(d, (m) => (m.format_version = "1")), file: M, field: "format_version" },
  { what: "unknown field", base: "fwd", edit: (d) => editManifest(d, (m) => (m.levle = 1)), file: M, field: "levle" },
  { what: "missing engine", base: "fwd", edit: (d) => editManifest(d, (m) => delete m.engine), file: M, field: "engine" },
  { what: "engine.name a number", base: "fwd", edit: (d) => editManifest(d, (m) => (m.engine.name = 3)), file: M, field: "engine.name" },
  { what: "engine.dtype empty", base: "fwd", edit: (d) => editManifest(d, (m) => (m.engine.dtype = "")), file: M, field: "engine.dtype" },
  { what: "engine extra field", base: "fwd", edit: (d) => editManifest(d, (m) => (m.engine.os = "linux")), file: M, field: "engine.os" },
  { what: "missing checkpoint", base: "fwd", edit: (d) => editManifest(d, (m) => delete m.checkpoint), file: M, field: "checkpoint" },
  { what: "checkpoint.files a list", base: "fwd", edit: (d) => editManifest(d, (m) => (m.checkpoint.files = ["config.json"])), file: M, field: "checkpoint.files" },
  { what: "hash not hex", base: "fwd", edit: (d) => editManifest(d, (m) => (m.checkpoint.files["config.json"] = "XYZ")), file: M, field: 'checkpoint.files["config.json"]' },
  { what: "hash uppercase", base: "fwd", edit: (d) => editManifest(d, (m) => (m.checkpoint.files["config.json"] = m.checkpoint.files["config.json"].toUpperCase())), file: M, field: 'checkpoint.files["config.json"]' },
  { what: "no config.json hash", base: "fwd", edit: (d) => editManifest(d, (m) => delete m.checkpoint.files["config.json"]), file: M, field: "checkpoint.files" },
  { what: "hashed file of another kind", base: "fwd", edit: (d) => editManifest(d, (m) => (m.checkpoint.files["tokenizer.json"] = "0".repeat(64))), file: M, field: 'checkpoint.files["tokenizer.json"]' },
  { what: "missing prompt", base: "fwd", edit: (d) => editManifest(d, (m) => delete m.prompt), file: M, field: "prompt" },
  { what: "empty prompt", base: "fwd", edit: (d) => editManifest(d, (m) => (m.prompt = [])), file: M, field: "prompt" },
  { what: "negative token", base: "fwd", edit: (d) => editManifest(d, (m) => (m.prompt[2] = -1)), file: M, field: "prompt[2]" },
  { what: "fractional token", base: "fwd", edit: (d) => editManifest(d, (m) => (m.prompt[1] = 1.5)), file: M, field: "prompt[1]" },
  { what: "token outside the vocabulary", base: "fwd", edit: (d) => editManifest(d, (m) => (m.prompt[0] = VOCAB)), file: M, field: "prompt[0]", says: "vocabulary" },
  { what: "missing schedule", base: "fwd", edit: (d) => editManifest(d, (m) => delete m.schedule), file: M, field: "schedule" },
  { what: "unknown schedule kind", base: "fwd", edit: (d) => editManifest(d, (m) => (m.schedule = { kind: "beam" })), file: M, field: "schedule.kind" },
  { what: "forward schedule with an extra field", base: "fwd", edit: (d) => editManifest(d, (m) => (m.schedule.max_tokens = 3)), file: M, field: "schedule.max_tokens" },
  { what: "prefill_step_size 0", base: "gen", edit: (d) => editManifest(d, (m) => (m.schedule.prefill_step_size = 0)), file: M, field: "schedule.prefill_step_size", says: "must be a positive integer" },
  { what: "max_tokens a string", base: "gen", edit: (d) => editManifest(d, (m) => (m.schedule.max_tokens = "2")), file: M, field: "schedule.max_tokens" },
  { what: "missing prefill_step_size", base: "gen", edit: (d) => editManifest(d, (m) => delete m.schedule.prefill_step_size), file: M, field: "schedule.prefill_step_size" },
  { what: "level 3", base: "fwd", edit: (d) => editManifest(d, (m) => (m.level = 3)), file: M, field: "level" },
  { what: "level a string", base: "fwd", edit: (d) => editManifest(d, (m) => (m.level = "1")), file: M, field: "level" },
  { what: "generate without generated", base: "gen", edit: (d) => editManifest(d, (m) => delete m.generated), file: M, field: "generated" },
  { what: "generated of the wrong length", base: "gen", edit: (d) => editManifest(d, (m) => m.generated.push(3)), file: M, field: "generated" },
  { what: "generated token not an integer", base: "gen", edit: (d) => editManifest(d, (m) => (m.generated[1] = "7")), file: M, field: "generated[1]" },
  { what: "generated token outside the vocabulary", base: "gen", edit: (d) => editManifest(d, (m) => (m.generated[1] = 9999)), file: M, field: "generated[1]" },
  { what: "forward with generated tokens", base: "fwd", edit: (d) => editManifest(d, (m) => (m.generated = [1])), file: M, field: "generated" },
  { what: "files not a list", base: "fwd", edit: (d) => editManifest(d, (m) => (m.files = ST)), file: M, field: "files" },
  { what: "file name with a folder", base: "fwd", edit: (d) => editManifest(d, (m) => (m.files = [`../${ST}`])), file: M, field: "files[0]" },
  { what: "file listed twice", base: "fwd", edit: (d) => editManifest(d, (m) => m.files.push(ST)), file: M, field: "files[1]" },
  { what: "tensors not a list", base: "fwd", edit: (d) => editManifest(d, (m) => (m.tensors = {})), file: M, field: "tensors" },
  { what: "tensor listed twice", base: "fwd", edit: (d) => editManifest(d, (m) => m.tensors.push("norm")), file: M, field: `tensors[${LAYERS + 3}]` },
  { what: "tensor name not a string", base: "fwd", edit: (d) => editManifest(d, (m) => (m.tensors[0] = 5)), file: M, field: "tensors[0]" },
  { what: "mask kind not causal/none", base: "fwd", edit: (d) => editManifest(d, (m) => (m.mask_kinds = { "mask/full_attention": "array" })), file: M, field: 'mask_kinds["mask/full_attention"]' },
  { what: "mask kind of a non-mask", base: "fwd", edit: (d) => editManifest(d, (m) => (m.mask_kinds = { norm: "none" })), file: M, field: 'mask_kinds["norm"]' },
  { what: "mask kind of an unknown mask", base: "fwd", edit: (d) => editManifest(d, (m) => (m.mask_kinds = { "mask/chunked_attention": "none" })), file: M, field: 'mask_kinds["mask/chunked_attention"]', says: "not a tap name" },
  { what: "notes not a string", base: "fwd", edit: (d) => editManifest(d, (m) => (m.notes = 1)), file: M, field: "notes" },
  // the checkpoint
  { what: "a dump of another checkpoint", base: "fwd", edit: () => {}, checkpoint: OTHER_CKPT, file: M, field: 'checkpoint.files["config.json"]', says: "a dump of another checkpoint" },
  { what: "a hash that differs", base: "fwd", edit: (d) => editManifest(d, (m) => (m.checkpoint.files["model.safetensors"] = "0".repeat(64))), file: M, field: 'checkpoint.files["model.safetensors"]', says: "another checkpoint" },
  { what: "a checkpoint file not hashed", base: "fwd", edit: (d) => editManifest(d, (m) => delete m.checkpoint.files["model.safetensors"]), file: M, field: 'checkpoint.files["model.safetensors"]' },
  { what: "a hashed file the checkpoint lacks", base: "fwd", edit: (d) => editManifest(d, (m) => (m.checkpoint.files["model-00002-of-00002.safetensors"] = "0".repeat(64))), file: M, field: 'checkpoint.files["model-00002-of-00002.safetensors"]' },
  // names
  { what: "unknown tap name", base: "fwd", edit: (d) => renameTensor(d, "norm", "final_norm"), file: M, field: `tensors[${LAYERS + 1}]`, says: '"final_norm" is not a tap name' },
  { what: "layer past the last", base: "fwd", edit: (d) => renameTensor(d, "layers.5/output", `layers.${LAYERS}/output`), file: M, field: "tensors[6]", says: "not a tap name" },
  { what: "a call the schedule does not have", base: "gen", edit: (d) => renameTensor(d, "prefill1/logits", "prefill2/logits"), file: M, field: "tensors[1]", says: "not a tap name" },
  { what: "a forward name in a generate dump", base: "gen", edit: (d) => renameTensor(d, "prefill1/logits", "logits"), file: M, field: "tensors[1]", says: "not a tap name" },
  { what: "a step beyond max_tokens", base: "gen", edit: (d) => renameTensor(d, "step1/logits", "step3/logits"), file: M, field: "tensors[4]", says: "not a tap name" },
  { what: "listed but absent", base: "fwd", edit: (d) => editManifest(d, (m) => m.tensors.push("lm_head")), file: M, field: `tensors[${LAYERS + 3}]`, says: "no file of files holds" },
  { what: "present but unlisted", base: "fwd", edit: (d) => editManifest(d, (m) => (m.tensors = m.tensors.filter((t: string) => t !== "norm"))), file: ST, field: 'tensor "norm"', says: "does not list it" },
  { what: "listed file absent", base: "fwd", edit: (d) => rmSync(join(d, ST)), file: ST, field: "files", says: "absent" },
  {
    what: "a name in two files",
    base: "fwd",
    edit: (d) => {
      splitInto(d, "norm", "extra.safetensors");
      editManifest(d, (m) => m.files.push("extra.safetensors"));
    },
    file: "extra.safetensors",
    field: 'tensor "norm"',
    says: "exactly one file",
  },
  // shapes and dtypes
  { what: "logits of the wrong vocabulary", base: "fwd", edit: (d) => rewrite(d, "logits", [1, PROMPT.length, VOCAB / 2]), file: ST, field: 'tensor "logits"', says: `shape [1,5,128] where the config gives [1,5,${VOCAB}]` },
  { what: "a layer output of the wrong width", base: "fwd", edit: (d) => rewrite(d, "layers.0/output", [1, PROMPT.length, HIDDEN / 2]), file: ST, field: 'tensor "layers.0/output"', says: "shape [1,5,32] where the config gives [1,5,64]" },
  { what: "one position short", base: "fwd", edit: (d) => rewrite(d, "embed_scaled", [1, PROMPT.length - 1, HIDDEN]), file: ST, field: 'tensor "embed_scaled"', says: "shape [1,4,64] where the config gives [1,5,64]" },
  { what: "a batch of 2", base: "fwd", edit: (d) => reshape(d, "norm", [2, PROMPT.length, HIDDEN / 2]), file: ST, field: 'tensor "norm"', says: "shape" },
  { what: "prefill logprobs of one row", base: "gen", edit: (d) => (logprobsOnly(d), reshape(d, "prefill0/logprobs", [1, VOCAB * 2])), file: ST, field: 'tensor "prefill0/logprobs"', says: "where the config gives [1,2,256]" },
  { what: "step logprobs over two positions", base: "gen", edit: (d) => (logprobsOnly(d), reshape(d, "step0/logprobs", [2, VOCAB / 2])), file: ST, field: 'tensor "step0/logprobs"', says: "where the config gives [1,256] or [1,1,256]" },
  { what: "step logits over the whole prompt", base: "gen", edit: (d) => reshape(d, "step0/logits", [1, VOCAB, 1]), file: ST, field: 'tensor "step0/logits"', says: "shape" },
  { what: "token of two elements", base: "gen", edit: (d) => editHeader(join(d, ST), (h) => (h["step1/token"].dtype = "U16", h["step1/token"].shape = [2])), file: ST, field: 'tensor "step1/token"', says: "dtype U16" },
  { what: "logits as integers", base: "fwd", edit: (d) => editHeader(join(d, ST), (h) => (h.logits.dtype = "I32")), file: ST, field: 'tensor "logits"', says: "dtype I32" },
  { what: "token as a float", base: "gen", edit: (d) => editHeader(join(d, ST), (h) => (h["step0/token"].dtype = "F32")), file: ST, field: 'tensor "step0/token"', says: "dtype F32" },
  { what: "float64 logits", base: "gen", edit: (d) => editHeader(join(d, ST), (h) => (h["step0/logits"].dtype = "F64", h["step0/logits"].shape = [1, 1, VOCAB / 2])), file: ST, field: 'tensor "step0/logits"', says: "dtype F64" },
  { what: "an unknown dtype", base: "fwd", edit: (d) => editHeader(join(d, ST), (h) => (h.norm.dtype = "F8_E4M3")), file: ST, field: 'tensor "norm"', says: "dtype" },
  // levels and tokens
  { what: "level 1 missing a layer output", base: "fwd", edit: (d) => dropTensor(d, "layers.3/output"), file: M, field: "level", says: '"layers.3/output" is absent' },
  { what: "level 2 claimed at level 1", base: "fwd", edit: (d) => editManifest(d, (m) => (m.level = 2)), file: M, field: "level", says: "level 2 is declared but" },
  { what: "level 0 claimed at level 1", base: "fwd", edit: (d) => editManifest(d, (m) => (m.level = 0)), file: M, field: "level", says: "level must be 1" },
  { what: "level 0 without a step token", base: "gen", edit: (d) => dropTensor(d, "step1/token"), file: M, field: "level", says: '"step1/token" is absent' },
  { what: "level 0 without a prefill's logits", base: "gen", edit: (d) => dropTensor(d, "prefill0/logits"), file: M, field: "level", says: '"prefill0/logits" is absent' },
  { what: "a stored token that is not the generated one", base: "gen", edit: (d) => editManifest(d, (m) => (m.generated[1] = 8)), file: ST, field: 'tensor "step1/token"', says: "generated[1] is 8" },
  // corrupt or truncated safetensors
  { what: "safetensors truncated in its data", base: "fwd", edit: (d) => truncate(d, -3), file: ST, field: /^tensor "/, says: "truncated safetensors file" },
  { what: "safetensors truncated in its header", base: "fwd", edit: (d) => truncate(d, 20), file: ST, field: "(header)", says: "truncated" },
  { what: "safetensors of 5 bytes", base: "fwd", edit: (d) => truncate(d, 5), file: ST, field: "(header)", says: "truncated" },
  { what: "safetensors with trailing bytes", base: "fwd", edit: (d) => writeFileSync(join(d, ST), Buffer.concat([readFileSync(join(d, ST)), Buffer.from([1, 2, 3, 4])])), file: ST, field: "(data)", says: "truncated or corrupt" },
  { what: "safetensors header length huge", base: "fwd", edit: (d) => patch(d, 0, [0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0]), file: ST, field: "(header)", says: "header length" },
  { what: "safetensors header not JSON", base: "fwd", edit: (d) => patch(d, 8, [0x5b, 0x7b]), file: ST, field: "(header)", says: "corrupt safetensors header" },
  { what: "data offsets disagree with the shape", base: "fwd", edit: (d) => editHeader(join(d, ST), (h) => (h.norm.shape = [1, PROMPT.length, HIDDEN + 1])), file: ST, field: 'tensor "norm"', says: "data_offsets" },
  { what: "overlapping tensors", base: "fwd", edit: (d) => editHeader(join(d, ST), (h) => (h.norm.data_offsets = h.embed_scaled.data_offsets)), file: ST, field: /^tensor "(norm|embed_scaled)"$/, says: "overlap" },
  { what: "metadata not strings", base: "fwd", edit: (d) => editHeader(join(d, ST), (h) => (h.__metadata__ = { a: 1 })), file: ST, field: "__metadata__.a", says: "must be strings" },
];

function renameTensor(dir: string, from: string, to: string): void {
  editHeader(join(dir, ST), (h) => {
    h[to] = h[from];
    delete h[from];
  });
  editManifest(dir, (m) => (m.tensors = m.tensors.map((t: string) => (t === from ? to : t))));
}

function dropTensor(dir: string, name: string): void {
  editHeader(join(dir, ST), (h) => delete h[name]);
  editManifest(dir, (m) => (m.tensors = m.tensors.filter((t: string) => t !== name)));
  // re-pack the data section (a gap left by the dropped tensor would be a corrupt file)
  const b = readFileSync(join(dir, ST));
  const n = Number(b.readBigUInt64LE(0));
  const h = JSON.parse(b.subarray(8, 8 + n).toString("utf8"));
  const parts: Buffer[] = [];
  let off = 0;
  for (const [k, e] of Object.entries<any>(h)) {
    if (k === "__metadata__") continue;
    const bytes = b.subarray(8 + n + e.data_offsets[0], 8 + n + e.data_offsets[1]);
    e.data_offsets = [off, off + bytes.length];
    off += bytes.length;
    parts.push(Buffer.from(bytes));
  }
  const hb = Buffer.from(JSON.stringify(h));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(hb.length));
  writeFileSync(join(dir, ST), Buffer.concat([len, hb, ...parts]));
}

/** Rewrites the dump (writeDump) with one tensor replaced by one of another shape. */
function rewrite(dir: string, name: string, shape: number[]): void {
  const d = readDump(dir);
  const t = new Map(d.tensors.names.map((n) => [n, d.tensors.read(n)] as const));
  t.set(name, f32(shape, mulberry32(3)));
  const { files: _f, tensors: _t, ...m } = d.manifest;
  writeDump(dir, m, t);
}

/** Same bytes, another shape of the same size. */
function reshape(dir: string, name: string, shape: number[]): void {
  editHeader(join(dir, ST), (h) => (h[name].shape = shape));
}

function truncate(dir: string, at: number): void {
  const b = readFileSync(join(dir, ST));
  writeFileSync(join(dir, ST), b.subarray(0, at < 0 ? b.length + at : at));
}

function patch(dir: string, at: number, bytes: number[]): void {
  const b = readFileSync(join(dir, ST));
  b.set(bytes, at);
  writeFileSync(join(dir, ST), b);
}

function outcome(dir: string, checkpoint = CKPT): DumpError | null | Error {
  try {
    validateDump(dir, checkpoint);
    return null;
  } catch (e) {
    return e as Error;
  }
}

/** Level 0 from an engine without raw logits: logprobs instead (prefill (1, L, V); steps (1, V) and (1, 1, V)). */
function logprobsOnly(dir: string): void {
  renameTensor(dir, "prefill0/logits", "prefill0/logprobs");
  renameTensor(dir, "step0/logits", "step0/logprobs");
  editHeader(join(dir, ST), (h) => (h["step0/logprobs"].shape = [1, VOCAB]));
}

describe("valid dumps", () => {
  it("level 0 with logprobs in place of logits (a prefill's (1, L, V), a step's (1, V))", () => {
    const dir = copyOf(GEN);
    logprobsOnly(dir);
    const v = validateDump(dir, CKPT);
    expect([v.level, v.tensors.info("step0/logprobs").shape, v.tensors.has("prefill0/logits")]).toEqual([0, [1, VOCAB], false]);
  });

  it("a level-1 forward and a level-0 generate validate and read back byte for byte", () => {
    for (const [base, make] of [
      [FWD, forwardL1],
      [GEN, generateL0],
    ] as const) {
      const v = validateDump(base, CKPT);
      const [m, t] = make();
      expect(v.level).toBe(m.level);
      expect(v.tensors.names).toEqual([...t.keys()]);
      for (const [name, raw] of t) {
        const got = v.tensors.read(name);
        expect([got.dtype, got.shape, Buffer.from(got.data).equals(Buffer.from(raw.data))]).toEqual([raw.dtype, raw.shape, true]);
      }
    }
  });

  it("checkpointHashes is the sha256 of config.json and every *.safetensors", () => {
    const h = checkpointHashes(CKPT);
    const files = readdirSync(CKPT).filter((f) => f === "config.json" || f.endsWith(".safetensors")).sort();
    expect(Object.keys(h)).toEqual(files);
    for (const f of files) expect(h[f]).toBe(new Bun.CryptoHasher("sha256").update(readFileSync(join(CKPT, f))).digest("hex"));
    expect(createHash("sha256").update(readFileSync(join(CKPT, "config.json"))).digest("hex")).toBe(h["config.json"]);
  });

  it("writeDump is atomic: a failed write keeps the old dump and leaves no temporary folder", () => {
    const dir = copyOf(FWD);
    const before = readFileSync(join(dir, M), "utf8");
    const [m, t] = forwardL1();
    t.set("norm", { dtype: "complex64", shape: [1], data: new Uint8Array(8) });
    expect(() => writeDump(dir, m, t)).toThrow(DumpError);
    expect(readFileSync(join(dir, M), "utf8")).toBe(before);
    // a malformed manifest is refused before the rename too
    expect(() => writeDump(dir, { ...forwardL1()[0], level: 7 as 1 }, forwardL1()[1])).toThrow(/level must be 0, 1 or 2/);
    expect(readFileSync(join(dir, M), "utf8")).toBe(before);
    expect(readdirSync(tmp).filter((f) => f.includes(".tmp-"))).toEqual([]);
    // replacing a dump works; a folder that is not a dump is refused
    writeDump(dir, ...generateL0());
    expect(readDump(dir).manifest.schedule.kind).toBe("generate");
    const other = join(tmp, `not-a-dump-${seq++}`);
    mkdirSync(other);
    writeFileSync(join(other, "notes.txt"), "mine");
    expect(() => writeDump(other, ...forwardL1())).toThrow(/not a dump/);
    expect(existsSync(join(other, "notes.txt"))).toBe(true);
  });
});

describe("every malformed case: one DumpError naming the file and the field", () => {
  it(`${CASES.length} cases`, () => {
    let checked = 0;
    const wrong: string[] = [];
    for (const c of CASES) {
      const dir = copyOf(c.base === "fwd" ? FWD : GEN);
      c.edit(dir);
      const e = outcome(dir, c.checkpoint);
      if (!(e instanceof DumpError)) {
        wrong.push(`${c.what}: ${e === null ? "accepted" : `${e.constructor.name}: ${e.message}`}`);
        continue;
      }
      const fieldOk = typeof c.field === "string" ? e.field === c.field : c.field.test(e.field);
      const fieldNamed = e.field.startsWith("(") || e.message.includes(e.field);
      if (e.file !== c.file || !fieldOk || !e.message.startsWith(`${c.file}: `) || !fieldNamed || (c.says && !e.message.includes(c.says))) {
        wrong.push(`${c.what}: got file ${e.file}, field ${e.field}: ${e.message}`);
      }
      checked++;
    }
    expect(wrong).toEqual([]);
    expect(checked).toBe(CASES.length);
  }, limit(30_000));
});

describe("fuzz: random corruptions give a DumpError or a valid dump, never another exception", () => {
  // A fixed count (deterministic for the seed): about 1 s on a free core of the 2-core machine.
  // CONFORM_FUZZ_RUNS / CONFORM_FUZZ_SEED run a longer or another campaign.
  const RUNS = Number(process.env.CONFORM_FUZZ_RUNS ?? 120);
  const SEED = Number(process.env.CONFORM_FUZZ_SEED ?? 24);
  it(`seeded, ${RUNS} corruptions`, () => {
    const rand = mulberry32(SEED);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
    const junk = (): unknown => pick([null, -1, 0, 1.5, 2 ** 53, "", "x", "step0/logits", [], [1, "a"], {}, { kind: "forward" }, true]);
    const counts = { runs: 0, rejected: 0, accepted: 0, mustReject: 0 };
    const other: string[] = [];
    while (counts.runs < RUNS) {
      const dir = copyOf(rand() < 0.5 ? FWD : GEN);
      const kind = pick(["manifest-bytes", "manifest-truncate", "manifest-field", "st-bytes", "st-truncate", "st-header-field"] as const);
      let mustReject = false;
      const mp = join(dir, M);
      const sp = join(dir, ST);
      if (kind === "manifest-bytes" || kind === "st-bytes") {
        const p = kind === "st-bytes" ? sp : mp;
        const b = readFileSync(p);
        // bias toward the header of the safetensors file, where a flip changes the structure
        const span = kind === "st-bytes" && rand() < 0.7 ? Math.min(b.length, 8 + Number(b.readBigUInt64LE(0))) : b.length;
        for (let k = 1 + Math.floor(rand() * 4); k > 0; k--) b[Math.floor(rand() * span)] = Math.floor(rand() * 256);
        writeFileSync(p, b);
      } else if (kind === "manifest-truncate" || kind === "st-truncate") {
        const p = kind === "st-truncate" ? sp : mp;
        const b = readFileSync(p);
        // the manifest's closing brace (or any byte of the safetensors file) goes
        const last = kind === "st-truncate" ? b.length : b.lastIndexOf("}");
        writeFileSync(p, b.subarray(0, Math.floor(rand() * last)));
        mustReject = true;
      } else if (kind === "manifest-field") {
        editManifest(dir, (m) => {
          // walk to a random node and replace or delete one of its entries
          let node: any = m;
          for (let depth = 0; depth < 3; depth++) {
            const keys = Object.keys(node);
            if (keys.length === 0) break;
            const k = pick(keys);
            if (node[k] === null || typeof node[k] !== "object" || rand() < 0.4) {
              if (rand() < 0.2) delete node[k];
              else node[k] = junk();
              return;
            }
            node = node[k];
          }
        });
      } else {
        editHeader(sp, (h) => {
          const k = pick(Object.keys(h));
          const e = h[k];
          if (rand() < 0.3 || e === null || typeof e !== "object") h[k] = junk();
          else e[pick(["dtype", "shape", "data_offsets"])] = junk();
        });
      }
      const e = outcome(dir);
      counts.runs++;
      if (mustReject) counts.mustReject++;
      if (e === null) {
        counts.accepted++;
        if (mustReject) other.push(`${kind}: a truncated file was accepted`);
      } else if (e instanceof DumpError && e.message.startsWith(`${e.file}: `) && e.field.length > 0) counts.rejected++;
      else other.push(`${kind}: ${e.constructor.name}: ${e.message}`);
      rmSync(dir, { recursive: true, force: true });
    }
    console.log(`[format fuzz] seed ${SEED}, ${counts.runs} corruptions: ${counts.rejected} DumpErrors, ${counts.accepted} still valid (${counts.mustReject} truncations, all rejected)`);
    expect(other).toEqual([]);
    expect(counts.runs).toBe(RUNS);
    expect(counts.rejected + counts.accepted).toBe(counts.runs);
    expect(counts.mustReject).toBeGreaterThan(0);
    expect(counts.rejected).toBeGreaterThan(counts.runs / 2);
  }, limit(30_000 + RUNS * 100));
});
