"""Pins the fused-kernel names Python MLX generates for mlx-lm's compiled gemma4 helpers.

Run from anywhere except the repo root:  ../../.venv/bin/python compile_kernels_gen.py
It compiles into a fresh TMPDIR and prints the sorted kernel library names as JSON, which
tests/mlx/compile.test.ts embeds (compile_kernels.pinned.json) and compares with the kernels
the binding's compile() produces for the same graphs (compile_kernels_ts.ts).
"""

import json
import os
import sys
import tempfile

tmp = tempfile.mkdtemp(prefix="mlx-kernels-py-")
os.environ["TMPDIR"] = tmp  # read by MLX when it first compiles

from functools import partial  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402


@partial(mx.compile, shapeless=True)
def logit_softcap(softcap, x):
    return mx.tanh(x / softcap) * softcap


@partial(mx.compile, shapeless=True)
def _complete_square(x2, y2, xy):
    return x2 + mx.expand_dims(y2, -1) - 2 * xy


@partial(mx.compile, shapeless=True)
def geglu(gate, x):
    return nn.gelu_approx(gate) * x


for dt in (mx.float32, mx.bfloat16):
    x = mx.arange(12, dtype=mx.float32).reshape(3, 4).astype(dt) / 7
    mx.eval(nn.gelu_approx(x), geglu(x, x), logit_softcap(30.0, x), _complete_square(x, x[:, 0], x))
cpu = os.path.join(tmp, "mlx", mx.__version__, "cpu")
names = sorted(f for f in os.listdir(cpu) if f.startswith("lib"))
json.dump(names, sys.stdout, indent=1)
print()
