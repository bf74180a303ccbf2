// Batch generation with quantized KV caches against mlx-vlm 0.7.10's batch path, on the CPU:
// the port's model/generate_batch_vlm.ts (mlx-vlm's BatchGenerator with every prompt in one
// prompt batch, as batch_generate runs it; greedy) against mlx-vlm's own BatchGenerator driven by
// oracle/python/kv_quant_ref.py batch_generate (one Python process for the file), call by call:
// - the sha256 of every logprobs matrix (B, V) the sampler saw, as float32;
// - the responses: uid, token, the float32 bits of the token's logprob, finish reason;
// - every batch cache: type (BatchRotatingKVCache / BatchKVCache / BatchTurboQuantKVCache /
//   BatchQuantizedKVCache, i.e. _make_cache's conversion rule), per-row offsets, left padding,
//   meta_state, and shape/dtype/sha256 of each state array (TurboQuant: key/value norms and packed
//   indices; uniform: packed, scales, biases; unquantized: keys/values).
// A case passes only when every call matches (oracle/kv_quant_batch.ts compareBatchGenerations);
// an error mlx-vlm raises (mx.quantize's group-size check) must be the port's, same message.
// Also the refusals before anything runs: a quantized donor read by KV-shared layers (mlx-vlm fails
// inside attention), mixed key/value schemes (mlx-vlm's NotImplementedError).
// Prompt shapes: three prompts of 20/5/13 tokens (left padding 15/7/0 after sorting; sliding
// window 8 crossed in prefill and decode) in chunks of 8; quantized_kv_start 12 (<= the longest
// prompt: quantized from the first token) with rows finishing at 2/7/4 tokens (filter, and a last
// row alone: TurboQuant's masked decode route); start 21 (> the longest: TurboQuant deferred to a
// plain BatchKVCache for good, uniform quantizes anyway); one prompt without chunking.
// KVQUANT_FULL=1: fixtures c1_dense, c2_keqv (k_eq_v), c3_e2b, c4_e4b (E2B/E4B-like: KV sharing,
// per-layer inputs), c5_moe in f32, c1_dense and c2_keqv in bf16, and two built by the oracle
// (suites/kvquant/fixtures.ts: an E2B-like c3_e2b whose layer 0 is full attention and quantized, an
// all-full-attention c1_dense), x TurboQuant 3.5/4 and uniform 4/8 (group 32: the fixtures'
// full-attention head dim is 32) x the four shapes; results in RESULTS.md. The default runs 6
// cases on c1_dense and one on the E2B-like fixture (a few seconds).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { join } from "node:path";
import { type LoadedModel, loadModel } from "../../model/gemma4/index.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { type BatchGenerationRecord, compareBatchGenerations, type KvQuantBatchCase, oracleBatchGenerations, portBatchGeneration } from "../../oracle/kv_quant_batch.ts";
import { limit } from "../../tests/time_limit.ts";
import { allFullFixture, e2bQuantizedFixture } from "./fixtures.ts";
import { kvSharedBatchConflict, makeBatchCaches } from "../../model/cache/kv_quantize_batch.ts";
import type { LanguageModel } from "../../model/gemma4/language.ts";
import { VlmBatchGenerator } from "../../model/generate_batch_vlm.ts";

const FULL = process.env.KVQUANT_FULL === "1";
const CK = join(REPO_ROOT, ".cache", "checkpoints");
const P = (n: number, shift: number) => Array.from({ length: n }, (_, i) => (i * 37 + 11 + shift) % 256);
const THREE = [P(20, 0), P(5, 3), P(13, 7)];

interface Case extends KvQuantBatchCase {
  label: string;
}

const SHAPES = [
  { tag: "3 prompts 20/5/13, chunks 8, start 0", prompts: THREE, maxTokens: [6, 6, 6], start: 0, step: 8 as number | null },
  { tag: "3 prompts, start 12, rows end at 2/7/4", prompts: THREE, maxTokens: [2, 7, 4], start: 12, step: 8 },
  { tag: "3 prompts, start 21 (> longest)", prompts: THREE, maxTokens: [5, 5, 5], start: 21, step: 8 },
  { tag: "1 prompt of 13, one prefill call", prompts: [P(13, 5)], maxTokens: [6], start: 0, step: null },
];
const SCHEMES: { scheme: "turboquant" | "uniform"; bits: number }[] = [
  { scheme: "turboquant", bits: 3.5 },
  { scheme: "turboquant", bits: 4 },
  { scheme: "uniform", bits: 4 },
  { scheme: "uniform", bits: 8 },
];
const FIXTURES = ["c1_dense/f32", "c2_keqv/f32", "c3_e2b/f32", "c4_e4b/f32", "c5_moe/f32", "c1_dense/bf16", "c2_keqv/bf16", "e2b-like (layer 0 full)", "all-full-attention"];
// built by the oracle before the cases (suites/kvquant/fixtures.ts)
const E2BQ = e2bQuantizedFixture();
const ALL_FULL = allFullFixture();
afterAll(() => {
  E2BQ.remove();
  ALL_FULL.remove();
});
const fixtureDir = (fx: string): string => (fx.startsWith("e2b-like") ? E2BQ.dir : fx === "all-full-attention" ? ALL_FULL.dir : join(CK, fx));

const mk = (fx: string, s: { scheme: "turboquant" | "uniform"; bits: number } | null, sh: (typeof SHAPES)[number], groupSize = 32): Case => ({
  label: `${fx} ${s ? `${s.scheme} ${s.bits}` : "unquantized"}${s?.scheme === "uniform" && groupSize !== 32 ? ` g${groupSize}` : ""} | ${sh.tag}`,
  checkpoint: fixtureDir(fx),
  prompts: sh.prompts,
  maxTokens: sh.maxTokens,
  kvBits: s ? s.bits : null,
  kvQuantScheme: s ? s.scheme : "uniform",
  kvGroupSize: groupSize,
  quantizedKvStart: sh.start,
  prefillStepSize: sh.step,
});

const UNQUANTIZED = mk("c1_dense/f32", null, SHAPES[0]!);
const CASES: Case[] = [
  UNQUANTIZED,
  ...(FULL
    ? FIXTURES.flatMap((fx) => SCHEMES.flatMap((s) => SHAPES.map((sh) => mk(fx, s, sh))))
    : [mk("c1_dense/f32", SCHEMES[0]!, SHAPES[0]!), mk("c1_dense/f32", SCHEMES[1]!, SHAPES[1]!), mk("c1_dense/f32", SCHEMES[2]!, SHAPES[1]!), mk("c1_dense/f32", SCHEMES[0]!, SHAPES[2]!), mk("c1_dense/f32", SCHEMES[1]!, SHAPES[3]!), mk("e2b-like (layer 0 full)", SCHEMES[2]!, SHAPES[1]!)]),
  // group 64 does not divide the fixtures' head dim 32: mx.quantize's error at the first update
  mk("c1_dense/f32", SCHEMES[3]!, SHAPES[0]!, 64),
];

let refs: BatchGenerationRecord[];
beforeAll(() => {
  refs = oracleBatchGenerations(CASES, [E2BQ.job, ALL_FULL.job]);
}, limit(FULL ? 600_000 : 120_000));

const models = new Map<string, LoadedModel>();
const model = (dir: string): LoadedModel => {
  let m = models.get(dir);
  if (!m) models.set(dir, (m = loadModel(dir)));
  return m;
};
afterAll(() => {
  for (const m of models.values()) m.model.dispose();
});

const summary: string[] = [];
const unsupported: string[] = [];
let ran = 0;
afterAll(() => {
  if (summary.length) console.log(`[kvquant batch] ${summary.length} cases bit-exact vs mlx-vlm's BatchGenerator\n${summary.join("\n")}`);
  if (unsupported.length) console.log(`[kvquant batch] ${unsupported.length} cases unsupported on ${mx.backend()} (both sides: the same MLX error)\n${unsupported.join("\n")}`);
});

describe("batch generation with quantized KV caches vs mlx-vlm's BatchGenerator, call by call", () => {
  for (const [i, k] of CASES.entries()) {
    it(k.label, () => {
      const want = refs[i]!;
      const got = portBatchGeneration(model(k.checkpoint), k);
      const c = compareBatchGenerations(got, want);
      expect(c.firstMismatch).toBeNull();
      if (c.unsupported !== null) {
        // both sides stopped at one MLX error (CUDA has no quantized_matmul at group 32 for these
        // shapes): unsupported on this backend, counted apart; on the CPU every case must run
        expect(mx.defaultDevice()).toBe("gpu");
        unsupported.push(`| ${k.label} | ${c.unsupported} |`);
        ran++;
        return;
      }
      const tokens = k.maxTokens.reduce((a, b) => a + b, 0);
      if (k.kvGroupSize === 64) {
        expect(want.error?.message).toMatch(/^\[quantize\] The last dimension of the matrix needs to be divisible by the quantization group size 64/);
      } else {
        expect(want.error).toBeNull();
        expect(c.tokens).toBe(tokens);
        // the E2B-like fixture's layer 0 is quantized (the point of that fixture), unless TurboQuant was deferred
        if (k.checkpoint === E2BQ.dir && !(k.kvQuantScheme === "turboquant" && k.quantizedKvStart > 20)) expect(c.quantizedCaches).toBe(1);
      }
      const short: Record<string, string> = { BatchRotatingKVCache: "Rot", BatchKVCache: "KV", BatchTurboQuantKVCache: "TQ", BatchQuantizedKVCache: "Q" };
      const types = (want.calls.find((x) => x.cache.length)?.cache ?? []).map((x) => short[x.type] ?? x.type);
      summary.push(`| ${k.label} | ${c.calls} | ${c.tokens} | ${c.quantizedCaches} | ${c.quantizedArrays} | ${want.error ? `${want.error.type}: ${want.error.message.slice(0, 90)}` : types.join(" ")} |`);
      ran++;
    }, limit(FULL ? 120_000 : 60_000));
  }

  it("the quantized caches change the logprobs (not a no-op) and every case ran", () => {
    const plain = refs[0]!.calls.flatMap((c) => c.logprobs_sha256);
    const quant = refs[1]!.calls.flatMap((c) => c.logprobs_sha256);
    expect(CASES[1]!.prompts).toEqual(UNQUANTIZED.prompts);
    expect(quant.length).toBe(plain.length);
    expect(quant.filter((h, j) => h !== plain[j]).length).toBeGreaterThan(0);
    expect(refs[1]!.calls.some((c) => c.cache.some((x) => x.type === "BatchTurboQuantKVCache"))).toBe(true);
    expect(ran).toBe(CASES.length);
  });
});

describe("the batch path's refusals, before anything runs", () => {
  it("a quantized donor read by KV-shared layers: named, and refused by the generator", () => {
    const F = "full_attention";
    const S = "sliding_attention";
    // non-shared F S S: layer 0 (full attention, not the last cache) is quantized and read by 3 and 5
    const types = [F, S, S, F, S, F];
    expect(kvSharedBatchConflict(types, 3)).toEqual({ donor: 0, readers: [3, 5] });
    // c3_e2b / c4_e4b and real E2B/E4B: the full-attention donor is the last cache, left unquantized
    expect(kvSharedBatchConflict([S, S, S, F, S, S, S, F], 4)).toBeNull();
    expect(kvSharedBatchConflict([S, S, F, S, S, F], 3)).toBeNull();
    const lm = { config: { layer_types: types, num_kv_shared_layers: 3 } } as unknown as LanguageModel;
    expect(() => new VlmBatchGenerator(lm, [[1, 2, 3]], { maxTokens: 2, kv: { kvBits: 4, kvQuantScheme: "turboquant", quantizedKvStart: 0 } })).toThrow(
      "KV-shared layer(s) 3, 5 read layer 0's cache, which mlx-vlm's batch path quantizes",
    );
  });

  it("mixed key/value schemes: mlx-vlm's NotImplementedError message", () => {
    expect(() => makeBatchCaches([], [0], { kvBits: 4, kvQuantScheme: "turboquant", kvValueScheme: "uniform", quantizedKvStart: 0 }, 3)).toThrow(
      "mixed key/value KV quantization schemes are not supported on the batch path yet",
    );
  });
});
