// Readable diff between two golden trees: entries and taps added/removed (diff package), files
// changed, and per changed tensor the largest absolute and ULP change.

import { join } from "node:path";
import { diffArrays, diffLines } from "diff";
import { type GoldenIndex, type Manifest, readIndex, readNpzTaps } from "./golden.ts";
import type { NpyRecord } from "./npy.ts";
import type { ScenarioDigests } from "./tap_digest.ts";
import { compareRaw } from "./tensor_diff.ts";

export interface TensorChange {
  tap: string;
  dtype: string;
  changed: number;
  total: number;
  maxAbs: number;
  maxUlp: number;
  note?: string;
}

export function compareTensors(tap: string, a: NpyRecord, b: NpyRecord): TensorChange {
  const d = compareRaw(tap, a, b);
  if (d.note) {
    const note = `shape/dtype ${a.dtype}${JSON.stringify(a.shape)} -> ${b.dtype}${JSON.stringify(b.shape)}`;
    return { tap, dtype: `${a.dtype}->${b.dtype}`, changed: Number.NaN, total: 0, maxAbs: Number.NaN, maxUlp: Number.NaN, note };
  }
  return { tap, dtype: a.dtype, changed: d.mismatches, total: d.total, maxAbs: d.maxAbs, maxUlp: d.maxUlp };
}

function fmtChange(c: TensorChange): string {
  if (c.note) return `      ~ ${c.tap}: ${c.note}`;
  const ulp = c.dtype.startsWith("float") || c.dtype === "bfloat16" ? `, max ${c.maxUlp} ulp` : "";
  return `      ~ ${c.tap} (${c.dtype}): ${c.changed}/${c.total} elements, max |d| ${c.maxAbs.toExponential(3)}${ulp}`;
}

function listChange<T>(label: string, before: T[], after: T[], show: (x: T) => string, limit = 12): string[] {
  const lines: string[] = [];
  for (const part of diffArrays(before, after)) {
    if (!part.added && !part.removed) continue;
    const sign = part.added ? "+" : "-";
    const vals = part.value;
    for (const v of vals.slice(0, limit)) lines.push(`    ${sign} ${label} ${show(v)}`);
    if (vals.length > limit) lines.push(`    ${sign} ... ${vals.length - limit} more ${label}s`);
  }
  return lines;
}

function short(s: string, n = 160): string {
  return s.length > n ? `${s.slice(0, n)}...` : s;
}

function jsonLines(label: string, a: unknown, b: unknown): string[] {
  const out: string[] = [];
  for (const part of diffLines(JSON.stringify(a ?? null, null, 2), JSON.stringify(b ?? null, null, 2))) {
    if (!part.added && !part.removed) continue;
    for (const l of part.value.split("\n").filter((x) => x.length > 0)) out.push(`    ${part.added ? "+" : "-"} ${label}: ${l.trim()}`);
  }
  return out;
}

/** Human-readable report; returns ["no changes"] when the trees are identical. */
export function diffGoldens(
  oldM: Manifest | undefined,
  newM: Manifest,
  oldDir: string,
  newDir: string,
  opts: { maxTensorsPerFile?: number } = {},
): string[] {
  if (!oldM?.files) {
    return [`new golden set: ${Object.keys(newM.entries).length} entries, ${(newM.total_bytes / 1e6).toFixed(2)} MB (no comparable previous manifest)`];
  }
  const out: string[] = [];
  const head = [
    ...jsonLines("versions", oldM.versions, newM.versions),
    ...jsonLines("fingerprint", oldM.fingerprint, newM.fingerprint),
    ...(oldM.taps_json_sha256 !== newM.taps_json_sha256 ? ["    ~ oracle/taps.json changed"] : []),
    ...jsonLines("plan", oldM.plan, newM.plan),
  ];
  if (head.length) out.push("environment:", ...head);

  const ckLines: string[] = [];
  const oldCk = Object.keys(oldM.checkpoints).sort();
  const newCk = Object.keys(newM.checkpoints).sort();
  ckLines.push(...listChange("checkpoint", oldCk, newCk, (x) => x));
  for (const id of newCk) {
    const a = oldM.checkpoints[id];
    const b = newM.checkpoints[id];
    if (!a || !b) continue;
    for (const [f, sha] of Object.entries(b.files)) {
      if (a.files[f] !== sha) ckLines.push(`    ~ ${id}/${f} sha256 ${a.files[f]?.slice(0, 12) ?? "(none)"} -> ${sha.slice(0, 12)}`);
    }
  }
  if (ckLines.length) out.push("checkpoints:", ...ckLines);

  const entryLines = listChange("entry", Object.keys(oldM.entries).sort(), Object.keys(newM.entries).sort(), (x) => {
    const e = newM.entries[x] ?? oldM.entries[x];
    return `${x} (${e?.mode})`;
  });
  for (const [id, b] of Object.entries(newM.entries)) {
    const a = oldM.entries[id];
    if (a && a.mode !== b.mode) entryLines.push(`    ~ entry ${id}: ${a.mode} -> ${b.mode}`);
  }
  if (entryLines.length) out.push("entries:", ...entryLines);

  const fileLines = listChange("file", Object.keys(oldM.files).sort(), Object.keys(newM.files).sort(), (x) => x);
  const limit = opts.maxTensorsPerFile ?? 20;
  for (const [path, f] of Object.entries(newM.files)) {
    const o = oldM.files[path];
    if (!o || o.sha256 === f.sha256) continue;
    fileLines.push(`    ~ ${path}: ${o.bytes} -> ${f.bytes} bytes`);
    if (path.endsWith(".npz")) fileLines.push(...npzDetail(path, oldDir, newDir, limit));
    if (path.endsWith(".json")) fileLines.push(...digestDetail(path, oldDir, newDir));
  }
  if (fileLines.length) out.push("files:", ...fileLines);
  if (oldM.total_bytes !== newM.total_bytes) out.push(`size: ${(oldM.total_bytes / 1e6).toFixed(2)} MB -> ${(newM.total_bytes / 1e6).toFixed(2)} MB`);
  return out.length ? out : ["no changes"];
}

/**
 * How a scenario's tap digests changed (oracle/tap_digest.ts): how many taps, and the first by
 * position (its call and place in the call: digests carry no names); null when unchanged.
 */
export function digestChange(a: ScenarioDigests | undefined, b: ScenarioDigests | undefined): string | null {
  if (!a && !b) return null;
  const count = (d: ScenarioDigests) => d.calls.reduce((n, c) => n + c.taps, 0);
  if (!a || !b) return a ? `digests removed (${count(a)} taps)` : `digests added (${count(b!)} taps)`;
  const flat = (d: ScenarioDigests) => d.calls.flatMap((c) => (c.short.match(/.{8}/g) ?? []).map((x, k) => ({ call: c.call, k, x })));
  const fa = flat(a);
  const fb = flat(b);
  let changed = 0;
  let first = -1;
  for (let i = 0; i < Math.max(fa.length, fb.length); i++) {
    if (fa[i]?.x === fb[i]?.x && fa[i]?.call === fb[i]?.call) continue;
    changed++;
    if (first < 0) first = i;
  }
  const calls = a.calls.filter((c, i) => c.sha256 !== b.calls[i]?.sha256).length + Math.max(0, b.calls.length - a.calls.length);
  if (changed === 0 && calls === 0 && a.form === b.form) return null;
  const at = first >= 0 ? (fb[first] ?? fa[first])! : undefined;
  const where = at ? `, first #${first} (call ${JSON.stringify(at.call)}, its tap ${at.k})` : "";
  return `digests: ${changed} of ${fb.length} taps changed${where}; ${calls} of ${b.calls.length} calls${a.form !== b.form ? `; form ${a.form} -> ${b.form}` : ""}`;
}

function digestDetail(path: string, oldDir: string, newDir: string): string[] {
  let ia: GoldenIndex;
  let ib: GoldenIndex;
  try {
    ia = readIndex(path, oldDir);
    ib = readIndex(path, newDir);
  } catch {
    return [];
  }
  const before = new Map(ia.scenarios.map((x) => [x.scenario, x.digests]));
  const lines: string[] = [];
  for (const x of ib.scenarios) {
    const c = digestChange(before.get(x.scenario), x.digests);
    if (c) lines.push(`      ~ ${x.scenario} ${c}`);
  }
  return lines;
}

function npzDetail(path: string, oldDir: string, newDir: string, limit: number): string[] {
  const idx = path.replace(/\.npz$/, ".json");
  let ia: GoldenIndex | undefined;
  let ib: GoldenIndex | undefined;
  try {
    ia = readIndex(idx, oldDir);
    ib = readIndex(idx, newDir);
  } catch {
    /* index missing on one side: compare tensors by npz entry names only */
  }
  const lines: string[] = [];
  if (ia && ib) {
    lines.push(...listChange("tap", ia.taps.map((t) => t.name), ib.taps.map((t) => t.name), (x) => x).map((l) => `  ${l}`));
    lines.push(...listChange("scenario", ia.scenarios.map((x) => x.scenario), ib.scenarios.map((x) => x.scenario), (x) => x).map((l) => `  ${l}`));
    const before = new Map(ia.scenarios.map((x) => [x.scenario, JSON.stringify({ ...x.meta, same_as: (x as { same_as?: string }).same_as })]));
    for (const x of ib.scenarios) {
      const was = before.get(x.scenario);
      const now = JSON.stringify({ ...x.meta, same_as: (x as { same_as?: string }).same_as });
      if (was !== undefined && was !== now) lines.push(`      ~ ${x.scenario} meta: ${short(was)} -> ${short(now)}`);
    }
  }
  const ta = readNpzTaps(join(oldDir, path), ia);
  const tb = readNpzTaps(join(newDir, path), ib);
  let shown = 0;
  let more = 0;
  for (const [name, y] of tb) {
    const x = ta.get(name);
    if (!x || (x.dtype === y.dtype && x.shape.join() === y.shape.join() && Buffer.compare(x.data, y.data) === 0)) continue;
    if (shown++ < limit) lines.push(fmtChange(compareTensors(name, x, y)));
    else more++;
  }
  if (more) lines.push(`      ~ ... ${more} more changed tensors`);
  return lines;
}
