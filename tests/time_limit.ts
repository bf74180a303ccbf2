// Time limits of the tests, in one place. A limit catches a hang; it never measures speed.
// On a GPU device MLX compiles each kernel variant the first time a process of the machine uses
// it (CUDA: NVRTC, kept in MLX_PTX_CACHE_DIR, else the temp folder), so a test's first run on a
// machine costs many times its CPU time. Measured on the H200 (suite in five lanes):
// c3_e2b/q4g32 × gen_P9_S8 took 71.7 s with cold kernels and 5.2 s with warm ones, and four
// tests passed their CPU limits. Limits are GPU_SCALE times longer on a GPU device.
import * as mx from "@mlx-bun/mlx";

const GPU_SCALE = 5;

/** `ms`, the limit a test needs on the CPU, for this process's device. */
export function limit(ms: number): number {
  return mx.defaultDevice() === "gpu" ? ms * GPU_SCALE : ms;
}
