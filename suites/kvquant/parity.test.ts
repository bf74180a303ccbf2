// KV-cache quantization against mlx-vlm 0.7.10 on the CPU (oracle/kv_quant.ts, one Python
// process running oracle/python/kv_quant_ref.py for the whole file):
// - kv_quant.ts fromLegacy against mlx-vlm's from_legacy on a table of flag combinations: the
//   policy (schemes, key/value bits, group size, split override) or the error message;
// - numpy's default_rng(seed + dim*7919).choice([-1, 1]) sign vectors (PCG64Generator) and the
//   carried codebooks (model/cache/turboquant_codebooks.json) against mlx-vlm's run-time values;
// - greedy generation with a quantized cache, per token: the token, the sha256 of its logprobs
//   and of every TurboQuant state array (key/value norms and packed indices) plus meta_state, the
//   cache types and offsets; prompts crossing quantized_kv_start and the sliding window, prefill
//   chunks after the conversion (dequantize + SDPA) and decode steps (the quantized decode path);
//   uniform's RotatingKVCache NYI after the same tokens; on an all-full-attention copy of c1_dense
//   (built by the oracle), uniform running: every cache a QuantizedKVCache, its state (packed,
//   scales, biases) and meta_state compared per token;
// - a TurboQuantKVCache driven directly (D 32/64/256/512, and 48 with mlx-vlm's numpy-QR rotation
//   matrices taken as an input): update, trim, update, decode and prefill attention, and a copy
//   restored from state + meta_state: state and output sha256 equal;
// - the generate face refusing a model whose KV-shared layers read a cache that would be
//   converted (exit 2), where mlx-vlm fails inside attention (bench/kvquant/kv_shared_repro.py).
// KVQUANT_FULL=1 runs the whole grid (5 f32 fixtures x 4 schemes x 3 prompt shapes, 3 bf16/f16
// fixtures x TurboQuant 3.5/4 x 3 shapes, all codebooks);
// its results are in RESULTS.md.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import codebookData from "../../model/cache/turboquant_codebooks.json" with { type: "json" };
import { createHash } from "node:crypto";
import * as mx from "@mlx-bun/mlx";
import { rhtSignVector, TurboQuantKVCache } from "../../model/cache/turboquant.ts";
import { generateStep } from "../../model/generate.ts";
import { type LoadedModel, loadModel } from "../../model/gemma4/index.ts";
import { fromLegacy, KVQuantError } from "../../model/kv_quant.ts";
import { generationModel } from "../../model/runtime.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { compareGenerations, type GenerationRecord, type KvQuantCase, kvQuantOracle, portGeneration } from "../../oracle/kv_quant.ts";
import { limit } from "../../tests/time_limit.ts";
import { allFullFixture, e2bQuantizedFixture } from "./fixtures.ts";

const FULL = process.env.KVQUANT_FULL === "1";
function FULL_GRID_FLAG(): boolean {
  return FULL;
}
const CK = join(REPO_ROOT, ".cache", "checkpoints");
const ckpt = (fx: string) => join(CK, fx, "f32");
const prompt = (P: number) => Array.from({ length: P }, (_, i) => (i * 37 + 11) % 256);

// ------------------------------------------------------------------ the cases

const POLICY_CASES: Record<string, unknown>[] = [
  { kv_bits: null },
  { kv_bits: 4 },
  { kv_bits: 8, kv_group_size: 32 },
  { kv_bits: 4, kv_quant_scheme: "turboquant" },
  { kv_bits: 3.5 },
  { kv_bits: 3.5, kv_quant_scheme: "uniform" },
  { kv_bits: 3.5, kv_value_bits: 5 },
  { kv_bits: 3, kv_quant_scheme: "turboquant", kv_key_bits: 2.5 },
  { kv_bits: 1, kv_quant_scheme: "turboquant" },
  { kv_bits: 2.25 },
  { kv_bits: 0.5, kv_quant_scheme: "turboquant" },
  { kv_bits: 4, kv_quant_scheme: "foo" },
  { kv_bits: 4, kv_key_scheme: "bar" },
  { kv_bits: 4, kv_key_bits: 3.5 },
  { kv_bits: 4, kv_quant_scheme: "turboquant", kv_value_scheme: "uniform" },
];

interface GenCase extends KvQuantCase {
  label: string;
  /** on the all-full-attention fixture (built in beforeAll): uniform runs there */
  allFull?: boolean;
}

// An all-full-attention copy of c1_dense (layer 2's weights at every layer index; written by the
// oracle's relayered_fixture command before the generations): the one shape where mlx-vlm's
// uniform scheme runs on the single-sequence path (QuantizedKVCache, every cache converted).
const ALL_FULL = allFullFixture();
const ALL_FULL_DIR = ALL_FULL.dir;
// and an E2B-like c3_e2b whose layer 0 is full attention, neither the last cache nor a donor
// (suites/kvquant/fixtures.ts): TurboQuant converts it, with KV sharing and per-layer inputs
const E2BQ = e2bQuantizedFixture();
afterAll(() => {
  ALL_FULL.remove();
  E2BQ.remove();
});
const e2bq = (label: string, kvBits: number, P: number, start: number, step: number, N: number): GenCase => ({
  label: `e2b-like (layer 0 full) turboquant ${kvBits}, ${label}`,
  checkpoint: E2BQ.dir,
  prompt: prompt(P),
  maxTokens: N,
  kvBits,
  kvQuantScheme: "turboquant",
  kvGroupSize: 64,
  quantizedKvStart: start,
  prefillStepSize: step,
});
const E2BQ_CASES: GenCase[] = FULL_GRID_FLAG()
  ? [3.5, 4].flatMap((b) => [e2bq("P=20 start 12 chunks of 8", b, 20, 12, 8, 12), e2bq("P=5 start 8: converted during decode", b, 5, 8, 2048, 12), e2bq("P=13 start 0 chunks of 4", b, 13, 0, 4, 12)])
  : [e2bq("P=5 start 8: converted during decode", 4, 5, 8, 2048, 6)];
const full = (label: string, scheme: "turboquant" | "uniform", kvBits: number, P: number, start: number, step: number, N: number): GenCase => ({
  label: `all-full-attention ${label}`,
  allFull: true,
  checkpoint: ALL_FULL_DIR,
  prompt: prompt(P),
  maxTokens: N,
  kvBits,
  kvQuantScheme: scheme,
  kvGroupSize: 32,
  quantizedKvStart: start,
  prefillStepSize: step,
});
const ALL_FULL_CASES: GenCase[] = FULL_GRID_FLAG()
  ? [
      full("uniform 4, P=20 start 12 chunks of 8", "uniform", 4, 20, 12, 8, 12),
      full("uniform 8, P=20 start 12 chunks of 8", "uniform", 8, 20, 12, 8, 12),
      full("uniform 4, P=5 start 8: converted during decode", "uniform", 4, 5, 8, 2048, 12),
      full("uniform 8, P=5 start 8: converted during decode", "uniform", 8, 5, 8, 2048, 12),
      full("uniform 4, P=13 start 0 chunks of 4", "uniform", 4, 13, 0, 4, 12),
      full("uniform 8, P=300 start 100 chunks of 64 (past the 256-column step)", "uniform", 8, 300, 100, 64, 4),
      full("turboquant 3.5, P=20 start 12 chunks of 8 (the last cache stays KVCache)", "turboquant", 3.5, 20, 12, 8, 12),
    ]
  : [full("uniform 4, P=20 start 12 chunks of 8", "uniform", 4, 20, 12, 8, 6)];

const gen = (label: string, fx: string, scheme: "turboquant" | "uniform", kvBits: number, P: number, start: number, step: number, N: number): GenCase => ({
  label,
  checkpoint: fx.includes("/") ? join(CK, fx) : ckpt(fx),
  prompt: prompt(P),
  maxTokens: N,
  kvBits,
  kvQuantScheme: scheme,
  kvGroupSize: 64,
  quantizedKvStart: start,
  prefillStepSize: step,
});

// prompt shapes: P=20 in chunks of 8 with start 12 (converted after the 2nd chunk, the 3rd chunk
// attends through the quantized cache; window 8 crossed); P=5 with start 8 (converted during
// decode); P=13 with start 0 (converted after the first chunk)
const SHAPES = [
  { tag: "P20/start12/chunks8", P: 20, start: 12, step: 8 },
  { tag: "P5/start8 (decode)", P: 5, start: 8, step: 2048 },
  { tag: "P13/start0/chunks4", P: 13, start: 0, step: 4 },
];
const SCHEMES: { scheme: "turboquant" | "uniform"; bits: number }[] = [
  { scheme: "turboquant", bits: 3.5 },
  { scheme: "turboquant", bits: 4 },
  { scheme: "uniform", bits: 4 },
  { scheme: "uniform", bits: 8 },
];
// Left out: c6_sink (untied embeddings, which the oracle's loader, speculative.py vlm_target,
// refuses); c7_defaults (mlx-vlm's gemma4 and the port, which follows mlx-lm, already differ on it
// unquantized: logprobs ~1e-2 apart at step 0, measured 2026-12-02; not a KV quantization matter)
const FIXTURES = ["c1_dense", "c2_keqv", "c3_e2b", "c4_e4b", "c5_moe"];

// bf16 / f16 weights: bf16 queries and keys enter the codec (astype float32) and the output is cast back
const HALF_FIXTURES = ["c1_dense/bf16", "c2_keqv/bf16", "c1_dense/f16"];

const GEN_CASES: GenCase[] = FULL
  ? [
      ...FIXTURES.flatMap((fx) => SCHEMES.flatMap((s) => SHAPES.map((sh) => gen(`${fx} ${s.scheme} ${s.bits} ${sh.tag}`, fx, s.scheme, s.bits, sh.P, sh.start, sh.step, 12)))),
      ...HALF_FIXTURES.flatMap((fx) => SCHEMES.filter((s) => s.scheme === "turboquant").flatMap((s) => SHAPES.map((sh) => gen(`${fx} ${s.scheme} ${s.bits} ${sh.tag}`, fx, s.scheme, s.bits, sh.P, sh.start, sh.step, 12)))),
    ]
  : [
      gen("c1_dense turboquant 3.5, P=20 start 12 chunks of 8", "c1_dense", "turboquant", 3.5, 20, 12, 8, 6),
      gen("c2_keqv (k_eq_v) turboquant 4, P=5 start 8: converted during decode", "c2_keqv", "turboquant", 4, 5, 8, 2048, 8),
      gen("c1_dense uniform 4, P=5 start 8: RotatingKVCache NYI after the tokens before", "c1_dense", "uniform", 4, 5, 8, 2048, 8),
      gen("c1_dense bf16 turboquant 4, P=13 start 0 chunks of 4", "c1_dense/bf16", "turboquant", 4, 13, 0, 4, 6),
    ];
GEN_CASES.push(...ALL_FULL_CASES, ...E2BQ_CASES);

const CODEBOOK_DIMS = FULL ? [32, 48, 64, 96, 128, 256, 512] : [32];
const CODEBOOK_BITS = FULL ? [1, 2, 3, 4, 5, 6, 7, 8] : [3, 4];
const SIGN_DIMS = [16, 32, 64, 128, 256, 512];
const SIGN_SEEDS = [0, 1, 7];

// ------------------------------------------------------------------ one oracle process

// TurboQuantKVCache driven directly: update, trim, update, decode + prefill attention, restore
const CACHE_OPS = [
  { seed: 5, heads: 2, dim: 32, prompt: 9, more: 3, trim: 4, bits: 3.5 },
  { seed: 6, heads: 1, dim: 256, prompt: 300, more: 2, trim: 40, bits: 4 },
  { seed: 7, heads: 2, dim: 64, prompt: 5, more: 1, trim: 9, bits: 2 },
  { seed: 9, heads: 1, dim: 512, prompt: 3, more: 1, trim: 1, bits: 3.5 },
  // not a power of two: mlx-vlm's numpy-QR rotation, handed to the port as an input
  { seed: 8, heads: 2, dim: 48, prompt: 7, more: 2, trim: 3, bits: 3.5 },
];

let ref: { policy: any[]; signs: Record<string, number[]>; codebooks: Record<string, string[]>; cacheOps: any[]; gens: GenerationRecord[] };
beforeAll(() => {
  const r = kvQuantOracle({
    command: "many",
    jobs: [
      { command: "policy", cases: POLICY_CASES },
      { command: "signs", dims: SIGN_DIMS, seeds: SIGN_SEEDS },
      { command: "codebooks", dims: CODEBOOK_DIMS, bits: CODEBOOK_BITS },
      { command: "many", jobs: CACHE_OPS.map((c) => ({ command: "cache_ops", ...c })) },
      ALL_FULL.job,
      E2BQ.job,
      { command: "generate_many", cases: GEN_CASES.map((k) => ({ checkpoint: k.checkpoint, prompt: k.prompt, max_tokens: k.maxTokens, kv_bits: k.kvBits, kv_quant_scheme: k.kvQuantScheme, kv_group_size: k.kvGroupSize, quantized_kv_start: k.quantizedKvStart, prefill_step_size: k.prefillStepSize })) },
    ],
  }).results;
  ref = { policy: r[0].results, signs: r[1], codebooks: r[2].codebooks, cacheOps: r[3].results, gens: r[6].results };
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

// ------------------------------------------------------------------ tests

describe("kv_quant policy vs mlx-vlm's from_legacy", () => {
  it("every case: the same policy or the same error message", () => {
    let n = 0;
    for (const [i, c] of POLICY_CASES.entries()) {
      const want = ref.policy[i];
      let got: unknown;
      try {
        const p = fromLegacy({
          kvBits: (c.kv_bits as number | null) ?? null,
          kvQuantScheme: (c.kv_quant_scheme as string) ?? null,
          kvGroupSize: (c.kv_group_size as number) ?? 64,
          kvKeyBits: (c.kv_key_bits as number) ?? null,
          kvValueBits: (c.kv_value_bits as number) ?? null,
          kvKeyScheme: (c.kv_key_scheme as string) ?? null,
          kvValueScheme: (c.kv_value_scheme as string) ?? null,
        });
        got = p === null ? null : { bits: p.bits, key: [p.key.scheme, p.key.bits, p.key.groupSize], value: [p.value.scheme, p.value.bits, p.value.groupSize], split_override: p.hasSplitOverride };
      } catch (e) {
        if (!(e instanceof KVQuantError)) throw e;
        got = { error: "ValueError", message: e.message };
      }
      expect({ case: c, got }).toEqual({ case: c, got: want });
      n++;
    }
    expect(n).toBe(POLICY_CASES.length);
    // the table holds both outcomes: 2.25, 0.5, key scheme "bar", uniform key bits 3.5 are refused
    expect(ref.policy.filter((p) => p && p.error).length).toBe(4);
  });
});

describe("numpy-side constants", () => {
  it("RHT sign vectors: default_rng(seed + dim*7919).choice([-1, 1]) reproduced", () => {
    let n = 0;
    for (const d of SIGN_DIMS) {
      for (const s of SIGN_SEEDS) {
        expect(Array.from(rhtSignVector(d, s))).toEqual(ref.signs[`${d}:${s}`]!);
        n++;
      }
    }
    expect(n).toBe(SIGN_DIMS.length * SIGN_SEEDS.length);
  });

  it("carried codebooks equal mlx-vlm's run-time numpy values on this machine", () => {
    const carried = codebookData.codebooks as Record<string, string[]>;
    let n = 0;
    for (const d of CODEBOOK_DIMS) {
      for (const b of CODEBOOK_BITS) {
        expect(carried[`${d}:${b}`]).toEqual(ref.codebooks[`${d}:${b}`]!);
        n++;
      }
    }
    expect(n).toBe(CODEBOOK_DIMS.length * CODEBOOK_BITS.length);
  });
});

describe("TurboQuantKVCache: trim, state and meta_state, attention", () => {
  const sha = (a: mx.MlxArray) => createHash("sha256").update(a.toBytes()).digest("hex");
  for (const [i, op] of CACHE_OPS.entries()) {
    it(`D=${op.dim} H=${op.heads} ${op.bits} bits: ${op.prompt} tokens, trim ${op.trim}, ${op.more} more`, () => {
      const want = ref.cacheOps[i];
      mx.random.seed(op.seed);
      const n = (shape: number[]) => mx.random.normal({ shape });
      const [k1, v1, k2, v2] = [n([1, op.heads, op.prompt, op.dim]), n([1, op.heads, op.prompt, op.dim]), n([1, op.heads, op.more, op.dim]), n([1, op.heads, op.more, op.dim])];
      const [q1, q3] = [n([1, 2 * op.heads, 1, op.dim]), n([1, 2 * op.heads, 3, op.dim])];
      const { rotations, ...expected } = want as { rotations: Record<string, string> } & Record<string, unknown>;
      const isPow2 = (op.dim & (op.dim - 1)) === 0;
      expect(Object.keys(rotations).length).toBe(isPow2 ? 0 : 2);
      const rotation = isPow2 ? undefined : (dim: number, seed: number) => mx.fromBytes(Uint8Array.from(Buffer.from(rotations[String(seed)]!, "hex")), [dim, dim], "float32");
      const c = new TurboQuantKVCache(op.bits, { rotation });
      const r = new TurboQuantKVCache(1, { rotation });
      try {
        for (const a of c.updateAndFetch(k1, v1)) a.dispose();
        const trimmed = c.trim(op.trim);
        for (const a of c.updateAndFetch(k2, v2)) a.dispose();
        using out1 = c.quantizedAttention(q1, 1, null);
        using out3 = c.quantizedAttention(q3, 1, "causal");
        const st = c.state;
        r.state = st;
        r.metaState = c.metaState;
        r.ensureCodecs(k1, v1);
        using out1r = r.quantizedAttention(q1, 1, null);
        expect({ trimmed, offset: c.offset, meta_state: c.metaState, restored_meta_state: r.metaState, state: st.map(sha), decode: sha(out1), prefill: sha(out3), restored_decode: sha(out1r) }).toEqual(expected);
        for (const a of st) a.dispose();
      } finally {
        c.dispose();
        r.dispose();
        for (const a of [k1, v1, k2, v2, q1, q3]) a.dispose();
      }
    });
  }
});

const summary: string[] = [];
const unsupported: string[] = [];
afterAll(() => {
  if (summary.length) console.log(`[kvquant] ${summary.length} generation cases bit-exact vs mlx-vlm\n${summary.join("\n")}`);
  if (unsupported.length) console.log(`[kvquant] ${unsupported.length} generation cases unsupported on ${mx.backend()} (both sides: the same MLX error)\n${unsupported.join("\n")}`);
});

describe("generation with a quantized KV cache vs mlx-vlm's generate_step, token by token", () => {
  for (const [i, k] of GEN_CASES.entries()) {
    it(k.label, async () => {
      const want = ref.gens[i]!;
      const got = await portGeneration(model(k.checkpoint), k);
      const c = compareGenerations(got, want);
      expect(c.firstMismatch).toBeNull();
      if (c.unsupported !== null) {
        // both sides stopped at one MLX error (CUDA has no quantized_matmul at group 32 for these
        // shapes): unsupported on this backend, counted apart; on the CPU every case must run
        expect(mx.defaultDevice()).toBe("gpu");
        unsupported.push(`${k.label}: ${c.unsupported}`);
        return;
      }
      if (k.kvQuantScheme === "uniform" && k.allFull) {
        // no sliding layer: every cache becomes a QuantizedKVCache once it reaches the start
        expect(want.error).toBeNull();
        expect(c.tokens).toBe(k.maxTokens);
        expect(want.steps.at(-1)!.cache.every((x) => x.type === "QuantizedKVCache")).toBe(true);
      } else if (k.kvQuantScheme === "uniform") {
        // every fixture has sliding layers: mlx-vlm stops with NYI once one reaches the start
        expect(want.error?.message).toBe("RotatingKVCache Quantization NYI");
      } else {
        expect(want.error).toBeNull();
        expect(c.tokens).toBe(k.maxTokens);
        // the E2B-like fixture's layer 0 is converted (the point of that fixture)
        if (k.checkpoint === E2BQ.dir) expect(c.turboCaches).toBe(1);
      }
      const last = want.steps.at(-1);
      summary.push(`${k.label}: ${c.tokens} tokens, ${c.turboCaches} quantized cache(s), ${c.quantizedArrays} state arrays${want.error ? `, then ${want.error.type}: ${want.error.message}` : ""}; caches at the end: ${last ? last.cache.map((x) => `${x.type}@${x.offset}`).join(" ") : "-"}`);
    }, limit(FULL ? 120_000 : 60_000));
  }

  it("the quantized cache changes the logprobs (the conversion is not a no-op)", async () => {
    const k = GEN_CASES[0]!;
    const m = generationModel(model(k.checkpoint));
    const plain: string[] = [];
    for await (const t of generateStep(m, k.prompt, { maxTokens: k.maxTokens, prefillStepSize: k.prefillStepSize })) plain.push(createHash("sha256").update(t.logprobs.toBytes()).digest("hex"));
    const quantized = ref.gens[0]!.steps.map((s) => s.logprobs_sha256);
    expect(quantized.length).toBe(plain.length);
    expect(quantized.filter((h, j) => h !== plain[j]).length).toBeGreaterThan(0);
    expect(ref.gens[0]!.steps.at(-1)!.cache.some((c) => c.type === "TurboQuantKVCache")).toBe(true);
  }, limit(60_000));
});

describe("npm run generate: KV sharing with a converted donor", () => {
  it("refuses (exit 2) where mlx-vlm fails inside attention", () => {
    const dir = mkdtempSync(join(tmpdir(), "kvq-shared-"));
    try {
      const cfg = JSON.parse(readFileSync(join(ckpt("c4_e4b"), "config.json"), "utf8"));
      // non-shared F,S,S: the full-attention donor (layer 0) is not the last cache, so it is converted
      cfg.layer_types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"];
      writeFileSync(join(dir, "config.json"), JSON.stringify(cfg));
      copyFileSync(join(ckpt("c4_e4b"), "model.safetensors"), join(dir, "model.safetensors"));
      const r = spawnSync("bun", [join(REPO_ROOT, "parity", "generate_cli.ts"), "--model", dir, "--tokens", "1,2,3", "--max-tokens", "2", "--kv-bits", "4", "--kv-quant-scheme", "turboquant"], { encoding: "utf8" });
      expect(r.status).toBe(2);
      expect(r.stderr).toContain("KV-shared layer(s) 3, 5 read layer 0's cache");
      expect(r.stderr.trim().split("\n").length).toBe(1);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, limit(60_000));
});
