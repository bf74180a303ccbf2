// A piece of a test on one MLX device, whatever device the test process runs on (MLX_DEVICE):
// facts of the CPU backend (its JIT's kernels, its f32-only gather_mm, bits pinned from Python on
// the CPU) are checked on the CPU device on every machine, a GPU's own behaviour on the GPU.
import * as mx from "@mlx-bun/mlx";

/** Runs `fn` (synchronous) with `device` as MLX's default device, then restores the previous one. */
export function onDevice<T>(device: mx.DeviceType, fn: () => T): T {
  const prev = mx.defaultDevice();
  mx.setDefaultDevice(device);
  try {
    return fn();
  } finally {
    mx.setDefaultDevice(prev);
  }
}
