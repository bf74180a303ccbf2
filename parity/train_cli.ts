// `npm run train -- --model DIR --data DIR --adapter-path OUT [...]`: LoRA / DoRA / full
// fine-tuning with the TS port, mlx_lm.lora's flags and run (model/lora.ts). Without --train or
// --test it trains (mlx_lm.lora asks for one of them; this command is named for the first).
// A progress bar shows the iteration, the last reported loss, it/s, tokens/s and peak memory;
// report, validation and save lines are mlx-lm's.

import { existsSync, readFileSync } from "node:fs";
import * as mx from "@mlx-bun/mlx";
import { ConfigError } from "../model/gemma4/config.ts";
import { WeightsError } from "../model/gemma4/weights.ts";
import { CONFIG_DEFAULTS, type LoraArgs, run } from "../model/lora.ts";
import { DatasetError } from "../model/tuner/datasets.ts";
import { AdapterError } from "../model/tuner/utils.ts";
import { type FlagSpec, helpText, parseArgs, runMain, UsageError, type Parsed } from "./args.ts";
import { applyDeviceFlag, DEVICE_FLAG } from "./device.ts";
import { ProgressBar } from "./progress.ts";

export const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "the local model directory (config.json, model*.safetensors, tokenizer.json)" },
  { name: "train", kind: "bool", help: "do training (the default when --test is not given)" },
  { name: "data", kind: "string", valueName: "dir", help: "directory with {train, valid, test}.jsonl files" },
  { name: "fine-tune-type", kind: "string", valueName: "lora|dora|full", help: "type of fine-tuning to perform (default: lora)" },
  { name: "optimizer", kind: "string", valueName: "adam|adamw|sgd", help: "optimizer to use for training (default: adam)" },
  { name: "mask-prompt", kind: "bool", help: "mask the prompt in the loss when training" },
  { name: "num-layers", kind: "int", valueName: "N", help: "number of layers to fine-tune (default: 16, -1 for all)" },
  { name: "batch-size", kind: "int", valueName: "N", help: "minibatch size (default: 4)" },
  { name: "iters", kind: "int", valueName: "N", help: "iterations to train for (default: 1000)" },
  { name: "val-batches", kind: "int", valueName: "N", help: "number of validation batches, -1 uses the entire validation set (default: 25)" },
  { name: "learning-rate", kind: "number", valueName: "LR", help: "learning rate (default: 1e-05)" },
  { name: "steps-per-report", kind: "int", valueName: "N", help: "training steps between loss reports (default: 10)" },
  { name: "steps-per-eval", kind: "int", valueName: "N", help: "training steps between validations (default: 200)" },
  { name: "grad-accumulation-steps", kind: "int", valueName: "N", help: "steps to accumulate before each optimizer update (default: 1)" },
  { name: "resume-adapter-file", kind: "string", valueName: "file", help: "load path to resume training from the given fine-tuned weights" },
  { name: "adapter-path", kind: "string", valueName: "dir", help: "save/load path for the fine-tuned weights (default: adapters)" },
  { name: "save-every", kind: "int", valueName: "N", help: "save the model every N iterations (default: 100)" },
  { name: "test", kind: "bool", help: "evaluate on the test set after training" },
  { name: "test-batches", kind: "int", valueName: "N", help: "number of test set batches, -1 uses the entire test set (default: 500)" },
  { name: "max-seq-length", kind: "int", valueName: "N", help: "maximum sequence length (default: 2048)" },
  { name: "config", kind: "string", valueName: "file", help: "a YAML configuration file with the training options (lora_parameters, lr_schedule, optimizer_config, ...)" },
  { name: "grad-checkpoint", kind: "bool", help: "use gradient checkpointing to reduce memory use" },
  { name: "clear-cache-threshold", kind: "string", valueName: "size", help: "clear the allocator cache between steps if it grows past this (e.g. 2GB; default: 0)" },
  { name: "seed", kind: "int", valueName: "S", help: "the PRNG seed (default: 0)" },
  { name: "trust-remote-code", kind: "bool", help: "accepted for mlx_lm.lora compatibility (no remote code runs here)" },
  { name: "eager", kind: "bool", help: "run the training step uncompiled (same bits; the trainer compiles it)" },
  DEVICE_FLAG,
  { name: "verbose", kind: "bool", help: "stack traces on errors" },
  { name: "help", kind: "bool", help: "show this help" },
];

/** mlx_lm.utils._parse_size: "2GB" → 2e9 ("", M, G, MB, GB). */
function parseSize(x: string): number {
  const m = /^([0-9.]*)(.*)$/.exec(x)!;
  const mult: Record<string, number> = { M: 1e6, G: 1e9, MB: 1e6, GB: 1e9, "": 1 };
  const unit = m[2]!.trim().toUpperCase();
  if (!(unit in mult) || m[1] === "" || !Number.isFinite(Number(m[1]))) throw new UsageError(`--clear-cache-threshold: cannot read size '${x}' (a number with M, G, MB or GB)`);
  return Math.trunc(Number(m[1]) * mult[unit]!);
}

/** The run's namespace: command line, then the YAML config for what the command line left out, then CONFIG_DEFAULTS. */
function buildArgs(a: Parsed): LoraArgs {
  const args: Record<string, unknown> = {};
  for (const s of FLAGS) {
    if (["eager", "device", "verbose", "help"].includes(s.name)) continue;
    const v = a[s.name];
    args[s.name.replaceAll("-", "_")] = v === undefined ? null : v;
  }
  args.clear_cache_threshold = typeof a["clear-cache-threshold"] === "string" ? parseSize(a["clear-cache-threshold"]) : 0;
  args.trust_remote_code = a["trust-remote-code"] === true;
  for (const k of ["train", "test", "mask_prompt", "grad_checkpoint"]) if (args[k] === false) args[k] = null;
  if (typeof args.config === "string") {
    if (!existsSync(args.config)) throw new UsageError(`--config: no such file: ${args.config}`);
    let cfg: unknown;
    try {
      cfg = Bun.YAML.parse(readFileSync(args.config, "utf8"));
    } catch (e) {
      throw new UsageError(`--config ${args.config}: invalid YAML: ${(e as Error).message}`);
    }
    if (cfg === null || typeof cfg !== "object" || Array.isArray(cfg)) throw new UsageError(`--config ${args.config}: must hold a mapping of options`);
    for (const [k, v] of Object.entries(cfg)) if (args[k] === null || args[k] === undefined) args[k] = v;
  }
  for (const [k, v] of Object.entries(CONFIG_DEFAULTS)) if (args[k] === null || args[k] === undefined) args[k] = structuredClone(v);
  if (!args.train && !args.test) args.train = true;
  const out = args as LoraArgs;
  if (!["lora", "dora", "full"].includes(out.fine_tune_type)) throw new UsageError(`--fine-tune-type must be lora, dora or full, got '${out.fine_tune_type}'`);
  if (!["adam", "adamw", "sgd", "muon", "adafactor"].includes(out.optimizer.toLowerCase())) throw new UsageError(`--optimizer must be adam, adamw or sgd, got '${out.optimizer}'`);
  if (out.report_to !== null) throw new UsageError("report_to (wandb, swanlab) is not supported by this command");
  return out;
}

/** Every check of the command line before any work starts (null for --help). */
export function trainPlan(argv: readonly string[]): { a: Parsed; args: LoraArgs } | null {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  if (a.model === undefined) throw new UsageError("--model <dir> is required (see --help)");
  applyDeviceFlag(a.device);
  const args = buildArgs(a);
  if (args.data === CONFIG_DEFAULTS.data && a.data === undefined) throw new UsageError("--data <dir> is required (a directory with train.jsonl and valid.jsonl)");
  if (!existsSync(args.data)) throw new UsageError(`--data: no such directory: ${args.data} (Hugging Face datasets are not fetched by this command)`);
  return { a, args };
}

async function main(argv: string[]): Promise<number> {
  const plan = trainPlan(argv);
  if (plan === null) {
    process.stdout.write(helpText("npm run train -- --model <dir> --data <dir> [--adapter-path <dir>] [options]", "LoRA, DoRA or full fine-tuning of a Gemma 4 checkpoint with the TypeScript port (mlx_lm.lora's flags, defaults and files).", FLAGS));
    return 0;
  }
  const { a, args } = plan;

  const bar = new ProgressBar("train");
  let last = { loss: Number.NaN, its: 0, tps: 0 };
  const tty = process.stderr.isTTY === true;
  // a report line first clears the bar's line on a terminal
  const log = (line: string) => {
    if (tty) process.stderr.write("\r\x1b[2K");
    process.stdout.write(`${line}\n`);
  };
  let headed = false;
  await run(args, {
    log,
    eager: a.eager === true,
    callback: {
      onStep: (it) => {
        if (!tty && it % args.steps_per_report !== 0 && it !== args.iters) return;
        const loss = Number.isNaN(last.loss) ? "…" : last.loss.toFixed(3);
        bar.update(it / args.iters, `it ${it}/${args.iters} · loss ${loss} · ${last.its.toFixed(2)} it/s · ${last.tps.toFixed(0)} tok/s · peak ${(mx.getPeakMemory() / 1e9).toFixed(3)} GB`);
      },
      onTrainLossReport: (r) => {
        if (!headed) log("  iter   train_loss     tok/s     tokens");
        headed = true;
        last = { loss: r.train_loss, its: r.iterations_per_second, tps: r.tokens_per_second };
        log(`  ${String(r.iteration).padStart(4)}    ${r.train_loss.toFixed(3).padStart(5)}    ${r.tokens_per_second.toFixed(0).padStart(5)}    ${(r.trained_tokens / 1000).toFixed(1).padStart(5)}k`);
      },
      // mlx-lm prints ui.report_val(it, ...) with the 1-based iteration; only its training
      // callback (this one, as mlx-lm's) gets it - 1
      onValLossReport: (r) => log(`  ${String(r.iteration + 1).padStart(4)}    val ${r.val_loss.toFixed(3).padStart(5)}    ${r.val_time.toFixed(2)}s`),
      onSave: (file) => log(`  save  ${file}`),
    },
  });
  bar.done(`done · peak memory ${(mx.getPeakMemory() / 1e9).toFixed(3)} GB`);
  return 0;
}

// a problem with the checkpoint, adapters or data is bad input: exit 2, as a usage error
const INPUT_ERRORS = [AdapterError, DatasetError, ConfigError, WeightsError];
if (import.meta.main) runMain((argv) =>
  main(argv).catch((e: unknown) => {
    throw INPUT_ERRORS.some((c) => e instanceof c) ? new UsageError((e as Error).message, { cause: e }) : e;
  }),
);
