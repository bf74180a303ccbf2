// A checkpoint tensor with its provenance, so every load error can name the file and the key.
import type { MlxArray } from "@mlx-bun/mlx";

export interface Tensor {
  array: MlxArray;
  /** The .safetensors file it came from. */
  file: string;
  /** Its key in that file (before sanitize renamed it). */
  key: string;
}
