// mlx_lm/lora.py (mlx-lm 0.32.2): the fine-tuning run behind `npm run train` (CONFIG_DEFAULTS,
// train_model, evaluate_model, run), in mlx_lm.lora's order: np.random.seed(seed), load the model
// and tokenizer, load the datasets, then mx.random.seed(seed), model.freeze(), convert (LoRA /
// DoRA) or unfreeze (full) the last num_layers layers, optional resume, adapter_config.json (the
// whole argument namespace, as save_config(vars(args)) writes it), the optimizer, and train().

import { mkdirSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { Adam, AdamW, type Optimizer, SGD } from "@mlx-bun/mlx/optimizers";
import { type AnyModel, loadModel } from "./gemma4/weights.ts";
import { PyFloat, type PyJson } from "./pyjson.ts";
import { CacheDataset, type DatasetConfig, load_local_dataset, loadTokenizer } from "./tuner/datasets.ts";
import { AdamWDecayAfter, tunerMutated } from "./tuner/mutations.ts";
import { globalRandom } from "./tuner/np_random.ts";
import { evaluate, train, type TrainingCallback } from "./tuner/trainer.ts";
import { AdapterError, build_schedule, linear_to_lora_layers, load_adapters, type LoraParameters, type ScheduleConfig } from "./tuner/utils.ts";
import { get_total_parameters, save_config } from "./utils.ts";

/** The mlx_lm.lora argument namespace (argparse dests + CONFIG_DEFAULTS keys). */
export interface LoraArgs {
  model: string;
  train: boolean;
  data: string;
  fine_tune_type: "lora" | "dora" | "full";
  optimizer: string;
  optimizer_config: Record<string, Record<string, unknown>>;
  mask_prompt: boolean;
  num_layers: number;
  batch_size: number;
  iters: number;
  val_batches: number;
  learning_rate: number;
  steps_per_report: number;
  steps_per_eval: number;
  grad_accumulation_steps: number;
  resume_adapter_file: string | null;
  adapter_path: string;
  save_every: number;
  test: boolean;
  test_batches: number;
  max_seq_length: number;
  config: string | null;
  grad_checkpoint: boolean;
  clear_cache_threshold: number;
  lr_schedule: ScheduleConfig | null;
  lora_parameters: LoraParameters | null;
  report_to: string | null;
  project_name: string | null;
  seed: number;
  trust_remote_code: boolean;
  [k: string]: unknown;
}

/** CONFIG_DEFAULTS of mlx_lm/lora.py. */
export const CONFIG_DEFAULTS: Omit<LoraArgs, "model" | "data"> & { model: string; data: string } = {
  model: "Qwen/Qwen3-0.6b",
  train: false,
  fine_tune_type: "lora",
  optimizer: "adam",
  optimizer_config: { adam: {}, adamw: {}, muon: {}, sgd: {}, adafactor: {} },
  data: "mlx-community/WikiSQL",
  seed: 0,
  num_layers: 16,
  batch_size: 4,
  iters: 1000,
  val_batches: 25,
  learning_rate: 1e-5,
  steps_per_report: 10,
  steps_per_eval: 200,
  resume_adapter_file: null,
  adapter_path: "adapters",
  save_every: 100,
  test: false,
  test_batches: 500,
  max_seq_length: 2048,
  config: null,
  grad_checkpoint: false,
  grad_accumulation_steps: 1,
  clear_cache_threshold: 0,
  lr_schedule: null,
  lora_parameters: { rank: 8, dropout: 0.0, scale: 20.0 },
  mask_prompt: false,
  report_to: null,
  project_name: null,
  trust_remote_code: false,
};

/** The keys argparse or CONFIG_DEFAULTS types as float (written as Python floats in adapter_config.json). */
const FLOAT_KEYS = new Set(["learning_rate", "scale", "dropout", "weight_decay", "eps", "betas", "momentum", "dampening", "warmup_init"]);

function asPyJson(v: unknown, key = ""): PyJson {
  if (typeof v === "number") return FLOAT_KEYS.has(key) ? new PyFloat(v) : v;
  if (Array.isArray(v)) return v.map((x) => asPyJson(x, key));
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, asPyJson(x, k)]));
  return (v ?? null) as PyJson;
}

const OPTIMIZER_OPTIONS: Record<string, string> = { weight_decay: "weightDecay", bias_correction: "biasCorrection", betas: "betas", eps: "eps", momentum: "momentum", dampening: "dampening", nesterov: "nesterov" };

/** The optimizer train_model builds: opt_class(learning_rate=lr, **optimizer_config[name]). */
export function make_optimizer(args: Pick<LoraArgs, "optimizer" | "optimizer_config" | "learning_rate" | "lr_schedule">): Optimizer {
  const lr = args.lr_schedule ? build_schedule(args.lr_schedule) : args.learning_rate;
  const name = args.optimizer.toLowerCase();
  const cfg = args.optimizer_config[name] ?? {};
  const opts: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(cfg)) {
    const ts = OPTIMIZER_OPTIONS[k];
    if (!ts) throw new AdapterError(`optimizer_config.${name}.${k}: not an option of ${name} in this port`);
    opts[ts] = v;
  }
  if (name === "adam") return new Adam(lr, opts);
  if (name === "adamw") return tunerMutated("adamw_decay_after") ? new AdamWDecayAfter(lr, opts) : new AdamW(lr, opts);
  if (name === "sgd") return new SGD(lr, opts);
  if (name === "muon" || name === "adafactor") throw new AdapterError(`optimizer ${name}: not ported (adam, adamw and sgd are)`);
  throw new AdapterError(`Unsupported optimizer: ${name}`);
}

export interface RunHooks {
  /** Lines mlx-lm prints (headers, trainable parameters, test loss). */
  log?: (line: string) => void;
  callback?: TrainingCallback;
  /** Run the training step uncompiled. */
  eager?: boolean;
}

/** train_model(args, model, train_set, valid_set): setup as mlx_lm.lora does it, then train(). */
export function train_model(args: LoraArgs, model: AnyModel, train_set: CacheDataset, valid_set: CacheDataset, hooks: RunHooks = {}): void {
  const log = hooks.log ?? console.log;
  mx.random.seed(args.seed);
  model.freeze();
  if (args.num_layers > model.layers.length) {
    throw new AdapterError(`Requested to train ${args.num_layers} layers but the model only has ${model.layers.length} layers.`);
  }
  if (args.fine_tune_type === "full") {
    const n = Math.max(args.num_layers, 0);
    for (const l of n === 0 ? model.layers : model.layers.slice(-n)) l.unfreeze();
    args.lora_parameters = null;
  } else if (args.fine_tune_type === "lora" || args.fine_tune_type === "dora") {
    // Convert linear layers to lora/dora layers and unfreeze in the process
    linear_to_lora_layers(model, args.num_layers, args.lora_parameters!, args.fine_tune_type === "dora");
  } else {
    throw new AdapterError(`Received unknown fine-tune-type ${String(args.fine_tune_type)}`);
  }
  // Resume from weights if provided
  if (args.resume_adapter_file !== null) {
    log(`Loading fine-tuned weights from ${args.resume_adapter_file}`);
    const { arrays } = mx.loadSafetensors(args.resume_adapter_file);
    const params = model.parameters();
    for (const [k, v] of arrays) {
      if (params.has(k)) model.setParameter(k, v);
      else v.dispose();
    }
  }
  const total = get_total_parameters(model) / 1e6;
  let trainable = 0;
  for (const [, v] of mx.utils.treeFlatten<mx.MlxArray>(model.trainableParameters())) trainable += v.size;
  trainable /= 1e6;
  log(`Trainable parameters: ${((trainable * 100) / total).toFixed(3)}% (${trainable.toFixed(3)}M/${total.toFixed(3)}M)`);

  mkdirSync(args.adapter_path, { recursive: true });
  const adapter_file = join(args.adapter_path, "adapters.safetensors");
  save_config(asPyJson(args) as Record<string, PyJson>, join(args.adapter_path, "adapter_config.json"));

  const optimizer = make_optimizer(args);
  train(model, optimizer, train_set, valid_set, {
    args: {
      batch_size: args.batch_size,
      iters: args.iters,
      val_batches: args.val_batches,
      steps_per_report: args.steps_per_report,
      steps_per_eval: args.steps_per_eval,
      steps_per_save: args.save_every,
      adapter_file,
      max_seq_length: args.max_seq_length,
      grad_checkpoint: args.grad_checkpoint,
      grad_accumulation_steps: args.grad_accumulation_steps,
      clear_cache_threshold: args.clear_cache_threshold,
    },
    callback: hooks.callback,
    eager: hooks.eager,
    warn: log,
  });
}

/** evaluate_model(args, model, test_set): the test loss and perplexity. */
export function evaluate_model(args: LoraArgs, model: AnyModel, test_set: CacheDataset, hooks: RunHooks = {}): number {
  const test_loss = evaluate(model, test_set, { batch_size: args.batch_size, num_batches: args.test_batches, max_seq_length: args.max_seq_length, warn: hooks.log });
  (hooks.log ?? console.log)(`Test loss ${test_loss.toFixed(3)}, Test ppl ${Math.exp(test_loss).toFixed(3)}.`);
  return test_loss;
}

/** run(args): mlx_lm.lora.run for a local model directory and a local {train,valid,test}.jsonl directory. */
export async function run(args: LoraArgs, hooks: RunHooks = {}): Promise<void> {
  const log = hooks.log ?? console.log;
  globalRandom.seed(args.seed);
  log("Loading pretrained model");
  const { model } = loadModel(args.model);
  try {
    const tokenizer = await loadTokenizer(args.model);
    log("Loading datasets");
    const [train_set, valid_set, test_set] = load_local_dataset(args.data, tokenizer, args as DatasetConfig);
    if (args.train && train_set.length === 0) throw new AdapterError("Training set not found or empty. Must provide training set for fine-tuning.");
    if (args.train && valid_set.length === 0) log("Warning: Validation set not found or empty. Training will proceed without validation.");
    if (args.test && test_set.length === 0) throw new AdapterError("Test set not found or empty. Must provide test set for evaluation.");
    if (args.test && !args.train) {
      // Allow testing without LoRA layers by providing empty path
      if (args.adapter_path !== "") load_adapters(model, args.adapter_path);
    } else if (args.train) {
      log("Training");
      train_model(args, model, new CacheDataset(train_set), new CacheDataset(valid_set), hooks);
    } else {
      throw new AdapterError("Must provide at least one of --train or --test");
    }
    if (args.test) {
      log("Testing");
      evaluate_model(args, model, new CacheDataset(test_set), hooks);
    }
  } finally {
    model.dispose();
  }
}
