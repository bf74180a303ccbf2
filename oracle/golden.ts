// Reading goldens: golden/manifest.json, per-entry .json index, and the uncompressed .npz tap files.

import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "./client.ts";
import { type NpyRecord, parseNpy } from "./npy.ts";
import type { ScenarioDigests } from "./tap_digest.ts";

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

/**
 * How the goldens may be used elsewhere: only bit for bit, where the fingerprint and versions
 * equal the manifest's. There is no cross-platform budget: the one recorded before (CUDA's
 * per-dtype maximum over all taps, runs that generated other tokens included: float32
 * 2,105,203,498 ULP, bfloat16 49,641, uint32 |d| 191) could not fail, and the 64/2/2 ULP
 * "starting budget" for another machine was never measured.
 */
export interface CrossPlatform {
  note: string;
}

export const CROSS_PLATFORM_NOTE =
  "Goldens apply bit for bit where the platform fingerprint and versions equal these; anywhere else they are not compared and the suites compare against the live oracle on that machine, bit for bit (oracle/golden.ts goldenRule). No cross-platform budget: a bound measured as a maximum over every tap of another backend could not fail.";

/** How goldens are compared on this platform (the manifest's rule, in one place). */
export type GoldenRule = { mode: "exact" } | { mode: "live"; differs: string[]; what: string };

/**
 * Same fingerprint and versions (what decides the bits: oracle/python/server.py fingerprint and
 * versions): the goldens, bit for bit. Anything else: the goldens are not compared, and the
 * caller compares against the live oracle on this machine instead, bit for bit; `what` says so
 * and names what differs.
 */
export function goldenRule(m: Manifest, here: { versions: Record<string, unknown>; fingerprint: Record<string, unknown> }): GoldenRule {
  const differs: string[] = [];
  for (const [section, want, have] of [["versions", m.versions, here.versions], ["fingerprint", m.fingerprint, here.fingerprint]] as const) {
    for (const k of [...new Set([...Object.keys(want), ...Object.keys(have)])].sort()) {
      const a = JSON.stringify((want as Record<string, unknown>)[k] ?? null);
      const b = JSON.stringify((have as Record<string, unknown>)[k] ?? null);
      if (a !== b) differs.push(`${section}.${k} ${a} here ${b}`);
    }
  }
  if (differs.length === 0) return { mode: "exact" };
  return {
    mode: "live",
    differs,
    what: `goldens not compared: recorded on another platform (${differs.join("; ")}); compared against the live oracle on this machine instead, bit for bit`,
  };
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
  /**
   * Logits-only multimodal entries: a digest of every tap recorded, per call (oracle/tap_digest.ts
   * for the form). Kept per call, not per IndexTap: a logits entry lists only its stored taps, and
   * naming all 51,928 unstored ones would cost megabytes of the 40 MB budget.
   */
  digests?: ScenarioDigests;
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
): { entry: GoldenEntry; scenario: IndexScenario; taps: IndexTap[]; arrays: Map<string, NpyRecord>; digests?: ScenarioDigests } {
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
  // an entry the same as another is stored once, its digests with the other
  const digests = scenario.digests ?? (entry.same_as ? index.scenarios.find((s) => s.scenario === entry.same_as)?.digests : undefined);
  return { entry, scenario, taps, arrays, ...(digests ? { digests } : {}) };
}
