#!/usr/bin/env python
"""The E2B-like q8g64 checkpoint of issue 25's H200 check: fixture c3_e2b with a per-layer input
width of 64, so that per_layer_projection (K = 64) is quantized with one group per row, like every
projection over the 64-wide hidden state. Built with the fixture builder's own code (mlx-lm's
classes, quantize_model, save_model), seeded, into OUT.

  python -I bench/cuda/make_e2b_p64.py OUT
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import make_checkpoints as mc  # noqa: E402

base = mc.text_config


def p64(fixture: str) -> dict:
    cfg = dict(base("c3_e2b"))
    cfg["hidden_size_per_layer_input"] = 64
    return cfg


mc.text_config = p64
out = Path(sys.argv[1])
path = mc.build_one("c3_e2b_p64/q8g64", "c3_e2b_p64", "q8g64", "flat", "bfloat16",
                    {"group_size": 64, "bits": 8, "mode": "affine"}, out, mc.DEFAULT_SEED)
print(path)
