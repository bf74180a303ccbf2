// What the speculative-decoding suites share: the fixture directories, the seeded prompt, the
// model pools of one test file, and the face runner (a CLI under parity/ as a child process, its
// generated ids, and the one-clear-error check).
import { afterAll, expect } from "vitest";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { ModelPool } from "../../oracle/speculative.ts";
import { type DFlashResult, DrafterPool } from "../../oracle/speculative_dflash.ts";
import { limit } from "../../tests/time_limit.ts";
import { ROWS_INVARIANT } from "./rows.ts";

/** The fixture checkpoints and the speculative ones (oracle/python/make_speculative_fixtures.py). */
export const CK = join(REPO_ROOT, ".cache", "checkpoints");
export const SP = join(CK, "speculative");

/** The suites' seeded prompt of P tokens (ids below 256, every fixture's vocabulary). */
export const prompt = (P: number): number[] => Array.from({ length: P }, (_, i) => (i * 37 + 11) % 256);

/** A target-model pool and a DFlash drafter pool for the calling test file, disposed after it. */
export function filePools(): { pool: ModelPool; drafters: DrafterPool } {
  const pool = new ModelPool();
  const drafters = new DrafterPool();
  afterAll(() => {
    pool.dispose();
    drafters.dispose();
  });
  return { pool, drafters };
}

/**
 * After the calling test file: one line summing its DFlash-loop results (scenarios, rounds, bit-exact
 * tensors and values, accepted / drafted); with `fullFile` (the SPEC_FULL grids) every result as a
 * row of that JSON file, checked in beside the suite.
 */
export function summarizeDFlashResults(label: string, results: readonly DFlashResult[], fullFile: string | null): void {
  afterAll(() => {
    const sum = (f: (r: DFlashResult) => number) => results.reduce((s, r) => s + f(r), 0);
    console.log(`[${label}] ${results.length} scenarios, ${sum((r) => r.rounds)} rounds, ${sum((r) => r.vsOracle.tensors)} tensors and ${sum((r) => r.vsOracle.values)} values bit-exact vs mlx-vlm; accepted ${sum((r) => r.accepted)}/${sum((r) => r.drafted)} drafts`);
    if (fullFile === null) return;
    const rows = results.map((r) => ({ target: r.spec.target.slice(CK.length + 1), drafter: r.spec.drafter.slice(CK.length + 1), P: r.spec.prompt.length, N: r.spec.maxTokens, block: r.spec.draftBlockSize ?? null, ...(r.spec.sampling ? { sampling: r.spec.sampling } : {}), rounds: r.rounds, blockSizes: r.blockSizes, accepted: r.accepted, drafted: r.drafted, tensors: r.vsOracle.tensors, values: r.vsOracle.values, firstMismatch: r.vsOracle.first, equalsGreedy: r.vsGreedy ? r.vsGreedy.first === null : null, oracleEqualsGreedy: r.oracleEqualsGreedy }));
    writeFileSync(fullFile, JSON.stringify({ device: ROWS_INVARIANT ? "cpu" : "gpu", scenarios: rows }, null, 1) + "\n");
  });
}

/** A round-by-round scenario of the drafter suites. */
export interface DrafterScenario {
  label: string;
  fx: string;
  /** Target directory relative to the checkpoint root (default `<fx>/f32`). */
  target?: string;
  /** Prompt length and tokens to generate. */
  P: number;
  N: number;
  /** --draft-block-size. */
  block?: number;
}

export interface FaceRun {
  code: number | null;
  /** stdout then stderr. */
  out: string;
  stdout: string;
}

/** `bun parity/<script> ...args` from the repository root. */
export function runFace(script: string, args: string[]): FaceRun {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", script), ...args], { cwd: REPO_ROOT, encoding: "utf8", timeout: limit(120_000) });
  return { code: r.status, out: `${r.stdout}${r.stderr}`, stdout: r.stdout };
}

/** `npm run generate -- ...args`. */
export const generate = (args: string[]): FaceRun => runFace("generate_cli.ts", args);

/** One clear error: the message, the exit code, no stack frames. */
export function expectClean(r: { code: number | null; out: string }, code: number, message: RegExp): void {
  expect(r.out).toMatch(message);
  expect(r.code).toBe(code);
  expect(r.out).not.toMatch(/\n\s+at .+:\d+:\d+/);
}

/** The generated ids: the text between the two ========== rules (never empty: a run that printed none fails here). */
export function ids(stdout: string): string {
  const text = (stdout.split("==========")[1] ?? "").trim();
  expect(text).toMatch(/^\d+( \d+)*$/);
  return text;
}
