// Safetensors load/save (mx.load / mx.save_safetensors), with metadata.
import { existsSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
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
  const arrays = new Map<string, MlxArray>();
  try {
    const n = checkStatus(lib.mlxb_loaded_count(l, 0), "load_safetensors");
    for (let i = 0; i < n; i++) arrays.set(loadedKey(l, 0, i, path), own(lib.mlxb_loaded_array(l, i), "load_safetensors"));
    const metadata: Record<string, string> = {};
    const m = checkStatus(lib.mlxb_loaded_count(l, 1), "load_safetensors");
    for (let i = 0; i < m; i++) metadata[loadedKey(l, 1, i, path)] = cstring(lib.mlxb_loaded_meta_value(l, i));
    return { arrays, metadata };
  } catch (e) {
    for (const a of arrays.values()) a.dispose();
    throw e;
  } finally {
    lib.mlxb_loaded_free(l);
  }
}

/** Key i of a loaded file; a key with a NUL byte is refused (it would read back cut short). */
function loadedKey(l: number, which: 0 | 1, i: number, path: string): string {
  const key = cstring(lib.mlxb_loaded_key(l, which, i));
  if (Buffer.byteLength(key, "utf8") !== lib.mlxb_loaded_key_length(l, which, i)) {
    throw new MlxError("load_safetensors", `${path}: ${which === 0 ? "tensor" : "metadata"} name ${JSON.stringify(key)}… contains a NUL byte`);
  }
  return key;
}

function joined(strings: readonly string[]): Buffer {
  for (const s of strings) if (s.includes("\0")) throw new MlxError("save_safetensors", "keys and metadata may not contain NUL");
  return Buffer.from(strings.map((s) => `${s}\0`).join("") || "\0", "utf8");
}

let tmpSeq = 0;

/**
 * Saves arrays (and string metadata) to a .safetensors file, named as MLX names it (".safetensors"
 * appended when missing). Written to a temporary name beside it, then renamed, so a save that
 * fails part-way (MLX writes the header before it meets, say, a float64 array) leaves no file.
 */
export function saveSafetensors(path: string, arrays: Map<string, MlxArray> | Record<string, MlxArray>, metadata: Record<string, string> = {}): void {
  if (path.includes("\0")) throw new MlxError("save_safetensors", `the path contains a NUL byte: ${JSON.stringify(path)}`);
  const final = path.endsWith(".safetensors") ? path : `${path}.safetensors`;
  const tmp = join(dirname(final), `.${basename(final)}.${process.pid}.${tmpSeq++}.tmp.safetensors`);
  try {
    writeSafetensors(tmp, arrays, metadata);
    renameSync(tmp, final);
  } catch (e) {
    rmSync(tmp, { force: true });
    if (e instanceof MlxError) throw e;
    throw new MlxError("save_safetensors", `${final}: ${(e as Error).message}`);
  }
}

function writeSafetensors(path: string, arrays: Map<string, MlxArray> | Record<string, MlxArray>, metadata: Record<string, string>): void {
  const entries = arrays instanceof Map ? [...arrays.entries()] : Object.entries(arrays);
  const keys = joined(entries.map(([k]) => k));
  const hs = handles(entries.map(([, v]) => v));
  const mk = Object.keys(metadata);
  const mkeys = joined(mk);
  const mvals = joined(mk.map((k) => metadata[k]!));
  checkStatus(lib.mlxb_save_safetensors(cstr(path), keys, hs.length ? hs : new Float64Array(1), hs.length, mkeys, mvals, mk.length), "save_safetensors");
}
