// Speculative ≡ greedy needs a matmul whose rows do not depend on how many rows are computed at
// once (the verify forward runs k+1 positions, greedy one). MLX's CPU backend gives that; its CUDA
// backend does not (measured on the H200: mlx-lm's own speculative run inside the window already
// differs from its greedy run at the first logprobs, max |d| ~2e-3, mlxlm_divergence.py; mlx-vlm's
// forward of a block differs from its verifier's on the dense model). There the relation cannot
// hold for any implementation: the suites assert parity with the oracles and print the distance.
import * as mx from "@mlx-bun/mlx";

export const ROWS_INVARIANT = mx.defaultDevice() === "cpu";
