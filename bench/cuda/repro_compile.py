#!/usr/bin/env python
"""Python-only check: does mx.compile change the bits of elementwise arithmetic on this device?

The project's compiled decode route (one mx.compile closure for the decode step) is bit-exact
against mlx-lm's op-by-op step on the CPU, and gave other bytes on CUDA (bench/PARITY-cuda.md,
first session). A compiled graph fuses chains of elementwise ops into one kernel that MLX's CUDA
backend compiles at run time with NVRTC (mlx/backend/cuda/jit_module.cpp passes no --fmad flag,
and NVRTC's default is --fmad=true), so a multiply feeding an add can become one fused
multiply-add, rounded once instead of twice. The op-by-op route runs each op as its own kernel.

For a few chains of the kind Gemma 4's decode step has (a*b + c, the logit softcap
tanh(x / c) * c, the gelu-tanh of the MLP, the residual scale), each in float32, float16 and
bfloat16, the script compares mx.compile(f)(inputs) with f(inputs) byte for byte, on the GPU
and on the CPU (the control).

    python -I bench/cuda/repro_compile.py
"""

from __future__ import annotations

import json
import sys

import mlx.core as mx
import numpy as np


def chains():
    def fma(a, b, c):
        return a * b + c

    def softcap(a, b, c):
        return mx.tanh(a / 30.0) * 30.0

    def gelu_tanh(a, b, c):
        return 0.5 * a * (1.0 + mx.tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))

    def scaled_residual(a, b, c):
        return (a + b * c) * 0.5

    return {"a*b + c": fma, "softcap": softcap, "gelu_tanh": gelu_tanh, "(a + b*c) * 0.5": scaled_residual}


def main() -> int:
    rng = np.random.default_rng(0)
    raw = [rng.standard_normal((4, 4096), dtype=np.float32) * s for s in (3.0, 1.0, 0.5)]
    devices = [d for d in (mx.gpu, mx.cpu) if mx.is_available(d)]
    rows = []
    for dev in devices:
        with mx.stream(dev):
            for dtype in (mx.float32, mx.float16, mx.bfloat16):
                xs = [mx.array(r).astype(dtype) for r in raw]
                mx.eval(xs)
                for name, f in chains().items():
                    eager = f(*xs)
                    fused = mx.compile(f)(*xs)
                    mx.eval(eager, fused)
                    e, c = np.array(eager.astype(mx.float32)), np.array(fused.astype(mx.float32))
                    rows.append({
                        "device": "gpu" if dev == mx.gpu else "cpu",
                        "dtype": str(dtype).replace("mlx.core.", ""),
                        "chain": name,
                        "compiled == eager": bool(np.array_equal(np.array(eager.view(mx.uint16 if dtype != mx.float32 else mx.uint32)), np.array(fused.view(mx.uint16 if dtype != mx.float32 else mx.uint32)))),
                        "elements differing": int((e != c).sum()),
                        "max |d|": float(np.abs(e - c).max()),
                    })
    for r in rows:
        print(json.dumps(r))
    by_dev = {}
    for r in rows:
        by_dev.setdefault(r["device"], [0, 0])
        by_dev[r["device"]][0] += 0 if r["compiled == eager"] else 1
        by_dev[r["device"]][1] += 1
    for d, (bad, n) in by_dev.items():
        print(f"{d}: {bad} of {n} chains give other bits compiled than op by op")
    return 0


if __name__ == "__main__":
    sys.exit(main())
