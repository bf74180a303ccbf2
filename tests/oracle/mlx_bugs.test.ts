// oracle/mlx_bugs.ts: which fixture checkpoints have a layer on MLX's CUDA qmm_sm90 path (a
// quantized layer with one group per row), checked against what the H200 measured
// (bench/PARITY-cuda.md): every run that diverged there is on such a checkpoint; the quantized
// ones that stayed bit-exact with two or more groups per row, and the unquantized ones, are not.
// And the per-tap attribution (mlxBugAtTap) with the CUDA classification passed in: a first
// divergent tap is a recorded bug's only when an op on that bug's path produced it.
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { atMlxBug, divergentTapOf, halfAttentionForCudnn, hasOneGroupRows, kvLengthAt, mlxBugAtTap, mlxBugForGradient, mlxBugForOp, oneGroupMatmulOf, reachableMlxBug, scatterAddsGradients, takesQmmSm90 } from "../../oracle/mlx_bugs.ts";
import { loadModel } from "../../model/gemma4/weights.ts";
import { CASES } from "../../oracle/ops/cases.ts";
import { vjpCases } from "../../oracle/ops/vjp_runner.ts";

const ck = (id: string) => join(REPO_ROOT, ".cache", "checkpoints", id);

// diverged on the H200 at a QuantizedMatmul of K = 64, group 64
const DIVERGED = ["c5_moe/q4g32", "c6_sink/q4g32", "c2_keqv/q8g64", "c3_e2b/q8g64", "c5_moe/q8g64", "c4_e4b/q4g64", "c4_e4b/mixed", "c4_e4b/q4g64_kv", "m2_e2b/q4g64"];
// bit-exact there with no layer of one group per row
const CLEAN = ["c1_dense/f32", "c1_dense/bf16", "c5_moe/f32", "c1_dense/q4g32", "c1_dense/q4g32_f32", "m1_dense/bf16"];

describe("recorded MLX bugs", () => {
  it("every checkpoint that diverged on the H200 has a quantized layer of one group per row; the clean ones have none", () => {
    for (const id of DIVERGED) expect(hasOneGroupRows(ck(id)), id).toBe(true);
    for (const id of CLEAN) expect(hasOneGroupRows(ck(id)), id).toBe(false);
  });

  it("a checkpoint can meet the qmm_sm90 bug only on the CUDA backend's GPU device (reachableMlxBug: pools, never verdicts)", () => {
    const expected = mx.backend() === "cuda" && mx.defaultDevice() === "gpu" ? "cuda-qmm-sm90" : null;
    for (const id of DIVERGED) expect(reachableMlxBug(ck(id), 0, mx.backend() === "cuda" && mx.defaultDevice() === "gpu")?.id ?? null).toBe(expected);
    for (const id of DIVERGED) expect(reachableMlxBug(ck(id), 0, true)?.id, id).toBe("cuda-qmm-sm90");
    for (const id of CLEAN) expect(reachableMlxBug(ck(id), 0, true)).toBeNull();
  });

  it("attributes a first divergent tap to qmm_sm90 only when a one-group quantized matmul of more than one row produced it", () => {
    const e2b = ck("c3_e2b/q8g64");
    const at = (name: string, shape: number[], onCuda = true) => mlxBugAtTap(e2b, { name, dtype: "bfloat16", shape }, onCuda)?.id ?? null;
    const cases: [string, number[], string | null][] = [
      ["prefill0/layers.0/self_attn/q_proj", [1, 5, 64], "cuda-qmm-sm90"], // K = 64 = one group, 5 rows
      ["layers.2/mlp/down_proj", [2, 7, 64], "cuda-qmm-sm90"],
      ["step3/layers.0/self_attn/q_proj", [1, 1, 64], null], // one row: qmv, not qmm_sm90
      ["prefill0/lm_head", [1, 5, 256], "cuda-qmm-sm90"], // tied: embed_tokens.as_linear
      ["prefill0/embed_tokens", [1, 5, 64], null], // a lookup multiplies nothing
      ["prefill0/layers.0/input_layernorm", [1, 5, 64], null], // not a matmul
      ["prefill0/layers.0/self_attn/sdpa", [1, 4, 5, 16], null],
      ["prefill0/layers.0/output", [1, 5, 64], null],
    ];
    for (const [name, shape, want] of cases) expect(at(name, shape), name).toBe(want);
    expect(cases.length).toBe(8);
    expect(oneGroupMatmulOf(e2b, "layers.0/self_attn/q_proj")).toBe("model.layers.0.self_attn.q_proj");
    // off the CUDA GPU nothing is attributed
    expect(at("prefill0/layers.0/self_attn/q_proj", [1, 5, 64], false)).toBeNull();
    // two groups per row (c1_dense/q4g32: K = 64, group 32) take another kernel
    expect(mlxBugAtTap(ck("c1_dense/q4g32"), { name: "prefill0/layers.0/self_attn/q_proj", dtype: "bfloat16", shape: [1, 5, 64] }, true)).toBeNull();
    // the wrapper layout's text keys (language_model.model.…) and its towers' (embed_audio.…)
    expect(oneGroupMatmulOf(ck("m2_e2b/q4g64"), "layers.0/mlp/up_proj")).toBe("language_model.model.layers.0.mlp.up_proj");
    expect(oneGroupMatmulOf(ck("m2_e2b/q4g64"), "embed_audio/embedding_projection")).toBe("embed_audio.embedding_projection");
    // QuantizedSwitchLinear: (B, L, K, 1, I) rows are the B·L tokens
    const moe = ck("c5_moe/q8g64");
    expect(mlxBugAtTap(moe, { name: "prefill0/layers.1/experts/switch_glu/up_proj", dtype: "bfloat16", shape: [1, 5, 2, 1, 64] }, true)?.id).toBe("cuda-qmm-sm90");
    expect(mlxBugAtTap(moe, { name: "step2/layers.1/experts/switch_glu/up_proj", dtype: "bfloat16", shape: [1, 1, 2, 1, 64] }, true)).toBeNull();
  });

  it("the suites' note names the bug and the tap only for a tap on its path; a structural first difference is nobody's bug", () => {
    const cuda = mx.backend() === "cuda" && mx.defaultDevice() === "gpu";
    const onPath = { name: "prefill0/layers.0/self_attn/q_proj", dtype: "bfloat16", shape: [1, 5, 64] };
    expect(atMlxBug(ck(DIVERGED[2]!), "diverges at x", onPath)).toBe(cuda ? "diverges at x (MLX bug cuda-qmm-sm90 at the first divergent tap prefill0/layers.0/self_attn/q_proj, bench/cuda/repro_qmm.py)" : null);
    expect(atMlxBug(ck(DIVERGED[2]!), "diverges at x", { ...onPath, name: "prefill0/layers.0/input_layernorm" })).toBeNull();
    expect(atMlxBug(ck(DIVERGED[2]!), "diverges at x", null)).toBeNull();
    expect(divergentTapOf({ name: "x", reason: "dtype/shape", diff: { dtype: "float32", shape: [1] } })).toBeNull();
    expect(divergentTapOf({ name: "x", reason: "value", diff: { dtype: "float32", shape: [1, 2] } })).toEqual({ name: "x", dtype: "float32", shape: [1, 2], kvLength: undefined });
  });

  it("names the op cases that take the qmm_sm90 path: the 18 of K = group 64 with 5 and 36 rows", () => {
    const sm90 = CASES.filter(takesQmmSm90);
    const k64 = sm90.filter((c) => "shape" in c.inputs[0]! && c.inputs[0].shape.at(-1) === 64);
    expect(k64.length).toBe(18);
    for (const c of sm90) expect(c.params.group_size ?? 64, c.id).toBeGreaterThanOrEqual(("shape" in c.inputs[0]! ? c.inputs[0].shape.at(-1) : 0)!);
    // one row of x takes qmv; a group smaller than K another kernel
    expect(sm90.some((c) => "shape" in c.inputs[0]! && c.inputs[0].shape.slice(0, -1).reduce((a, b) => a * b, 1) === 1)).toBe(false);
    const expected = mx.backend() === "cuda" && mx.defaultDevice() === "gpu";
    for (const c of CASES) expect(mlxBugForOp(c) !== null, c.id).toBe(expected && takesQmmSm90(c));
  });

  it("names the gradient cases that meet an MLX bug: transposed-back products on qmm_sm90, the scatter-add of unsorted gather products and of cummax/cummin", () => {
    const grads = vjpCases();
    // as measured on the H200: the x gradient of a transpose=False product whose w rows are one group
    const back = grads.filter((c) => takesQmmSm90(c) && c.params.transpose === false);
    expect(back.map((c) => c.id).sort()).toEqual(CASES.filter((c) => c.op === "quantizedMatmul" && c.params.transpose === false && c.params.bits === undefined && "shape" in c.inputs[1]! && c.inputs[1].shape.at(-1) === 8).map((c) => c.id).sort());
    expect(back.length).toBeGreaterThan(0);
    for (const c of back) expect(CASES.find((f) => f.id === c.id)!.params._vjp, "forward cases never take it this way").toBeUndefined();
    const scatter = grads.filter(scatterAddsGradients);
    expect(scatter.length).toBeGreaterThan(0);
    for (const c of scatter) expect(["gatherMm", "gatherQmm", "cummax", "cummin"]).toContain(c.op);
    // measured on the H200: cummin float16 [2,3,7] reverse exclusive, 1 of 84 bytes differing
    expect(scatter.some((c) => c.op === "cummin" && c.params.reverse === true && c.params.inclusive === false)).toBe(true);
    expect(grads.some((c) => c.op === "gatherMm" && c.params.sorted_indices === true && scatterAddsGradients(c))).toBe(false);
    expect(CASES.some(scatterAddsGradients), "forward gather products do not scatter").toBe(false);
    const cuda = mx.backend() === "cuda" && mx.defaultDevice() === "gpu";
    for (const c of grads) expect(mlxBugForOp(c)?.id ?? null, c.id).toBe(!cuda ? null : takesQmmSm90(c) ? "cuda-qmm-sm90" : scatterAddsGradients(c) ? "cuda-scatter-add-order" : null);
  });

  it("names the model gradients the scatter-add order reaches: the experts' weights of c5_moe below 64 routes, on CUDA", () => {
    const { model } = loadModel(ck("c5_moe/f32"));
    try {
      const paths = [...model.parameters().keys()];
      const cuda = mx.backend() === "cuda" && mx.defaultDevice() === "gpu";
      // measured on the H200: 18 of the 138 gradients differ at 28 routes (2 × 7 tokens, top-2)
      expect(paths.length).toBe(138);
      const named = paths.filter((p) => /\.switch_glu\.(gate|up|down)_proj\.weight$/.test(p));
      expect(named.length).toBe(18);
      for (const p of paths) expect(mlxBugForGradient(p, 28)?.id ?? null, p).toBe(cuda && named.includes(p) ? "cuda-scatter-add-order" : null);
      // sorted from 64 routes (mlx-lm's SwitchGLU): not covered
      for (const p of named) expect(mlxBugForGradient(p, 64), p).toBeNull();
    } finally {
      model.dispose();
    }
  });

  // diverged on the H200 at a decode step's sdpa (gen_P300_S128), bit-exact with MLX_CUDA_USE_CUDNN_SDPA=0
  const SDPA_DIVERGED = ["c1_dense/bf16", "c2_keqv/bf16", "c3_e2b/bf16"];
  it("the one-row attention kernel choice is named for half-precision checkpoints with cuDNN's head dims, on CUDA, from 256 keys", () => {
    for (const id of [...SDPA_DIVERGED, "c3_e2b/f16", "c1_dense/q4g32"]) expect(halfAttentionForCudnn(ck(id)), id).toBe(true);
    for (const id of ["c1_dense/f32", "c1_dense/q4g32_f32", "c5_moe/f32"]) expect(halfAttentionForCudnn(ck(id)), id).toBe(false);
    const cudnn = process.env.MLX_CUDA_USE_CUDNN_SDPA !== "0";
    for (const id of SDPA_DIVERGED) {
      expect(reachableMlxBug(ck(id), 428, true)?.id ?? null, id).toBe(cudnn ? "cuda-sdpa-decode-kernel" : null);
      expect(reachableMlxBug(ck(id), 255, true), id).toBeNull();
      expect(reachableMlxBug(ck(id), 428, false), id).toBeNull();
    }
    expect(reachableMlxBug(ck("c1_dense/f32"), 428, true)).toBeNull();
  });

  it("attributes a first divergent tap to the attention kernel choice only at a decode step's half-precision sdpa of a cuDNN head dim over at least 256 keys", () => {
    const dir = ck("c1_dense/bf16");
    const sdpa = { name: "step40/layers.1/self_attn/sdpa", dtype: "bfloat16", shape: [1, 4, 1, 64], kvLength: 339 };
    const want = process.env.MLX_CUDA_USE_CUDNN_SDPA !== "0" ? "cuda-sdpa-decode-kernel" : null;
    expect(mlxBugAtTap(dir, sdpa, true)?.id ?? null).toBe(want);
    expect(mlxBugAtTap(dir, sdpa, false)).toBeNull();
    expect(mlxBugAtTap(dir, { ...sdpa, kvLength: 255 }, true)).toBeNull();
    expect(mlxBugAtTap(dir, { ...sdpa, kvLength: undefined }, true)).toBeNull();
    expect(mlxBugAtTap(dir, { ...sdpa, dtype: "float32" }, true)).toBeNull();
    expect(mlxBugAtTap(dir, { ...sdpa, shape: [1, 4, 1, 256] }, true)).toBeNull(); // Gemma 4's real head dims never take cuDNN
    expect(mlxBugAtTap(dir, { ...sdpa, name: "prefill0/layers.1/self_attn/sdpa", shape: [1, 4, 300, 64] }, true)).toBeNull();
    expect(mlxBugAtTap(dir, { ...sdpa, name: "step40/layers.1/self_attn/o_proj", shape: [1, 1, 64] }, true)).toBeNull();
    // the keys come from the oracle's meta: the sdpa tap names its keys' tap in the same call
    const theirs = [
      { name: "step40/layers.0/self_attn/cache_keys", shape: [1, 1, 339, 64] },
      { name: "step40/layers.1/self_attn/sdpa", shape: [1, 4, 1, 64], meta: { k: "layers.0/self_attn/cache_keys" } },
    ];
    expect(kvLengthAt("step40/layers.1/self_attn/sdpa", theirs)).toBe(339);
    expect(kvLengthAt("step40/layers.1/self_attn/o_proj", theirs)).toBeUndefined();
  });
});
