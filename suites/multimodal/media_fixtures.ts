// Shared by the multimodal suites: the generated media (make_media.py, fixed seeds) and the
// processor directories mlx-vlm loads, made once per test file in a temp dir.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";

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
