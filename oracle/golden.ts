// Reading goldens: golden/manifest.json, per-entry .json index, and the uncompressed .npz tap files.

import * as mx from "@mlx-bun/mlx";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "./client.ts";
import { type NpyRecord, parseNpy } from "./npy.ts";

export const GOLDEN_DIR = join(REPO_ROOT, "golden");

/** One (checkpoint, scenario) golden. Logits-only entries of a checkpoint share one file. */
export interface GoldenEntry {
  checkpoint: string;
  scenario: string;
  mode: "full" | "logits";
  npz: string; // relative to golden/
  index: string; // relative to golden/
  /** Name prefix of this entry's taps inside the npz ("" or "<scenario>/"). */
  prefix: string;
  /** Set when this scenario runs exactly the same model calls as another one (stored once). */
  same_as?: string;
  taps: number;
  stored: number;
}

export interface Manifest {
  format: number;
  generated_by: string;
  versions: Record<string, string>;
  fingerprint: Record<string, unknown>;
  cross_platform: CrossPlatform;
  taps_json_sha256: string;
  plan: unknown;
  checkpoints: Record<string, { layout: string; dtype: string; quantization: unknown; features: string[]; files: Record<string, string> }>;
  /** Every file under golden/ except manifest.json. */
  files: Record<string, { sha256: string; bytes: number }>;
  entries: Record<string, GoldenEntry>;
  full_dumps: string[];
  logits_only: string[];
  total_bytes: number;
}

/** A measured distance between the goldens and mlx-lm on another backend (oracle/python/golden_distance.py). */
export interface BackendMeasurement {
  measured: string;
  backend: string;
  device: string;
  fingerprint: Record<string, unknown>;
  versions: Record<string, string>;
  /** Which golden set it was measured against (goldenFilesDigest of the manifest's files). */
  golden_files: string;
  entries: number;
  /** Every measured entry of the manifest was measured (golden_distance.py writes partial results too). */
  complete: boolean;
  taps: number;
  /** Entries whose generated tokens differ there (taps compared up to the first differing token). */
  diverged: { entry: string; first_differing_token: number }[];
  /** max_abs null: a non-finite difference (one side inf where the other is finite). */
  per_dtype: Record<string, { taps: number; taps_differing: number; max_ulp: number; max_abs: number | null }>;
  per_kind: Record<string, Record<string, { taps: number; taps_differing: number; max_ulp: number; max_abs: number | null }>>;
  /** Per checkpoint id, then dtype (some checkpoints meet backend bugs others do not); absent in older measurements. */
  per_checkpoint?: Record<string, Record<string, { taps: number; taps_differing: number; max_ulp: number; max_abs: number | null }>>;
}

export interface CrossPlatform {
  /** For another fingerprint of the recording backend (another machine): a starting value, not measured. */
  ulp_budget: Record<string, number>;
  note: string;
  /** Measured per backend ("cuda", "metal"): its per-dtype ULP budget is the measured maximum. */
  backends?: Record<string, BackendMeasurement>;
}

/** How goldens are compared on this platform (the manifest's rule, in one place). */
export type GoldenRule =
  | { mode: "exact" }
  | { mode: "budget"; budget: Record<string, number>; measured: boolean; what: string }
  | { mode: "none"; what: string };

/**
 * Same fingerprint and versions: bit for bit. Another backend with a measurement in the manifest:
 * within that backend's measured per-dtype maximum ULP distance. Another backend without one:
 * not compared (nothing says how far they may be), said as such; the live oracle stays the bar.
 * Another machine of the same backend: within the unmeasured starting budget, said as such.
 */
export function goldenRule(m: Manifest, here: { versions: Record<string, string>; fingerprint: Record<string, unknown> }): GoldenRule {
  if (JSON.stringify(m.fingerprint) === JSON.stringify(here.fingerprint) && JSON.stringify(m.versions) === JSON.stringify(here.versions)) return { mode: "exact" };
  const from = String(m.fingerprint.mlx_backend ?? "cpu");
  const backend = String(here.fingerprint.mlx_backend ?? "cpu");
  const meas = m.cross_platform.backends?.[backend];
  if (backend !== from && meas && JSON.stringify(meas.versions) === JSON.stringify(here.versions)) {
    // float dtypes: the measured max ULP; integer and bool dtypes (no ULP): the measured max |d|
    const budget: Record<string, number> = {};
    for (const [dt, v] of Object.entries(meas.per_dtype)) {
      const float = mx.isFloating(dt as mx.Dtype);
      if (float && v.max_ulp >= 0) budget[dt] = v.max_ulp;
      else if (!float && v.max_abs !== null && Number.isFinite(v.max_abs)) budget[dt] = v.max_abs;
    }
    return { mode: "budget", budget, measured: true, what: `goldens recorded on ${from} compared within the ${backend} distance measured ${meas.measured.slice(0, 10)} (per dtype: max ULP for floats, max |d| for integers: ${JSON.stringify(budget)})` };
  }
  if (backend !== from) return { mode: "none", what: `goldens recorded on ${from} not compared on ${backend}: the manifest has no distance measured there (oracle/python/golden_distance.py); the live oracle is compared bit for bit` };
  return { mode: "budget", budget: m.cross_platform.ulp_budget, measured: false, what: `goldens recorded on another ${from} machine compared within the unmeasured starting budget ${JSON.stringify(m.cross_platform.ulp_budget)}` };
}

/** Identifies a golden set: sha256 over "path:sha256" lines of the manifest's files, sorted by path. */
export function goldenFilesDigest(files: Manifest["files"]): string {
  return sha256(new TextEncoder().encode(Object.keys(files).sort().map((k) => `${k}:${files[k]!.sha256}\n`).join("")));
}

export interface IndexTap {
  name: string;
  kind?: "array" | "none" | "str";
  dtype?: string;
  shape?: number[];
  stored?: boolean;
  value?: string;
  meta?: Record<string, unknown>;
}

export interface IndexScenario {
  scenario: string;
  mode: "full" | "logits";
  meta: Record<string, unknown>;
  tap_count: number;
  stored: number;
  calls?: Record<string, unknown>[];
}

export interface GoldenIndex {
  checkpoint: string;
  scenarios: IndexScenario[];
  /** Full dumps: every tap in execution order. Logits groups: the stored taps only. */
  taps: IndexTap[];
}

export function sha256(buf: Uint8Array): string {
  return createHash("sha256").update(buf).digest("hex");
}

export function readManifest(dir = GOLDEN_DIR): Manifest | undefined {
  const p = join(dir, "manifest.json");
  return existsSync(p) ? (JSON.parse(readFileSync(p, "utf8")) as Manifest) : undefined;
}

export function readIndex(relPath: string, dir = GOLDEN_DIR): GoldenIndex {
  return JSON.parse(readFileSync(join(dir, relPath), "utf8")) as GoldenIndex;
}

/** Entries of an uncompressed zip (what golden_io.write_npz writes): name -> bytes. */
export function readZipStored(buf: Uint8Array): Map<string, Uint8Array> {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let eocd = -1;
  for (let i = buf.length - 22; i >= Math.max(0, buf.length - 22 - 65535); i--) {
    if (dv.getUint32(i, true) === 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw new Error("not a zip file (no end of central directory)");
  const count = dv.getUint16(eocd + 10, true);
  let p = dv.getUint32(eocd + 16, true);
  const out = new Map<string, Uint8Array>();
  const dec = new TextDecoder();
  for (let k = 0; k < count; k++) {
    if (dv.getUint32(p, true) !== 0x02014b50) throw new Error("corrupt zip central directory");
    const method = dv.getUint16(p + 10, true);
    const size = dv.getUint32(p + 20, true);
    const nameLen = dv.getUint16(p + 28, true);
    const extraLen = dv.getUint16(p + 30, true);
    const commentLen = dv.getUint16(p + 32, true);
    const local = dv.getUint32(p + 42, true);
    const name = dec.decode(buf.subarray(p + 46, p + 46 + nameLen));
    if (method !== 0) throw new Error(`zip entry ${name} is compressed (method ${method}); goldens are stored`);
    const lNameLen = dv.getUint16(local + 26, true);
    const lExtraLen = dv.getUint16(local + 28, true);
    const start = local + 30 + lNameLen + lExtraLen;
    out.set(name, buf.subarray(start, start + size));
    p += 46 + nameLen + extraLen + commentLen;
  }
  return out;
}

/** Stored taps of an .npz as records (bf16 re-tagged from the index). */
export function readNpzTaps(npzPath: string, index?: GoldenIndex): Map<string, NpyRecord> {
  const tags = new Map<string, string>();
  for (const t of index?.taps ?? []) if (t.dtype) tags.set(t.name, t.dtype);
  const out = new Map<string, NpyRecord>();
  for (const [entry, bytes] of readZipStored(new Uint8Array(readFileSync(npzPath)))) {
    const name = entry.replace(/\.npy$/, "");
    out.set(name, parseNpy(bytes, tags.get(name)));
  }
  return out;
}

/** One golden entry ("c1_dense/f32/fwd_L13"): its index part and stored taps, names without the file prefix. */
export function loadGolden(
  entryId: string,
  dir = GOLDEN_DIR,
): { entry: GoldenEntry; scenario: IndexScenario; taps: IndexTap[]; arrays: Map<string, NpyRecord> } {
  const m = readManifest(dir);
  const entry = m?.entries[entryId];
  if (!entry) throw new Error(`no golden entry ${entryId} in ${join(dir, "manifest.json")}`);
  const index = readIndex(entry.index, dir);
  const scenario = index.scenarios.find((s) => s.scenario === entry.scenario);
  if (!scenario) throw new Error(`index ${entry.index} has no scenario ${entry.scenario}`);
  const strip = (n: string) => n.slice(entry.prefix.length);
  const taps = index.taps.filter((t) => t.name.startsWith(entry.prefix)).map((t) => ({ ...t, name: strip(t.name) }));
  const arrays = new Map<string, NpyRecord>();
  for (const [name, rec] of readNpzTaps(join(dir, entry.npz), index)) if (name.startsWith(entry.prefix)) arrays.set(strip(name), rec);
  return { entry, scenario, taps, arrays };
}
