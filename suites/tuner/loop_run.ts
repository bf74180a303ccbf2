// The training-loop cases run on both sides: mlx-lm's own trainer.train() (tuner_ref.py
// "train_loop") and model/tuner's train() after the same mlx_lm.lora setup.

import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadModel } from "../../model/gemma4/index.ts";
import { make_optimizer } from "../../model/lora.ts";
import { globalRandom, RandomState } from "../../model/tuner/np_random.ts";
import { type Example, train, type TrainingArgs } from "../../model/tuner/trainer.ts";
import { linear_to_lora_layers, type LoraParameters } from "../../model/tuner/utils.ts";
import { CKPT_ROOT } from "./ref.ts";

function data(lengths: number[], seed: number): Example[] {
  const r = new RandomState(seed);
  return lengths.map((n, i) => [Array.from({ length: n }, () => 1 + (r.nextUint32() % 255)), i % 3] as const);
}

export interface LoopCase {
  name: string;
  ckpt: string;
  lora: LoraParameters;
  optimizer: { name: string; learning_rate: number };
  args: Partial<TrainingArgs>;
}

export const LOOP_CASES: LoopCase[] = [
  {
    name: "dense f32 LoRA, dropout 0.1, validation every 2 iterations, saves every 3",
    ckpt: "c1_dense/f32",
    lora: { rank: 4, scale: 20.0, dropout: 0.1 },
    optimizer: { name: "adamw", learning_rate: 1e-2 },
    args: { batch_size: 2, iters: 6, val_batches: 2, steps_per_report: 2, steps_per_eval: 2, steps_per_save: 3 },
  },
  {
    name: "dense bf16 LoRA, grad_checkpoint, grad accumulation 2",
    ckpt: "c1_dense/bf16",
    lora: { rank: 4, scale: 10.0, dropout: 0.0 },
    optimizer: { name: "adam", learning_rate: 5e-3 },
    args: { batch_size: 2, iters: 4, val_batches: -1, steps_per_report: 3, steps_per_eval: 10, steps_per_save: 10, grad_checkpoint: true, grad_accumulation_steps: 2 },
  },
];

export const TRAIN_DATA = data([9, 14, 17, 21, 12, 30, 7, 25, 40, 11], 3);
export const VAL_DATA = data([10, 20, 15, 8, 33], 4);

export function loopJob(c: LoopCase, out: string): object {
  return { kind: "train_loop", ckpt: join(CKPT_ROOT, c.ckpt), seed: 0, np_seed: 0, num_layers: 4, lora_parameters: c.lora, optimizer: c.optimizer, args: c.args, data: TRAIN_DATA, val_data: VAL_DATA, out };
}

/** The TS side of a loop case: mlx_lm.lora's seeds and setup, then train(); the recorded reports. */
export function runLoop(c: LoopCase, adapterDir: string): { train: object[]; val: object[] } {
  const { model } = loadModel(join(CKPT_ROOT, c.ckpt));
  const reports = { train: [] as object[], val: [] as object[] };
  try {
    globalRandom.seed(0);
    mx.random.seed(0);
    model.freeze();
    linear_to_lora_layers(model, 4, c.lora);
    const optimizer = make_optimizer({ optimizer: c.optimizer.name, optimizer_config: {}, learning_rate: c.optimizer.learning_rate, lr_schedule: null });
    const ds = (d: Example[]) => ({ length: d.length, get: (i: number) => d[i]! });
    train(model, optimizer, ds(TRAIN_DATA), ds(VAL_DATA), {
      args: { ...c.args, adapter_file: join(adapterDir, "adapters.safetensors") },
      callback: {
        onTrainLossReport: (i) => reports.train.push({ iteration: i.iteration, train_loss: i.train_loss, learning_rate: i.learning_rate, trained_tokens: i.trained_tokens }),
        onValLossReport: (i) => reports.val.push({ iteration: i.iteration, val_loss: i.val_loss }),
      },
    });
  } finally {
    model.dispose();
  }
  return reports;
}
