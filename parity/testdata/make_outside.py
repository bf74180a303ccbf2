"""Random Gemma 4 checkpoints OUTSIDE the fixture set (other dimensions, seeded), saved with
mlx-lm's own classes and save functions through the oracle's checkpoint builder, in the three
layouts: flat gemma4_text, the gemma4 wrapper, and raw Hugging-Face keys. Used by the parity
command's tests (`--model` must report them bit-exact).

  python parity/testdata/make_outside.py OUT_DIR [--seed N]
Writes OUT_DIR/<name>/ for each entry of CHECKPOINTS and prints their names.
"""

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import make_checkpoints as mc  # noqa: E402


def random_config(rng: random.Random, moe: bool, ple: bool) -> dict:
    layers = 7 if ple else rng.choice([5, 7])  # the shared tail needs both types before it
    period = 5
    types = (["sliding_attention"] * (period - 1) + ["full_attention"]) * 2
    types = types[:layers]
    hidden = 128
    heads = rng.choice([2, 4])
    k_eq_v = moe or rng.random() < 0.5
    cfg = {
        "model_type": "gemma4_text",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": rng.choice([192, 256]),
        "num_attention_heads": heads,
        "num_key_value_heads": rng.choice([1, 2]) if heads == 4 else 1,
        "num_global_key_value_heads": 1 if k_eq_v else None,
        "attention_k_eq_v": k_eq_v,
        "head_dim": 32,
        "global_head_dim": 64,
        "rms_norm_eps": 1e-6,
        "vocab_size": 512,
        "vocab_size_per_layer_input": 512,
        "sliding_window": rng.choice([12, 16]),
        "max_position_embeddings": 2048,
        "layer_types": types,
        "final_logit_softcapping": rng.choice([30.0, 50.0]),
        "tie_word_embeddings": True,
        "num_kv_shared_layers": 2 if ple else 0,
        "hidden_size_per_layer_input": 16 if ple else 0,
        "use_double_wide_mlp": ple,
        "enable_moe_block": moe,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
            "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 1e4, "rope_type": "default"},
        },
    }
    if moe:
        cfg.update(num_experts=4, top_k_experts=2, moe_intermediate_size=64)
    return {k: v for k, v in cfg.items() if v is not None}


# name -> (layout, dtype, quantization, moe, ple)
CHECKPOINTS = {
    "outside_flat_bf16": ("flat", "bfloat16", None, False, False),
    "outside_wrap_q4g64": ("wrap", "bfloat16", {"group_size": 64, "bits": 4, "mode": "affine"}, False, True),
    "outside_hf_f32_moe": ("hf", "float32", None, True, False),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=20261130)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    for name, (layout, dtype, quant, moe, ple) in CHECKPOINTS.items():
        cfg = random_config(rng, moe, ple)
        # The builder reads fixture configs by name; serve it this random one instead.
        mc.text_config = lambda _fixture, cfg=cfg: dict(cfg)
        mc.load_fixture = lambda _fixture, cfg=cfg: dict(cfg)
        mc.build_one(name, name, "ckpt", layout, dtype, quant, args.out, args.seed)
        final = args.out / name / "ckpt"
        target = args.out / name
        for p in final.iterdir():
            p.rename(target / p.name)
        final.rmdir()
        print(name, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
