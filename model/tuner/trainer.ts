// mlx_lm/tuner/trainer.py (mlx-lm 0.32.2): default_loss, iterate_batches, evaluate.
//
// default_loss replicates mlx-lm's loss mask exactly, including its off-by-one: target j counts
// when offset <= j + 1 <= length, so each sequence also scores the first padding target (the
// token after its last one). ntoks for lengths [[3, 9], [3, 14]] is 7 + 12 = 19, not 17.
//
// iterate_batches sorts by length (for a CacheDataset, by the raw record's key count: mlx-lm's
// itemlen, which leaves file order in place), groups consecutive examples, and shuffles the
// batches with numpy's global legacy RandomState (np_random.ts), the same draws as numpy makes.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { cross_entropy } from "../gemma4/losses.ts";
import type { Module } from "../gemma4/nn.ts";
import { tunerMutated } from "./mutations.ts";
import { globalRandom, type RandomState } from "./np_random.ts";

/** One example: token ids and the offset where the scored part starts. */
export type Example = readonly [tokens: readonly number[], offset: number];

/** What iterate_batches reads: examples by index and, for a CacheDataset, the raw record length. */
export interface Dataset {
  readonly length: number;
  get(i: number): Example;
  /** CacheDataset.itemlen: len() of the raw record (the sort key instead of the token count). */
  itemlen?(i: number): number;
}

/** A model the loss can call: token ids (B, L) → logits (B, L, V). */
export interface CausalLM extends Module {
  call(inputs: MlxArray): MlxArray;
}

export type LossFn = (model: CausalLM, batch: MlxArray, lengths: MlxArray) => [MlxArray, MlxArray];

/** default_loss(model, batch, lengths) → (mean cross-entropy over the masked targets, ntoks). */
export function default_loss(model: CausalLM, batch: MlxArray, lengths: MlxArray): [MlxArray, MlxArray] {
  const [B, T] = batch.shape as [number, number];
  using stack = new DisposableStack();
  const inputs = stack.use(mx.slice(batch, [0, 0], [B, T - 1]));
  const targets = stack.use(mx.slice(batch, [0, 1], [B, T]));

  const logits = stack.use(model.call(inputs));

  const steps = stack.use(mx.arange(1, T - 1 + 1));
  const lo = stack.use(mx.slice(lengths, [0, 0], [B, 1])); // lengths[:, 0:1]
  const hi = stack.use(mx.slice(lengths, [0, 1], [B, 2])); // lengths[:, 1:]
  const ge = stack.use(mx.greaterEqual(steps, lo));
  const le = stack.use(tunerMutated("loss_mask_exact") ? mx.less(steps, hi) : mx.lessEqual(steps, hi));
  const mask = stack.use(mx.logicalAnd(ge, le));

  const ce0 = stack.use(cross_entropy(logits, targets));
  const ce = stack.use(mx.multiply(ce0, mask));
  const ntoks = mx.sum(mask);
  try {
    const ce32 = stack.use(mx.astype(ce, "float32"));
    const s = stack.use(mx.sum(ce32));
    return [mx.divide(s, ntoks), ntoks];
  } catch (e) {
    ntoks.dispose();
    throw e;
  }
}

/** A batch: token ids (B, padded length) int32 and [[offset, length], ...] int32. */
export type Batch = [batch: MlxArray, lengths: MlxArray];

export interface IterateOptions {
  batch_size: number;
  max_seq_length: number;
  loop?: boolean;
  /** np.random.seed(seed) before the first permutation (the trainer passes none). */
  seed?: number | null;
  /** Called with a warning line (mlx-lm prints it). */
  warn?: (line: string) => void;
  /** The numpy RandomState to draw from (default: numpy's global one). */
  rng?: RandomState;
}

/**
 * iterate_batches(dataset, batch_size, max_seq_length, loop=False, seed=None): a lazy generator,
 * as Python's: the permutation of an epoch is drawn when its first batch is requested.
 */
export function* iterate_batches(dataset: Dataset, { batch_size, max_seq_length, loop = false, seed = null, warn = console.warn, rng = globalRandom }: IterateOptions): Generator<Batch> {
  // Sort by length:
  const len = dataset.itemlen ? (i: number) => dataset.itemlen!(i) : (i: number) => dataset.get(i)[0].length;
  const keys = Array.from({ length: dataset.length }, (_, i) => len(i));
  const idx = Array.from({ length: dataset.length }, (_, i) => i).sort((a, b) => keys[a]! - keys[b]!);
  if (dataset.length < batch_size) {
    throw new RangeError(`Dataset must have at least batch_size=${batch_size} examples but only has ${dataset.length}.`);
  }
  // Make the batches:
  const batch_idx: number[][] = [];
  for (let i = 0; i + batch_size <= idx.length; i += batch_size) batch_idx.push(idx.slice(i, i + batch_size));
  if (seed !== null && seed !== undefined) rng.seed(seed);
  for (;;) {
    const indices = rng.permutation(batch_idx.length);
    for (const i of indices) {
      const batch = batch_idx[i]!.map((j) => dataset.get(j));
      const lengths = batch.map(([t]) => t.length);
      const longest = Math.max(...lengths);
      if (longest > max_seq_length) {
        warn(
          `[WARNING] Some sequences are longer than ${max_seq_length} tokens. The longest sentence ${longest} will be truncated to ${max_seq_length}. Consider pre-splitting your data to save memory.`,
        );
      }
      // Pad to one plus nearest multiple of pad_to or the maximum length
      const pad_to = 32;
      const width = Math.min(1 + pad_to * Math.floor((longest + pad_to - 1) / pad_to), max_seq_length);
      const arr = new Int32Array(batch_size * width);
      for (let j = 0; j < batch_size; j++) {
        const n = Math.min(lengths[j]!, max_seq_length);
        const toks = batch[j]![0];
        for (let t = 0; t < n; t++) arr[j * width + t] = toks[t]!;
        lengths[j] = n; // Update lengths to match truncated lengths
      }
      const pairs = new Int32Array(batch_size * 2);
      for (let j = 0; j < batch_size; j++) {
        pairs[2 * j] = batch[j]![1];
        pairs[2 * j + 1] = lengths[j]!;
      }
      yield [mx.array(arr, [batch_size, width]), mx.array(pairs, [batch_size, 2])];
    }
    if (!loop) break;
  }
}

export interface EvaluateOptions {
  batch_size: number;
  /** -1: the whole dataset. */
  num_batches: number;
  max_seq_length?: number;
  loss?: LossFn;
  iterate?: typeof iterate_batches;
  progress?: () => void;
  warn?: (line: string) => void;
}

/** evaluate(model, dataset, ...): model.eval(), then sum(loss * ntoks) / sum(ntoks) over the batches. */
export function evaluate(model: CausalLM, dataset: Dataset, { batch_size, num_batches, max_seq_length = 2048, loss = default_loss, iterate = iterate_batches, progress, warn }: EvaluateOptions): number {
  model.eval();
  let all_losses = mx.array(0.0);
  let ntokens = mx.array(0);
  try {
    const batches = iterate(dataset, { batch_size, max_seq_length, warn });
    // zip(range(num_batches), batches): the count runs out before the next batch is drawn
    for (let n = 0; num_batches === -1 || n < num_batches; n++) {
      const next = batches.next();
      if (next.done) break;
      const [batch, lengths] = next.value;
      try {
        const [losses, toks] = loss(model, batch, lengths);
        using _l = losses;
        using _t = toks;
        using lt = mx.multiply(losses, toks);
        const a = mx.add(all_losses, lt);
        all_losses.dispose();
        all_losses = a;
        const t = mx.add(ntokens, toks);
        ntokens.dispose();
        ntokens = t;
        mx.evaluate(all_losses, ntokens);
      } finally {
        batch.dispose();
        lengths.dispose();
      }
      progress?.();
    }
    using avg = mx.divide(all_losses, ntokens);
    return avg.item() as number;
  } finally {
    all_losses.dispose();
    ntokens.dispose();
  }
}
