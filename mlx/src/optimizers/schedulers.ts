// mlx/optimizers/schedulers.py: a schedule maps the optimizer's step (a uint64 array) to a
// value, op for op as Python builds it. Python floats (the documented float arguments and every
// float the Python code computes) are weak float scalars; Python ints (step counts, boundaries)
// are weak ints, so they take the step's uint64 dtype as in Python.
import type { MlxArray } from "../array.ts";
import { MlxError } from "../mlx_error.ts";
import { add, cos, floorDivide, less, minimum, multiply, power, subtract, where } from "../ops.ts";
import { pyFloat, pyInt } from "../scalar.ts";

export type Schedule = (step: MlxArray) => MlxArray;

/** exponential_decay(init, decay_rate): init * decay_rate ** step. */
export function exponentialDecay(init: number, decayRate: number): Schedule {
  return (step) => {
    using p = power(pyFloat(decayRate), step); // decay_rate**step: array.__rpow__
    return multiply(p, pyFloat(init)); // init * (...): array.__rmul__
  };
}

/** step_decay(init, decay_rate, step_size): init * decay_rate ** (step // step_size). */
export function stepDecay(init: number, decayRate: number, stepSize: number): Schedule {
  if (stepSize < 1) throw new MlxError("step_decay", `step_size must be greater than 0, but got ${stepSize}.`);
  return (step) => {
    using q = floorDivide(step, pyInt(stepSize));
    using p = power(pyFloat(decayRate), q);
    return multiply(p, pyFloat(init));
  };
}

/** cosine_decay(init, decay_steps, end=0): end + 0.5 * (1 + cos(pi / decay_steps * min(step, decay_steps))) * (init - end). */
export function cosineDecay(init: number, decaySteps: number, end = 0.0): Schedule {
  if (decaySteps < 1) throw new MlxError("cosine_decay", `decay_steps must be greater than 0, but got ${decaySteps}.`);
  return (step) => {
    using s = minimum(step, pyInt(decaySteps));
    using a = multiply(s, pyFloat(Math.PI / decaySteps)); // (math.pi / decay_steps) * s
    using c = cos(a);
    using c1 = add(c, pyFloat(1.0)); // 1.0 + cos(...)
    using decay = multiply(c1, pyFloat(0.5)); // 0.5 * (...)
    using d = multiply(decay, pyFloat(init - end));
    return add(d, pyFloat(end)); // end + decay * (init - end)
  };
}

/** linear_schedule(init, end, steps): min(step, steps) * ((end - init) / steps) + init. */
export function linearSchedule(init: number, end: number, steps: number): Schedule {
  if (steps < 1) throw new MlxError("linear_schedule", `steps must be greater than 0, but got ${steps}.`);
  return (step) => {
    using s = minimum(step, pyInt(steps));
    using m = multiply(s, pyFloat((end - init) / steps));
    return add(m, pyFloat(init));
  };
}

/** join_schedules(schedules, boundaries): schedule i+1 takes over at boundaries[i], counting from it. */
export function joinSchedules(schedules: readonly Schedule[], boundaries: readonly number[]): Schedule {
  if (schedules.length === 0) throw new MlxError("join_schedules", "Must provide at least 1 schedule to join.");
  if (schedules.length !== boundaries.length + 1) {
    throw new MlxError("join_schedules", `Received ${boundaries.length} boundaries but expected ${schedules.length - 1}.`);
  }
  return (step) => {
    let output = schedules[0]!(step);
    for (let i = 0; i < boundaries.length; i++) {
      const b = pyInt(boundaries[i]!);
      using before = less(step, b);
      using shifted = subtract(step, b);
      using next = schedules[i + 1]!(shifted);
      const joined = where(before, output, next);
      output.dispose();
      output = joined;
    }
    return output;
  };
}
