// The training loop against mlx-lm's own trainer.train() (compiled step, mx.random and numpy
// state, validation at it == 1 / every steps_per_eval / the last iteration in eval mode, reports
// every steps_per_report, adapter checkpoints every steps_per_save and the final save): the same
// validation losses, train losses, learning rates and token counts at the same iterations, and
// bit-identical adapter files. One run with LoRA dropout 0.1 (the masks come from the global key
// inside the compiled step, and validation must not draw), one with grad_checkpoint and gradient
// accumulation on a bf16 base.

import { afterAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { firstMismatch, readMeta, readTensors, runTunerRef } from "./ref.ts";
import { LOOP_CASES, loopJob, runLoop } from "./loop_run.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "tuner-loop-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

// the default run takes the first case; TUNER_FULL=1 both
const CASES = process.env.TUNER_FULL === "1" ? LOOP_CASES : LOOP_CASES.slice(0, 1);
runTunerRef(CASES.map((c, i) => loopJob(c, join(tmp, `py${i}`))));

describe("train() vs mlx-lm's trainer.train()", () => {
  CASES.forEach((c, i) => {
    it(c.name, () => {
      const want = readMeta<{ train: object[]; val: object[] }>(join(tmp, `py${i}`));
      const got = runLoop(c, join(tmp, `ts${i}`));
      expect(got.val).toEqual(want.val);
      expect(got.train).toEqual(want.train);
      expect(want.train.length).toBeGreaterThan(0);
      const files = ["adapters.safetensors", ...(c.args.steps_per_save! <= c.args.iters! ? [`${String(c.args.steps_per_save).padStart(7, "0")}_adapters.safetensors`] : [])];
      for (const f of files) {
        const bad = firstMismatch(readTensors(join(tmp, `ts${i}`, f)), readTensors(join(tmp, `py${i}`, "adapters", f)));
        if (bad) throw new Error(`${f}: ${bad}`);
      }
    }, limit(120_000));
  });
});
