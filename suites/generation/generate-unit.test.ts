// generate.ts mechanics on a toy model (no oracle): prefill chunking, step count, pipelining,
// EOS / maxTokens stopping, argument errors.
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVCache, RotatingKVCache, type KVCacheLike } from "../../model/cache/index.ts";
import { generate, generateStep, GenerateError, type CallInfo, type GenerateModel } from "../../model/generate.ts";
import { SamplerError, makeSampler } from "../../model/sample.ts";
import { limit } from "../../tests/time_limit.ts";

const V = 16;

/** Logits favour (last input token + 1) mod V; K/V of each token go through the caches. */
function toyModel(calls: { call: CallInfo; len: number; dtype: string }[]): GenerateModel {
  return {
    makeCache: () => [new KVCache(), new RotatingKVCache(4, 0)],
    forward(inputs: MlxArray, cache: KVCacheLike[], call: CallInfo): MlxArray {
      const [B, L] = inputs.shape as [number, number];
      calls.push({ call, len: L, dtype: inputs.dtype });
      const ids = inputs.toNumbers();
      using kv = mx.ones([B, 1, L, 2], "float32");
      for (const c of cache) {
        const [k, v] = c.updateAndFetch(kv, kv);
        k.dispose();
        v.dispose();
      }
      const out = new Float32Array(B * L * V);
      for (let i = 0; i < L; i++) out[i * V + ((ids[i]! + 1) % V)] = 5;
      return mx.array(out, [B, L, V]);
    },
  };
}

async function collect<T>(it: AsyncGenerator<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

describe("generate_step mechanics", () => {
  it("prefills all but the last token in chunks, then max_tokens+1 single-token steps", async () => {
    const calls: { call: CallInfo; len: number; dtype: string }[] = [];
    const toks = await collect(generateStep(toyModel(calls), Array.from({ length: 21 }, (_, i) => i % V), { maxTokens: 5, prefillStepSize: 8 }));
    expect(toks.map((t) => t.token)).toEqual([5, 6, 7, 8, 9]);
    expect(calls.map((c) => `${c.call.kind}${c.call.index}:${c.len}`)).toEqual([
      "prefill0:8", "prefill1:8", "prefill2:4", "step0:1", "step1:1", "step2:1", "step3:1", "step4:1", "step5:1",
    ]);
    // The last prompt token is int32, later inputs are the sampled uint32 y, as in Python.
    expect(calls[3]!.dtype).toBe("int32");
    expect(calls[4]!.dtype).toBe("uint32");
  });

  it("a 1-token prompt has no prefill", async () => {
    const calls: { call: CallInfo; len: number; dtype: string }[] = [];
    await collect(generateStep(toyModel(calls), [3], { maxTokens: 2 }));
    expect(calls.map((c) => c.call.kind)).toEqual(["step", "step", "step"]);
  });

  it("stops on EOS (yielded, finishReason stop) and on maxTokens (length)", async () => {
    const a = await collect(generate(toyModel([]), [1, 2], { maxTokens: 10, eosTokenIds: [6] }));
    expect(a.map((t) => t.token)).toEqual([3, 4, 5, 6]);
    expect(a.at(-1)!.finishReason).toBe("stop");
    const b = await collect(generate(toyModel([]), [1, 2], { maxTokens: 3 }));
    expect(b.map((t) => t.finishReason)).toEqual([null, null, "length"]);
  });

  it("logprobs = logits - logsumexp(logits)", async () => {
    for await (const t of generateStep(toyModel([]), [1], { maxTokens: 1 })) {
      const lp = t.logprobs.toNumbers();
      expect(lp.length).toBe(V);
      const z = Math.log(Math.exp(5) + (V - 1));
      expect(lp[2]).toBeCloseTo(5 - z, 5);
    }
  });

  it("rejects bad arguments with clear errors", () => {
    const m = toyModel([]);
    expect(() => generateStep(m, [1], { maxTokens: 0 })).toThrow(GenerateError);
    expect(() => generateStep(m, [1], { maxTokens: -1 })).toThrow(/maxTokens must be a positive integer/);
    expect(() => generateStep(m, [1], { samplerOptions: { temp: -0.5 } })).toThrow(/temperature/);
    expect(() => generateStep(m, [], {})).toThrow(/at least one token/);
    expect(() => generateStep(m, [1], { prefillStepSize: 0 })).toThrow(/prefillStepSize/);
    expect(() => makeSampler({ temp: -1 })).toThrow(SamplerError);
  });

  it("sampled runs are reproducible under the same seed (first run JIT-compiles the sampler kernels)", async () => {
    const run = async () =>
      (await collect(generateStep(toyModel([]), [1, 2, 3], { maxTokens: 8, samplerOptions: { temp: 3.0 }, seed: 7 }))).map((t) => t.token);
    const a = await run();
    const b = await run();
    expect(a).toEqual(b);
  }, limit(120_000));
});
