// Opt-in (GEMMA4_REAL_SHAPES=1): logits of full-width random checkpoints (real Gemma 4 shapes:
// head dims 256/512, vocab 262144, PLE 256, 4-bit g64; built by
// `make_checkpoints.py --shape e2b|e4b|26b-a4b|31b --out .cache/bench/<name>`) byte-identical to
// mlx-lm's (oracle `forward`). Minutes per model on a 2-core CPU, so not part of the default run.
// Measured: .cache/bench/e2b-35l (35 layers, 20 KV-shared) bit-identical, B=1 L=6.

import { describe, expect, it } from "vitest";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { loadModel } from "../../model/gemma4/index.ts";
import { compareRaw, formatDiff } from "../../oracle/compare.ts";
import { limit } from "../../tests/time_limit.ts";

const BENCH = join(REPO_ROOT, ".cache", "bench");
const enabled = process.env.GEMMA4_REAL_SHAPES === "1";
const dirs = enabled && existsSync(BENCH) ? readdirSync(BENCH).filter((d) => existsSync(join(BENCH, d, "config.json"))) : [];
const TOKENS = [[2, 818, 5279, 529, 7001, 563]];

describe.skipIf(!enabled)("real-shape checkpoints vs mlx-lm (opt-in)", () => {
  it("has checkpoints to check", () => expect(dirs.length).toBeGreaterThan(0));
  for (const d of dirs) {
    it(d, async () => {
      const oracle = await sharedOracle();
      const want = await oracle.forward(join(BENCH, d), TOKENS);
      const { model } = loadModel(join(BENCH, d));
      try {
        using x = mx.array(TOKENS.flat(), [1, TOKENS[0]!.length], "int32");
        using l = model.call(x);
        const diff = compareRaw("logits", { dtype: l.dtype, shape: l.shape, data: l.toBytes() }, want);
        if (!diff.equal) throw new Error(formatDiff(diff));
      } finally {
        model.dispose();
      }
    }, limit(1_800_000));
  }
});
