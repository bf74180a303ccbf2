// The TurboQuant codecs beyond MSE in mlx-vlm 0.7.10 (oracle/python/kv_quant_codecs.py, one Python
// process for the file):
// - reachability: an AST scan of mlx-vlm's sources must show what suites/kvquant/RESULTS.md says:
//   the Prod (QJL) codec is chosen only where mode == "prod" and every call passes mode "mse";
//   the Polar codec (_TurboQuantPolarProdCodec) is constructed nowhere; the Split codec is built
//   by _build_codec for a .5 width; HybridQuantKVCache by maybe_quantize_kv_cache;
// - the carried codebooks of the Split halves' dims (16, 24) against mlx-vlm's run-time values;
// - the Split codec (model/cache/turboquant_split.ts) driven directly as a TurboQuantKVCache
//   (update, trim, update, decode and prefill attention): its outlier index sets, every state
//   leaf (shape, dtype, sha256), meta_state and both attention outputs (sha256) equal mlx-vlm's
//   (D=48: halves of 24, so mlx-vlm's numpy-QR rotation matrices are taken as an input);
// - greedy generation with a Split codec (kv_key_bits / kv_value_bits .5) on c1_dense and c3_e2b,
//   and with mixed key/value schemes (HybridQuantKVCache: uniform keys, TurboQuant 4 or 3.5
//   values) on c1_dense, per token: the token, the sha256 of its logprobs, every cache's type and
//   offset, each quantized state leaf (shape, dtype, sha256) and meta_state, against mlx-vlm's
//   generate_step. KVQUANT_FULL=1 runs the grid (14 generation cases: c1, c2_keqv, c5_moe, bf16
//   fixtures, the E2B-like fixture with a converted layer, 12 tokens instead of 6); its results are
//   in RESULTS.md.
// - no MLX handle leaks through a Split and a Hybrid cache's lifecycle.
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import type { KVCacheLike } from "../../model/cache/index.ts";
import { makeKvQuantizer } from "../../model/cache/kv_quantize.ts";
import { codebookValues, TurboQuantKVCache } from "../../model/cache/turboquant.ts";
import { HybridQuantKVCache } from "../../model/cache/turboquant_hybrid.ts";
import { TurboQuantSplitCodec, TurboQuantSplitKVCache } from "../../model/cache/turboquant_split.ts";
import { generateStep } from "../../model/generate.ts";
import { fromLegacy } from "../../model/kv_quant.ts";
import { type LoadedModel, loadModel } from "../../model/gemma4/index.ts";
import { generationModel } from "../../model/runtime.ts";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";
import { e2bQuantizedFixture } from "./fixtures.ts";

const FULL = process.env.KVQUANT_FULL === "1";
const CK = join(REPO_ROOT, ".cache", "checkpoints");

function oracle(job: Record<string, unknown>): any {
  const r = spawnSync(DEFAULT_PYTHON, [join(REPO_ROOT, "oracle", "python", "kv_quant_codecs.py")], { input: JSON.stringify(job), encoding: "utf8", maxBuffer: 256 << 20 });
  if (r.status !== 0) throw new Error(`kv_quant_codecs.py failed (exit ${r.status}): ${r.stderr.slice(-2000)}`);
  return JSON.parse(r.stdout);
}

const sha = (a: MlxArray) => {
  using f = a.dtype === "bfloat16" ? mx.astype(a, "float32") : mx.alias(a);
  return createHash("sha256").update(f.toBytes()).digest("hex");
};
const arrRecord = (a: MlxArray) => ({ shape: a.shape, dtype: a.dtype, sha256: sha(a) });

interface CacheRec {
  type: string;
  offset: number;
  keys?: ReturnType<typeof arrRecord>[];
  values?: ReturnType<typeof arrRecord>[];
  meta_state?: string[];
}

/** kv_quant_codecs.py's cache_record for a port cache (mlx-vlm's class name, its state leaves in order). */
function cacheRecord(c: KVCacheLike): CacheRec {
  if (c instanceof TurboQuantSplitKVCache || c instanceof TurboQuantKVCache || c instanceof HybridQuantKVCache) {
    const st = c.quantizedState;
    const nk = c instanceof TurboQuantKVCache ? 2 : c.keyLeafCount;
    try {
      return { type: c instanceof HybridQuantKVCache ? "HybridQuantKVCache" : "TurboQuantKVCache", offset: c.offset, keys: st.slice(0, nk).map(arrRecord), values: st.slice(nk).map(arrRecord), meta_state: c.metaState };
    } finally {
      for (const a of st) a.dispose();
    }
  }
  const named = c as { pythonClass?: string };
  return { type: named.pythonClass ?? c.constructor.name, offset: c.offset };
}

// ------------------------------------------------------------------ the cases

interface OpsCase {
  seed: number;
  heads: number;
  dim: number;
  prompt: number;
  more: number;
  trim: number;
  bits: number;
  key_bits?: number;
  value_bits?: number;
}

const OPS: OpsCase[] = [
  { seed: 3, heads: 2, dim: 32, prompt: 9, more: 3, trim: 4, bits: 4, key_bits: 3.5 },
  { seed: 4, heads: 1, dim: 256, prompt: 20, more: 2, trim: 5, bits: 3, key_bits: 2.5, value_bits: 3.5 },
  { seed: 5, heads: 2, dim: 64, prompt: 4, more: 1, trim: 9, bits: 2, value_bits: 1.5 },
  // D=48: Split halves of 24 and MSE values of 48 rotate with mlx-vlm's numpy-QR matrices, taken as inputs
  { seed: 6, heads: 2, dim: 48, prompt: 7, more: 2, trim: 3, bits: 4, key_bits: 3.5 },
];
// the carried codebooks of the Split halves' dims (added for these tests) against mlx-vlm's run-time values
const SPLIT_CODEBOOK_DIMS = [16, 24];
const SPLIT_CODEBOOK_BITS = FULL ? [1, 2, 3, 4, 5, 6, 7, 8] : [2, 3, 4];

interface GenCase {
  label: string;
  checkpoint: string;
  prompt: number[];
  max_tokens: number;
  kv_bits: number;
  kv_key_bits?: number;
  kv_value_bits?: number;
  kv_quant_scheme?: "turboquant" | "uniform";
  kv_key_scheme?: string;
  kv_value_scheme?: string;
  kv_group_size?: number;
  quantized_kv_start: number;
  prefill_step_size: number;
}

const prompt = (P: number) => Array.from({ length: P }, (_, i) => (i * 37 + 11) % 256);
const gen = (fx: string, bits: [number, number?, number?], P: number, start: number, step: number): GenCase => ({
  label: `${fx} bits ${bits[0]} key ${bits[1] ?? "-"} value ${bits[2] ?? "-"} P${P}/start${start}/chunks${step}`,
  checkpoint: fx.includes("/") ? join(CK, fx) : join(CK, fx, "f32"),
  prompt: prompt(P),
  max_tokens: FULL ? 12 : 6,
  kv_bits: bits[0],
  ...(bits[1] !== undefined ? { kv_key_bits: bits[1] } : {}),
  ...(bits[2] !== undefined ? { kv_value_bits: bits[2] } : {}),
  quantized_kv_start: start,
  prefill_step_size: step,
});

// KVQUANT_FULL: the E2B-like fixture whose layer 0 is full attention (suites/kvquant/fixtures.ts,
// built by kv_quant_ref.py's relayered_fixture): a converted cache with KV sharing and per-layer inputs
const E2BQ = FULL ? e2bQuantizedFixture() : null;
if (E2BQ) {
  const r = spawnSync(DEFAULT_PYTHON, [join(REPO_ROOT, "oracle", "python", "kv_quant_ref.py")], { input: JSON.stringify(E2BQ.job), encoding: "utf8" });
  if (r.status !== 0) throw new Error(`relayered_fixture failed: ${r.stderr.slice(-2000)}`);
}
afterAll(() => E2BQ?.remove());

const GENS: GenCase[] = [
  gen("c1_dense", [4, 3.5], 20, 12, 8), // keys Split 3/4 bits, values MSE 4; converted mid-prefill (prefill and decode routes), window crossed
  gen("c3_e2b", [4, 3.5], 13, 0, 4), // E2B-like: its only convertible layer is the last cache: nothing converted
  // HybridQuantKVCache with a uniform base scheme: uniform 4/g32 keys, TurboQuant 3.5 values (the Split codec inside the hybrid)
  { ...gen("c1_dense", [4, undefined, 3.5], 5, 8, 2048), label: "c1_dense hybrid: uniform 4/g32 keys, values TurboQuant 3.5 (Split), P5/start8", kv_quant_scheme: "uniform", kv_value_scheme: "turboquant", kv_group_size: 32 },
  ...(FULL
    ? [
        gen("c1_dense", [3, 2.5, 3.5], 5, 8, 2048), // both sides Split, converted during decode
        { ...gen("c1_dense", [4], 20, 12, 8), label: "c1_dense hybrid: keys uniform 4/g32, values TurboQuant 4, P20/start12/chunks8", kv_key_scheme: "uniform", kv_group_size: 32 },
        gen("c1_dense", [4, 3.5], 13, 0, 4),
        gen("c1_dense", [3, 2.5, 3.5], 20, 12, 8),
        gen("c2_keqv", [4, 4, 3.5], 20, 12, 8),
        gen("c5_moe", [3, 2.5, 3.5], 13, 0, 4),
        gen("c1_dense/bf16", [4, 3.5], 20, 12, 8),
        gen("c2_keqv/bf16", [3, 2.5, 3.5], 5, 8, 2048),
        { ...gen("c2_keqv", [4], 20, 12, 8), label: "c2_keqv hybrid: keys uniform 4/g32, values TurboQuant 4, P20/start12/chunks8", kv_key_scheme: "uniform", kv_group_size: 32 },
        { ...gen("c5_moe", [8, undefined, 3.5], 13, 0, 4), label: "c5_moe hybrid: uniform 8/g32 keys, values TurboQuant 3.5 (Split), P13/start0/chunks4", kv_quant_scheme: "uniform" as const, kv_value_scheme: "turboquant", kv_group_size: 32 },
        { ...gen("c3_e2b", [4, 3.5], 20, 12, 8), checkpoint: E2BQ!.dir, label: "e2b-like (layer 0 full) bits 4 key 3.5, P20/start12/chunks8" },
        { ...gen("c3_e2b", [3, 2.5, 3.5], 5, 8, 2048), checkpoint: E2BQ!.dir, label: "e2b-like (layer 0 full) bits 3 key 2.5 value 3.5, P5/start8" },
        { ...gen("c3_e2b", [4, undefined, 3.5], 13, 0, 4), checkpoint: E2BQ!.dir, label: "e2b-like (layer 0 full) hybrid: uniform 4/g32 keys, TurboQuant 3.5 values, P13/start0/chunks4", kv_quant_scheme: "uniform" as const, kv_value_scheme: "turboquant", kv_group_size: 32 },
      ]
    : []),
];

const ref = oracle({
  command: "many",
  jobs: [{ command: "reachability" }, { command: "codebooks", dims: SPLIT_CODEBOOK_DIMS, bits: SPLIT_CODEBOOK_BITS }, ...OPS.map((o) => ({ command: "split_ops", ...o })), ...GENS.map(({ label: _, ...g }) => ({ command: "generate", kv_quant_scheme: "turboquant", kv_group_size: 64, ...g }))],
}).results;
const [reach, codebooks, ...rest] = ref;
const opsRef = rest.slice(0, OPS.length);
const genRef = rest.slice(OPS.length);

describe("which TurboQuant codecs mlx-vlm's generation can build (AST scan of its sources)", () => {
  const calls = reach.calls as { file: string; in: string; callee: string; mode: string | null }[];
  const choices = reach.choices as { file: string; in: string; expr: string }[];
  it("Prod (QJL): chosen only where mode == 'prod', and every codec build passes mode 'mse'", () => {
    expect(calls.filter((c) => c.callee === "_TurboQuantProdCodec")).toEqual([]);
    expect(choices.map((c) => c.in).sort()).toEqual(["_SplitCodec._init_from_indices", "_build_codec"]);
    for (const c of choices) expect(c.expr).toBe("_TurboQuantProdCodec if mode == 'prod' else _TurboQuantMSECodec");
    const builds = calls.filter((c) => c.callee === "_build_codec" || c.callee === "from_indices");
    expect(builds.length).toBeGreaterThanOrEqual(5);
    for (const b of builds) expect(b.mode).toBe("'mse'");
    // _SplitCodec is built only by _build_codec, which passes its own (always 'mse') mode on
    expect(calls.filter((c) => c.callee === "_SplitCodec")).toEqual([{ file: "turboquant.py", in: "_build_codec", callee: "_SplitCodec", mode: "mode" }]);
  });
  it("Polar: _TurboQuantPolarProdCodec is constructed nowhere (its unit codec only inside it)", () => {
    expect(calls.filter((c) => c.callee === "_TurboQuantPolarProdCodec")).toEqual([]);
    expect(calls.filter((c) => c.callee === "_PolarQuantUnitCodec").map((c) => c.in)).toEqual(["_TurboQuantPolarProdCodec.__init__"]);
  });
  it("HybridQuantKVCache: built by generate_step's maybe_quantize_kv_cache (mixed key/value schemes)", () => {
    expect(calls.filter((c) => c.callee === "HybridQuantKVCache").map((c) => `${c.file}:${c.in}`)).toContain("generate/common.py:maybe_quantize_kv_cache.hybridize");
  });
});

describe("the Split codec driven as a TurboQuantKVCache vs mlx-vlm", () => {
  it(`carried codebooks for dims ${SPLIT_CODEBOOK_DIMS} equal mlx-vlm's run-time numpy values on this machine`, () => {
    let n = 0;
    for (const d of SPLIT_CODEBOOK_DIMS) {
      for (const b of SPLIT_CODEBOOK_BITS) {
        const carried = Array.from(new Uint32Array(codebookValues(d, b).buffer), (x) => x.toString(16).padStart(8, "0"));
        expect(carried).toEqual(codebooks[`${d}:${b}`]);
        n++;
      }
    }
    expect(n).toBe(SPLIT_CODEBOOK_DIMS.length * SPLIT_CODEBOOK_BITS.length);
  });
  for (const [i, op] of OPS.entries()) {
    it(`D=${op.dim} H=${op.heads} bits ${op.bits} key ${op.key_bits ?? "-"} value ${op.value_bits ?? "-"}: ${op.prompt} tokens, trim ${op.trim}, ${op.more} more`, () => {
      const want = opsRef[i];
      mx.random.seed(op.seed);
      const n = (shape: number[]) => mx.random.normal({ shape });
      const [k1, v1, k2, v2] = [n([1, op.heads, op.prompt, op.dim]), n([1, op.heads, op.prompt, op.dim]), n([1, op.heads, op.more, op.dim]), n([1, op.heads, op.more, op.dim])];
      const [q1, q3] = [n([1, 2 * op.heads, 1, op.dim]), n([1, 2 * op.heads, 3, op.dim])];
      const { rotations, ...expected } = want as { rotations: Record<string, string> } & Record<string, unknown>;
      const rotation = (dim: number, seed: number) => {
        const hex = rotations[`${dim}:${seed}`];
        if (hex === undefined) throw new Error(`the oracle sent no rotation for dim ${dim} seed ${seed}`);
        return mx.fromBytes(Uint8Array.from(Buffer.from(hex, "hex")), [dim, dim], "float32");
      };
      expect(Object.keys(rotations).length).toBe(op.dim === 48 ? 3 : 0);
      const c = new TurboQuantSplitKVCache(op.bits, { keyBits: op.key_bits ?? null, valueBits: op.value_bits ?? null, rotation });
      try {
        for (const a of c.updateAndFetch(k1, v1)) a.dispose();
        const trimmed = c.trim(op.trim);
        for (const a of c.updateAndFetch(k2, v2)) a.dispose();
        using out1 = c.quantizedAttention(q1, 1, null);
        using out3 = c.quantizedAttention(q3, 1, "causal");
        const idx = (codec: unknown) => (codec instanceof TurboQuantSplitCodec ? { low: [...codec.lowIndices], high: [...codec.highIndices] } : null);
        const got = { trimmed, offset: c.offset, meta_state: c.metaState, cache: cacheRecord(c), key_split: idx(c.keyCodec), value_split: idx(c.valueCodec), decode: sha(out1), prefill: sha(out3) };
        expect(got).toEqual(expected);
        expect(got.key_split !== null || got.value_split !== null).toBe(true);
      } finally {
        c.dispose();
        for (const a of [k1, v1, k2, v2, q1, q3]) a.dispose();
      }
    });
  }
});

const models = new Map<string, LoadedModel>();

describe("generation with a Split codec or a HybridQuantKVCache vs mlx-vlm's generate_step, token by token", () => {
  for (const [i, g] of GENS.entries()) {
    it(g.label, async () => {
      const want = genRef[i] as { steps: { token: number; logprobs_sha256: string; cache: CacheRec[] }[]; error: unknown };
      expect(want.error).toBeNull();
      let loaded = models.get(g.checkpoint);
      if (!loaded) models.set(g.checkpoint, (loaded = loadModel(g.checkpoint)));
      const model = generationModel(loaded);
      const cache = model.makeCache();
      const ref: KVCacheLike[] = cache;
      const quantizeCache = makeKvQuantizer({
        kvBits: g.kv_bits,
        kvQuantScheme: g.kv_quant_scheme ?? "turboquant",
        kvGroupSize: g.kv_group_size ?? 64,
        quantizedKvStart: g.quantized_kv_start,
        kvKeyBits: g.kv_key_bits ?? null,
        kvValueBits: g.kv_value_bits ?? null,
        kvKeyScheme: g.kv_key_scheme ?? null,
        kvValueScheme: g.kv_value_scheme ?? null,
      })!;
      const steps: { token: number; logprobs_sha256: string; cache: CacheRec[] }[] = [];
      try {
        for await (const t of generateStep(model, g.prompt, { maxTokens: g.max_tokens, prefillStepSize: g.prefill_step_size, promptCache: cache, quantizeCache })) {
          using lp32 = mx.astype(t.logprobs, "float32");
          steps.push({ token: t.token, logprobs_sha256: sha(lp32), cache: ref.map(cacheRecord) });
        }
      } finally {
        for (const c of ref) c.dispose();
      }
      expect(steps.length).toBe(g.max_tokens);
      for (let s = 0; s < steps.length; s++) expect({ step: s, ...steps[s] }).toEqual({ step: s, ...want.steps[s]! });
      const converted = want.steps.at(-1)!.cache.filter((c) => c.type === (g.kv_key_scheme || g.kv_value_scheme ? "HybridQuantKVCache" : "TurboQuantKVCache")).length;
      expect(converted).toBe(g.checkpoint.includes("c3_e2b") ? 0 : 1);
    }, limit(60_000));
  }
});

describe("Split and Hybrid caches dispose what they create", () => {
  it("a full lifecycle (update, update, trim, decode and prefill attention, state, dispose) leaves no MLX handle behind", () => {
    mx.random.seed(0);
    using k = mx.random.normal({ shape: [1, 2, 5, 32] });
    using v = mx.random.normal({ shape: [1, 2, 5, 32] });
    using k1 = mx.random.normal({ shape: [1, 2, 1, 32] });
    using q = mx.random.normal({ shape: [1, 4, 1, 32] });
    using q3 = mx.random.normal({ shape: [1, 4, 3, 32] });
    const before = mx.liveHandles();
    let rounds = 0;
    for (let r = 0; r < 2; r++) {
      const c = new TurboQuantSplitKVCache(3, { keyBits: 2.5, valueBits: 3.5 });
      for (const a of c.updateAndFetch(k, v)) a.dispose();
      for (const a of c.updateAndFetch(k1, k1)) a.dispose();
      c.trim(2);
      c.quantizedAttention(q, 1, null).dispose();
      c.quantizedAttention(q3, 1, "causal").dispose();
      for (const a of c.state) a.dispose();
      c.dispose();
      const h = new HybridQuantKVCache(fromLegacy({ kvBits: 4, kvQuantScheme: "uniform", kvGroupSize: 32, kvValueScheme: "turboquant", kvValueBits: 3.5 })!);
      for (const a of h.updateAndFetch(k, v)) a.dispose();
      for (const a of h.updateAndFetch(k1, k1)) a.dispose();
      h.trim(1);
      for (const a of h.state) a.dispose();
      h.dispose();
      rounds++;
    }
    expect(rounds).toBe(2);
    expect(mx.liveHandles() - before).toBe(0);
  });
});
