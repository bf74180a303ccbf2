#!/usr/bin/env python
"""Python-only check of the op gradients that differ between the binding and the oracle on CUDA:
is each one a function of its inputs?

1. Scatter-add order. MLX's CUDA scatter_add adds with atomics (ScatterSum in
   mlx/backend/cuda/device/scatter_ops.cuh), so where indices repeat, the order of the float
   additions, and so their rounding, is whatever order the threads arrive in. gather_mm's and
   gather_qmm's vjp with unsorted indices scatter-add their gradients (gather_mm_grad and
   GatherQMM::vjp in mlx/primitives.cpp). Each case runs R times on identical inputs, back to
   back and with the allocator's free blocks refilled between runs, on the GPU and on the CPU (the
   control: one result), and counts the distinct results; then in fresh processes (the binding
   and the oracle are two processes), one run each.
2. The vjp of quantized_matmul(transpose=False) w.r.t. x is quantized_matmul(cotangent, w,
   transpose=True) on the same w: with one group per row that is the qmm_sm90 path of
   bench/cuda/repro_qmm.py, whose result follows the allocator's state.

    MLX_DEVICE=gpu python -I bench/cuda/repro_vjp.py [--runs 20] [--processes 4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repro_qmm import GPU, scribble  # noqa: E402  (the same junk filling as the qmm reproducer)

rng = np.random.default_rng(0)


def normal(shape, dtype=mx.float32):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def idx(values):
    return mx.array(np.array(values, dtype=np.uint32))


def digest(outs) -> str:
    return hashlib.sha256(b"".join(np.array(o.view(mx.uint8)).tobytes() for o in outs)).hexdigest()


def runs(fn, dev, n: int, scribbled: bool) -> tuple[int, list, str]:
    """Distinct byte results of fn() over n runs on dev, the first run's outputs (float32 numpy) and their digest."""
    seen: set = set()
    first = None
    for i in range(n):
        if scribbled and i:
            scribble()
        with mx.stream(dev):
            outs = fn()
            mx.eval(outs)
        seen.add(digest(outs))
        if first is None:
            first, first_digest = [np.array(o.astype(mx.float32)) for o in outs], digest(outs)
    return len(seen), first, first_digest


def scatter_cases():
    # the gradient cases of the op table that differ on the H200 (their shapes and parameters)
    x = normal((2, 4, 1, 16))
    w = normal((8, 16, 32))
    ri = idx([[3, 0, 3, 5], [0, 3, 7, 3]])
    cot = normal((2, 4, 1, 32))
    yield ("gather_mm vjp wrt rhs, f32 [2,4,1,16] x [8,16,32], unsorted", lambda: mx.vjp(lambda b: mx.gather_mm(x, b, rhs_indices=ri), [w], [cot])[1])

    for name, bits, gs, n_words in (("bf16", 8, 32, 32), ("f16", 3, 64, 12), ("bf16", 2, 128, 8)):
        dt = mx.bfloat16 if name == "bf16" else mx.float16
        wq, s, b = mx.quantize(normal((4, 6, 128), dt), group_size=gs, bits=bits, stream=mx.cpu)
        assert wq.shape[-1] == n_words
        xq = normal((5, 1, 128), dt)
        rq = idx([2, 0, 2, 3, 2])
        cq = normal((5, 1, 6), dt)
        f = lambda s_, b_, xq=xq, wq=wq, rq=rq, gs=gs, bits=bits: mx.gather_qmm(xq, wq, s_, b_, rhs_indices=rq, transpose=True, group_size=gs, bits=bits)  # noqa: E731
        yield (f"gather_qmm vjp wrt scales+biases, {name} [5,1,128], {bits}-bit g{gs}, unsorted", lambda f=f, s=s, b=b, cq=cq: mx.vjp(f, [s, b], [cq])[1])

    wq, s, b = mx.quantize(normal((4, 6, 128), mx.bfloat16), group_size=64, bits=4, stream=mx.cpu)
    xl = normal((3, 2, 128), mx.bfloat16)
    li, rj = idx([1, 0, 1, 2]), idx([3, 1, 0, 3])
    cl = normal((4, 2, 6), mx.bfloat16)
    f = lambda x_: mx.gather_qmm(x_, wq, s, b, lhs_indices=li, rhs_indices=rj, transpose=True, group_size=64, bits=4)  # noqa: E731
    yield ("gather_qmm vjp wrt x, bf16 [3,2,128], lhs+rhs indices, unsorted", lambda: mx.vjp(f, [xl], [cl])[1])

    # cummin's vjp scatter-adds each cotangent into the element holding the running minimum there
    # (Scan::vjp, scatter_add_axis): the op table's failing case, float16 [2,3,7], reverse, exclusive
    xc = normal((2, 3, 7), mx.float16)
    cc = normal((2, 3, 7), mx.float16)
    yield ("cummin vjp, f16 [2,3,7], axis -1, reverse, exclusive", lambda: mx.vjp(lambda a: mx.cummin(a, axis=-1, reverse=True, inclusive=False), [xc], [cc])[1])
    xm = normal((64, 512), mx.float16)
    cm = normal((64, 512), mx.float16)
    yield ("cummax vjp, f16 [64,512], axis -1 (long runs of one owner)", lambda: mx.vjp(lambda a: mx.cummax(a, axis=-1), [xm], [cm])[1])

    # the mechanism alone: many updates into few rows
    base = mx.zeros((4, 64))
    upd = normal((4096, 1, 64))
    where = idx(rng.integers(0, 4, 4096))
    yield ("scatter_add: 4096 rows of updates into 4", lambda: [base.at[where].add(upd.reshape(4096, 64))])


def qmm_case(n: int) -> dict:
    wq, s, b = mx.quantize(normal((128, 64)), group_size=64, bits=4, stream=mx.cpu)
    x = normal((3, 128))
    cot = normal((3, 64))
    grad = lambda: mx.vjp(lambda x_: mx.quantized_matmul(x_, wq, s, b, transpose=False), [x], [cot])[1]  # noqa: E731
    direct = lambda: [mx.quantized_matmul(cot, wq, s, b, transpose=True)]  # noqa: E731
    mx.clear_cache()
    with mx.stream(GPU):
        g, d = grad()[0], direct()[0]
        mx.eval(g, d)
        same_kernel = bool(np.array_equal(np.array(g), np.array(d)))
    k_back, g_first, _ = runs(grad, GPU, n, False)
    k_scr, _, _ = runs(grad, GPU, n, True)
    k_cpu, c_first, _ = runs(grad, mx.cpu, 2, False)
    return {"what": "quantized_matmul vjp wrt x, f32 [3,128], transpose=False, 4-bit g64 (w: one group per row)",
            "vjp_equals_transposed_qmm": same_kernel, "gpu_distinct_back_to_back": k_back, "gpu_distinct_scribbled": k_scr,
            "cpu_distinct": k_cpu, "gpu_vs_cpu_max_abs": float(np.abs(g_first[0] - c_first[0]).max())}


def child_digests() -> None:
    """One GPU run of every case, as digests: the cross-process leg."""
    print(json.dumps({what: digest(o) for what, f in scatter_cases() if (o := safe(f)) is not None}))


def safe(f):
    """f()'s outputs evaluated on the GPU, or None where MLX refuses them."""
    try:
        with mx.stream(GPU):
            o = f()
            mx.eval(o)
            return o
    except RuntimeError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--processes", type=int, default=4, help="fresh processes for the cross-process leg")
    ap.add_argument("--digests", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.digests:
        return child_digests()
    n = args.runs
    children = [json.loads(subprocess.run([sys.executable, "-I", __file__, "--digests"], capture_output=True, text=True, check=True).stdout.splitlines()[-1]) for _ in range(args.processes)]
    rows = []
    for what, fn in scatter_cases():
        try:
            k_back, g, dg = runs(fn, GPU, n, False)
            k_scr, _, _ = runs(fn, GPU, n, True)
        except RuntimeError as e:  # the CPU's gather_mm is float32 only (without a GPU both legs are the CPU's)
            rows.append({"what": what, "error": str(e)})
            print(f"{what:<66} {GPU}: {e}", flush=True)
            continue
        k_proc = len({dg, *(c[what] for c in children if what in c)})
        try:
            k_cpu, c, _ = runs(fn, mx.cpu, 3, False)
            d = max(float(np.abs(a - b).max()) for a, b in zip(g, c))
            cpu = f"CPU {k_cpu} of 3; |gpu-cpu| {d:.3g}"
        except RuntimeError as e:
            k_cpu, d, cpu = None, None, f"CPU: {e}"
        rows.append({"what": what, "gpu_distinct_back_to_back": k_back, "gpu_distinct_scribbled": k_scr, "gpu_distinct_processes": k_proc, "cpu_distinct": k_cpu, "gpu_vs_cpu_max_abs": d})
        print(f"{what:<66} GPU distinct: {k_back}/{n} back to back, {k_scr}/{n} scribbled, {k_proc}/{args.processes + 1} processes; {cpu}", flush=True)
    r = qmm_case(n)
    rows.append(r)
    print(f"{r['what']:<66} = qmm(cot, w, transpose=True): {r['vjp_equals_transposed_qmm']}; GPU distinct: {r['gpu_distinct_back_to_back']}/{n} back to back, "
          f"{r['gpu_distinct_scribbled']}/{n} scribbled; CPU {r['cpu_distinct']} of 2; |gpu-cpu| {r['gpu_vs_cpu_max_abs']:.3g}", flush=True)
    print(json.dumps({"mlx": mx.__version__, "device": str(GPU), "runs": n, "processes": args.processes, "rows": rows}))


if __name__ == "__main__":
    main()
