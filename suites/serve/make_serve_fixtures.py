"""Fixtures for suites/serve/adapters_draft.test.ts, built with mlx-lm's own functions from the
tokenizer fixture (a tiny bfloat16 Gemma 4 over a real Gemma tokenizer,
oracle/python/make_checkpoints.py), into OUT/ (rebuilt when this file or the source changes):

  OUT/w64        the tokenizer fixture with sliding_window 64 (same weights, tokenizer copied):
                 short requests stay inside every window, where mlx-lm's speculative decoding
                 rewinds its caches correctly (see oracle/python/make_speculative_fixtures.py)
  OUT/w64_draft  a draft for it: every float weight + 0.002 * N(0, 1) (seeded), cast back, so that
                 the target accepts some drafts and rejects others (OUT/draft_stats.json counts
                 both, from mlx-lm's speculative_generate_step on a greedy run)
  OUT/adapter    LoRA adapters for OUT/w64 (mlx-lm's linear_to_lora_layers on both layers, rank
                 4, scale 2; lora_b drawn at 0.01 * N(0, 1) so that the adapters change the
                 output; saved as mlx-lm's trainer saves them: adapters.safetensors of the
                 trainable parameters, adapter_config.json)

usage: python make_serve_fixtures.py SOURCE_FIXTURE OUT
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import device_env  # noqa: F401,E402

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.generate import speculative_generate_step  # noqa: E402
from mlx_lm.tuner.utils import linear_to_lora_layers  # noqa: E402
from mlx_lm.utils import load  # noqa: E402

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]
LORA = {"rank": 4, "scale": 2.0, "dropout": 0.0}


def stamp_of(src: Path) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    for f in ["config.json", "model.safetensors", *TOKENIZER_FILES]:
        p = src / f
        h.update(f.encode())
        h.update(str(p.stat().st_size if p.exists() else -1).encode())
        h.update(str(int(p.stat().st_mtime) if p.exists() else -1).encode())
    return h.hexdigest()


def write_checkpoint(src: Path, dst: Path, weights: dict) -> None:
    dst.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg["sliding_window"] = 64
    (dst / "config.json").write_text(json.dumps(cfg, indent=4))
    for f in TOKENIZER_FILES:
        shutil.copy(src / f, dst / f)
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "mlx"})


def main() -> int:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    stamp = stamp_of(src)
    if (out / "stamp").exists() and (out / "stamp").read_text() == stamp:
        print(f"fixtures up to date in {out}")
        return 0
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    weights = mx.load(str(src / "model.safetensors"))
    write_checkpoint(src, out / "w64", weights)

    mx.random.seed(20261202)
    noisy = {}
    for name, w in sorted(weights.items()):
        if mx.issubdtype(w.dtype, mx.floating):
            n = mx.random.normal(w.shape)
            w = (w.astype(mx.float32) + 0.002 * n).astype(w.dtype)
        noisy[name] = w
    write_checkpoint(src, out / "w64_draft", noisy)

    model, _ = load(str(out / "w64"))
    model.freeze()
    linear_to_lora_layers(model, 2, LORA)
    mx.random.seed(7)
    params = dict(tree_flatten(model.trainable_parameters()))
    updated = {k: (0.01 * mx.random.normal(v.shape)).astype(v.dtype) if k.endswith("lora_b") else v for k, v in params.items()}
    (out / "adapter").mkdir()
    mx.save_safetensors(str(out / "adapter" / "adapters.safetensors"), updated)
    (out / "adapter" / "adapter_config.json").write_text(
        json.dumps({"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": LORA}, indent=4)
    )

    # the draft is useful only if the target both accepts and rejects its tokens
    target, tok = load(str(out / "w64"))
    draft, _ = load(str(out / "w64_draft"))
    prompt = mx.array(tok.encode("The quick brown fox jumps over the lazy dog"))
    accepted = rejected = 0
    for _, (token, _, from_draft) in zip(range(24), speculative_generate_step(prompt, target, draft, num_draft_tokens=3)):
        accepted += bool(from_draft)
        rejected += not from_draft
    (out / "draft_stats.json").write_text(json.dumps({"tokens": accepted + rejected, "from_draft": accepted, "from_target": rejected}))
    (out / "stamp").write_text(stamp)
    print(f"fixtures written to {out}: draft tokens accepted {accepted}, target tokens {rejected}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
