// Relations between two runs that compute the same rows in forwards of other shapes need a matmul
// whose rows do not depend on how many rows are computed at once: speculative ≡ greedy (the verify
// forward runs k+1 positions, greedy one); a batch of one ≡ generate_step, and removing a finished
// sequence leaves the others' bits unchanged (suites/batch/generation-properties.test.ts). MLX's
// CPU backend gives that; its CUDA backend does not (measured on the H200: mlx-lm's own
// speculative run inside the window already differs from its greedy run at the first logprobs,
// max |d| ~2e-3, mlxlm_divergence.py; mlx-vlm's forward of a block differs from its verifier's on
// the dense model; mlx-lm's own BatchGenerator runs with and without a removal differ for the
// others; 4 of 200 random batches of one differ from generate_step).
// There the relations cannot hold for any implementation: the suites assert parity with the
// oracles and print the distance, or require TS's verdict on each case to be the oracle's.
import * as mx from "@mlx-bun/mlx";

export const ROWS_INVARIANT = mx.defaultDevice() === "cpu";
