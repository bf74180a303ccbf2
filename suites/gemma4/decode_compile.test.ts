// The compiled decode route (DecoderLayer.decodeCompiled) against the op-by-op route of the same
// model, without the oracle: every decode step's logits and the final caches must be the same
// bytes, the route must really be taken (every layer traced its closures), and disposing the
// model must release them. The oracle comparison of this route is the generation parity suite
// (it runs with the default route: compiled on the CPU device).
//
// On a GPU device the route is off by default: on CUDA this check failed on 7 of 7 fixtures
// (bench/PARITY-cuda.md), since NVRTC contracts a multiply feeding an add inside a fused kernel
// (bench/cuda/repro_compile.py). GEMMA4_DECODE_COMPILE=1 runs it there, to measure again.
import { describe, expect, it } from "vitest";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { sharedOracle } from "../../oracle/client.ts";
import { loadModel } from "../../model/gemma4/index.ts";
import { setDecodeCompile } from "../../model/gemma4/gemma4_text.ts";
import { cacheFactory, CKPT_ROOT } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

// Every fixture feature on the decode path: dense bf16, k_eq_v bf16, PLE + KV sharing (4-bit),
// E4B f32, MoE (f32 and 4-bit, so the router scale input and gather_qmm), attention sinks.
const CKPTS = ["c1_dense/bf16", "c2_keqv/bf16", "c3_e2b/q4g32", "c4_e4b/f32", "c5_moe/f32", "c5_moe/q4g32", "c6_sink/q4g64"];
await (await sharedOracle()).request("make_checkpoints", { only: CKPTS }, limit(600_000));

interface Run {
  logits: Buffer[];
  state: Buffer[];
}

/** A 12-token prefill, then 20 greedy decode steps (past the fixtures' sliding windows). */
function decode(model: ReturnType<typeof loadModel>["model"], compiled: boolean): Run {
  setDecodeCompile(compiled);
  const caches = model.makeCache(cacheFactory);
  const logits: Buffer[] = [];
  try {
    let y = mx.array(Array.from({ length: 12 }, (_, i) => (i * 37 + 11) % 256), [1, 12], "int32");
    for (let step = 0; step <= 20; step++) {
      const l = model.call(y, { cache: caches });
      y.dispose();
      const L = l.shape[1]!;
      using last = mx.slice(l, [0, L - 1, 0], [1, L, l.shape[2]!]);
      l.dispose();
      y = mx.reshape(mx.argmax(last, -1), [1, 1]);
      logits.push(Buffer.from(last.toBytes()));
    }
    y.dispose();
    const st = caches.flatMap((c) => c.state);
    const state = st.map((a) => Buffer.from(a.toBytes()));
    for (const a of st) a.dispose();
    return { logits, state };
  } finally {
    for (const c of caches) c.dispose();
    setDecodeCompile("auto");
  }
}

const onGpuUnforced = mx.defaultDevice() === "gpu" && process.env.GEMMA4_DECODE_COMPILE !== "1";

describe.skipIf(onGpuUnforced)("compiled decode steps equal the op-by-op route (off on GPU devices: see above)", () => {
  for (const ckpt of CKPTS) {
    it(ckpt, () => {
      const { model } = loadModel(join(CKPT_ROOT, ckpt));
      const plain = decode(model, false);
      expect(model.layers.some((l) => l.decodeTraced)).toBe(false);
      const compiled = decode(model, true);
      expect(model.layers.every((l) => l.decodeTraced)).toBe(true);
      const again = decode(model, true); // replayed closures, not a fresh trace
      for (const run of [compiled, again]) {
        for (let i = 0; i < plain.logits.length; i++) {
          if (!run.logits[i]!.equals(plain.logits[i]!)) throw new Error(`${ckpt}: call ${i} logits differ between the compiled and the op-by-op decode`);
        }
        expect(run.state.length).toBe(plain.state.length);
        run.state.forEach((b, i) => expect(b.equals(plain.state[i]!), `${ckpt}: cache state ${i}`).toBe(true));
      }
      const live = mx.liveHandles();
      model.dispose();
      expect(mx.liveHandles()).toBeLessThan(live);
    }, limit(300_000));
  }
});
