#!/usr/bin/env python
"""Why transformers' bfloat16 run leaves the float32 floor at its first computed tap
(layers.0/input_layernorm, engines/RESULTS.md): the two RMSNorms round differently in bfloat16.

mlx-lm's nn.RMSNorm calls mx.fast.rms_norm, which (on the CPU) normalizes in float32, rounds to
bfloat16, then multiplies by the bfloat16 weight (a second rounding); transformers'
Gemma4RMSNorm multiplies by the weight in float32 and rounds once. Run with the oracle's venv
(.venv/bin/python engines/transformers/bf16_rmsnorm_repro.py): prints how many of 1,024 outputs
each formula shares with mx.fast.rms_norm (measured: two roundings 1,024, one rounding 768).
"""

import mlx.core as mx
import numpy as np

mx.set_default_device(mx.cpu)
rng = np.random.default_rng(0)
x = mx.array(rng.standard_normal((16, 64)).astype(np.float32)).astype(mx.bfloat16)
w = mx.array(rng.standard_normal((64,)).astype(np.float32)).astype(mx.bfloat16)
fast = mx.fast.rms_norm(x, w, 1e-6)
xf = x.astype(mx.float32)
normed = xf * mx.rsqrt(mx.mean(xf * xf, -1, keepdims=True) + 1e-6)
two_roundings = normed.astype(mx.bfloat16) * w  # mlx: round, then the weight in bfloat16
one_rounding = (normed * w.astype(mx.float32)).astype(mx.bfloat16)  # transformers: weight in float32, round once
print({"equal_to_fast_rms_norm": {"two_roundings (mlx)": (fast == two_roundings).sum().item(),
                                  "one_rounding (transformers)": (fast == one_rounding).sum().item()},
       "of": fast.size})
