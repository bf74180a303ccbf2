"""Is llama.cpp's float16 GELU table the cause of its distance from mlx-lm? A control experiment.

Usage: python gelu_table_check.py CHECKPOINT_DIR DUMP_DIR [L1_DUMP_DIR]   (the oracle venv: mlx, mlx-lm)
Prints one JSON line.

llama.cpp's CPU backend (ggml-cpu/vec.h, GGML_GELU_FP16 defined) computes GELU, and the GELU of
GeGLU, on float32 inputs by a lookup: x is rounded to float16, and the table holds
gelu(x) for every float16 x, itself rounded to float16 (filled in ggml-cpu.c at init); inputs
<= -10 give 0, inputs >= 10 give x. mlx-lm computes the same tanh formula in float32.

This script runs mlx-lm's forward (float32) on the dump's prompt twice: as it is, and with every
GELU replaced by that lookup (written here from the description above, in numpy/MLX), and
reports how far llama.cpp's log-probabilities (the dump's `logprobs`) are from each. If the
lookup accounts for the distance, the second is far smaller than the first.

With a level-1 dump of the same forward (L1_DUMP_DIR) it also reports, per position, the
relative L2 error of layer 0's output (llama.cpp against mlx-lm with the lookup) beside the
smallest relative distance of any of layer 0's GELU inputs from a float16 rounding midpoint:
where an input lies within float32 noise of a midpoint, the two engines' float32 rounding
differences can round it to different float16 values, one table step apart.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import gemma4_text
from mlx_lm.utils import load_model


def gelu_tanh_f32(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    c = np.float32(np.sqrt(2.0 / np.pi))
    return (np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * x * (np.float32(1.0) + np.float32(0.044715) * x * x)))).astype(np.float32)


def ggml_gelu_table() -> mx.array:
    """gelu(x) rounded to float16 for every float16 bit pattern x, as float32 (NaN patterns give NaN)."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x = bits.view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        y = gelu_tanh_f32(x).astype(np.float16).astype(np.float32)
    return mx.array(y)


TABLE = ggml_gelu_table()


def gelu_lookup(x: mx.array) -> mx.array:
    x32 = x.astype(mx.float32)
    idx = mx.view(x32.astype(mx.float16), mx.uint16).astype(mx.uint32)
    y = mx.take(TABLE, idx)
    y = mx.where(x32 <= -10.0, mx.zeros_like(x32), y)
    y = mx.where(x32 >= 10.0, x32, y)
    return y.astype(x.dtype)


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def distances(engine: np.ndarray, ref_logits: np.ndarray) -> dict:
    lr = log_softmax64(ref_logits)
    le = log_softmax64(engine)  # log p renormalized in float64 (float32 probabilities sum to 1 only within rounding)
    p = np.exp(lr)
    kl = (p * (lr - le)).sum(axis=-1)
    rows = np.abs(le - lr).max(axis=-1).reshape(-1)
    return {
        "max_abs_dlogprob": float(rows.max()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        # per position: the largest |Δ log p| over the vocabulary (a float16 rounding flip shows
        # as one position far above the others)
        "row_max_abs_dlogprob": [float(x) for x in rows],
        "rows_within_1e-5": int((rows <= 1e-5).sum()),
    }


def midpoint_margin(x: np.ndarray) -> np.ndarray:
    """|x − the nearest float16 rounding midpoint| / |x|, element-wise (float32 x)."""
    h = x.astype(np.float16)
    lo = np.nextafter(h, np.float16(-np.inf)).astype(np.float64)
    hi = np.nextafter(h, np.float16(np.inf)).astype(np.float64)
    c = h.astype(np.float64)
    d = np.minimum(np.abs((c + lo) / 2 - x), np.abs((c + hi) / 2 - x))
    return d / np.maximum(np.abs(x.astype(np.float64)), 1e-30)


def layer0_report(model, tokens: mx.array, l1_dump: Path) -> dict:
    """Per position: layer 0's output error against llama.cpp and its GELU inputs' midpoint margin."""
    inner = model.language_model.model if hasattr(model, "language_model") else model.model
    first = inner.layers[0]
    cls = type(first)
    original_call = cls.__call__
    state = {"in_layer0": False, "out": None}
    margins: list[np.ndarray] = []

    def recording_lookup(x: mx.array) -> mx.array:
        if state["in_layer0"]:
            a = np.array(x.astype(mx.float32))
            # every GELU input of layer 0, reduced to its smallest margin per position (axis 1)
            m = midpoint_margin(a).reshape(a.shape[0], a.shape[1], -1).min(axis=-1)[0]
            margins.append(m)
        return gelu_lookup(x)

    def call(self, *args, **kwargs):
        state["in_layer0"] = self is first
        out = original_call(self, *args, **kwargs)
        if self is first:
            h = out[0] if isinstance(out, tuple) else out
            state["out"] = np.array(h.astype(mx.float32))[0]
        state["in_layer0"] = False
        return out

    original_geglu, original_gelu = gemma4_text.geglu, nn.gelu_approx
    gemma4_text.geglu = lambda gate, x: recording_lookup(gate) * x
    nn.gelu_approx = recording_lookup
    cls.__call__ = call
    try:
        model(tokens)
    finally:
        gemma4_text.geglu, nn.gelu_approx = original_geglu, original_gelu
        cls.__call__ = original_call
    engine = np.array(mx.load(str(l1_dump / "tensors.safetensors"))["layers.0/output"].astype(mx.float32))[0].astype(np.float64)
    ref = state["out"].astype(np.float64)
    rel = np.linalg.norm(engine - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    margin = np.min(np.stack(margins), axis=0)
    return {"layer0_rel_l2_per_position": [float(v) for v in rel], "layer0_gelu_input_midpoint_margin_per_position": [float(v) for v in margin]}


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        sys.stderr.write("usage: gelu_table_check.py CHECKPOINT_DIR DUMP_DIR [L1_DUMP_DIR]\n")
        return 2
    ckpt, dump = Path(argv[1]), Path(argv[2])
    manifest = json.loads((dump / "manifest.json").read_text())
    if manifest["schedule"]["kind"] != "forward":
        sys.stderr.write("gelu_table_check: the dump must be a forward\n")
        return 2
    engine = np.array(mx.load(str(dump / "tensors.safetensors"))["logprobs"].astype(mx.float32))
    model, _ = load_model(ckpt)
    tokens = mx.array([manifest["prompt"]], dtype=mx.int32)

    stock = np.array(model(tokens).astype(mx.float32))
    original_geglu, original_gelu = gemma4_text.geglu, nn.gelu_approx
    gemma4_text.geglu = lambda gate, x: gelu_lookup(gate) * x
    nn.gelu_approx = gelu_lookup  # the per-layer-input gate calls nn.gelu_approx directly
    try:
        lookup = np.array(model(tokens).astype(mx.float32))
    finally:
        gemma4_text.geglu, nn.gelu_approx = original_geglu, original_gelu
    out = {"stock_gelu": distances(engine, stock), "ggml_table_gelu": distances(engine, lookup)}
    if len(argv) == 4:
        out.update(layer0_report(model, tokens, Path(argv[3])))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
