// The binding's custom-kernel primitive (mlx/src/kernels.ts: mx.fast.metal_kernel / cuda_kernel),
// which mlx-vlm's TurboQuant runs its codecs through on macOS.
//
// Compared:
// - metal_kernel without a Metal back-end (Linux): building the kernel succeeds and calling it
//   fails through the binding's one error path (MlxError) with exactly the message Python's
//   mx.fast.metal_kernel gives on this machine, measured live from the oracle's venv (same pinned
//   MLX). With Metal (macOS) the same kernel runs instead and must equal x * 2 bit for bit.
// - cuda_kernel: where MLX's CUDA back-end is in use (MLX_BACKEND=cuda, a GPU), a kernel that
//   doubles its input must equal mx.multiply(x, 2) bit for bit; elsewhere its call must fail with
//   Python's own message, as above.
// - On a CUDA GPU also a kernel with template arguments (dtype, int, bool), init_value and two
//   outputs: the same outputs as Python's call, bit for bit.
// - Bad arguments: one MlxError each, no abort.
import { describe, expect, test } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { backend, isAvailable } from "../../mlx/src/device.ts";
import { DEFAULT_PYTHON } from "../../oracle/client.ts";

const PY_PROBE = `
import json, mlx.core as mx
out = {}
for kind in ("metal", "cuda"):
    make = getattr(mx.fast, kind + "_kernel")
    try:
        k = make(name="double_it", input_names=["a"], output_names=["out"], source=SRC[kind])
    except Exception as e:
        out[kind] = {"error": str(e), "at": "build"}
        continue
    try:
        r = k(inputs=[mx.array([1.0, 2.0, 3.0, 4.0])], grid=(4, 1, 1), threadgroup=(4, 1, 1),
              output_shapes=[(4,)], output_dtypes=[mx.float32])
        mx.eval(r)
        out[kind] = {"ok": [float(v) for v in r[0].tolist()]}
    except Exception as e:
        out[kind] = {"error": str(e), "at": "call"}
print(json.dumps(out))
`;

const SOURCES = {
  metal: "uint elem = thread_position_in_grid.x; out[elem] = a[elem] * 2.0f;",
  cuda: "auto elem = blockIdx.x * blockDim.x + threadIdx.x; out[elem] = a[elem] * 2.0f;",
};

type Outcome = { ok?: number[]; error?: string; at?: "build" | "call" };

function pythonOutcome(): Record<"metal" | "cuda", Outcome> {
  const script = `SRC = ${JSON.stringify(SOURCES)}\n${PY_PROBE}`;
  const r = Bun.spawnSync([DEFAULT_PYTHON, "-c", script], { stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`the Python probe failed: ${r.stderr.toString()}`);
  return JSON.parse(r.stdout.toString());
}

function errorOf(e: unknown, kind: "metal" | "cuda", at: "build" | "call"): Outcome {
  if (!(e instanceof mx.MlxError)) throw e;
  expect(e.op).toBe(kind === "metal" ? "fast.metal_kernel" : "fast.cuda_kernel");
  return { error: e.detail, at };
}

/** Python's outcome, reproduced: MLX raises at build (cuda_kernel without CUDA) or at call (metal_kernel without Metal). */
function runDouble(kind: "metal" | "cuda"): Outcome {
  let built: mx.fast.CustomKernel;
  try {
    built = kind === "metal"
      ? mx.fast.metalKernel({ name: "double_it", inputNames: ["a"], outputNames: ["out"], source: SOURCES.metal })
      : mx.fast.cudaKernel({ name: "double_it", inputNames: ["a"], outputNames: ["out"], source: SOURCES.cuda });
  } catch (e) {
    return errorOf(e, kind, "build");
  }
  using k = built;
  using x = mx.array([1, 2, 3, 4], [4], "float32");
  try {
    const [o, ...rest] = k.call({ inputs: [x], grid: [4, 1, 1], threadgroup: [4, 1, 1], outputShapes: [[4]], outputDtypes: ["float32"] });
    for (const r of rest) r.dispose();
    using out = o!;
    using want = mx.multiply(x, 2);
    mx.evaluate([out, want]);
    expect(Array.from(out.toTypedArray() as Float32Array)).toEqual(Array.from(want.toTypedArray() as Float32Array));
    return { ok: Array.from(out.toTypedArray() as Float32Array) };
  } catch (e) {
    return errorOf(e, kind, "call");
  }
}

describe("mx.fast custom kernels through the binding", () => {
  const py = pythonOutcome();
  const gpuBackend = backend();

  test("metal_kernel: the same outcome as Python's mx.fast.metal_kernel on this machine", () => {
    const ts = runDouble("metal");
    expect(ts).toEqual(py.metal);
    if (gpuBackend !== "metal") expect(ts.error).toBe("[metal_kernel] No Metal back-end.");
  });

  test("cuda_kernel: the same outcome as Python's mx.fast.cuda_kernel on this machine", () => {
    const ts = runDouble("cuda");
    expect(ts).toEqual(py.cuda);
    if (gpuBackend !== "cuda") expect(ts.error).toBe("[cuda_kernel] No CUDA back-end.");
  });

  // Runs only where MLX's CUDA back-end drives a GPU; on a CPU-only build the test above proves
  // the error path instead (skip reason: no CUDA back-end in this MLX build / no GPU).
  test.skipIf(!(gpuBackend === "cuda" && isAvailable("gpu")))("cuda_kernel on the GPU: doubles its input bit for bit", () => {
    expect(runDouble("cuda").ok).toEqual([2, 4, 6, 8]);
  });

  // Template arguments (a dtype, an int, a bool), init_value and two outputs, on the GPU: the same
  // outputs as Python's call of the same kernel (skip reason as above).
  test.skipIf(!(gpuBackend === "cuda" && isAvailable("gpu")))("cuda_kernel with template arguments, init_value and two outputs: Python's outputs bit for bit", () => {
    const src = "auto elem = blockIdx.x * blockDim.x + threadIdx.x; if (elem < N) { T x = a[elem]; out0[elem] = DOUBLE ? x * static_cast<T>(2) : x; if (elem < 2) out1[elem] = x + static_cast<T>(1); }";
    const script = `
import json, mlx.core as mx
k = mx.fast.cuda_kernel(name="templated", input_names=["a"], output_names=["out0", "out1"], source=${JSON.stringify(src)})
o = k(inputs=[mx.array([1.5, -2.0, 3.25, 4.0], dtype=mx.float16)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
      output_shapes=[(4,), (4,)], output_dtypes=[mx.float16, mx.float16],
      template=[("T", mx.float16), ("N", 3), ("DOUBLE", True)], init_value=7.0)
print(json.dumps([[float(v) for v in x.tolist()] for x in o]))
`;
    const r = Bun.spawnSync([DEFAULT_PYTHON, "-c", script], { stdout: "pipe", stderr: "pipe" });
    expect(r.exitCode).toBe(0);
    const want = JSON.parse(r.stdout.toString()) as number[][];
    using k = mx.fast.cudaKernel({ name: "templated", inputNames: ["a"], outputNames: ["out0", "out1"], source: src });
    using x = mx.array([1.5, -2.0, 3.25, 4.0], [4], "float16");
    const outs = k.call({ inputs: [x], grid: [4, 1, 1], threadgroup: [4, 1, 1], outputShapes: [[4], [4]], outputDtypes: ["float16", "float16"], template: [["T", "float16"], ["N", 3], ["DOUBLE", true]], initValue: 7 });
    try {
      expect(outs.map((o) => o.toNumbers())).toEqual(want);
      expect(want).toEqual([[3, -4, 6.5, 7], [2.5, -1, 7, 7]]);
    } finally {
      for (const o of outs) o.dispose();
    }
  });

  test("bad arguments: one MlxError each", () => {
    using k = mx.fast.metalKernel({ name: "k", inputNames: ["a"], outputNames: ["out"], source: SOURCES.metal });
    using x = mx.array([1], [1], "float32");
    const base = { inputs: [x], grid: [1, 1, 1] as const, threadgroup: [1, 1, 1] as const, outputShapes: [[1]], outputDtypes: ["float32" as const] };
    const cases: [string, () => unknown][] = [
      ["grid of two", () => k.call({ ...base, grid: [1, 1] as unknown as [number, number, number] })],
      ["shapes/dtypes count", () => k.call({ ...base, outputDtypes: [] })],
      ["negative dim", () => k.call({ ...base, outputShapes: [[-1]] })],
      ["fractional template int", () => k.call({ ...base, template: [["N", 1.5]] })],
      ["NUL in a name", () => mx.fast.metalKernel({ name: "k", inputNames: ["a\0b"], outputNames: ["o"], source: "" })],
      ["negative shared memory", () => mx.fast.cudaKernel({ name: "k", inputNames: ["a"], outputNames: ["o"], source: "", sharedMemory: -1 })],
    ];
    let ran = 0;
    for (const [, f] of cases) {
      expect(f).toThrow(mx.MlxError);
      ran++;
    }
    expect(ran).toBe(6);
    k.dispose();
    expect(() => k.call(base)).toThrow("the kernel was disposed");
  });
});
