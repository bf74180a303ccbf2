// oracle/mlx_bugs.ts: which fixture checkpoints meet MLX's CUDA qmm_sm90 path (a quantized layer
// with one group per row), checked against what the H200 measured (bench/PARITY-cuda.md): every
// run that diverged there is on such a checkpoint; the quantized ones that stayed bit-exact with
// two or more groups per row, and the unquantized ones, are not.
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { atMlxBug, halfAttentionForCudnn, hasOneGroupRows, mlxBugFor, mlxBugForGradient, mlxBugForOp, scatterAddsGradients, takesQmmSm90 } from "../../oracle/mlx_bugs.ts";
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

  it("the qmm_sm90 bug is named only on the CUDA backend's GPU device", () => {
    const expected = mx.backend() === "cuda" && mx.defaultDevice() === "gpu" ? "cuda-qmm-sm90" : null;
    for (const id of DIVERGED) expect(mlxBugFor(ck(id))?.id ?? null).toBe(expected);
    for (const id of CLEAN) expect(mlxBugFor(ck(id))).toBeNull();
    // the suites' note for a run counted apart, null where the divergence is a failure
    expect(atMlxBug(ck(DIVERGED[0]!), "diverges at x")).toBe(expected ? "diverges at x (MLX bug cuda-qmm-sm90, bench/cuda/repro_qmm.py)" : null);
    expect(atMlxBug(ck(CLEAN[0]!), "diverges at x")).toBeNull();
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
    const cuda = mx.backend() === "cuda" && mx.defaultDevice() === "gpu" && process.env.MLX_CUDA_USE_CUDNN_SDPA !== "0";
    for (const id of SDPA_DIVERGED) {
      expect(mlxBugFor(ck(id), 428)?.id ?? null, id).toBe(cuda ? "cuda-sdpa-decode-kernel" : null);
      expect(mlxBugFor(ck(id), 255), id).toBeNull();
    }
    expect(mlxBugFor(ck("c1_dense/f32"), 428)).toBeNull();
  });
});
