"""The quality model of the KV-quantization bench: E2B's attention layout at a narrow width.

make_checkpoints.py's E2B shape (head dims 256 sliding / 512 full, 8 query heads, 1 KV head,
sliding window 512, period 5: four sliding layers then one full) with hidden 256, MLP 1024,
per-layer inputs 64, vocabulary 4096, 11 layers and no KV sharing (so both full-attention layers,
4 and 9, are converted by TurboQuant and the last cache, layer 10, is sliding), random weights,
4-bit g64 as every bench shape. Narrow so that 1,000+ decode steps per scheme fit a 2-core CPU;
the attention (what a quantized cache changes) keeps the real head shapes.

Usage: make_narrow.py OUT [--dtype bfloat16|float32]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import make_checkpoints as mc  # noqa: E402

NARROW = dict(hidden_size=256, intermediate_size=1024, hidden_size_per_layer_input=64, vocab_size=4096,
              vocab_size_per_layer_input=4096, num_kv_shared_layers=0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--layers", type=int, default=11)
    a = ap.parse_args()
    real = mc.shape_config
    mc.shape_config = lambda shape, layers: {**real(shape, layers), **NARROW}
    mc.build_shape("e2b", a.layers, a.out, mc.DEFAULT_SEED, a.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
