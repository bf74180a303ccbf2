#!/usr/bin/env python
"""Python-only check of MLX's quantized matmul on the GPU: is its result a function of its inputs?

For each (bits, group_size, K, N, M) it computes mx.quantized_matmul on the GPU twice, once on a
fresh allocator and once after filling and freeing scratch memory with large values, and on the
CPU. A configuration whose two GPU results differ reads memory it does not own (its result
depends on what was there before); one whose GPU result is far from the CPU's computes something
else. The first rows are the router projection of the c5_moe/q4g32 fixture (8-bit g64, K=64, N=8).

    MLX_DEVICE=gpu python -I bench/cuda/repro_qmm.py [--checkpoint .cache/checkpoints/c5_moe/q4g32]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
import numpy as np


# (without a GPU the script still runs, CPU against CPU, to check itself)
GPU = mx.gpu if mx.is_available(mx.gpu) else mx.cpu


def scribble() -> None:
    """Leave the allocator's free blocks full of large values."""
    junk = [mx.full((1 << 16,), 3.0e4, dtype=mx.bfloat16) for _ in range(64)]
    mx.eval(junk)
    del junk


def qmm(x, w, s, b, gs, bits, dev):
    with mx.stream(dev):
        y = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)
        mx.eval(y)
        return np.array(y.astype(mx.float32))


def case(x, w, s, b, gs, bits) -> dict:
    mx.clear_cache()
    g1 = qmm(x, w, s, b, gs, bits, GPU)
    scribble()
    g2 = qmm(x, w, s, b, gs, bits, GPU)
    c = qmm(x, w, s, b, gs, bits, mx.cpu)
    return {"gpu_runs_equal": bool(np.array_equal(g1, g2)), "gpu_vs_gpu_max_abs": float(np.abs(g1 - g2).max()),
            "gpu_vs_cpu_max_abs": float(np.abs(g1 - c).max()), "gpu2_vs_cpu_max_abs": float(np.abs(g2 - c).max())}


def report(rows: list, r: dict) -> None:
    rows.append(r)
    flag = "" if r["gpu_runs_equal"] and r["gpu_vs_cpu_max_abs"] < 0.05 else "  <-- "
    print(f"{r['what']:<42} gpu==gpu {r['gpu_runs_equal']!s:<5} |gpu-gpu| {r['gpu_vs_gpu_max_abs']:.3g}  "
          f"|gpu-cpu| {r['gpu_vs_cpu_max_abs']:.3g} / {r['gpu2_vs_cpu_max_abs']:.3g}{flag}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, default=Path(".cache/checkpoints/c5_moe/q4g32"))
    ap.add_argument("--sweep", action="store_true", help="also K 256/512 and N 64 (each new kernel variant is compiled on first use: minutes)")
    args = ap.parse_args()
    rows: list = []
    rng = np.random.default_rng(0)
    f = args.checkpoint / "model.safetensors"
    if f.exists():
        p = mx.load(str(f))
        k = "model.layers.0.router.proj"
        w, s, b = p[f"{k}.weight"], p[f"{k}.scales"], p[f"{k}.biases"]
        for m in (1, 5, 36):
            x = mx.array(rng.standard_normal((1, m, 64)).astype(np.float32)).astype(mx.bfloat16)
            report(rows, {"what": f"c5_moe/q4g32 layers.0.router.proj, M={m}", **case(x, w, s, b, 64, 8)})
    # K equal to one quantization group (as in the fixtures above) against K of several groups
    grid = [(8, 64, 64), (4, 64, 64), (4, 32, 64), (8, 64, 128), (4, 64, 128)]
    if args.sweep:
        grid += [(bits, gs, K) for bits in (4, 8) for gs in (32, 64, 128) for K in (256, 512) if K % gs == 0]
    for bits, gs, K in grid:
        for N in ((8, 64) if args.sweep else (8,)):
            for m in (1, 5):
                wf = mx.array(rng.standard_normal((N, K)).astype(np.float32)).astype(mx.bfloat16)
                w, s, b = mx.quantize(wf, group_size=gs, bits=bits, stream=mx.cpu)
                x = mx.array(rng.standard_normal((1, m, K)).astype(np.float32)).astype(mx.bfloat16)
                report(rows, {"what": f"bits {bits} g{gs} K={K} N={N} M={m}", **case(x, w, s, b, gs, bits)})
    print(json.dumps({"mlx": mx.__version__, "device": str(GPU), "rows": rows}))


if __name__ == "__main__":
    main()
