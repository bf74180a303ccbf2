// Model-level properties against the live oracle:
//  - differential: random prompts (length 1..40) and prefill chunk sizes give the same per-step
//    logprobs (logits − logsumexp, bytes), tokens and final caches (every layer's offsets and
//    buffer shapes, and its key and value bytes by sha256) as mlx-lm's generate_step;
//  - metamorphic, RECORDING where mlx-lm itself differs rather than assuming equality:
//      chunked vs single-pass prefill (next-token logprobs), cached vs uncached next-token logits.
//    Each TS side is bit-exact against its mlx-lm counterpart, and the TS relation's verdict
//    (equal or different bytes) is asserted equal to mlx-lm's, both computed; the counts are printed.
import { beforeAll, describe, expect, it } from "vitest";
import fc from "fast-check";
import * as mx from "@mlx-bun/mlx";
import { type OracleClient, sharedOracle } from "../../oracle/client.ts";
import { KVCache, RotatingKVCache } from "../../model/cache/index.ts";
import { generateStep } from "../../model/generate.ts";
import { join } from "node:path";
import { reachableMlxBug } from "../../oracle/mlx_bugs.ts";
import { CKPT_ROOT, generateModel, model } from "../generation/parity.ts";
import { cacheSha256, firstCacheDifference } from "../generation/cache_sha256.ts";
import { compareRaw, formatDiff, rawOfNpy, type RawTensor } from "../../oracle/compare.ts";
import { checkProperty, propertyRuns, propertyTimeout } from "./harness.ts";
import { limit } from "../../tests/time_limit.ts";

let oracle: OracleClient;
beforeAll(async () => {
  oracle = await sharedOracle();
}, limit(120_000));

const ALL_CKPTS = ["c1_dense/f32", "c3_e2b/bf16", "c4_e4b/f32", "c5_moe/q4g32", "c6_sink/f32", "c2_keqv/bf16"];
// a checkpoint with a layer on a path of MLX's own proven broken on this backend
// (oracle/mlx_bugs.ts reachableMlxBug; at most 43 keys here) leaves the pool before it runs, said
// below: only logprobs are compared, so a divergence could not be located at a tap and
// attributed; the property is about the port, not that bug
const notes = ALL_CKPTS.map((ck) => {
  const bug = reachableMlxBug(join(CKPT_ROOT, ck), 43);
  return [ck, bug && `${ck} (MLX bug ${bug.id}, ${bug.reproducer})`] as const;
});
const CKPTS = notes.filter(([, n]) => n === null).map(([ck]) => ck);
const AT_BUGS = notes.flatMap(([, n]) => n ?? []);
if (AT_BUGS.length) console.log(`[model properties] left out of the random pool on this backend: ${AT_BUGS.join("; ")}`);

async function tsGenerate(ck: string, prompt: number[], prefill: number, maxTokens: number) {
  const gm = generateModel(model(ck));
  const cache = gm.makeCache();
  const toks: number[] = [];
  const lps: RawTensor[] = [];
  try {
    for await (const t of generateStep(gm, prompt, { maxTokens, prefillStepSize: prefill, promptCache: cache })) {
      toks.push(t.token);
      lps.push({ dtype: t.logprobs.dtype, shape: t.logprobs.shape, data: t.logprobs.toBytes() });
    }
    const contents = cacheSha256(cache);
    const metas = cache.map((c) => {
      const o: Record<string, unknown> = { layer: 0, type: c instanceof KVCache ? "KVCache" : "RotatingKVCache", offset: c.offset };
      if (c instanceof RotatingKVCache) Object.assign(o, { keep: c.keep, max_size: c.maxSize, idx: c.idx });
      o.keys_shape = (c as KVCache).keys?.shape ?? null;
      o.values_shape = (c as KVCache).values?.shape ?? null;
      return o;
    });
    return { toks, lps, metas, contents };
  } finally {
    for (const c of cache) c.dispose();
  }
}

const arbPrompt = fc.record({
  ck: fc.constantFrom(...CKPTS),
  prompt: fc.array(fc.integer({ min: 1, max: 255 }), { minLength: 1, maxLength: 40 }),
  prefill: fc.integer({ min: 1, max: 24 }),
  maxTokens: fc.integer({ min: 1, max: 3 }),
});

const same = (a: RawTensor, b: RawTensor) => compareRaw("x", a, b).equal;

describe("model vs the live oracle on random prompts and chunk sizes", () => {
  it("per-step logprobs bytes, tokens and final caches (offsets, shapes, key/value bytes) equal mlx-lm's generate_step", async () => {
    let cases = 0;
    await checkProperty(
      "oracle-model-random-prompts",
      fc.asyncProperty(arbPrompt, async ({ ck, prompt, prefill, maxTokens }) => {
        // the oracle (its own process, its own core) generates while TS does
        const pending = oracle.generate(ck, prompt, { prefillStepSize: prefill, maxTokens });
        pending.catch(() => {}); // observed below
        await oracle.sent();
        const ts = await tsGenerate(ck, prompt, prefill, maxTokens);
        const py = await pending;
        for (let i = 0; i < py.logprobs.length; i++) {
          const d = compareRaw(`step${i}/logprobs`, ts.lps[i]!, rawOfNpy(py.logprobs[i]!));
          if (!d.equal) throw new Error(`${ck} prompt ${prompt.length} prefill ${prefill}: ${formatDiff(d)}`);
        }
        if (JSON.stringify(ts.toks) !== JSON.stringify(py.tokens)) throw new Error(`tokens ${ts.toks} vs ${py.tokens}`);
        const pm = JSON.stringify(py.cache.map((c) => ({ ...c, layer: 0 })));
        if (JSON.stringify(ts.metas) !== pm) throw new Error(`final caches ${JSON.stringify(ts.metas)} vs ${pm}`);
        const contents = firstCacheDifference(ts.contents, py.cacheSha256);
        if (contents !== null) throw new Error(`${ck} prompt ${prompt.length} prefill ${prefill}: final caches' contents differ: ${contents}`);
        if (!py.cacheSha256.some((c) => c.keys !== null)) throw new Error(`${ck}: no cache layer holds keys after the run`);
        cases++;
      }),
      { runs: propertyRuns() },
    );
    expect(cases).toBe(propertyRuns());
  }, propertyTimeout(400_000));
});

describe("metamorphic relations, recorded against mlx-lm", () => {
  it("chunked vs single-pass prefill: next-token logprobs (TS relation == mlx-lm relation)", async () => {
    let differ = 0;
    let total = 0;
    let maxAbs = 0;
    await checkProperty(
      "metamorphic-chunked-prefill",
      fc.asyncProperty(arbPrompt, async ({ ck, prompt, prefill }) => {
        if (prompt.length < 3) prompt = [...prompt, 7, 9];
        const pendingA = oracle.generate(ck, prompt, { prefillStepSize: 2048, maxTokens: 1 });
        const pendingB = oracle.generate(ck, prompt, { prefillStepSize: prefill, maxTokens: 1 });
        pendingA.catch(() => {}); // observed below
        pendingB.catch(() => {});
        await oracle.sent();
        const tsA = await tsGenerate(ck, prompt, 2048, 1);
        const tsB = await tsGenerate(ck, prompt, prefill, 1);
        const [pyA, pyB] = [await pendingA, await pendingB];
        const a = rawOfNpy(pyA.logprobs[0]!);
        const b = rawOfNpy(pyB.logprobs[0]!);
        if (!same(tsA.lps[0]!, a) || !same(tsB.lps[0]!, b)) throw new Error(`${ck}: TS differs from the oracle on one side`);
        const pyEq = same(a, b);
        const tsEq = same(tsA.lps[0]!, tsB.lps[0]!);
        if (pyEq !== tsEq) throw new Error(`relation differs: mlx-lm equal=${pyEq}, TS equal=${tsEq}`);
        total++;
        if (!pyEq) {
          differ++;
          maxAbs = Math.max(maxAbs, compareRaw("d", a, b).maxAbs);
        }
      }),
      { runs: Math.max(20, Math.floor(propertyRuns() / 4)) },
    );
    expect(total).toBe(Math.max(20, Math.floor(propertyRuns() / 4)));
    console.log(`[metamorphic] chunked vs single-pass prefill: mlx-lm itself differs in ${differ}/${total} cases (max |d| ${maxAbs}); TS reproduces every verdict`);
  }, propertyTimeout(400_000));

  it("cached (prefill + step) vs uncached (one forward) next-token logprobs (TS relation == mlx-lm relation)", async () => {
    let differ = 0;
    let total = 0;
    let maxAbs = 0;
    await checkProperty(
      "metamorphic-cached-vs-uncached",
      fc.asyncProperty(arbPrompt, async ({ ck, prompt, prefill }) => {
        // Uncached: logits of one forward over the whole prompt, last row, → logprobs with
        // generate_step's ops (logits − logsumexp(logits, keepdims)); each side computes its own:
        // TS with the binding, mlx-lm's with mlx.core in the oracle (op requests on its own row).
        const pendingLogits = oracle.forward(ck, [prompt]);
        const pendingCached = oracle.generate(ck, prompt, { prefillStepSize: prefill, maxTokens: 1 });
        pendingLogits.catch(() => {}); // observed below
        pendingCached.catch(() => {});
        await oracle.sent();
        const lm = model(ck);
        using inp = mx.array(Int32Array.from(prompt), [1, prompt.length], "int32");
        using tsLogits = lm.model.call(inp);
        const tsRaw: RawTensor = { dtype: tsLogits.dtype, shape: tsLogits.shape, data: tsLogits.toBytes() }; // evaluates
        const pyLogits = await pendingLogits;
        const d0 = compareRaw("uncached logits", tsRaw, rawOfNpy(pyLogits));
        if (!d0.equal) throw new Error(`${ck}: uncached forward differs from the oracle: ${formatDiff(d0)}`);
        const L = prompt.length;
        const V = tsLogits.shape[2]!;
        using last = mx.slice(tsLogits, [0, L - 1, 0], [1, L, V]);
        using row = mx.squeeze(last, 1);
        using lse = mx.logsumexp(row, null, true);
        using lp = mx.subtract(row, lse);
        using lp1 = mx.squeeze(lp, 0);
        const tsUnc: RawTensor = { dtype: lp1.dtype, shape: lp1.shape, data: lp1.toBytes() };
        // mlx-lm's side: the oracle's own last logits row (its bytes, sliced), its ops
        const rowBytes = (V * pyLogits.data.byteLength) / (pyLogits.shape.reduce((a, b) => a * b, 1));
        const pyRow = { dtype: pyLogits.dtype, shape: [1, V], data: pyLogits.data.slice((L - 1) * rowBytes, L * rowBytes) };
        const [pyLse] = await oracle.op("logsumexp", [pyRow], { keepdims: true });
        const [pyLp] = await oracle.op("subtract", [pyRow, pyLse!]);
        const pyUnc: RawTensor = { ...rawOfNpy(pyLp!), shape: [V] };
        const dU = compareRaw("uncached logprobs", tsUnc, pyUnc);
        if (!dU.equal) throw new Error(`${ck}: uncached TS logprobs differ from mlx-lm's: ${formatDiff(dU)}`);
        const ts = await tsGenerate(ck, prompt, prefill, 1);
        const pyCached = rawOfNpy((await pendingCached).logprobs[0]!);
        if (!same(ts.lps[0]!, pyCached)) throw new Error(`${ck}: cached TS logprobs differ from the oracle`);
        const pyEq = same(pyUnc, pyCached);
        const tsEq = same(tsUnc, ts.lps[0]!);
        if (pyEq !== tsEq) throw new Error(`${ck}: relation differs: mlx-lm cached == uncached is ${pyEq}, TS ${tsEq}`);
        total++;
        if (!pyEq) {
          differ++;
          maxAbs = Math.max(maxAbs, compareRaw("d", pyUnc, pyCached).maxAbs);
        }
      }),
      { runs: Math.max(20, Math.floor(propertyRuns() / 4)) },
    );
    expect(total).toBe(Math.max(20, Math.floor(propertyRuns() / 4)));
    console.log(`[metamorphic] cached vs uncached next-token logprobs: mlx-lm itself differs in ${differ}/${total} cases (max |d| ${maxAbs}); TS reproduces every verdict`);
  }, propertyTimeout(400_000));
});
