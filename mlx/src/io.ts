// Safetensors load/save (mx.load / mx.save_safetensors), with metadata.
import { existsSync, statSync } from "node:fs";
import { handles, MlxArray, own } from "./array.ts";
import { checkPtr, checkStatus, MlxError } from "./errors.ts";
import { cstr, cstring, lib } from "./native.ts";

export interface Safetensors {
  /** Arrays by key, sorted by key. */
  arrays: Map<string, MlxArray>;
  metadata: Record<string, string>;
}

/** Loads every tensor of a .safetensors file (lazily, as mx.load does). */
export function loadSafetensors(path: string): Safetensors {
  if (!existsSync(path)) throw new MlxError("load_safetensors", `no such file: ${path}`);
  if (!statSync(path).isFile()) throw new MlxError("load_safetensors", `not a file: ${path}`);
  const l = checkPtr(lib.mlxb_load_safetensors(cstr(path)), "load_safetensors");
  try {
    const arrays = new Map<string, MlxArray>();
    const n = checkStatus(lib.mlxb_loaded_count(l, 0), "load_safetensors");
    for (let i = 0; i < n; i++) arrays.set(cstring(lib.mlxb_loaded_key(l, 0, i)), own(lib.mlxb_loaded_array(l, i), "load_safetensors"));
    const metadata: Record<string, string> = {};
    const m = checkStatus(lib.mlxb_loaded_count(l, 1), "load_safetensors");
    for (let i = 0; i < m; i++) metadata[cstring(lib.mlxb_loaded_key(l, 1, i))] = cstring(lib.mlxb_loaded_meta_value(l, i));
    return { arrays, metadata };
  } finally {
    lib.mlxb_loaded_free(l);
  }
}

function joined(strings: readonly string[]): Buffer {
  for (const s of strings) if (s.includes("\0")) throw new MlxError("save_safetensors", "keys and metadata may not contain NUL");
  return Buffer.from(strings.map((s) => `${s}\0`).join("") || "\0", "utf8");
}

/** Saves arrays (and string metadata) to a .safetensors file. */
export function saveSafetensors(path: string, arrays: Map<string, MlxArray> | Record<string, MlxArray>, metadata: Record<string, string> = {}): void {
  const entries = arrays instanceof Map ? [...arrays.entries()] : Object.entries(arrays);
  const keys = joined(entries.map(([k]) => k));
  const hs = handles(entries.map(([, v]) => v));
  const mk = Object.keys(metadata);
  const mkeys = joined(mk);
  const mvals = joined(mk.map((k) => metadata[k]!));
  checkStatus(lib.mlxb_save_safetensors(cstr(path), keys, hs.length ? hs : new Float64Array(1), hs.length, mkeys, mvals, mk.length), "save_safetensors");
}
