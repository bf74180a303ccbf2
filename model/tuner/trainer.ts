// mlx_lm/tuner/trainer.py (mlx-lm 0.32.2): grad_checkpoint, TrainingArgs, default_loss,
// iterate_batches, evaluate, train.
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
import type { CompileState } from "@mlx-bun/mlx/compile";
import { type Tree, treeFlatten, treeMap } from "@mlx-bun/mlx/utils";
import { cross_entropy } from "../gemma4/losses.ts";
import { checkpoint, type Module, valueAndGrad } from "../gemma4/nn.ts";
import { saveSafetensorsAtomic } from "../utils.ts";
import { dirname, join } from "node:path";
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

// ------------------------------------------------------------------ grad_checkpoint

type Callable = Module & { call(...args: unknown[]): unknown };

/**
 * grad_checkpoint(layer): every instance of layer's class (all decoder layers) runs its call
 * under mx.checkpoint, with its trainable parameters as inputs (trainer.py's class-wide patch).
 * Python's patch lasts for the process; this returns the function that undoes it.
 */
export function grad_checkpoint(layer: Module): () => void {
  const proto = Object.getPrototypeOf(layer) as { call: (...args: unknown[]) => unknown };
  const fn = proto.call;
  proto.call = function checkpointed(this: Callable, ...args: unknown[]) {
    return checkpoint(this, (...a: unknown[]) => fn.apply(this, a) as Tree)(...args);
  };
  return () => {
    proto.call = fn;
  };
}

// ------------------------------------------------------------------ train

/** TrainingArgs (trainer.py), mlx-lm's defaults. */
export interface TrainingArgs {
  batch_size: number;
  iters: number;
  /** -1 uses the entire validation set. */
  val_batches: number;
  steps_per_report: number;
  steps_per_eval: number;
  steps_per_save: number;
  max_seq_length: number;
  adapter_file: string;
  grad_checkpoint: boolean;
  grad_accumulation_steps: number;
  clear_cache_threshold: number;
}

export const TRAINING_ARGS_DEFAULTS: TrainingArgs = {
  batch_size: 4,
  iters: 100,
  val_batches: 25,
  steps_per_report: 10,
  steps_per_eval: 200,
  steps_per_save: 100,
  max_seq_length: 2048,
  adapter_file: "adapters.safetensors",
  grad_checkpoint: false,
  grad_accumulation_steps: 1,
  clear_cache_threshold: 0,
};

/** What the trainer needs of an optimizer (@mlx-bun/mlx/optimizers). */
export interface TrainOptimizer {
  update(model: Module, gradients: Tree<MlxArray>): void;
  readonly state: Tree<MlxArray>;
  readonly learningRate: MlxArray;
  compileState(): CompileState;
}

/** The training_callback reports (callbacks.TrainingCallback), plus the progress UI's hooks. */
export interface TrainingCallback {
  onTrainLossReport?(info: { iteration: number; train_loss: number; learning_rate: number; iterations_per_second: number; tokens_per_second: number; trained_tokens: number; peak_memory: number }): void;
  onValLossReport?(info: { iteration: number; val_loss: number; val_time: number }): void;
  /** One iteration done (the progress bar's advance). */
  onStep?(iteration: number): void;
  /** A validation batch done. */
  onValStep?(): void;
  onSave?(file: string): void;
}

/** trainable parameters as the trainer saves them: dict(tree_flatten(model.trainable_parameters())). */
export function save_adapters(model: Module, file: string): void {
  saveSafetensorsAtomic(file, new Map(treeFlatten<MlxArray>(model.trainableParameters())));
}

function disposeTree(t: Tree<MlxArray> | null): void {
  if (t === null) return;
  for (const [, a] of treeFlatten<MlxArray>(t)) if (a instanceof mx.MlxArray) a.dispose();
}

/**
 * Python's `state = [model.state, optimizer.state, mx.random.state]` as compile state: every
 * parameter of the model (frozen ones too) in tree order, then the optimizer's state, then the
 * random key; set() writes them back in the same order.
 */
export function trainState(model: Module, optimizer: TrainOptimizer): CompileState {
  const opt = optimizer.compileState();
  return {
    get: () => [...[...model.parameters().values()].map((a) => mx.alias(a)), ...opt.get(), ...mx.random.state.get()],
    set: (arrays) => {
      const paths = [...model.parameters().keys()];
      paths.forEach((p, i) => model.setParameter(p, arrays[i]!));
      const rest = arrays.slice(paths.length);
      opt.set(rest.slice(0, rest.length - 1));
      mx.random.state.set(rest.slice(rest.length - 1));
    },
  };
}

/** mx.eval(state, *extra) with state = [model.state, optimizer.state, mx.random.state]. */
export function evalState(model: Module, optimizer: TrainOptimizer, extra: MlxArray[]): void {
  const key = mx.random.state.get();
  try {
    mx.evaluate([...model.parameters().values(), ...mx.utils.treeArrays(optimizer.state), ...key, ...extra]);
  } finally {
    for (const k of key) k.dispose();
  }
}

export type StepFn = (batch: Batch, prev_grad: Tree<MlxArray> | null, do_update: boolean) => [MlxArray, MlxArray, Tree<MlxArray> | null];

export interface StepOptions {
  loss?: LossFn;
  grad_accumulation_steps?: number;
  /** mx.compile(step, inputs=state, outputs=state), as the trainer runs it (default true). */
  compiled?: boolean;
  /** Receives the step's own gradients (before accumulation; eager only, borrowed). */
  onGrad?: (grad: Tree<MlxArray>) => void;
}

/**
 * The trainer's step: (lvalue, toks), grad = loss_value_and_grad(model, *batch); grad += prev_grad;
 * with do_update: grad / grad_accum_steps, optimizer.update(model, grad), grad = None. Returns
 * [lvalue, toks, grad]; the caller owns them and runs the one mx.eval of the iteration. The
 * compiled variant keeps one compiled closure per (prev_grad given, do_update), the constants
 * Python's compile keys on. Dispose the returned function's `dispose` to free the closures.
 */
export function makeStep(model: CausalLM, optimizer: TrainOptimizer, { loss = default_loss, grad_accumulation_steps = 1, compiled = true, onGrad }: StepOptions = {}): StepFn & { dispose(): void } {
  if (grad_accumulation_steps < 1) throw new RangeError("grad_accumulation_steps must be at least 1");
  const lvg = valueAndGrad(model, (b: MlxArray, l: MlxArray) => loss(model, b, l) as unknown as Tree);
  const body = (batch: Batch, prev: Tree<MlxArray> | null, do_update: boolean): [MlxArray, MlxArray, Tree<MlxArray> | null] => {
    const [value, g] = lvg(batch[0], batch[1]);
    const [lvalue, toks] = value as [MlxArray, MlxArray];
    let grad: Tree<MlxArray> | null = g;
    if (onGrad) onGrad(g);
    if (prev !== null) {
      const sum = treeMap((x: MlxArray, y: MlxArray) => mx.add(x, y), grad, prev);
      disposeTree(grad);
      grad = sum;
    }
    if (do_update) {
      // average_gradients is the identity for a world of one
      if (grad_accumulation_steps > 1) {
        const avg = treeMap((x: MlxArray) => mx.divide(x, grad_accumulation_steps), grad);
        disposeTree(grad);
        grad = avg;
      }
      optimizer.update(model, grad);
      disposeTree(grad);
      grad = null;
    }
    return [lvalue, toks, grad];
  };
  if (!compiled) return Object.assign(body, { dispose() {} });

  const state = trainState(model, optimizer);
  const closures = new Map<string, { fn: mx.CompiledFunction<(...a: MlxArray[]) => MlxArray[]>; shape: Tree<MlxArray> | null }>();
  const step = (batch: Batch, prev: Tree<MlxArray> | null, do_update: boolean): [MlxArray, MlxArray, Tree<MlxArray> | null] => {
    const key = `${prev !== null}|${do_update}`;
    let c = closures.get(key);
    if (!c) {
      const entry: { fn: mx.CompiledFunction<(...a: MlxArray[]) => MlxArray[]>; shape: Tree<MlxArray> | null } = { fn: null as never, shape: null };
      entry.fn = mx.compile(
        (...inputs: MlxArray[]) => {
          const prevTree = prev === null ? null : mx.utils.treeFill(prev, inputs.slice(2));
          const [lv, tk, g] = body([inputs[0]!, inputs[1]!], prevTree, do_update);
          entry.shape = g;
          return [lv, tk, ...(g === null ? [] : mx.utils.treeArrays(g))];
        },
        { inputs: state, outputs: state },
      );
      closures.set(key, (c = entry));
    }
    const outs = c.fn(batch[0], batch[1], ...(prev === null ? [] : mx.utils.treeArrays(prev)));
    const [lv, tk, ...gs] = outs;
    return [lv!, tk!, c.shape === null ? null : mx.utils.treeFill(c.shape, gs)];
  };
  return Object.assign(step, {
    dispose() {
      for (const c of closures.values()) c.fn.dispose();
      closures.clear();
    },
  });
}

export interface TrainOptions {
  args?: Partial<TrainingArgs>;
  loss?: LossFn;
  iterate?: typeof iterate_batches;
  callback?: TrainingCallback;
  /** Run the step uncompiled (the trainer compiles it; both give the same bits). */
  eager?: boolean;
  warn?: (line: string) => void;
}

/**
 * train(model, optimizer, train_dataset, val_dataset, args, loss, iterate_batches, callback):
 * trainer.train's loop. Per iteration: validation (model.eval(); at it == 1, every
 * steps_per_eval and at the last), the step, one mx.eval of [state, losses, n_tokens,
 * grad_accum], reports every steps_per_report, adapter checkpoints every steps_per_save
 * (<adapter_file> and <dir>/<it:07d>_adapters.safetensors), and the final save.
 */
export function train(model: CausalLM & { layers: Module[] }, optimizer: TrainOptimizer, train_dataset: Dataset, val_dataset: Dataset | null, opts: TrainOptions = {}): void {
  const args: TrainingArgs = { ...TRAINING_ARGS_DEFAULTS, ...opts.args };
  const loss = opts.loss ?? default_loss;
  const iterate = opts.iterate ?? iterate_batches;
  const cb = opts.callback ?? {};
  const undo = args.grad_checkpoint ? grad_checkpoint(model.layers[0]!) : () => {};
  const step = makeStep(model, optimizer, { loss, grad_accumulation_steps: args.grad_accumulation_steps, compiled: !opts.eager });
  const batches = iterate(train_dataset, { batch_size: args.batch_size, max_seq_length: args.max_seq_length, loop: true, warn: opts.warn });
  model.train();
  let losses: MlxArray | null = null;
  let n_tokens: MlxArray | null = null;
  let steps = 0;
  let trained_tokens = 0;
  let train_time = 0;
  let grad_accum: Tree<MlxArray> | null = null;
  try {
    for (let it = 1; it <= args.iters; it++) {
      const next = batches.next();
      if (next.done) break;
      const batch = next.value;
      let tic = performance.now();
      try {
        if (val_dataset && val_dataset.length > 0 && (it === 1 || it % args.steps_per_eval === 0 || it === args.iters)) {
          tic = performance.now();
          const val_loss = evaluate(model, val_dataset, { batch_size: args.batch_size, num_batches: args.val_batches, max_seq_length: args.max_seq_length, loss, iterate, progress: cb.onValStep, warn: opts.warn });
          model.train();
          const val_time = (performance.now() - tic) / 1000;
          cb.onValLossReport?.({ iteration: it - 1, val_loss, val_time }); // mlx-lm reports it - 1
          tic = performance.now();
        }
        const [lvalue, toks, g]: [MlxArray, MlxArray, Tree<MlxArray> | null] = step(batch, grad_accum, it % args.grad_accumulation_steps === 0);
        disposeTree(grad_accum);
        grad_accum = g;
        // losses += lvalue (from the Python int 0: lvalue.__radd__(0))
        const l2: MlxArray = losses === null ? mx.add(lvalue, 0) : mx.add(losses, lvalue);
        const n2: MlxArray = n_tokens === null ? mx.add(toks, 0) : mx.add(n_tokens, toks);
        lvalue.dispose();
        toks.dispose();
        losses?.dispose();
        n_tokens?.dispose();
        losses = l2;
        n_tokens = n2;
        steps++;
        evalState(model, optimizer, [losses, n_tokens, ...(grad_accum ? mx.utils.treeArrays(grad_accum) : [])]);
      } finally {
        batch[0].dispose();
        batch[1].dispose();
      }
      if (args.clear_cache_threshold > 0 && mx.getCacheMemory() > args.clear_cache_threshold) mx.clearCache();
      train_time += (performance.now() - tic) / 1000;
      cb.onStep?.(it);

      // Report training loss if needed
      if (it % args.steps_per_report === 0 || it === args.iters) {
        const train_loss = (losses!.item() as number) / steps;
        const ntok = n_tokens!.item() as number;
        trained_tokens += ntok;
        cb.onTrainLossReport?.({
          iteration: it,
          train_loss,
          learning_rate: optimizer.learningRate.item() as number,
          iterations_per_second: args.steps_per_report / train_time,
          tokens_per_second: ntok / train_time,
          trained_tokens,
          peak_memory: mx.getPeakMemory() / 1e9,
        });
        losses!.dispose();
        n_tokens!.dispose();
        losses = n_tokens = null;
        steps = 0;
        train_time = 0;
      }

      // Save adapter weights
      if (it % args.steps_per_save === 0) {
        save_adapters(model, args.adapter_file);
        const ckpt = join(dirname(args.adapter_file), `${String(it).padStart(7, "0")}_adapters.safetensors`);
        save_adapters(model, ckpt);
        cb.onSave?.(ckpt);
      }
    }
    // Save final weights
    save_adapters(model, args.adapter_file);
  } finally {
    losses?.dispose();
    n_tokens?.dispose();
    disposeTree(grad_accum);
    step.dispose();
    batches.return(undefined);
    undo();
  }
}
