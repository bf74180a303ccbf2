// Differences that are MLX's own, each proven by a Python-only reproducer, and the checkpoints
// they reach. A parity run that diverges on such a checkpoint, on the backend where the bug
// lives, is reported as diverging at that bug (counted apart, with the reproducer named), never
// as bit-exact; every other divergence stays a failure. No tolerance is involved: the taps are
// still compared bit for bit and shown.
import * as mx from "@mlx-bun/mlx";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { checkSafetensors } from "../model/gemma4/weights.ts";

export interface MlxBug {
  id: string;
  what: string;
  reproducer: string;
}

/**
 * MLX 0.32.4's CUDA `QuantizedMatmul` takes the CUTLASS `qmm_sm90` kernel on compute capability 9
 * when a quantized layer has one group per row (K = group size, 64 or 128), bits 4 or 8, affine,
 * and x has more than one row (prefill). Measured on the H200 with bench/cuda/repro_qmm.py: the
 * same inputs give other outputs after the allocator's free blocks were filled with junk (up to
 * 3.7e19 apart), outputs change when junk follows any operand in memory, and they are far from
 * the CPU's (max |d| 23 against 0.3 for the same layer with K = 2 groups, which takes another
 * kernel and is stable). The fixtures' hidden size is 64: their g64 layers take that path.
 */
const QMM_SM90: MlxBug = {
  id: "cuda-qmm-sm90",
  what: "MLX's CUDA qmm_sm90 kernel (a quantized layer with K = group size, prefill rows > 1) reads memory it does not own: its result depends on the process's allocator state",
  reproducer: "bench/cuda/repro_qmm.py",
};

/** `.scales` tensors with one group per row (their last dimension is 1), from the safetensors headers. */
export function hasOneGroupRows(dir: string): boolean {
  if (!existsSync(dir)) return false;
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".safetensors"))) {
    const h = checkSafetensors(join(dir, f));
    for (const [k, v] of Object.entries(h)) {
      // affine (biases beside the scales), one group per row
      if (k.endsWith(".scales") && v.shape.at(-1) === 1 && `${k.slice(0, -".scales".length)}.biases` in h) return true;
    }
  }
  return false;
}

const onCudaGpu = () => mx.backend() === "cuda" && mx.defaultDevice() === "gpu";

/** The recorded MLX bug a run on this checkpoint can meet on the current backend, if any. */
export function mlxBugFor(dir: string): MlxBug | null {
  if (onCudaGpu() && hasOneGroupRows(dir)) return QMM_SM90;
  return null;
}

/** What an op parity case is, as far as the predicates below need it (oracle/ops/cases.ts). */
export interface OpCaseShape {
  oracle: string;
  inputs: readonly ({ shape: number[] } | { scalar: number })[];
  params: Record<string, unknown>;
}

/**
 * A `quantized_matmul` case on the path MLX's CUDA QuantizedMatmul sends to qmm_sm90 on compute
 * capability 9 (mlx/backend/cuda/quantized/qmm/qmm.cu: affine with biases, bits 4 or 8,
 * transposed, K a multiple of 64 and group_size >= K; more than one row of x, since one row
 * takes qmv).
 */
export function takesQmmSm90(c: OpCaseShape): boolean {
  const x = c.inputs[0];
  if (c.oracle !== "quantized_matmul" || !x || !("shape" in x)) return false;
  const k = x.shape.at(-1)!;
  const rows = x.shape.slice(0, -1).reduce((a, b) => a * b, 1);
  const p = c.params;
  return p.mode === "affine" && p.has_biases === true && p.transpose === true && (p.bits === 4 || p.bits === 8) && k % 64 === 0 && ((p.group_size as number | undefined) ?? 64) >= k && rows > 1;
}

/** The recorded MLX bug an op case meets on the current backend, if any. */
export function mlxBugForOp(c: OpCaseShape): MlxBug | null {
  return onCudaGpu() && takesQmmSm90(c) ? QMM_SM90 : null;
}
