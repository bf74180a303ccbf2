// mlx_lm/tuner/utils.py (mlx-lm 0.32.2): build_schedule, linear_to_lora_layers, load_adapters.
//
// Targeting and draw order are mlx-lm's (mlxlm-extras §2.5–2.7): with no `keys`, the key set is
// every Linear / QuantizedLinear / SwitchLinear / QuantizedSwitchLinear / Embedding /
// QuantizedEmbedding path found under any layer (relative to the layer); the last
// `num_layers` layers (0 and -1 mean all: `layers[-0:]`) convert every module whose relative
// path is a key, in each layer's named_modules order (Python's LIFO walk), which fixes the order
// of the random draws; a last pass over the model's full paths converts user keys such as
// "lm_head".

import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { cosineDecay, exponentialDecay, joinSchedules, linearSchedule, type Schedule, stepDecay } from "@mlx-bun/mlx/optimizers";
import { Embedding, Linear, type Module, QuantizedEmbedding, QuantizedLinear } from "../gemma4/nn.ts";
import { QuantizedSwitchLinear, SwitchLinear } from "../gemma4/switch_layers.ts";
import { DoRAEmbedding, DoRALinear } from "./dora.ts";
import { LoRAEmbedding, LoRALinear, LoRASwitchLinear } from "./lora.ts";

/** The `lora_parameters` of a config: rank, scale, dropout and optional keys. */
export interface LoraParameters {
  rank: number;
  scale: number;
  dropout: number;
  keys?: string[] | null;
  [k: string]: unknown;
}

/** A model the tuner can adapt: its decoder layers are `layers` (gemma4_text.Model, gemma4.Model). */
export interface LayeredModel extends Module {
  readonly layers: Module[];
}

/** A problem with a LoRA config or an adapter directory (file and key named where known). */
export class AdapterError extends Error {
  override readonly name = "AdapterError";
}

const LORA_TARGETS = [Linear, QuantizedLinear, SwitchLinear, QuantizedSwitchLinear, Embedding, QuantizedEmbedding];

function isTarget(m: Module): boolean {
  return LORA_TARGETS.some((c) => m instanceof c);
}

function toLora(layer: Module, config: LoraParameters, use_dora: boolean): Module {
  const { rank: r, scale, dropout } = config;
  if (layer instanceof Linear || layer instanceof QuantizedLinear) {
    return use_dora ? DoRALinear.fromBase(layer, r, dropout, scale) : LoRALinear.fromBase(layer, r, dropout, scale);
  }
  if (layer instanceof SwitchLinear || layer instanceof QuantizedSwitchLinear) {
    if (use_dora) throw new AdapterError(`${layer.constructor.name} doesn't support DoRA yet.`);
    return LoRASwitchLinear.fromBase(layer, r, dropout, scale);
  }
  if (layer instanceof Embedding || layer instanceof QuantizedEmbedding) {
    if (use_dora) return DoRAEmbedding.fromBase(layer as Embedding, r, dropout, scale);
    return LoRAEmbedding.fromBase(layer, r, dropout, scale);
  }
  throw new AdapterError(`Can't convert layer of type ${layer.constructor.name} to LoRA`);
}

/** The converted modules of one pass, applied after the walk (update_modules). */
function convert(root: Module, keys: ReadonlySet<string>, config: LoraParameters, use_dora: boolean): void {
  const lora: [string, Module][] = [];
  for (const [k, m] of root.namedModules()) if (keys.has(k)) lora.push([k, toLora(m, config, use_dora)]);
  for (const [k, m] of lora) root.replaceModule(k, m);
}

/** linear_to_lora_layers(model, num_layers, config, use_dora). */
export function linear_to_lora_layers(model: LayeredModel, num_layers: number, config: LoraParameters, use_dora = false): void {
  if (!("scale" in config)) {
    const hint = "alpha" in config ? " Found 'alpha' instead — mlx-lm's LoRA config uses 'scale', not 'alpha' (unlike some other LoRA frameworks). See LORA.md." : "";
    throw new AdapterError(`LoRA config is missing required key 'scale'.${hint}`);
  }
  for (const k of ["rank", "dropout", "scale"] as const) {
    if (typeof config[k] !== "number") throw new AdapterError(`LoRA config key '${k}' must be a number, got ${JSON.stringify(config[k])}`);
  }
  let keys: Set<string>;
  if (config.keys === undefined || config.keys === null) {
    keys = new Set();
    for (const l of model.layers) l.applyToModules((p, m) => isTarget(m) && keys.add(p));
  } else {
    keys = new Set(config.keys);
  }
  const n = Math.max(num_layers, 0);
  for (const l of n === 0 ? model.layers : model.layers.slice(-n)) convert(l, keys, config, use_dora);
  convert(model, keys, config, use_dora);
}

/** The adapter_config.json fields load_adapters reads. */
export interface AdapterConfig {
  fine_tune_type?: "lora" | "dora" | "full";
  num_layers: number;
  lora_parameters: LoraParameters | null;
  [k: string]: unknown;
}

/** Reads `<dir>/adapter_config.json` (one error naming the file and key on a problem). */
export function readAdapterConfig(dir: string): AdapterConfig {
  if (!existsSync(dir)) throw new AdapterError(`The adapter path does not exist: ${dir}`);
  const file = join(dir, "adapter_config.json");
  if (!existsSync(file)) throw new AdapterError(`${file}: no adapter_config.json in the adapter directory`);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, "utf8"));
  } catch (e) {
    throw new AdapterError(`${file}: invalid JSON: ${(e as Error).message}`);
  }
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) throw new AdapterError(`${file}: must hold a JSON object`);
  const cfg = raw as AdapterConfig;
  const type = cfg.fine_tune_type ?? "lora";
  if (!["lora", "dora", "full"].includes(type)) throw new AdapterError(`${file}: fine_tune_type must be lora, dora or full, got ${JSON.stringify(type)}`);
  if (type !== "full") {
    if (!Number.isInteger(cfg.num_layers)) throw new AdapterError(`${file}: num_layers must be an integer, got ${JSON.stringify(cfg.num_layers)}`);
    const lp = cfg.lora_parameters;
    if (lp === null || typeof lp !== "object") throw new AdapterError(`${file}: lora_parameters must be an object`);
  }
  return cfg;
}

/**
 * load_adapters(model, adapter_path): converts the layers as adapter_config.json says (this
 * draws from the random key, as mlx-lm does), then loads adapters.safetensors after checking
 * that every tensor names an adapter parameter (lora_a, lora_b, m; anything for "full") of the
 * right shape. Returns the model.
 */
export function load_adapters<M extends LayeredModel>(model: M, adapter_path: string): M {
  const config = readAdapterConfig(adapter_path);
  const fine_tune_type = config.fine_tune_type ?? "lora";
  if (fine_tune_type !== "full") {
    try {
      linear_to_lora_layers(model, config.num_layers, config.lora_parameters!, fine_tune_type === "dora");
    } catch (e) {
      if (e instanceof AdapterError) throw new AdapterError(`${join(adapter_path, "adapter_config.json")}: ${e.message}`);
      throw e;
    }
  }
  const file = join(adapter_path, "adapters.safetensors");
  if (!existsSync(file) || !statSync(file).isFile()) throw new AdapterError(`${file}: no adapters.safetensors in the adapter directory`);
  const { arrays: weights } = mx.loadSafetensors(file);
  const params = model.parameters();
  const leaves = new Set(["lora_a", "lora_b", "m"]);
  const errors: string[] = [];
  for (const [name, w] of weights) {
    const p = params.get(name);
    const allowed = p !== undefined && (fine_tune_type === "full" || leaves.has(name.slice(name.lastIndexOf(".") + 1)));
    if (!allowed) errors.push(`  ${name}: not an adapter parameter in the model`);
    else if (w.shape.length !== p.shape.length || w.shape.some((d, i) => d !== p.shape[i])) {
      errors.push(`  ${name}: adapter shape (${w.shape.join(", ")}) does not match model parameter shape (${p.shape.join(", ")})`);
    }
  }
  if (errors.length) {
    for (const w of weights.values()) w.dispose();
    throw new AdapterError(`Adapter at ${adapter_path} contains incompatible tensors:\n${errors.join("\n")}`);
  }
  // model.load_weights(list(weights.items()), strict=False)
  for (const [name, w] of weights) model.setParameter(name, w);
  return model;
}

/** An lr_schedule entry of the config: {name, arguments, warmup?, warmup_init?}. */
export interface ScheduleConfig {
  name: string;
  arguments: number[];
  warmup?: number;
  warmup_init?: number;
}

const SCHEDULES: Record<string, (...a: number[]) => Schedule> = {
  cosine_decay: (init, steps, end) => cosineDecay(init!, steps!, end),
  exponential_decay: (init, rate) => exponentialDecay(init!, rate!),
  step_decay: (init, rate, size) => stepDecay(init!, rate!, size!),
  linear_schedule: (init, end, steps) => linearSchedule(init!, end!, steps!),
};

/** build_schedule(schedule_config): the named schedule, after a linear warmup when `warmup` is set. */
export function build_schedule(config: ScheduleConfig): Schedule {
  const make = SCHEDULES[config.name];
  if (!make) throw new AdapterError(`lr_schedule.name: unknown schedule ${JSON.stringify(config.name)} (one of ${Object.keys(SCHEDULES).join(", ")})`);
  const args = config.arguments;
  const initial_lr = args[0]!;
  const bound = make(...args);
  const warmup = config.warmup ?? 0;
  if (!warmup) return bound;
  const warmup_fn = linearSchedule(config.warmup_init ?? 0.0, initial_lr, warmup);
  return joinSchedules([warmup_fn, bound], [warmup + 1]);
}
