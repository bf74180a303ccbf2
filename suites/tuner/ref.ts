// Helpers of the tuner suites: run oracle/python/tuner_ref.py on a list of jobs (one Python
// process), read its safetensors back as raw tensors, and compare named tensors one by one.

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { compareRaw, formatDiff, type RawTensor, rawOf } from "../../oracle/compare.ts";

export const CKPT_ROOT = join(REPO_ROOT, ".cache", "checkpoints");

/** Runs tuner_ref.py on `jobs`; throws with its stderr if the process fails outright. */
export function runTunerRef(jobs: object[]): void {
  const r = Bun.spawnSync([DEFAULT_PYTHON, "-I", join(REPO_ROOT, "oracle/python/tuner_ref.py")], {
    stdin: new TextEncoder().encode(JSON.stringify(jobs)),
    stderr: "pipe",
    stdout: "pipe",
  });
  if (r.exitCode !== 0 && r.exitCode !== 1) throw new Error(`tuner_ref.py exited ${r.exitCode}: ${r.stderr.toString().slice(-4000)}`);
}

/** A job's meta.json (throws with the Python traceback if the job crashed). */
export function readMeta<T = Record<string, unknown>>(out: string): T {
  const p = join(out, "meta.json");
  if (!existsSync(p)) throw new Error(`${p}: the oracle job wrote no meta.json`);
  const m = JSON.parse(readFileSync(p, "utf8")) as Record<string, unknown>;
  if (m.crash) throw new Error(`oracle job crashed:\n${String(m.crash)}`);
  return m as T;
}

/** Every tensor of a safetensors file as raw bytes (the arrays are freed). */
export function readTensors(file: string): Map<string, RawTensor> {
  const { arrays } = mx.loadSafetensors(file);
  const out = new Map<string, RawTensor>();
  for (const [k, a] of arrays) {
    out.set(k, rawOf(a));
    a.dispose();
  }
  return out;
}

/** Compares named arrays with the oracle's, in the given order; returns the first difference or null. */
export function firstMismatch(ours: Iterable<[string, MlxArray | RawTensor]>, theirs: Map<string, RawTensor>): string | null {
  const seen = new Set<string>();
  for (const [k, a] of ours) {
    seen.add(k);
    const t = theirs.get(k);
    if (!t) return `${k}: not in the oracle's tensors`;
    const d = compareRaw(k, a instanceof mx.MlxArray ? rawOf(a) : a, t);
    if (!d.equal) return formatDiff(d);
  }
  for (const k of theirs.keys()) if (!seen.has(k)) return `${k}: the oracle has it, the port does not`;
  return null;
}
