// The engine-neutral conformance dump (oracle/conform/FORMAT.md is the spec; this file follows it):
// types, the reader, the atomic writer and the validator. A dump is a folder holding
// manifest.json and safetensors files whose tensor names are full tap names (oracle/TAPS.md).
// Every malformed case is ONE DumpError naming the file and the field at fault; nothing else is
// thrown for bad input (the face maps it to exit code 2).

import { createHash } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { checkSafetensors, WeightsError } from "../../model/gemma4/weights.ts";
import { expandTaps, prefillChunks, tapConfig } from "../taps.ts";
import type { RawTensor } from "../tensor_diff.ts";

export const DUMP_FORMAT = "gemma4-conform-dump";
export const DUMP_FORMAT_VERSION = 1;
export const MANIFEST = "manifest.json";

export type DumpLevel = 0 | 1 | 2;
export type MaskKind = "causal" | "none";

export type DumpSchedule = { kind: "forward" } | { kind: "generate"; prefill_step_size: number; max_tokens: number };

export interface DumpEngine {
  name: string;
  version: string;
  device: string;
  dtype: string;
}

export interface DumpManifest {
  format: typeof DUMP_FORMAT;
  format_version: typeof DUMP_FORMAT_VERSION;
  engine: DumpEngine;
  /** sha256 (lowercase hex) of config.json and every *.safetensors of the checkpoint folder. */
  checkpoint: { files: Record<string, string> };
  prompt: number[];
  schedule: DumpSchedule;
  level: DumpLevel;
  /** generate: the max_tokens greedy tokens of step0..step{max_tokens-1}; forward: absent or []. */
  generated?: number[];
  /** The safetensors files of the dump (plain names inside the folder). */
  files: string[];
  /** Every tensor name stored, across all files. */
  tensors: string[];
  /** Mask taps whose value is not an array (mlx-lm's "causal" string or None), by full tap name. */
  mask_kinds?: Record<string, MaskKind>;
  /** Free text for humans (ignored by the comparison). */
  notes?: string;
}

/** One model call of the schedule. */
export interface DumpCall {
  /** "" (forward), "prefill{k}/" or "step{n}/". */
  prefix: string;
  kind: "forward" | "prefill" | "step";
  index: number;
  /** Tokens fed to the call (L). */
  length: number;
  /** False only for the last step of a generation (computed by generate_step, never yielded). */
  required: boolean;
}

/** A malformed dump: `file` (relative to the dump folder, or the checkpoint's file) and `field` say where. */
export class DumpError extends Error {
  override readonly name = "DumpError";
  constructor(
    readonly file: string,
    readonly field: string,
    /** The message after "file: "; it names the field. */
    readonly detail: string,
  ) {
    super(`${file}: ${detail}`);
  }
}

/** What the reader knows of one stored tensor (dtype as MLX names it: "float32", "bfloat16", ...). */
export interface DumpTensorInfo {
  name: string;
  file: string;
  dtype: string;
  /** The safetensors dtype tag ("F32", "BF16", ...). */
  stDtype: string;
  shape: number[];
}

/** Lazy access to a dump's tensors: headers are read at once, data only when asked for. */
export interface DumpTensors {
  /** Stored tensor names (manifest order). */
  readonly names: readonly string[];
  has(name: string): boolean;
  info(name: string): DumpTensorInfo;
  /** The tensor's raw little-endian bytes, read from its file now. */
  read(name: string): RawTensor;
  /** The kind of a mask tap stored as a kind, not an array. */
  maskKind(name: string): MaskKind | undefined;
}

export interface Dump {
  dir: string;
  manifest: DumpManifest;
  tensors: DumpTensors;
}

export interface ValidDump extends Dump {
  /** The checkpoint's config.json. */
  config: Record<string, unknown>;
  calls: DumpCall[];
  /** The level every required call reaches (= manifest.level once valid). */
  level: DumpLevel;
}

// ------------------------------------------------------------------ dtypes

/** The safetensors dtypes a dump may use, with MLX's names and item sizes. */
const ST_DTYPES: Record<string, { dtype: mx.Dtype; size: number }> = {
  F32: { dtype: "float32", size: 4 },
  F16: { dtype: "float16", size: 2 },
  BF16: { dtype: "bfloat16", size: 2 },
  I32: { dtype: "int32", size: 4 },
  U32: { dtype: "uint32", size: 4 },
  I64: { dtype: "int64", size: 8 },
  BOOL: { dtype: "bool", size: 1 },
};
const ST_OF_MLX = new Map(Object.entries(ST_DTYPES).map(([k, v]) => [v.dtype as string, k]));

const FLOAT_DTYPES = ["F32", "F16", "BF16"];
const INT_DTYPES = ["I32", "U32", "I64"];

/** The safetensors dtypes allowed for a tap (name without the call prefix). */
export function allowedDtypes(tap: string): string[] {
  if (tap.startsWith("mask/")) return ["BOOL"];
  if (/^(inputs|token)$|(^|\/)(offset|router\/indices|sort_indices|sort_inv_order)$/.test(tap)) return INT_DTYPES;
  return FLOAT_DTYPES;
}

// ------------------------------------------------------------------ schedule and levels

const PREFIX_RE = /^(prefill|step)(0|[1-9]\d*)\//;

/** Splits a full tap name into its call prefix and tap name. */
export function splitName(name: string): { prefix: string; tap: string } {
  const m = PREFIX_RE.exec(name);
  return m ? { prefix: m[0], tap: name.slice(m[0].length) } : { prefix: "", tap: name };
}

/** The model calls of a schedule on a prompt of `promptLength` tokens (mlx-lm's generate_step order). */
export function scheduleCalls(promptLength: number, schedule: DumpSchedule): DumpCall[] {
  if (schedule.kind === "forward") return [{ prefix: "", kind: "forward", index: 0, length: promptLength, required: true }];
  const calls: DumpCall[] = prefillChunks(promptLength, schedule.prefill_step_size).map((n, k) => ({ prefix: `prefill${k}/`, kind: "prefill", index: k, length: n, required: true }));
  for (let n = 0; n <= schedule.max_tokens; n++) calls.push({ prefix: `step${n}/`, kind: "step", index: n, length: 1, required: n < schedule.max_tokens });
  return calls;
}

/** Every tap name (without prefix) of one call, in mlx-lm's order (oracle/taps.ts). */
export function callTaps(config: Record<string, unknown>, call: DumpCall): string[] {
  return expandTaps(tapConfig(config), { batch: 1, length: call.length, cache: call.kind !== "forward", step: call.kind === "step" });
}

/** The level-1 names of a call beyond level 0: scaled embeddings, every layer's output, the final norm. */
export function residualTaps(config: Record<string, unknown>): string[] {
  const n = tapConfig(config).num_hidden_layers;
  return ["embed_scaled", ...Array.from({ length: n }, (_, i) => `layers.${i}/output`), "norm"];
}

/**
 * The names (without prefix) a call needs for `level`. Level 0's `logits` may be replaced by
 * `logprobs` (engines without raw logits); the validator accepts either.
 */
export function levelTaps(config: Record<string, unknown>, call: DumpCall, level: DumpLevel): string[] {
  if (level === 2) return callTaps(config, call);
  const l0 = call.kind === "step" ? ["logits", "token"] : ["logits"];
  return level === 0 ? l0 : [...l0, ...residualTaps(config)];
}

function textConfig(config: Record<string, unknown>): Record<string, unknown> {
  const t = config.text_config;
  return t !== null && typeof t === "object" && !Array.isArray(t) ? (t as Record<string, unknown>) : config;
}

/** The shape a level-0/1 tensor must have (null: checked by the comparison against the oracle). */
function expectedShape(tap: string, call: DumpCall, hidden: number, vocab: number): number[][] | null {
  const L = call.length;
  if (tap === "logits") return [[1, L, vocab]];
  if (tap === "logprobs") return call.kind === "step" ? [[1, vocab], [1, 1, vocab]] : [[1, L, vocab]];
  if (tap === "token") return [[1]];
  if (tap === "embed_scaled" || tap === "norm" || /^layers\.\d+\/output$/.test(tap)) return [[1, L, hidden]];
  return null;
}

// ------------------------------------------------------------------ checkpoint hashes

/** Hashes already computed in this process, by path, keyed on the file's identity and mtime (a real checkpoint is gigabytes). */
const hashMemo = new Map<string, { stamp: string; hex: string }>();

function sha256File(path: string): string {
  const st = statSync(path);
  const stamp = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
  const known = hashMemo.get(path);
  if (known?.stamp === stamp) return known.hex;
  const hex = hashFile(path);
  hashMemo.set(path, { stamp, hex });
  return hex;
}

function hashFile(path: string): string {
  const h = createHash("sha256");
  const fd = openSync(path, "r");
  try {
    const buf = Buffer.allocUnsafe(1 << 22);
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      h.update(buf.subarray(0, n));
    }
  } finally {
    closeSync(fd);
  }
  return h.digest("hex");
}

/** sha256 (lowercase hex) of config.json and every *.safetensors directly in a checkpoint folder, by file name. */
export function checkpointHashes(dir: string): Record<string, string> {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new DumpError(dir, "checkpoint", `not a checkpoint folder`);
  const names = readdirSync(dir)
    .filter((f) => f === "config.json" || f.endsWith(".safetensors"))
    .filter((f) => statSync(join(dir, f)).isFile())
    .sort();
  if (!names.includes("config.json")) throw new DumpError(join(dir, "config.json"), "checkpoint", "missing: the checkpoint folder has no config.json");
  if (!names.some((f) => f.endsWith(".safetensors"))) throw new DumpError(dir, "checkpoint", `the checkpoint folder has no *.safetensors file`);
  return Object.fromEntries(names.map((f) => [f, sha256File(join(dir, f))]));
}

// ------------------------------------------------------------------ manifest parsing

type Json = Record<string, unknown>;

const TOP_FIELDS = ["format", "format_version", "engine", "checkpoint", "prompt", "schedule", "level", "generated", "files", "tensors", "mask_kinds", "notes"];

function describe(v: unknown): string {
  if (v === undefined) return "missing";
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "string") return `the string ${JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v)}`;
  if (typeof v === "number") return `the number ${v}`;
  return `${typeof v === "object" ? "an object" : `a ${typeof v}`}`;
}

const isObject = (v: unknown): v is Json => v !== null && typeof v === "object" && !Array.isArray(v);
const isNat = (v: unknown): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= 0;

/** Checks manifest.json's fields (types and the rules that need no checkpoint); returns it typed. */
export function parseManifest(text: string): DumpManifest {
  const bad = (field: string, detail: string) => new DumpError(MANIFEST, field, `${field} ${detail}`);
  let m: unknown;
  try {
    m = JSON.parse(text);
  } catch (e) {
    throw new DumpError(MANIFEST, "(json)", `not valid JSON: ${(e as Error).message}`);
  }
  if (!isObject(m)) throw new DumpError(MANIFEST, "(root)", `the manifest must be a JSON object, got ${describe(m)}`);
  if (m.format !== DUMP_FORMAT) throw bad("format", `must be ${JSON.stringify(DUMP_FORMAT)}, got ${describe(m.format)}`);
  if (m.format_version !== DUMP_FORMAT_VERSION) {
    throw bad("format_version", `must be ${DUMP_FORMAT_VERSION} (the version this reader knows), got ${describe(m.format_version)}`);
  }
  for (const k of Object.keys(m)) if (!TOP_FIELDS.includes(k)) throw bad(k, `is not a field of format version ${DUMP_FORMAT_VERSION} (fields: ${TOP_FIELDS.join(", ")})`);

  if (!isObject(m.engine)) throw bad("engine", `must be an object {name, version, device, dtype}, got ${describe(m.engine)}`);
  for (const k of Object.keys(m.engine)) if (!["name", "version", "device", "dtype"].includes(k)) throw bad(`engine.${k}`, "is not a field of engine (name, version, device, dtype)");
  for (const k of ["name", "version", "device", "dtype"]) {
    const v = m.engine[k];
    if (typeof v !== "string" || v.trim() === "") throw bad(`engine.${k}`, `must be a non-empty string, got ${describe(v)}`);
  }

  if (!isObject(m.checkpoint)) throw bad("checkpoint", `must be an object {files}, got ${describe(m.checkpoint)}`);
  for (const k of Object.keys(m.checkpoint)) if (k !== "files") throw bad(`checkpoint.${k}`, "is not a field of checkpoint (files)");
  const cf = m.checkpoint.files;
  if (!isObject(cf) || Object.keys(cf).length === 0) throw bad("checkpoint.files", `must be a non-empty object of file name → sha256, got ${describe(cf)}`);
  for (const [f, h] of Object.entries(cf)) {
    if (f !== "config.json" && !f.endsWith(".safetensors")) throw bad(`checkpoint.files[${JSON.stringify(f)}]`, "names neither config.json nor a *.safetensors file");
    if (typeof h !== "string" || !/^[0-9a-f]{64}$/.test(h)) throw bad(`checkpoint.files[${JSON.stringify(f)}]`, `must be a sha256 in 64 lowercase hex digits, got ${describe(h)}`);
  }
  if (!Object.hasOwn(cf, "config.json")) throw bad("checkpoint.files", 'must include "config.json"');

  if (!Array.isArray(m.prompt) || m.prompt.length === 0) throw bad("prompt", `must be a non-empty array of token ids, got ${describe(m.prompt)}`);
  m.prompt.forEach((t, i) => {
    if (!isNat(t)) throw bad(`prompt[${i}]`, `must be a non-negative integer token id, got ${describe(t)}`);
  });

  const s = m.schedule;
  if (!isObject(s)) throw bad("schedule", `must be an object, got ${describe(s)}`);
  if (s.kind === "forward") {
    for (const k of Object.keys(s)) if (k !== "kind") throw bad(`schedule.${k}`, 'is not a field of a "forward" schedule (kind only)');
  } else if (s.kind === "generate") {
    for (const k of Object.keys(s)) if (!["kind", "prefill_step_size", "max_tokens"].includes(k)) throw bad(`schedule.${k}`, 'is not a field of a "generate" schedule (kind, prefill_step_size, max_tokens)');
    for (const k of ["prefill_step_size", "max_tokens"]) if (!isNat(s[k]) || s[k] === 0) throw bad(`schedule.${k}`, `must be a positive integer, got ${describe(s[k])}`);
  } else {
    throw bad("schedule.kind", `must be "forward" or "generate", got ${describe(s.kind)}`);
  }

  if (m.level !== 0 && m.level !== 1 && m.level !== 2) throw bad("level", `must be 0, 1 or 2, got ${describe(m.level)}`);

  if (s.kind === "generate") {
    const want = s.max_tokens as number;
    if (!Array.isArray(m.generated)) throw bad("generated", `must be an array of the ${want} generated token ids, got ${describe(m.generated)}`);
    if (m.generated.length !== want) throw bad("generated", `has ${m.generated.length} tokens where schedule.max_tokens is ${want}`);
  } else if (m.generated !== undefined && !(Array.isArray(m.generated) && m.generated.length === 0)) {
    throw bad("generated", `must be absent (or []) for a forward schedule, got ${describe(m.generated)}`);
  }
  (m.generated as unknown[] | undefined)?.forEach((t, i) => {
    if (!isNat(t)) throw bad(`generated[${i}]`, `must be a non-negative integer token id, got ${describe(t)}`);
  });

  if (!Array.isArray(m.files)) throw bad("files", `must be an array of safetensors file names, got ${describe(m.files)}`);
  const seenFiles = new Set<string>();
  m.files.forEach((f, i) => {
    if (typeof f !== "string" || !/^[^/\\]+\.safetensors$/.test(f) || f.startsWith(".")) {
      throw bad(`files[${i}]`, `must be a plain *.safetensors file name inside the dump folder, got ${describe(f)}`);
    }
    if (seenFiles.has(f)) throw bad(`files[${i}]`, `lists ${JSON.stringify(f)} twice`);
    seenFiles.add(f);
  });

  if (!Array.isArray(m.tensors)) throw bad("tensors", `must be an array of tensor names, got ${describe(m.tensors)}`);
  const seen = new Set<string>();
  m.tensors.forEach((t, i) => {
    if (typeof t !== "string" || t === "") throw bad(`tensors[${i}]`, `must be a non-empty tensor name, got ${describe(t)}`);
    if (seen.has(t)) throw bad(`tensors[${i}]`, `lists ${JSON.stringify(t)} twice`);
    seen.add(t);
  });
  if (m.tensors.length > 0 && m.files.length === 0) throw bad("files", `is empty but tensors lists ${m.tensors.length} names`);

  if (m.mask_kinds !== undefined) {
    if (!isObject(m.mask_kinds)) throw bad("mask_kinds", `must be an object of mask tap name → "causal" | "none", got ${describe(m.mask_kinds)}`);
    for (const [k, v] of Object.entries(m.mask_kinds)) {
      const field = `mask_kinds[${JSON.stringify(k)}]`;
      if (!splitName(k).tap.startsWith("mask/")) throw bad(field, "is not a mask tap name (mask/{type}, with its call prefix)");
      if (v !== "causal" && v !== "none") throw bad(field, `must be "causal" or "none", got ${describe(v)}`);
      if (seen.has(k)) throw bad(field, "names a mask that tensors also lists (a mask is stored either as an array or as a kind)");
    }
  }
  if (m.notes !== undefined && typeof m.notes !== "string") throw bad("notes", `must be a string, got ${describe(m.notes)}`);
  return m as unknown as DumpManifest;
}

// ------------------------------------------------------------------ reading

interface Stored {
  info: DumpTensorInfo;
  /** Absolute byte offset of the data in its file. */
  start: number;
  bytes: number;
}

function readHeader(dir: string, file: string): { entries: Map<string, Stored> } {
  const path = join(dir, file);
  if (!existsSync(path)) throw new DumpError(file, "files", `listed in manifest.json files but absent from the dump folder`);
  let header: ReturnType<typeof checkSafetensors>;
  try {
    header = checkSafetensors(path);
  } catch (e) {
    if (!(e instanceof WeightsError)) throw e;
    const key = e.keys[0];
    if (!key) throw new DumpError(file, "(header)", e.detail);
    const field = key.startsWith("__metadata__") ? key : `tensor ${JSON.stringify(key)}`;
    throw new DumpError(file, field, `${field}: ${e.detail}`);
  }
  const lenBuf = Buffer.alloc(8);
  const fd = openSync(path, "r");
  try {
    readSync(fd, lenBuf, 0, 8, 0);
  } finally {
    closeSync(fd);
  }
  const dataStart = 8 + Number(lenBuf.readBigUInt64LE(0));
  const dataSize = statSync(path).size - dataStart;
  let end = 0;
  const entries = new Map<string, Stored>();
  for (const [name, t] of Object.entries(header)) {
    const st = ST_DTYPES[t.dtype];
    if (!st) throw new DumpError(file, `tensor ${JSON.stringify(name)}`, `tensor ${JSON.stringify(name)}: dtype ${t.dtype} is not one a dump may use (${Object.keys(ST_DTYPES).join(", ")})`);
    const [b, e] = t.data_offsets;
    end = Math.max(end, e);
    entries.set(name, { info: { name, file, dtype: st.dtype, stDtype: t.dtype, shape: [...t.shape] }, start: dataStart + b, bytes: e - b });
  }
  if (end !== dataSize) throw new DumpError(file, "(data)", `the data section holds ${dataSize} bytes but its tensors end at byte ${end} (truncated or corrupt)`);
  return { entries };
}

/**
 * Reads a dump folder: manifest.json's fields, every listed file's safetensors header, and the
 * listing (every name in exactly one file; nothing listed but absent, or present but unlisted).
 * Tensor data is read lazily by `tensors.read`.
 */
export function readDump(dir: string): Dump {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new DumpError(dir, "(folder)", `not a dump folder`);
  const mpath = join(dir, MANIFEST);
  if (!existsSync(mpath)) throw new DumpError(MANIFEST, "(file)", `missing: the dump folder ${dir} has no ${MANIFEST}`);
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(readFileSync(mpath));
  } catch (e) {
    throw new DumpError(MANIFEST, "(file)", `unreadable or not UTF-8: ${(e as Error).message}`);
  }
  const manifest = parseManifest(text);

  const stored = new Map<string, Stored>();
  for (const f of manifest.files) {
    for (const [name, s] of readHeader(dir, f).entries) {
      const other = stored.get(name);
      if (other) throw new DumpError(f, `tensor ${JSON.stringify(name)}`, `tensor ${JSON.stringify(name)} is also in ${other.info.file} (a name must be in exactly one file)`);
      stored.set(name, s);
    }
  }
  const listed = new Set(manifest.tensors);
  manifest.tensors.forEach((name, i) => {
    if (!stored.has(name)) throw new DumpError(MANIFEST, `tensors[${i}]`, `tensors[${i}] lists ${JSON.stringify(name)}, which no file of files holds`);
  });
  for (const [name, s] of stored) {
    if (!listed.has(name)) throw new DumpError(s.info.file, `tensor ${JSON.stringify(name)}`, `tensor ${JSON.stringify(name)} is present but manifest.json tensors does not list it`);
  }

  const masks = manifest.mask_kinds ?? {};
  const tensors: DumpTensors = {
    names: manifest.tensors,
    has: (name) => stored.has(name),
    info: (name) => {
      const s = stored.get(name);
      if (!s) throw new DumpError(MANIFEST, "tensors", `no tensor ${JSON.stringify(name)} in this dump`);
      return s.info;
    },
    read: (name) => {
      const s = stored.get(name);
      if (!s) throw new DumpError(MANIFEST, "tensors", `no tensor ${JSON.stringify(name)} in this dump`);
      const data = new Uint8Array(s.bytes);
      const path = join(dir, s.info.file);
      let fd: number;
      try {
        fd = openSync(path, "r");
      } catch (e) {
        throw new DumpError(s.info.file, `tensor ${JSON.stringify(name)}`, `cannot open to read tensor ${JSON.stringify(name)}: ${(e as Error).message}`);
      }
      try {
        const n = s.bytes ? readSync(fd, data, 0, s.bytes, s.start) : 0;
        if (n !== s.bytes) throw new DumpError(s.info.file, `tensor ${JSON.stringify(name)}`, `tensor ${JSON.stringify(name)}: read ${n} of ${s.bytes} bytes (the file changed or is truncated)`);
      } finally {
        closeSync(fd);
      }
      return { dtype: s.info.dtype, shape: [...s.info.shape], data };
    },
    maskKind: (name) => (Object.hasOwn(masks, name) ? masks[name] : undefined),
  };
  return { dir, manifest, tensors };
}

// ------------------------------------------------------------------ validation against a checkpoint

function readConfig(checkpointDir: string): Record<string, unknown> {
  const path = join(checkpointDir, "config.json");
  let c: unknown;
  try {
    c = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new DumpError(path, "(json)", `unreadable checkpoint config: ${(e as Error).message}`);
  }
  if (!isObject(c)) throw new DumpError(path, "(root)", `the checkpoint config is not a JSON object`);
  return c;
}

function positiveInt(config: Record<string, unknown>, key: string, path: string): number {
  const v = textConfig(config)[key];
  if (!isNat(v) || v === 0) throw new DumpError(path, key, `${key} must be a positive integer to check a dump's shapes, got ${describe(v)}`);
  return v;
}

function tokenValue(t: RawTensor): number {
  const dv = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  if (t.dtype === "int64") return Number(dv.getBigInt64(0, true));
  return t.dtype === "uint32" ? dv.getUint32(0, true) : dv.getInt32(0, true);
}

/**
 * Reads a dump and checks it against the checkpoint folder it claims: the hashes, the tap names
 * of every call of its schedule, the dtypes, the level-0/1 shapes the config gives, the declared
 * level, and the generated tokens against the stored step tokens. Returns the dump with a lazy
 * tensor reader; throws one DumpError for the first problem.
 */
export function validateDump(dir: string, checkpointDir: string): ValidDump {
  const dump = readDump(dir);
  const { manifest: m, tensors } = dump;

  const theirs = checkpointHashes(checkpointDir);
  const ours = m.checkpoint.files;
  for (const f of Object.keys(theirs)) {
    const field = `checkpoint.files[${JSON.stringify(f)}]`;
    if (!Object.hasOwn(ours, f)) throw new DumpError(MANIFEST, field, `${field} is missing: the checkpoint has ${f} (a dump of another checkpoint?)`);
    if (ours[f] !== theirs[f]) throw new DumpError(MANIFEST, field, `${field} is ${ours[f]!.slice(0, 12)}… but the checkpoint's ${f} hashes to ${theirs[f]!.slice(0, 12)}…: a dump of another checkpoint`);
  }
  for (const f of Object.keys(ours)) {
    const field = `checkpoint.files[${JSON.stringify(f)}]`;
    if (!Object.hasOwn(theirs, f)) throw new DumpError(MANIFEST, field, `${field} names a file the checkpoint does not have: a dump of another checkpoint`);
  }

  const cpath = join(checkpointDir, "config.json");
  const config = readConfig(checkpointDir);
  const hidden = positiveInt(config, "hidden_size", cpath);
  const vocab = positiveInt(config, "vocab_size", cpath);
  m.prompt.forEach((t, i) => {
    if (t >= vocab) throw new DumpError(MANIFEST, `prompt[${i}]`, `prompt[${i}] is ${t}, outside the checkpoint's vocabulary of ${vocab}`);
  });
  (m.generated ?? []).forEach((t, i) => {
    if (t >= vocab) throw new DumpError(MANIFEST, `generated[${i}]`, `generated[${i}] is ${t}, outside the checkpoint's vocabulary of ${vocab}`);
  });

  const calls = scheduleCalls(m.prompt.length, m.schedule);
  const byPrefix = new Map(calls.map((c) => [c.prefix, c]));
  const valid = new Map(calls.map((c) => [c.prefix, new Set([...callTaps(config, c), "logprobs"])]));
  const schedule = () => (calls.length === 1 ? "one forward call" : `calls ${calls[0]!.prefix}…${calls[calls.length - 1]!.prefix}`);
  const checkName = (name: string, field: string) => {
    const { prefix, tap } = splitName(name);
    const call = byPrefix.get(prefix);
    if (!call || !valid.get(prefix)!.has(tap)) {
      throw new DumpError(MANIFEST, field, `${field}: ${JSON.stringify(name)} is not a tap name of this schedule (${schedule()}; names: oracle/TAPS.md)`);
    }
    return { call, tap };
  };

  m.tensors.forEach((name, i) => {
    const { call, tap } = checkName(name, `tensors[${i}]`);
    const info = tensors.info(name);
    const where = `tensor ${JSON.stringify(name)}`;
    const allowed = allowedDtypes(tap);
    if (!allowed.includes(info.stDtype)) throw new DumpError(info.file, where, `${where}: dtype ${info.stDtype} where this tap must be one of ${allowed.join(", ")}`);
    const shapes = expectedShape(tap, call, hidden, vocab);
    if (shapes && !shapes.some((s) => s.length === info.shape.length && s.every((d, k) => d === info.shape[k]))) {
      throw new DumpError(info.file, where, `${where}: shape [${info.shape.join(",")}] where the config gives ${shapes.map((s) => `[${s.join(",")}]`).join(" or ")}`);
    }
  });
  for (const name of Object.keys(m.mask_kinds ?? {})) checkName(name, `mask_kinds[${JSON.stringify(name)}]`);

  // The level: every required call has every name of it (masks may be stored as kinds).
  const present = (name: string) => tensors.has(name) || tensors.maskKind(name) !== undefined;
  const firstMissing = (level: DumpLevel): string | null => {
    for (const c of calls) {
      if (!c.required) continue;
      for (const t of levelTaps(config, c, level)) {
        const name = c.prefix + t;
        if (present(name)) continue;
        if (t === "logits" && level < 2 && present(`${c.prefix}logprobs`)) continue;
        return name;
      }
    }
    return null;
  };
  let reached: DumpLevel | -1 = -1;
  for (const l of [0, 1, 2] as const) {
    if (firstMissing(l) !== null) break;
    reached = l;
  }
  if (reached !== m.level) {
    const detail =
      reached < m.level
        ? `level ${m.level} is declared but ${JSON.stringify(firstMissing(m.level))} is absent${m.level === 0 ? " (level 0: every call's logits or logprobs, and token on step calls)" : ""}`
        : `level ${m.level} is declared but every level-${reached} tensor is present: level must be ${reached} (the highest level complete)`;
    throw new DumpError(MANIFEST, "level", detail);
  }

  // The stored greedy tokens must be the ones the manifest says were generated.
  (m.generated ?? []).forEach((g, n) => {
    const name = `step${n}/token`;
    if (!tensors.has(name)) return;
    const info = tensors.info(name);
    const v = tokenValue(tensors.read(name));
    if (v !== g) throw new DumpError(info.file, `tensor ${JSON.stringify(name)}`, `tensor ${JSON.stringify(name)} holds token ${v} but manifest.json generated[${n}] is ${g}`);
  });
  return { ...dump, config, calls, level: m.level };
}

// ------------------------------------------------------------------ writing

/** The manifest a writer gives: `files` and `tensors` are filled in from the tensors written. */
export type DumpManifestInput = Omit<DumpManifest, "files" | "tensors" | "format" | "format_version"> & Partial<Pick<DumpManifest, "format" | "format_version">>;

export const TENSORS_FILE = "tensors.safetensors";

function isRaw(t: RawTensor | MlxArray): t is RawTensor {
  return "data" in t && (t as RawTensor).data instanceof Uint8Array;
}

let writeSeq = 0;

/**
 * Writes a dump folder atomically: everything goes to a temporary sibling folder, which is read
 * back (readDump) and then renamed to `dir`; an existing dump at `dir` is replaced, anything else
 * there is refused. Tensors (raw bytes or MlxArrays, in order) go to one tensors.safetensors
 * through MLX's safetensors writer (bytes unchanged). Returns the manifest written.
 */
export function writeDump(dir: string, manifest: DumpManifestInput, tensors: Map<string, RawTensor | MlxArray> | Iterable<[string, RawTensor | MlxArray]>): DumpManifest {
  const entries = [...tensors];
  if (existsSync(dir)) {
    if (!statSync(dir).isDirectory()) throw new DumpError(dir, "(folder)", `exists and is not a folder; refusing to replace it`);
    const inside = readdirSync(dir);
    if (inside.length > 0 && !inside.includes(MANIFEST)) throw new DumpError(dir, "(folder)", `exists and is not a dump (no ${MANIFEST}); refusing to replace it`);
  }
  const parent = dirname(dir);
  mkdirSync(parent, { recursive: true });
  const tmp = join(parent, `.${basename(dir)}.tmp-${process.pid}-${writeSeq++}`);
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp);
  try {
    const full: DumpManifest = {
      format: DUMP_FORMAT,
      format_version: DUMP_FORMAT_VERSION,
      ...manifest,
      files: entries.length ? [TENSORS_FILE] : [],
      tensors: entries.map(([n]) => n),
    };
    if (full.mask_kinds && Object.keys(full.mask_kinds).length === 0) delete full.mask_kinds;
    if (entries.length) {
      const arrays = new Map<string, MlxArray>();
      const owned: MlxArray[] = [];
      try {
        for (const [name, t] of entries) {
          if (isRaw(t)) {
            if (!ST_OF_MLX.has(t.dtype)) throw new DumpError(TENSORS_FILE, `tensor ${JSON.stringify(name)}`, `tensor ${JSON.stringify(name)}: dtype ${t.dtype} cannot be stored in a dump`);
            const a = mx.fromBytes(t.data, t.shape, t.dtype as mx.Dtype);
            owned.push(a);
            arrays.set(name, a);
          } else {
            arrays.set(name, t);
          }
        }
        // (MLX writes "__metadata__": null without metadata, which the safetensors format does not allow)
        mx.saveSafetensors(join(tmp, TENSORS_FILE), arrays, { format: DUMP_FORMAT });
      } finally {
        for (const a of owned) a.dispose();
      }
    }
    writeFileSync(join(tmp, MANIFEST), `${JSON.stringify(full, null, 2)}\n`);
    readDump(tmp);
    if (existsSync(dir)) {
      const old = `${tmp}.old`;
      renameSync(dir, old);
      renameSync(tmp, dir);
      rmSync(old, { recursive: true, force: true });
    } else {
      renameSync(tmp, dir);
    }
    return full;
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
}
