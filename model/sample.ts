// Samplers, op for op as mlx_lm/sample_utils.py (mlx-lm 0.32.2) make_sampler: the filters run
// in the order top-p, min-p, top-k, then categorical sampling at the temperature; each filter and
// the categorical draw is mx.compile'd with the global random state captured as input and output
// (Python's `@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)`), so the
// random key sequence and the fused kernels are the ones Python uses. Scalars are weak scalars
// of Python's type (mx.pyFloat where Python has a float).
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";

export type Sampler = ((logprobs: MlxArray) => MlxArray) & { dispose?: () => void };

export class SamplerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SamplerError";
  }
}

export interface SamplerOptions {
  /** Temperature; 0 ⇒ greedy argmax. Must be ≥ 0. */
  temp?: number;
  /** Nucleus threshold; active when 0 < topP < 1. */
  topP?: number;
  /** min-p; active when != 0; must be in [0, 1]. */
  minP?: number;
  minTokensToKeep?: number;
  /** top-k; active when > 0. */
  topK?: number;
  /** Run the filters eagerly instead of through mx.compile (debugging only). */
  eager?: boolean;
}

/** greedy_sampler: argmax(logprobs, axis=-1). */
export const greedySampler: Sampler = (logprobs: MlxArray): MlxArray => mx.argmax(logprobs, -1);

/** apply_top_k body. */
export function applyTopK(logprobs: MlxArray, topK: number): MlxArray {
  const V = logprobs.shape[logprobs.ndim - 1]!;
  if (!Number.isInteger(topK) || !(topK > 0 && topK < V)) {
    throw new SamplerError(`\`top_k\` has to be an integer in the (0, ${V}) interval, but is ${topK}.`);
  }
  using neg = mx.negative(logprobs);
  using part = mx.argpartition(neg, topK - 1, -1);
  const sh = part.shape;
  using maskIdx = mx.slice(part, sh.map((_, i) => (i === sh.length - 1 ? topK : 0)), sh);
  using ninf = mx.scalar(-Infinity, logprobs.dtype);
  return mx.putAlongAxis(logprobs, maskIdx, ninf, -1);
}

/** apply_min_p body. */
export function applyMinP(logprobs: MlxArray, minP: number, minTokensToKeep = 1): MlxArray {
  if (!(minP >= 0 && minP <= 1)) throw new SamplerError(`\`min_p\` has to be a float in the [0, 1] interval, but is ${minP}`);
  if (!Number.isInteger(minTokensToKeep) || minTokensToKeep < 1) {
    throw new SamplerError(`\`min_tokens_to_keep\` has to be a positive integer, but is ${minTokensToKeep}`);
  }
  using top = mx.max(logprobs, -1, true);
  using scaled = mx.add(top, mx.pyFloat(Math.log(minP)));
  let remove = mx.less(logprobs, scaled);
  if (minTokensToKeep > 1) {
    using part = mx.argpartition(logprobs, -minTokensToKeep, -1);
    const sh = part.shape;
    using topIdx = mx.slice(part, sh.map((d, i) => (i === sh.length - 1 ? d - minTokensToKeep : 0)), sh);
    using f = mx.scalar(false);
    const r2 = mx.putAlongAxis(remove, topIdx, f, -1);
    remove.dispose();
    remove = r2;
  }
  try {
    return mx.where(remove, mx.pyFloat(-Infinity), logprobs);
  } finally {
    remove.dispose();
  }
}

/** apply_top_p body. */
export function applyTopP(logprobs: MlxArray, topP: number): MlxArray {
  using sorted = mx.sort(logprobs, -1);
  using sortedF = mx.astype(sorted, "float32");
  using probs = mx.exp(sortedF);
  using massAbove = mx.cumsum(probs, -1, { reverse: true, inclusive: false });
  const sh = probs.shape;
  const first = sh.map((d, i) => (i === sh.length - 1 ? 1 : d));
  const zeros = sh.map(() => 0);
  using ma0 = mx.slice(massAbove, zeros, first);
  using p0 = mx.slice(probs, zeros, first);
  using total = mx.add(ma0, p0);
  using thr = mx.multiply(total, mx.pyFloat(topP));
  using ge = mx.greaterEqual(massAbove, thr);
  using numDropped = mx.sum(ge, -1, true);
  using threshold = mx.takeAlongAxis(sorted, numDropped, -1);
  using lt = mx.less(logprobs, threshold);
  return mx.where(lt, mx.pyFloat(-Infinity), logprobs);
}

/** categorical_sampling body: random.categorical(logits * (1.0 / temp)). */
export function categoricalSampling(logits: MlxArray, temp: number): MlxArray {
  using scaled = mx.multiply(logits, mx.pyFloat(1.0 / temp));
  return mx.random.categorical(scaled);
}

function compiled(fn: (x: MlxArray) => MlxArray, eager: boolean): { f: (x: MlxArray) => MlxArray; dispose: () => void } {
  if (eager) return { f: fn, dispose: () => {} };
  const c = mx.compile((x: MlxArray) => fn(x), { inputs: mx.random.state, outputs: mx.random.state });
  return { f: (x) => c(x) as MlxArray, dispose: () => c.dispose() };
}

/**
 * make_sampler(temp, top_p, min_p, min_tokens_to_keep, top_k) (no XTC). temp == 0 returns the
 * greedy sampler. Throws SamplerError on a negative or non-finite temperature.
 */
export function makeSampler({ temp = 0, topP = 0, minP = 0, minTokensToKeep = 1, topK = 0, eager = false }: SamplerOptions = {}): Sampler {
  if (typeof temp !== "number" || !Number.isFinite(temp) || temp < 0) {
    throw new SamplerError(`temperature must be a finite number >= 0, got ${temp}`);
  }
  if (temp === 0) return greedySampler;
  if (!(minP >= 0 && minP <= 1)) throw new SamplerError(`\`min_p\` has to be a float in the [0, 1] interval, but is ${minP}`);
  if (!Number.isInteger(minTokensToKeep) || minTokensToKeep < 1) {
    throw new SamplerError(`\`min_tokens_to_keep\` has to be a positive integer, but is ${minTokensToKeep}`);
  }
  if (!Number.isInteger(topK) || topK < 0) throw new SamplerError(`\`top_k\` has to be a non-negative integer, but is ${topK}`);
  const methods: { f: (x: MlxArray) => MlxArray; dispose: () => void }[] = [];
  if (topP > 0 && topP < 1.0) methods.push(compiled((x) => applyTopP(x, topP), eager));
  if (minP !== 0.0) methods.push(compiled((x) => applyMinP(x, minP, minTokensToKeep), eager));
  if (topK > 0) methods.push(compiled((x) => applyTopK(x, topK), eager));
  const cat = compiled((x) => categoricalSampling(x, temp), eager);
  const sampler = ((logprobs: MlxArray): MlxArray => {
    let cur = logprobs;
    try {
      for (const m of methods) {
        const next = m.f(cur);
        if (cur !== logprobs) cur.dispose();
        cur = next;
      }
      return cat.f(cur);
    } finally {
      if (cur !== logprobs) cur.dispose();
    }
  }) as Sampler;
  sampler.dispose = () => {
    for (const m of methods) m.dispose();
    cat.dispose();
  };
  return sampler;
}
