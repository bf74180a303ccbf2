// Training-step benchmarks (`npm run bench -- --only train-dense,train-e2b`): the trainer's
// step (value_and_grad of default_loss, AdamW update, one eval of [model, optimizer, random
// state]) on the same checkpoint, LoRA setup and batches on both sides, compiled as mlx-lm's
// trainer runs it and eager. A sample is the median of `steps` timed steps after one warm-up
// step per closure; samples alternate TS, mlx-lm, TS, ...
import * as mx from "@mlx-bun/mlx";
import { join } from "node:path";
import { loadModel } from "../model/gemma4/weights.ts";
import { make_optimizer } from "../model/lora.ts";
import { evalState, grad_checkpoint, makeStep } from "../model/tuner/trainer.ts";
import { linear_to_lora_layers } from "../model/tuner/utils.ts";

export interface TrainWorkload {
  name: string;
  what: string;
  ckpt: string;
  batch: number;
  length: number;
  grad_checkpoint: boolean;
}

export function trainWorkloads(root: string): TrainWorkload[] {
  const fx = (f: string, v: string) => join(root, ".cache", "checkpoints", f, v);
  return [
    { name: "train-dense", what: "fixture C1 (dense, 6 layers) float32, LoRA rank 8 on all layers, AdamW", ckpt: fx("c1_dense", "f32"), batch: 4, length: 65, grad_checkpoint: false },
    { name: "train-e2b", what: "fixture C3 (E2B-like, PLE + KV sharing) float32, LoRA rank 8 on all layers, AdamW, grad_checkpoint", ckpt: fx("c3_e2b", "f32"), batch: 4, length: 65, grad_checkpoint: true },
  ];
}

/** The batch both sides train on: fixed ids, every row `length` long, offsets 0. */
export function trainBatch(w: TrainWorkload, vocab: number): { tokens: number[][]; lengths: number[][] } {
  let s = 777;
  const tokens = Array.from({ length: w.batch }, () =>
    Array.from({ length: w.length }, () => {
      s = (s * 1103515245 + 12345) % 2147483648;
      return 1 + (s % (vocab - 1));
    }),
  );
  return { tokens, lengths: tokens.map((t) => [0, t.length - 1]) };
}

/** A TS trainer ready to step: returns timed step runs and its disposal. */
export function tsTrainer(w: TrainWorkload, vocab: number, compiled: boolean) {
  const { model } = loadModel(w.ckpt);
  mx.random.seed(0);
  model.freeze();
  linear_to_lora_layers(model, -1, { rank: 8, scale: 20.0, dropout: 0.0 });
  const optimizer = make_optimizer({ optimizer: "adamw", optimizer_config: {}, learning_rate: 1e-5, lr_schedule: null });
  const undo = w.grad_checkpoint ? grad_checkpoint(model.layers[0]!) : () => {};
  const step = makeStep(model, optimizer, { compiled });
  const { tokens, lengths } = trainBatch(w, vocab);
  const batch = mx.array(tokens.flat(), [w.batch, w.length], "int32");
  const lens = mx.array(lengths.flat(), [w.batch, 2], "int32");
  model.train();
  const one = () => {
    const t0 = performance.now();
    const [loss, toks] = step([batch, lens], null, true);
    evalState(model, optimizer, [loss, toks]);
    const dt = (performance.now() - t0) / 1000;
    loss.dispose();
    toks.dispose();
    return dt;
  };
  one(); // warm-up: traces (and JIT-builds) the closures, initializes the optimizer state
  one(); // the compiled step retraces once the optimizer state exists
  return {
    /** Median seconds over `steps` steps, with the peak memory of the run. */
    run(steps: number): { seconds: number; peak_memory: number } {
      mx.resetPeakMemory();
      const ts = Array.from({ length: steps }, one).sort((a, b) => a - b);
      return { seconds: ts[steps >> 1]!, peak_memory: mx.getPeakMemory() };
    },
    dispose() {
      step.dispose();
      undo();
      batch.dispose();
      lens.dispose();
      model.dispose();
      mx.clearCache();
    },
  };
}
