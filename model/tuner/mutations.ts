// Test-only switch for the tuner's mutation suite (suites/mutations/tuner.test.ts): each name
// re-introduces one plausible training-port bug at the one place it would live. The gradient
// parity must catch each and name the first divergent tensor. The switch is
// model/mutation_switch.ts, shared with the model's list; production code never switches
// anything on.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { Adam, AdamW, type ParamState } from "@mlx-bun/mlx/optimizers";
import { switchedOn, withSwitchAsync } from "../mutation_switch.ts";

export const TUNER_MUTATIONS = [
  "lora_add_swapped", // LoRALinear returns (scale*z).astype + y instead of y + (scale*z).astype
  "lora_scale_twice", // the LoRA branch multiplied by scale twice
  "dropout_at_eval", // nn.Dropout draws its mask in eval mode too
  "loss_mask_exact", // default_loss mask `steps < length` (no extra padding target)
  "adamw_decay_after", // AdamW decays the updated parameter instead of the parameter before the update
] as const;

export type TunerMutation = (typeof TUNER_MUTATIONS)[number];

/** True when the named bug is switched on (tests only). */
export function tunerMutated(name: TunerMutation): boolean {
  return switchedOn(name);
}

/** Runs fn with exactly one tuner mutation active (tests only). */
export function withTunerMutation<T>(name: TunerMutation, fn: () => T | Promise<T>): Promise<T> {
  return withSwitchAsync(name, fn);
}

/**
 * The adamw_decay_after bug: Adam's update first, then the decay on its result,
 * `Adam.apply_single(g, p, state) * (1 - lr * weight_decay)`, where mlx decays the parameter
 * that enters the update.
 */
export class AdamWDecayAfter extends AdamW {
  protected override applySingle(gradient: MlxArray, parameter: MlxArray, state: ParamState): MlxArray {
    using updated = Adam.prototype["applySingle"].call(this, gradient, parameter, state) as MlxArray;
    using lr = mx.astype(this.learningRate, gradient.dtype);
    using lw = mx.multiply(lr, mx.pyFloat(this.weightDecay));
    using f = mx.subtract(1, lw);
    return mx.multiply(updated, f);
  }
}
