// default_loss, iterate_batches and numpy's batch shuffle against mlx-lm / numpy:
// - np.random.seed + permutation: the TS MT19937 port gives numpy's permutations;
// - iterate_batches: the same batches (ids, padding width, [offset, length], truncation) in the
//   same shuffled order, over two epochs with loop=True;
// - default_loss: the loss bits and ntoks of mlx-lm's default_loss on those batches (dense f32,
//   bf16, E2B-like with LoRA, MoE), including the mask's extra padding target per sequence.

import { afterAll, describe, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadModel } from "../../model/gemma4/index.ts";
import { RandomState } from "../../model/tuner/np_random.ts";
import { default_loss, type Example, iterate_batches } from "../../model/tuner/trainer.ts";
import { linear_to_lora_layers } from "../../model/tuner/utils.ts";
import { withTunerMutation } from "../../model/tuner/mutations.ts";
import { CKPT_ROOT, firstMismatch, readMeta, readTensors, runTunerRef } from "./ref.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "tuner-loss-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const PERMS: [number, number, number][] = [
  [0, 10, 3],
  [42, 1, 2],
  [7, 100, 2],
  [123456789, 1000, 1],
  [2 ** 32 - 1, 37, 2],
  [5, 70000, 1],
];

/** Deterministic token lists of the given lengths (ids 1..255) with offsets. */
function dataset(lengths: number[], offsets: (i: number) => number): Example[] {
  const r = new RandomState(99);
  return lengths.map((n, i) => [Array.from({ length: n }, () => 1 + (r.nextUint32() % 255)), offsets(i)] as const);
}

const DATA = dataset([9, 14, 17, 21, 40, 3, 33, 64, 5, 12, 70, 8], (i) => (i % 3 === 0 ? 0 : Math.min(3, i)));
const SHORT = dataset([9, 14, 17, 21], () => 3);

interface BatchCase {
  name: string;
  data: Example[];
  batch_size: number;
  max_seq_length: number;
  loop: boolean;
  take: number;
  seed_batches: number | null;
  np_seed: number | null;
  ckpt?: string;
  lora?: boolean;
}

const CASES: BatchCase[] = [
  { name: "batch 3, two epochs (loop), truncation at 48", data: DATA, batch_size: 3, max_seq_length: 48, loop: true, take: 8, seed_batches: 11, np_seed: null },
  { name: "batch 2 after np.random.seed(0) (the trainer's path)", data: DATA, batch_size: 2, max_seq_length: 2048, loop: false, take: 6, seed_batches: null, np_seed: 0 },
  { name: "dense f32 default_loss", data: SHORT, batch_size: 2, max_seq_length: 2048, loop: false, take: 2, seed_batches: 7, np_seed: null, ckpt: "c1_dense/f32" },
  { name: "dense bf16 default_loss (bf16 CE summed in f32)", data: DATA, batch_size: 3, max_seq_length: 48, loop: false, take: 4, seed_batches: 3, np_seed: null, ckpt: "c1_dense/bf16" },
  { name: "E2B-like f32 + LoRA default_loss", data: DATA, batch_size: 2, max_seq_length: 64, loop: false, take: 3, seed_batches: 5, np_seed: null, ckpt: "c3_e2b/f32", lora: true },
  { name: "MoE f32 default_loss", data: SHORT, batch_size: 2, max_seq_length: 2048, loop: false, take: 2, seed_batches: 1, np_seed: null, ckpt: "c5_moe/f32" },
];

const LORA = { rank: 4, scale: 20.0, dropout: 0.0 };

runTunerRef([
  { kind: "permutation", cases: PERMS, out: join(tmp, "perm") },
  ...CASES.map((c, i) => ({
    kind: "batches",
    data: c.data,
    batch_size: c.batch_size,
    max_seq_length: c.max_seq_length,
    loop: c.loop,
    take: c.take,
    seed_batches: c.seed_batches,
    np_seed: c.np_seed,
    ckpt: c.ckpt ? join(CKPT_ROOT, c.ckpt) : null,
    ...(c.lora ? { lora_parameters: LORA, seed: 42, num_layers: 4 } : {}),
    out: join(tmp, `b${i}`),
  })),
]);

describe("numpy's legacy RandomState", () => {
  it("seed + permutation equal numpy's", () => {
    const want = readMeta<{ permutations: number[][][] }>(join(tmp, "perm")).permutations;
    PERMS.forEach(([seed, n, k], i) => {
      const r = new RandomState(seed);
      for (let j = 0; j < k; j++) expect(r.permutation(n)).toEqual(want[i]![j]!);
    });
  });
});

describe("iterate_batches and default_loss vs mlx-lm", () => {
  CASES.forEach((c, i) => {
    it(c.name, async () => {
      readMeta(join(tmp, `b${i}`));
      const theirs = readTensors(join(tmp, `b${i}`, "batches.safetensors"));
      const rng = new RandomState(0);
      if (c.np_seed !== null) rng.seed(c.np_seed);
      const ds = { length: c.data.length, get: (k: number) => c.data[k]! };
      const loaded = c.ckpt ? loadModel(join(CKPT_ROOT, c.ckpt)) : null;
      const warnings: string[] = [];
      const ours: [string, mx.MlxArray][] = [];
      try {
        if (loaded && c.lora) {
          mx.random.seed(42);
          linear_to_lora_layers(loaded.model, 4, LORA);
        }
        loaded?.model.eval();
        const gen = iterate_batches(ds, { batch_size: c.batch_size, max_seq_length: c.max_seq_length, loop: c.loop, seed: c.seed_batches, rng, warn: (l) => warnings.push(l) });
        for (let b = 0; b < c.take; b++) {
          const n = gen.next();
          if (n.done) break;
          const [batch, lengths] = n.value;
          ours.push([`${b}.batch`, batch], [`${b}.lengths`, lengths]);
          if (loaded) {
            const [loss, ntoks] = default_loss(loaded.model, batch, lengths);
            ours.push([`${b}.loss`, loss], [`${b}.ntoks`, ntoks]);
          }
        }
        const bad = firstMismatch(ours, theirs);
        if (bad) throw new Error(bad);
        if (c.max_seq_length < 64) expect(warnings.length).toBeGreaterThan(0);
        if (loaded) {
          // the mask counts one padding target per sequence shorter than the batch width: without it
          // ntoks drops by exactly that many (checked on the first batch that has such a sequence)
          const named = new Map(ours);
          const shorterIn = (b: number) => named.get(`${b}.lengths`)!.toNumbers().filter((n, r) => r % 2 === 1 && n < named.get(`${b}.batch`)!.shape[1]!).length;
          const b = Array.from({ length: c.take }, (_, k) => k).find((k) => named.has(`${k}.lengths`) && shorterIn(k) > 0);
          expect(b).toBeDefined();
          const [batch, lengths, ntoks] = [named.get(`${b}.batch`)!, named.get(`${b}.lengths`)!, named.get(`${b}.ntoks`)!];
          const shorter = shorterIn(b!);
          const [l2, n2] = await withTunerMutation("loss_mask_exact", () => default_loss(loaded.model, batch, lengths));
          using _l = l2;
          using _n = n2;
          expect(n2.item()).toBe((ntoks.item() as number) - shorter);
        }
      } finally {
        for (const [, a] of ours) a.dispose();
        loaded?.model.dispose();
      }
    }, limit(60_000));
  });
});
