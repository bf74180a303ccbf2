"""MLX_DEVICE=cpu|gpu: the one switch for the device of a test or parity run.

Every oracle-side Python process imports this module, and the TS side reads the same variable
(`applyDeviceEnv` in @mlx-bun/mlx), so both sides run on one device. Unset, MLX keeps its own
default device (the GPU on a Metal or CUDA build, else the CPU).
"""

from __future__ import annotations

import os

import mlx.core as mx


def apply() -> str:
    want = os.environ.get("MLX_DEVICE")
    if want:
        if want not in ("cpu", "gpu"):
            raise SystemExit(f"MLX_DEVICE={want}: unknown device (expected cpu or gpu)")
        dev = mx.cpu if want == "cpu" else mx.gpu
        if not mx.is_available(dev):
            raise SystemExit("MLX_DEVICE=gpu: no GPU is available to MLX here (this libmlx has the CPU backend only)")
        mx.set_default_device(dev)
    return "gpu" if mx.default_device() == mx.gpu else "cpu"


def backend() -> str:
    """The GPU backend this libmlx can use here: "metal", "cuda", or "cpu" (none)."""
    if mx.metal.is_available():
        return "metal"
    if mx.cuda.is_available():
        return "cuda"
    return "cpu"


DEVICE = apply()
