"""Reproducer: mlx-vlm 0.7.10's TurboQuant KV cache and Gemma 4's KV-shared layers (CPU).

Run: .venv/bin/python bench/kvquant/kv_shared_repro.py [checkpoints dir]

A KV-shared layer reads the (keys, values) its donor returned from update_and_fetch: the last
non-shared layer of its type (Gemma4TextModel.previous_kvs). maybe_quantize_kv_cache skips the
last cache entry, so when the last non-shared layer is full attention (E2B, E4B and the c3_e2b /
c4_e4b fixtures) the full-attention donor stays a KVCache and generation runs. When the last
non-shared layer is sliding, the full-attention donor is an earlier layer, it is converted, and
the shared layer is handed _QuantizedStateProxy objects: mx.fast.scaled_dot_product_attention
raises TypeError. The second shape below is c4_e4b's config with layer_types rearranged (random
weights; the failure is structural). Prints one line per case.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
from mlx_vlm.generate.ar import generate_step  # noqa: E402
from mlx_vlm.models.gemma4 import Model, ModelConfig, TextConfig, VisionConfig  # noqa: E402
from speculative import TINY_VISION, vlm_target  # noqa: E402


def model_from_text_config(tcfg: dict) -> Model:
    cfg = ModelConfig.from_dict({"model_type": "gemma4", "text_config": tcfg, "vision_config": TINY_VISION, "vocab_size": tcfg["vocab_size"]})
    cfg.text_config = TextConfig.from_dict(tcfg)
    cfg.vision_config = VisionConfig.from_dict(TINY_VISION)
    cfg.audio_config = None
    mx.random.seed(0)
    model = Model(cfg)
    mx.eval(model.parameters())
    return model


def run(model, label: str) -> None:
    prompt = mx.array([list(range(2, 22))], dtype=mx.int32)
    toks = []
    try:
        for t, _ in generate_step(prompt, model, None, None, max_tokens=6, kv_bits=4.0, kv_quant_scheme="turboquant",
                                  quantized_kv_start=8, prefill_step_size=8):
            toks.append(int(t))
        print(json.dumps({"case": label, "ok": True, "tokens": toks}))
    except Exception as e:  # noqa: BLE001 - the failure is the finding
        print(json.dumps({"case": label, "ok": False, "tokens": toks, "error": type(e).__name__, "message": str(e).splitlines()[0]}))


def main() -> None:
    ck = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / ".cache" / "checkpoints"
    for fx in ("c3_e2b", "c4_e4b"):
        run(vlm_target(ck / fx / "f32"), f"{fx} (last non-shared layer full: donor skipped)")
    tcfg = json.loads((ck / "c4_e4b" / "f32" / "config.json").read_text())
    tcfg["layer_types"] = ["full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    run(model_from_text_config(tcfg), "c4_e4b with layer_types F,S,S | F,S,F (full donor = layer 0, converted)")


if __name__ == "__main__":
    main()
