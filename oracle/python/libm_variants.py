#!/usr/bin/env python
"""Does the CPU's ISA (FMA, AVX2) change MLX's CPU results? The measurement behind the golden
fingerprint leaving the CPU model out (server.fingerprint's docstring).

libmlx (mlx-cpu wheel) and its bundled BLAS have no runtime ISA dispatch; the one dispatch MLX's
CPU kernels reach is glibc libm's (IFUNC variants of logf, sinf, powf, ... for FMA+AVX2 machines).
This runs 17 float32 MLX ops (their compiled forms included) on 4,194,304 inputs twice: with the
variants this CPU selects, and with the SSE2 ones forced (GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA,
-FMA4, glibc >= 2.33), and prints how many results differ per op. Exit 0: none differ; 1: some do.

    .venv/bin/python -I oracle/python/libm_variants.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

TUNABLES = "glibc.cpu.hwcaps=-AVX2,-FMA,-FMA4"


def compute(out: str) -> None:
    import mlx.core as mx
    import numpy as np

    mx.set_default_device(mx.cpu)
    x = mx.array(np.random.default_rng(0).uniform(-30, 30, 1 << 22).astype(np.float32))
    p = mx.abs(x) + 1e-3
    ops = {"log": lambda: mx.log(p), "log2": lambda: mx.log2(p), "log10": lambda: mx.log10(p), "log1p": lambda: mx.log1p(p),
           "sin": lambda: mx.sin(x), "cos": lambda: mx.cos(x), "tan": lambda: mx.tan(x), "arctan": lambda: mx.arctan(x),
           "arctan2": lambda: mx.arctan2(x, p), "expm1": lambda: mx.expm1(x / 8), "power": lambda: mx.power(p, x / 7),
           "tanh": lambda: mx.tanh(x), "sinh": lambda: mx.sinh(x / 4), "exp": lambda: mx.exp(x / 2), "erf": lambda: mx.erf(x / 8),
           "compiled log": lambda: mx.compile(lambda a: mx.log(a) * 2 + 1)(p),
           "compiled sin": lambda: mx.compile(lambda a: mx.sin(a) * 2 + 1)(x)}
    res = {}
    for k, f in ops.items():
        a = f()
        mx.eval(a)
        res[k] = np.array(a).view(np.uint32)
    np.savez(out, **res)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--compute":
        compute(sys.argv[2])
        return 0
    import numpy as np

    with tempfile.TemporaryDirectory() as d:
        runs = {}
        for label, env in (("native", {}), ("sse2", {"GLIBC_TUNABLES": TUNABLES})):
            out = str(Path(d) / f"{label}.npz")
            subprocess.run([sys.executable, "-I", __file__, "--compute", out], check=True, env={**os.environ, **env})
            runs[label] = np.load(out)
        a, b = runs["native"], runs["sse2"]
        differing = 0
        for k in a.files:
            n = int((a[k] != b[k]).sum())
            differing += n
            print(f"{k:14s} {n} of {a[k].size} differ")
    print(f"libm's ISA variants: {'no result differs' if differing == 0 else f'{differing} results differ'}")
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
