"""Reference for suites/gemma4/embeddings.test.ts: mlx-lm's logits for model(None, input_embeddings=e).

stdin: JSON list of {"ckpt", "in", "dtype", "out"}: checkpoint dir, input .npy (raw bits; bf16
as uint16 tagged by "dtype"), output .npy. One process for all jobs (mlx-lm imports are slow).
The embeddings-only path reverse-looks-up the token ids for the per-layer inputs
(_complete_square + argmin) before projecting them.
"""
import json
import sys
from pathlib import Path

import mlx.core as mx
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import device_env  # noqa: E402,F401  (MLX_DEVICE: the run's device, as on the TS side)
import numpy as np
from mlx_lm.utils import load_model

for job in json.load(sys.stdin):
    model, _ = load_model(Path(job["ckpt"]))
    e = mx.array(np.load(job["in"]))
    if job["dtype"] == "bfloat16":
        e = e.view(mx.bfloat16)
    logits = model(None, input_embeddings=e)
    if logits.dtype == mx.bfloat16:
        logits = logits.view(mx.uint16)
    mx.eval(logits)
    np.save(job["out"], np.array(logits))
