// `npm run parity -- --mode batch --model DIR` on a checkpoint whose vocabulary is smaller than
// the token ids of fixtures/batch_scenarios.json: refused before any oracle starts, exit 2, with
// the scenario, the id and the vocabulary named (it once ran and died in MLX's take: "index 233 is
// out of range for an axis of size 211", exit 1). The checkpoint is c1_dense/f32 cut to its first
// 211 embedding rows (vocab_size 211, tied output layer).
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { REPO_ROOT } from "../../oracle/client.ts";
import { limit } from "../time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "parity-batch-vocab-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const SRC = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");

/** c1_dense/f32 with `vocab` embedding rows. */
function smallVocab(vocab: number): string {
  const dir = join(tmp, `vocab${vocab}`);
  mkdirSync(dir, { recursive: true });
  const { arrays, metadata } = mx.loadSafetensors(join(SRC, "model.safetensors"));
  const key = [...arrays.keys()].find((k) => k.endsWith("embed_tokens.weight"))!;
  const full = arrays.get(key)!;
  arrays.set(key, mx.slice(full, [0, 0], [vocab, full.shape[1]!]));
  full.dispose();
  mx.saveSafetensors(join(dir, "model.safetensors"), arrays, metadata);
  for (const a of arrays.values()) a.dispose();
  const config = JSON.parse(readFileSync(join(SRC, "config.json"), "utf8")) as Record<string, unknown>;
  writeFileSync(join(dir, "config.json"), JSON.stringify({ ...config, vocab_size: vocab, vocab_size_per_layer_input: vocab }));
  copyFileSync(join(SRC, "model.safetensors.index.json"), join(dir, "model.safetensors.index.json"));
  return dir;
}

function cli(args: string[]): { code: number | null; out: string } {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", "cli.ts"), ...args], { cwd: REPO_ROOT, encoding: "utf8", timeout: limit(180_000) });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

describe("parity --mode batch --model on a small vocabulary", () => {
  it("refuses scenarios with token ids outside the vocabulary, exit 2, before any oracle starts", () => {
    const dir = smallVocab(211);
    const r = cli(["--mode", "batch", "--model", dir, "--out", join(tmp, "out")]);
    expect(r.out).toMatch(/error: batch scenario straddle_window has token id 233, outside the vocabulary of this checkpoint \(vocab_size 211\)/);
    expect(r.out).not.toContain("[take]");
    expect(r.code, r.out).toBe(2);
    expect(r.out).not.toContain("[batch "); // no run started
  }, limit(180_000));
});
