// The decode step's graph against mlx-lm's, primitive by primitive: the TS op-by-op route (the one
// GPUs run) must build the same primitives, as many of each, as mlx-lm's generate_step `_step`
// (suites/gemma4/graph_ref.py counts them from mx.export_to_dot). The bits are proven elsewhere;
// this pins the cost: on a GPU every primitive is a kernel launch or a view, and the decode step
// is launch-bound there (bench/RESULTS-cuda.md), so an extra op is a measurable slowdown that the
// bit comparisons would not see.
import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { setDecodeCompile } from "../../model/gemma4/gemma4_text.ts";
import { withMutation } from "../../model/gemma4/mutations.ts";
import { loadGenerationModel } from "../../model/runtime.ts";
import { CKPT_ROOT } from "./run.ts";

// dense bf16, k_eq_v bf16, PLE + KV sharing (4-bit), E4B f32, MoE 4-bit (gather_qmm), sinks
const CKPTS = ["c1_dense/bf16", "c2_keqv/bf16", "c3_e2b/q4g32", "c4_e4b/f32", "c5_moe/q4g32", "c6_sink/q4g64"];
const PROMPT = Array.from({ length: 12 }, (_, i) => (i * 37 + 11) % 256);

const ref = (() => {
  const p = Bun.spawnSync([".venv/bin/python", "-I", "suites/gemma4/graph_ref.py"], {
    stdin: new TextEncoder().encode(JSON.stringify({ runs: CKPTS.map((c) => ({ checkpoint: join(CKPT_ROOT, c), prompt: PROMPT })) })),
  });
  if (p.exitCode !== 0) throw new Error(`graph_ref.py failed: ${p.stderr.toString().slice(-2000)}`);
  return (JSON.parse(p.stdout.toString()) as { runs: { primitives: Record<string, number> }[] }).runs;
})();

/** The prompt but its last token prefilled, one decode step evaluated, the next one's graph counted. */
function decodeGraph(ckpt: string): Record<string, number> {
  const { loaded, model } = loadGenerationModel(join(CKPT_ROOT, ckpt));
  const cache = model.makeCache();
  let index = 0;
  // generate_step's _step (model/generate.ts), greedy
  const step = (tokens: MlxArray): [MlxArray, MlxArray] => {
    using inp = mx.expandDims(tokens, 0);
    using all = model.forward(inp, cache, { kind: "step", index: index++ });
    const [B, L, V] = all.shape as [number, number, number];
    using last = mx.slice(all, [0, L - 1, 0], [B, L, V]);
    using logits = mx.squeeze(last, 1);
    using lse = mx.logsumexp(logits, null, true);
    using logprobs = mx.subtract(logits, lse);
    return [mx.argmax(logprobs, -1), mx.squeeze(logprobs, 0)];
  };
  try {
    {
      using inp = mx.array(Int32Array.from(PROMPT.slice(0, -1)), [1, PROMPT.length - 1], "int32");
      model.forward(inp, cache, { kind: "prefill", index: 0 }).dispose();
      const states = cache.flatMap((c) => c.state);
      mx.evaluate(states);
      for (const s of states) s.dispose();
    }
    using last = mx.array(Int32Array.from(PROMPT.slice(-1)), [1], "int32");
    const first = step(last);
    mx.evaluate(first);
    const second = step(first[0]);
    for (const a of first) a.dispose();
    const states = cache.flatMap((c) => c.state);
    try {
      return mx.graph.primitiveCounts([...second, ...states]);
    } finally {
      for (const a of [...second, ...states]) a.dispose();
    }
  } finally {
    for (const c of cache) c.dispose();
    loaded.model.dispose();
  }
}

const counted: string[] = [];
afterAll(() => console.log(`[graph parity] decode-step graphs equal to mlx-lm's, primitive by primitive: ${counted.join(", ")}`));

describe("decode-step graph = mlx-lm's (op-by-op route)", () => {
  CKPTS.forEach((ckpt, i) => {
    it(ckpt, () => {
      setDecodeCompile(false);
      try {
        const ours = decodeGraph(ckpt);
        const theirs = ref[i]!.primitives;
        const ops = [...new Set([...Object.keys(ours), ...Object.keys(theirs)])].sort();
        const diff = ops.filter((o) => ours[o] !== theirs[o]).map((o) => `${o}: TS ${ours[o] ?? 0}, mlx-lm ${theirs[o] ?? 0}`);
        expect(diff, `${ckpt}: primitives that differ in count`).toEqual([]);
        counted.push(`${ckpt} ${Object.values(ours).reduce((a, b) => a + b, 0)} nodes`);
      } finally {
        setDecodeCompile("auto");
      }
    });
  });

  it("fails on a model that builds other primitives (the gelu_cube_mul mutation: x*x*x for mlx-lm's compiled x**3)", () => {
    setDecodeCompile(false);
    try {
      const ours = withMutation("gelu_cube_mul", () => decodeGraph(CKPTS[0]!));
      expect(JSON.stringify(Object.entries(ours).sort())).not.toBe(JSON.stringify(Object.entries(ref[0]!.primitives).sort()));
    } finally {
      setDecodeCompile("auto");
    }
  });
});
