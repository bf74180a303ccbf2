// A training run described once and run on both sides: tuner_ref.py's "train" job (mlx-lm's
// trainer step) and the same setup through model/tuner, compared step by step with
// TrainComparison (every loss, gradient, parameter and optimizer-state tensor).

import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type Tree, treeFlatten } from "@mlx-bun/mlx/utils";
import { loadModel } from "../../model/gemma4/index.ts";
import { make_optimizer } from "../../model/lora.ts";
import { RandomState } from "../../model/tuner/np_random.ts";
import { evalState, type Example, grad_checkpoint, iterate_batches, makeStep } from "../../model/tuner/trainer.ts";
import { linear_to_lora_layers, type LoraParameters, type ScheduleConfig } from "../../model/tuner/utils.ts";
import type { RawTensor } from "../../oracle/compare.ts";
import { TrainComparison } from "../../oracle/train_compare.ts";
import { CKPT_ROOT } from "./ref.ts";

export interface TrainSpec {
  name: string;
  /** A fixture checkpoint id ("c1_dense/f32"), or build: a model made by mlx-lm (saved for TS). */
  ckpt?: string;
  build?: { args: Record<string, unknown>; seed?: number; dtype?: string };
  fine_tune_type: "lora" | "dora" | "full";
  num_layers: number;
  lora_parameters?: LoraParameters;
  seed: number;
  optimizer: { name: string; learning_rate: number; config?: Record<string, unknown>; lr_schedule?: ScheduleConfig };
  data: Example[];
  batch_size: number;
  max_seq_length?: number;
  seed_batches?: number;
  steps: number;
  grad_checkpoint?: boolean;
  compiled?: boolean;
  grad_accumulation_steps?: number;
  same_batch?: boolean;
}

/** The Python job of a spec, writing under `out`. */
export function pythonJob(s: TrainSpec, out: string): object {
  return {
    kind: "train",
    ...(s.ckpt ? { ckpt: join(CKPT_ROOT, s.ckpt) } : { build: s.build }),
    fine_tune_type: s.fine_tune_type,
    num_layers: s.num_layers,
    lora_parameters: s.lora_parameters ?? null,
    seed: s.seed,
    optimizer: s.optimizer,
    data: s.data,
    batch_size: s.batch_size,
    max_seq_length: s.max_seq_length ?? 2048,
    seed_batches: s.seed_batches ?? null,
    steps: s.steps,
    grad_checkpoint: s.grad_checkpoint ?? false,
    compiled: s.compiled ?? false,
    grad_accumulation_steps: s.grad_accumulation_steps ?? 1,
    same_batch: s.same_batch ?? false,
    out,
  };
}

/**
 * Runs the spec through the TS trainer (mlx_lm.lora's setup, the trainer's step, one eval per
 * iteration) and compares every step with the reference dump. `out` is the Python job's
 * directory (its saved model for `build` specs).
 */
export function runAndCompare(s: TrainSpec, reference: ReadonlyMap<string, RawTensor>, out: string): { cmp: TrainComparison; losses: number[] } {
  const { model } = loadModel(s.ckpt ? join(CKPT_ROOT, s.ckpt) : join(out, "model"));
  const cmp = new TrainComparison(reference);
  const losses: number[] = [];
  mx.random.seed(s.seed);
  model.freeze();
  const n = Math.max(s.num_layers, 0);
  if (s.fine_tune_type === "full") for (const l of n === 0 ? model.layers : model.layers.slice(-n)) l.unfreeze();
  else linear_to_lora_layers(model, s.num_layers, s.lora_parameters!, s.fine_tune_type === "dora");
  const optimizer = make_optimizer({ optimizer: s.optimizer.name, optimizer_config: { [s.optimizer.name]: s.optimizer.config ?? {} }, learning_rate: s.optimizer.learning_rate, lr_schedule: s.optimizer.lr_schedule ?? null });
  const undo = s.grad_checkpoint ? grad_checkpoint(model.layers[0]!) : () => {};
  let grads: Tree<MlxArray> | undefined;
  const step = makeStep(model, optimizer, {
    compiled: s.compiled ?? false,
    grad_accumulation_steps: s.grad_accumulation_steps ?? 1,
    onGrad: s.compiled ? undefined : (g) => (grads = mx.utils.treeMap((a: MlxArray) => mx.alias(a), g)),
  });
  const ds = { length: s.data.length, get: (i: number) => s.data[i]! };
  const batches = iterate_batches(ds, { batch_size: s.batch_size, max_seq_length: s.max_seq_length ?? 2048, loop: true, seed: s.seed_batches ?? null, rng: new RandomState(0) });
  let first: [MlxArray, MlxArray] | null = null;
  let accum: Tree<MlxArray> | null = null;
  const accumSteps = s.grad_accumulation_steps ?? 1;
  model.train();
  try {
    for (let it = 1; it <= s.steps; it++) {
      const batch: [MlxArray, MlxArray] = s.same_batch && first ? first : batches.next().value!;
      if (s.same_batch) first = batch;
      const [loss, ntoks, g]: [MlxArray, MlxArray, Tree<MlxArray> | null] = step(batch, accum, it % accumSteps === 0);
      for (const [, a] of accum ? treeFlatten<MlxArray>(accum) : []) a.dispose();
      accum = g;
      try {
        evalState(model, optimizer, [loss, ntoks, ...(accum ? mx.utils.treeArrays(accum) : [])]);
        losses.push(loss.item() as number);
        cmp.step(it, { loss, ntoks, grads, params: model.trainableParameters(), opt: optimizer.state as Tree<MlxArray> });
      } finally {
        loss.dispose();
        ntoks.dispose();
        for (const [, a] of grads ? treeFlatten<MlxArray>(grads) : []) a.dispose();
        grads = undefined;
        if (!s.same_batch) {
          batch[0].dispose();
          batch[1].dispose();
        }
      }
    }
  } finally {
    for (const [, a] of accum ? treeFlatten<MlxArray>(accum) : []) a.dispose();
    if (first) {
      first[0].dispose();
      first[1].dispose();
    }
    step.dispose();
    undo();
    model.dispose();
  }
  return { cmp, losses };
}
