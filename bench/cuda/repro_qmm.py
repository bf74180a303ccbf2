#!/usr/bin/env python
"""Python-only check of MLX's quantized matmul on the GPU: is its result a function of its inputs?

For each (bits, group_size, K, N, M) it computes mx.quantized_matmul on the GPU twice, once on a
fresh allocator and once after filling and freeing scratch memory with large values, and on the
CPU. A configuration whose two GPU results differ reads memory it does not own (its result
depends on what was there before); one whose GPU result is far from the CPU's computes something
else. The first rows are the router projection of the c5_moe/q4g32 fixture (8-bit g64, K=64, N=8).

A third check places each operand (x, w, scales, biases) at the start of a larger buffer whose
tail holds junk, as a row-contiguous view that the kernel takes without a copy: the operand's
bytes are the same, only what lies after them differs. A result that changes then reads past the
end of that operand.

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
    """Leave the allocator's free blocks full of large values: big ones, and small ones of the sizes
    the kernel's own scratch copies take (qmm_sm90 transposes scales and biases on every call)."""
    junk = [mx.full((1 << 16,), 3.0e4, dtype=mx.bfloat16) for _ in range(64)]
    junk += [mx.full((n,), 3.0e4, dtype=dt) for n in (4, 8, 16, 32, 64, 128, 256, 1024, 4096) for dt in (mx.bfloat16, mx.float32) for _ in range(16)]
    mx.eval(junk)
    del junk


def qmm(x, w, s, b, gs, bits, dev):
    with mx.stream(dev):
        y = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)
        mx.eval(y)
        return np.array(y.astype(mx.float32))


def junk_tailed(a):
    """The same values as `a`, as a prefix view of a buffer twice its size whose tail is junk."""
    flat = a.reshape(-1)
    n = flat.size
    fill = 0xFFFFFFFF if a.dtype == mx.uint32 else 3.0e4
    big = mx.concatenate([flat, mx.full((max(n, 4096),), fill, dtype=a.dtype)])
    mx.eval(big)
    v = big[:n].reshape(a.shape)
    mx.eval(v)
    return v


def case(x, w, s, b, gs, bits) -> dict:
    mx.clear_cache()
    g1 = qmm(x, w, s, b, gs, bits, GPU)
    scribble()
    g2 = qmm(x, w, s, b, gs, bits, GPU)
    c = qmm(x, w, s, b, gs, bits, mx.cpu)
    ops = [x, w, s, b]
    tails = {}
    for i, name in enumerate(("x", "w", "scales", "biases")):
        args = list(ops)
        args[i] = junk_tailed(ops[i])
        tails[name] = float(np.abs(qmm(*args, gs, bits, GPU) - g1).max())
    return {"gpu_runs_equal": bool(np.array_equal(g1, g2)), "gpu_vs_gpu_max_abs": float(np.abs(g1 - g2).max()),
            "gpu_vs_cpu_max_abs": float(np.abs(g1 - c).max()), "gpu2_vs_cpu_max_abs": float(np.abs(g2 - c).max()),
            "junk_tail_max_abs": tails}


def report(rows: list, r: dict) -> None:
    rows.append(r)
    tails = r["junk_tail_max_abs"]
    clean = r["gpu_runs_equal"] and r["gpu_vs_cpu_max_abs"] < 0.05 and not any(tails.values())
    tail = " ".join(f"{k}:{v:.3g}" for k, v in tails.items())
    print(f"{r['what']:<42} gpu==gpu {r['gpu_runs_equal']!s:<5} |gpu-gpu| {r['gpu_vs_gpu_max_abs']:.3g}  "
          f"|gpu-cpu| {r['gpu_vs_cpu_max_abs']:.3g} / {r['gpu2_vs_cpu_max_abs']:.3g}  junk after {tail}{'' if clean else '  <-- '}", flush=True)


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
    # (K = group: CUTLASS qmm_sm90 on compute capability 9 when M > 1; K = 2 groups and M = 1: other kernels)
    grid = [(8, 64, 64), (4, 64, 64), (8, 64, 128)]
    if args.sweep:
        grid += [(4, 32, 64), (4, 64, 128)] + [(bits, gs, K) for bits in (4, 8) for gs in (32, 64, 128) for K in (256, 512) if K % gs == 0]
    for bits, gs, K in grid:
        for N in ((8, 64) if args.sweep else (8,)):
            for m in ((1, 5) if args.sweep or K > gs else (5,)):
                wf = mx.array(rng.standard_normal((N, K)).astype(np.float32)).astype(mx.bfloat16)
                w, s, b = mx.quantize(wf, group_size=gs, bits=bits, stream=mx.cpu)
                x = mx.array(rng.standard_normal((1, m, K)).astype(np.float32)).astype(mx.bfloat16)
                report(rows, {"what": f"bits {bits} g{gs} K={K} N={N} M={m}", **case(x, w, s, b, gs, bits)})
    print(json.dumps({"mlx": mx.__version__, "device": str(GPU), "rows": rows}))


if __name__ == "__main__":
    main()
