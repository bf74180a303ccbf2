// Shared by the multimodal suites: the generated media (make_media.py, fixed seeds) and the
// processor directories mlx-vlm loads, made once per test file in a temp dir.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_PYTHON, type OracleClient, REPO_ROOT } from "../../oracle/client.ts";
import { oracleMedia } from "../../oracle/media.ts";
import { keepMlxBugNote } from "../../oracle/mlx_bugs.ts";
import type { RunResult } from "../../parity/schema.ts";
import { expect } from "vitest";

export interface MediaItem {
  name: string;
  file: string;
  [k: string]: unknown;
}

/** Opt-in full sweeps: MEDIA_FULL=1 (see suites/multimodal/README.md). */
export const FULL = process.env.MEDIA_FULL === "1";

export function tempDir(tag: string): { dir: string; remove: () => void } {
  const dir = mkdtempSync(join(tmpdir(), `mm-${tag}-`));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Run make_media.py and parse its manifest. */
export function makeMedia<T = MediaItem[]>(out: string, what: string, extra: string[] = []): T {
  const p = Bun.spawnSync([DEFAULT_PYTHON, "-I", join(REPO_ROOT, "suites/multimodal/make_media.py"), out, what, ...extra], { cwd: "/" });
  if (p.exitCode !== 0) throw new Error(`make_media.py ${what} failed: ${p.stderr.toString()}`);
  return JSON.parse(p.stdout.toString()) as T;
}

/** One entry of make_video.py's manifest (a "bad" file has no geometry). */
export interface VideoFile {
  name: string;
  path: string;
  kind: "video" | "bad";
  width?: number;
  height?: number;
  fps?: number;
  frames?: number;
}

/** Run make_video.py into out (its --full set when full) and parse its manifest. */
export function makeVideos(out: string, full: boolean): VideoFile[] {
  const p = Bun.spawnSync([DEFAULT_PYTHON, "-I", join(REPO_ROOT, "suites/multimodal/make_video.py"), out, ...(full ? ["--full"] : [])], { cwd: "/" });
  if (p.exitCode !== 0) throw new Error(`make_video.py failed: ${p.stderr.toString()}`);
  return JSON.parse(p.stdout.toString()) as VideoFile[];
}

/** The oracle's video variant of each fixture checkpoint (video_token_id set), under dir/ckpt: checkpoint -> its directory. */
export async function makeVideoVariants(oracle: OracleClient, dir: string, checkpoints: readonly string[], videoTokenId: number): Promise<Map<string, string>> {
  const variants = new Map<string, string>();
  for (const c of checkpoints) {
    const dst = join(dir, "ckpt", c.replace("/", "_"));
    await oracleMedia(oracle, "make_video_variant", { src: join(REPO_ROOT, ".cache/checkpoints", c), dst, video_token_id: videoTokenId });
    variants.set(c, dst);
  }
  return variants;
}

export interface ProcessorSpec {
  name: string;
  /** processor_config.json contents (null: no processor config file at all). */
  config: Record<string, unknown> | null;
  /** Write it flat, as preprocessor_config.json. */
  flat?: boolean;
}

/** Processor directories under `out` (tokenizer + config.json + each processor config). */
export function makeProcessorDirs(out: string, specs: ProcessorSpec[]): { name: string; dir: string; vocab: Record<string, number> }[] {
  return makeMedia(out, "processors", ["--configs", JSON.stringify(specs)]);
}

/**
 * A video tap run (parity/engine.ts runParity) checked: every tap byte-identical, the tokens equal,
 * or, only on the backend where a recorded MLX bug lives, a first divergent tap that an op on the
 * bug's path produced (oracle/mlx_bugs.ts mlxBugAtTap, as `npm run parity` attributes it): that run
 * is counted apart in `atBugs`, its taps from there on unverified, never a pass. Returns whether
 * the run was bit-exact.
 */
export function expectExactOrAtMlxBug(label: string, r: RunResult, o: { steps: number; minTaps: number; suite: string; atBugs: string[] }): boolean {
  expect(r.tapsCompared, label).toBeGreaterThan(o.minTaps);
  if (r.firstDivergence && r.mlxBug) {
    expect(r.firstDivergence.tap, label).toBe(r.mlxBug.tap);
    keepMlxBugNote(o.atBugs, o.suite, `${label}: first divergent tap ${r.mlxBug.tap} (MLX bug ${r.mlxBug.id}, ${r.mlxBug.reproducer}); ${r.tapsCompared - (r.unverifiedTaps ?? 0)} taps bit-exact before it, ${r.unverifiedTaps} unverified`);
    return false;
  }
  expect({ label, first: r.firstDivergence?.tap ?? null, exact: r.bitExact }).toEqual({ label, first: null, exact: r.tapsCompared });
  expect(r.tokens.ts, label).toEqual(r.tokens.oracle);
  expect(r.tokens.ts.length, label).toBe(o.steps);
  return true;
}
