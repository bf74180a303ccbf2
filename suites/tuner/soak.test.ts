// Opt-in soak (TUNER_SOAK=1): 500 training steps of the compiled trainer step (dense f32 LoRA,
// AdamW, batches cycling through iterate_batches with loop) hold memory flat: MLX's active
// memory at every 50th step stays within ±5% of its value at step 50, and the count of live
// native array handles does not grow. Prints the series.

import { describe, expect, it } from "vitest";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadModel } from "../../model/gemma4/index.ts";
import { make_optimizer } from "../../model/lora.ts";
import { RandomState } from "../../model/tuner/np_random.ts";
import { evalState, type Example, iterate_batches, makeStep } from "../../model/tuner/trainer.ts";
import { linear_to_lora_layers } from "../../model/tuner/utils.ts";
import { CKPT_ROOT } from "./ref.ts";
import { limit } from "../../tests/time_limit.ts";

const STEPS = 500;

describe.skipIf(process.env.TUNER_SOAK !== "1")("training soak (TUNER_SOAK=1)", () => {
  it(`${STEPS} compiled steps: active memory within ±5% of step 50, no handle growth`, () => {
    const r = new RandomState(1);
    const data: Example[] = [9, 14, 17, 21, 12, 30, 7, 25].map((n) => [Array.from({ length: n }, () => 1 + (r.nextUint32() % 255)), 0] as const);
    const { model } = loadModel(join(CKPT_ROOT, "c1_dense/f32"));
    mx.random.seed(0);
    model.freeze();
    linear_to_lora_layers(model, 4, { rank: 8, scale: 20.0, dropout: 0.0 });
    const optimizer = make_optimizer({ optimizer: "adamw", optimizer_config: {}, learning_rate: 1e-4, lr_schedule: null });
    const step = makeStep(model, optimizer);
    const batches = iterate_batches({ length: data.length, get: (i) => data[i]! }, { batch_size: 2, max_seq_length: 2048, loop: true, rng: new RandomState(0) });
    const series: { step: number; active: number; handles: number }[] = [];
    model.train();
    try {
      for (let it = 1; it <= STEPS; it++) {
        const [b, l] = batches.next().value!;
        const [loss, toks] = step([b, l], null, true);
        evalState(model, optimizer, [loss, toks]);
        for (const a of [loss, toks, b, l]) a.dispose();
        if (it % 50 === 0) series.push({ step: it, active: mx.getActiveMemory(), handles: mx.liveHandles() });
      }
    } finally {
      step.dispose();
      batches.return(undefined);
      model.dispose();
    }
    const base = series[0]!;
    console.log(`[tuner soak] active memory / live handles every 50 steps:\n  ${series.map((s) => `${s.step}: ${(s.active / 1e6).toFixed(3)} MB, ${s.handles} handles`).join("\n  ")}`);
    for (const s of series) {
      expect(Math.abs(s.active - base.active) / base.active).toBeLessThanOrEqual(0.05);
      expect(s.handles).toBeLessThanOrEqual(base.handles);
    }
  }, limit(600_000));
});
