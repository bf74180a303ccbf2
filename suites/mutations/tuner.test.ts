// Mutation checks for the tuner: each case re-introduces ONE plausible training-port bug through
// the test-only switch in model/tuner/mutations.ts, runs the comparison the training suites run
// against mlx-lm's trainer, and asserts it fails FIRST at the tensor where the bug shows (named
// by step and parameter path, or the validation report). The unmutated port passes the same run
// (control). The loop runs its step compiled, as mlx-lm's trainer does: on a GPU a compiled step
// has other bits than an eager one (fused kernels contract a*b + c into one FMA), so an eager TS
// loop could not match mlx-lm's there.
// Reports the mutation score.

import { afterAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TUNER_MUTATIONS, type TunerMutation, withTunerMutation } from "../../model/tuner/mutations.ts";
import { RandomState } from "../../model/tuner/np_random.ts";
import type { Example } from "../../model/tuner/trainer.ts";
import type { StepKind } from "../../oracle/train_compare.ts";
import { type LoopCase, loopJob, runLoop } from "../tuner/loop_run.ts";
import { readMeta, readTensors, runTunerRef } from "../tuner/ref.ts";
import { pythonJob, runAndCompare, type TrainSpec } from "../tuner/train_run.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "tuner-mut-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const r = new RandomState(11);
const DATA: Example[] = [9, 14, 17, 21, 12, 30].map((n, i) => [Array.from({ length: n }, () => 1 + (r.nextUint32() % 255)), i % 2 === 0 ? 0 : 2] as const);

const SPEC: TrainSpec = {
  name: "dense f32 LoRA, AdamW, 4 steps (eager)",
  ckpt: "c1_dense/f32",
  fine_tune_type: "lora",
  num_layers: 3,
  lora_parameters: { rank: 4, scale: 20.0, dropout: 0.0 },
  seed: 42,
  optimizer: { name: "adamw", learning_rate: 1e-2 },
  data: DATA,
  batch_size: 2,
  seed_batches: 3,
  steps: 4,
};

const LOOP: LoopCase = {
  name: "dense f32 LoRA, dropout 0.1, validation at iterations 1 and 2",
  ckpt: "c1_dense/f32",
  lora: { rank: 4, scale: 20.0, dropout: 0.1 },
  optimizer: { name: "adamw", learning_rate: 1e-2 },
  args: { batch_size: 2, iters: 2, val_batches: 2, steps_per_report: 1, steps_per_eval: 1, steps_per_save: 10 },
};

interface Case {
  mutation: TunerMutation;
  why: string;
  /** Where the first divergence must be: step kind (and optionally step) of the training run. */
  first?: { kind: StepKind; step?: number; path?: RegExp };
  /** Or the loop run: the first differing report. */
  loop?: RegExp;
}

const CASES: Case[] = [
  { mutation: "lora_add_swapped", why: "LoRALinear sums (scale*z).astype + y: same loss, other gradient bits (tape order)", first: { kind: "grad", path: /lora_[ab]$/ } },
  { mutation: "lora_scale_twice", why: "the LoRA branch scaled twice: the lora_b gradients at step 1", first: { kind: "grad", step: 1, path: /lora_b$/ } },
  { mutation: "dropout_at_eval", why: "Dropout draws masks in eval mode: the validation loss after the first update (lora_b is 0 before it)", loop: /^val 1:/ },
  { mutation: "loss_mask_exact", why: "the loss mask without mlx-lm's extra padding target: step 1's loss", first: { kind: "loss", step: 1 } },
  { mutation: "adamw_decay_after", why: "AdamW decays the updated parameter: step 1's parameters", first: { kind: "param", step: 1 } },
];

runTunerRef([pythonJob(SPEC, join(tmp, "spec")), loopJob(LOOP, join(tmp, "loop"))]);

/** The first report that differs between two loop runs, as "val <it>: ..." / "train <it>: ...". */
function firstReportDiff(got: { train: object[]; val: object[] }, want: { train: object[]; val: object[] }): string | null {
  for (const kind of ["val", "train"] as const) {
    for (let i = 0; i < Math.max(got[kind].length, want[kind].length); i++) {
      const g = JSON.stringify(got[kind][i]);
      const w = JSON.stringify(want[kind][i]);
      if (g !== w) return `${kind} ${(want[kind][i] as { iteration?: number })?.iteration ?? i}: ${g} != ${w}`;
    }
  }
  return null;
}

const score = { applied: 0, caught: 0, lines: [] as string[] };

describe("tuner mutations: each bug fails first where it shows", () => {
  it("every mutation switch has a case", () => {
    expect(new Set(CASES.map((c) => c.mutation))).toEqual(new Set(TUNER_MUTATIONS));
  });

  const ref = () => readTensors(join(tmp, "spec", "train.safetensors"));
  const loopRef = () => readMeta<{ train: object[]; val: object[] }>(join(tmp, "loop"));

  it("control: the unmutated port matches both runs", () => {
    const { cmp } = runAndCompare(SPEC, ref(), join(tmp, "spec"));
    if (!cmp.ok) throw new Error(cmp.summary());
    expect(firstReportDiff(runLoop(LOOP, join(tmp, "ts-loop")), loopRef())).toBeNull();
  }, limit(120_000));

  for (const c of CASES) {
    it(`${c.mutation}: ${c.why}`, async () => {
      score.applied++;
      let caught = false;
      let what: string;
      if (c.loop) {
        const got = await withTunerMutation(c.mutation, () => runLoop(LOOP, join(tmp, `ts-${c.mutation}`)));
        const d = firstReportDiff(got, loopRef());
        what = d ?? "no report differs";
        caught = d !== null && c.loop.test(d);
      } else {
        const { cmp } = await withTunerMutation(c.mutation, () => runAndCompare(SPEC, ref(), join(tmp, "spec")));
        const f = cmp.first;
        what = f ? `step ${f.step}, ${f.kind} ${f.path}` : "no divergence";
        caught = f !== null && f.kind === c.first!.kind && (c.first!.step === undefined || f.step === c.first!.step) && (c.first!.path === undefined || c.first!.path.test(f.path));
      }
      if (caught) score.caught++;
      score.lines.push(`${caught ? "caught" : "MISSED"} ${c.mutation}: ${what}`);
      if (!caught) throw new Error(`mutation ${c.mutation} not caught where expected: ${what}`);
    }, limit(120_000));
  }
});

afterAll(() => {
  console.log(`[tuner mutations] score ${score.caught}/${score.applied}\n  ${score.lines.join("\n  ")}`);
});
