#!/usr/bin/env python
"""Python-only check of MLX's CUDA attention for one query row: does its result depend on the
allocator's state?

For a decode step (one query row, no mask array, float16/bfloat16, head dim <= 128, >= 256 keys)
MLX 0.32.4's CUDA `ScaledDotProductAttention` takes cuDNN only when the keys and values look like
slices of a KV-cache buffer whose length is a multiple of 256 (`use_cudnn_for_decoding`,
mlx/backend/cuda/scaled_dot_product_attention.cpp), and it reads that buffer's length from
`array::buffer_size()`: the size of the allocation, not of the array. The CUDA allocator hands
out a cached free block up to min(2x, +32 KiB) larger than asked for, so the same cache buffer is
"a slice" after a fresh allocation and not after one that reused a slightly larger block; the
call then takes the vector kernel, which sums in another order.

Here the same keys, values and query are attended to twice, each time with the cache buffer
built the way mlx-lm's KVCache builds it (a buffer of 512 rows, the prompt's 300 written in,
sliced to 300): once on a fresh allocator, once after a freed block one page larger than the
buffer was left in the allocator's cache. The inputs are byte-identical; a result that differs
depends on the allocation, not on the inputs. With MLX_CUDA_USE_CUDNN_SDPA=0 (set before MLX
starts) both take the vector kernel; the script runs itself again that way as the control.

    MLX_DEVICE=gpu python -I bench/cuda/repro_sdpa.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np

GPU = mx.gpu if mx.is_available(mx.gpu) else mx.cpu
PAGE = 16384  # the CUDA allocator's page (mlx/backend/cuda/allocator.cpp)


def inputs(dtype, n_q_heads: int, n_kv_heads: int, head_dim: int, prompt: int, seed: int):
    rng = np.random.default_rng(seed)
    q = mx.array(rng.standard_normal((1, n_q_heads, 1, head_dim), dtype=np.float32)).astype(dtype)
    k = mx.array(rng.standard_normal((1, n_kv_heads, prompt, head_dim), dtype=np.float32)).astype(dtype)
    v = mx.array(rng.standard_normal((1, n_kv_heads, prompt, head_dim), dtype=np.float32)).astype(dtype)
    mx.eval(q, k, v)
    return q, k, v


def attend(q, k, v, buffer_rows: int, spare_block: bool):
    """k and v written into cache buffers of `buffer_rows` rows (as mlx-lm's KVCache: zeros, then
    the prompt's rows updated in), then attended to as the slices [:, :, :prompt]."""
    mx.synchronize()
    mx.clear_cache()
    n = k.shape[2]
    shape = (k.shape[0], k.shape[1], buffer_rows, k.shape[3])
    nbytes = int(np.prod(shape)) * k.dtype.size
    if spare_block:
        # two free blocks one page larger than a cache buffer: the next two allocations of that
        # size reuse them (buffer_cache.h: lower_bound(size), taken if < min(2 size, size + 2 pages))
        spare = [mx.zeros(((nbytes + PAGE // 2) // 2,), dtype=mx.float16) + 1 for _ in range(2)]
        mx.eval(spare)
        del spare
    kb = mx.zeros(shape, dtype=k.dtype)
    vb = mx.zeros(shape, dtype=v.dtype)
    kb[..., :n, :] = k
    vb[..., :n, :] = v
    mx.eval(kb, vb)
    out = mx.fast.scaled_dot_product_attention(q, kb[..., :n, :], vb[..., :n, :], scale=q.shape[-1] ** -0.5, mask=None)
    mx.eval(out)
    return np.array(out.astype(mx.float32)), np.array(kb[..., :n, :].astype(mx.float32)), np.array(vb[..., :n, :].astype(mx.float32))


def run() -> dict:
    rows = []
    with mx.stream(GPU):
        for dtype in (mx.bfloat16, mx.float16, mx.float32):
            for heads, kv_heads, head_dim in ((4, 1, 64), (8, 2, 128)):
                q, k, v = inputs(dtype, heads, kv_heads, head_dim, 300, seed=heads + head_dim)
                fresh, kf, vf = attend(q, k, v, 512, spare_block=False)
                reused, kr, vr = attend(q, k, v, 512, spare_block=True)
                again, _, _ = attend(q, k, v, 512, spare_block=False)
                # a 300-row buffer is no slice of a 256-multiple cache: the vector kernel, always
                vector, _, _ = attend(q, k, v, 300, spare_block=False)
                rows.append({
                    "dtype": str(dtype).replace("mlx.core.", ""),
                    "q": [1, heads, 1, head_dim],
                    "kv": [1, kv_heads, 300, head_dim],
                    "inputs identical": bool(np.array_equal(kf, kr) and np.array_equal(vf, vr)),
                    "fresh == fresh again": bool(np.array_equal(fresh, again)),
                    "fresh == after a larger free block": bool(np.array_equal(fresh, reused)),
                    "after a larger free block == vector kernel": bool(np.array_equal(reused, vector)),
                    "max |d|": float(np.abs(fresh - reused).max()),
                })
    return {"device": str(GPU), "cudnn_sdpa": os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "1"), "cases": rows}


def main() -> int:
    res = run()
    print(f"device {res['device']}, MLX_CUDA_USE_CUDNN_SDPA={res['cudnn_sdpa']}")
    for c in res["cases"]:
        print(json.dumps(c))
    sys.stdout.flush()
    if os.environ.get("MLX_CUDA_USE_CUDNN_SDPA") is None:
        control = subprocess.run([sys.executable, "-I", __file__], env={**os.environ, "MLX_CUDA_USE_CUDNN_SDPA": "0"})
        if control.returncode != 0:
            return control.returncode
    depends = [c for c in res["cases"] if c["inputs identical"] and not c["fresh == after a larger free block"]]
    print(f"{len(depends)} of {len(res['cases'])} cases: the result depends on the allocation (MLX_CUDA_USE_CUDNN_SDPA={res['cudnn_sdpa']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
