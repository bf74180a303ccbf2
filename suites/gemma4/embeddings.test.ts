// The embeddings-only path (model(None, input_embeddings=e)): the per-layer inputs come from a
// reverse lookup of the token ids (_complete_square + argmin) instead of the ids. Logits must be
// byte-identical to mlx-lm's for the PLE fixtures (float, unquantized: with a quantized
// embedding mlx-lm's lookup reads the packed weight, a latent upstream bug not worth mirroring
// in a test). Also: without a tap sink the forward evaluates and copies nothing.

import { afterAll, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { lib } from "../../mlx/src/native.ts";
import { DEFAULT_PYTHON, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { parseNpy, toNpy } from "../../oracle/npy.ts";
import { gemma4_text, loadModel } from "../../model/gemma4/index.ts";
import { compareRaw, formatDiff } from "../../oracle/compare.ts";
import { CKPT_ROOT } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "gemma4-emb-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const oracle = await sharedOracle();
await oracle.request("make_checkpoints", { only: ["c3_e2b/f32", "c3_e2b/bf16", "c4_e4b/f32", "c6_sink/f32", "c1_dense/f32"] }, limit(600_000));

const TOKENS = [
  [92, 35, 201, 117, 109, 58, 233, 71, 198, 75, 117, 114, 158],
  [85, 73, 70, 119, 23, 255, 187, 96, 215, 183, 245, 126, 85],
];

const EMB_CKPTS = ["c3_e2b/f32", "c3_e2b/bf16", "c4_e4b/f32", "c6_sink/f32"];

/** e = embed rows * 1.01 (not exactly a row: the argmin has to find the nearest one), as raw bytes. */
function embeddings(ckpt: string): { dtype: string; shape: number[]; data: Uint8Array } {
  const { text } = loadModel(join(CKPT_ROOT, ckpt));
  try {
    using ids = mx.array(TOKENS.flat(), [2, 13], "int32");
    using rows = text.model.embed_tokens.call(ids);
    using e = mx.multiply(rows, 1.01);
    return { dtype: e.dtype, shape: e.shape, data: e.toBytes() };
  } finally {
    text.dispose();
  }
}

// One Python process computes every reference (mlx-lm's import dominates its run time).
const jobs = EMB_CKPTS.map((ckpt) => {
  const tag = ckpt.replace("/", "_");
  const e = embeddings(ckpt);
  const job = { ckpt: join(CKPT_ROOT, ckpt), in: join(tmp, `${tag}-in.npy`), dtype: e.dtype, out: join(tmp, `${tag}-out.npy`) };
  writeFileSync(job.in, toNpy({ dtype: e.dtype as "float32", shape: e.shape, data: e.data }));
  return { name: ckpt, e, job };
});
const ref = Bun.spawnSync([DEFAULT_PYTHON, "-I", join(REPO_ROOT, "suites/gemma4/embeddings_ref.py")], {
  stdin: new TextEncoder().encode(JSON.stringify(jobs.map((j) => j.job))),
  cwd: "/",
});

describe("embeddings-only path vs mlx-lm", () => {
  for (const { name, e, job } of jobs) {
    it(name, () => {
      if (ref.exitCode !== 0) throw new Error(`embeddings_ref.py failed: ${ref.stderr.toString()}`);
      const want = parseNpy(new Uint8Array(readFileSync(job.out)), e.dtype);
      const { model } = loadModel(join(CKPT_ROOT, name));
      try {
        using ein = mx.fromBytes(e.data, e.shape, e.dtype as mx.Dtype);
        using logits = model.call(null, { input_embeddings: ein });
        const d = compareRaw("logits", { dtype: logits.dtype, shape: logits.shape, data: logits.toBytes() }, want);
        if (!d.equal) throw new Error(formatDiff(d));
        expect(d.equal).toBe(true);
      } finally {
        model.dispose();
      }
    }, limit(60_000));
  }
});

describe("taps cost nothing without a sink", () => {
  it("a forward without taps evaluates and copies nothing (lazy graph only)", () => {
    const { model } = loadModel(join(CKPT_ROOT, "c3_e2b/f32"));
    const counts = { eval: 0, copy: 0 };
    const L = lib as unknown as Record<string, (...a: unknown[]) => unknown>;
    const orig = { eval: L.mlxb_eval!, async: L.mlxb_async_eval!, copy: L.mlxb_copy_out! };
    L.mlxb_eval = (...a) => (counts.eval++, orig.eval(...a));
    L.mlxb_async_eval = (...a) => (counts.eval++, orig.async(...a));
    L.mlxb_copy_out = (...a) => (counts.copy++, orig.copy(...a));
    try {
      using x = mx.array(TOKENS.flat(), [2, 13], "int32");
      using l1 = model.call(x);
      expect(counts).toEqual({ eval: 0, copy: 0 });
      // a sink that keeps nothing adds nothing either
      let seen = 0;
      using l2 = model.call(x, { taps: () => void seen++ });
      expect(counts).toEqual({ eval: 0, copy: 0 });
      expect(seen).toBeGreaterThan(200);
      mx.evaluate(l1, l2);
      expect(Buffer.compare(Buffer.from(l1.toBytes()), Buffer.from(l2.toBytes()))).toBe(0);
    } finally {
      L.mlxb_eval = orig.eval;
      L.mlxb_async_eval = orig.async;
      L.mlxb_copy_out = orig.copy;
      model.dispose();
    }
  });

  it("the text model class is the one the loader builds", () => {
    const { text } = loadModel(join(CKPT_ROOT, "c1_dense/f32"));
    expect(text).toBeInstanceOf(gemma4_text.Model);
    text.dispose();
  });
});
