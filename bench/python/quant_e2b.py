#!/usr/bin/env python
"""A full-width random E2B (fewer layers) and its quantizations, for bench/quant_score.ts.

The source is built exactly as make_checkpoints.py --shape e2b builds a bench checkpoint (same
config from shape_config, MLX's default random init under mx.random.seed(seed), cast to --dtype),
but saved unquantized: <out>/bf16 or <out>/f32. Each variant is that same source quantized with
mlx-lm's own quantize_model and the model's own predicate, as the fixtures are (q4g64, q4g32,
q8g64 affine, scales in the source's dtype; mxfp4 g32 from bfloat16 only, see SKIP): <out>/<variant>. A stamp file skips
an up-to-date build.

  quant_e2b.py --out DIR [--layers N] [--seed S] [--dtype bfloat16|float32]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import shutil
import sys
from pathlib import Path

ORACLE_PY = Path(__file__).resolve().parents[2] / "oracle" / "python"
sys.path.insert(0, str(ORACLE_PY))

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten, tree_map, tree_unflatten  # noqa: E402
from mlx_lm.models import gemma4_text  # noqa: E402
from mlx_lm.utils import quantize_model, save_config, save_model  # noqa: E402

import make_checkpoints as mkc  # noqa: E402
from common import atomic_replace_dir  # noqa: E402

VARIANTS = {
    "q4g64": {"group_size": 64, "bits": 4, "mode": "affine"},
    "q4g32": {"group_size": 32, "bits": 4, "mode": "affine"},
    "q8g64": {"group_size": 64, "bits": 8, "mode": "affine"},
    "mxfp4": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
}


SOURCE_NAME = {"bfloat16": "bf16", "float32": "f32"}

# libmlx's CPU mxfp4 quantize of a float32 matrix peaks at about 17x its input (65,536 x 1,536:
# 7 GB measured); the E2B's 262,144-row embeddings then exhaust a 23 GB machine (the process was
# killed, then segfaulted). mxfp4 is built from the bfloat16 source only.
SKIP = {"float32": {"mxfp4"}}


def variants(dtype: str) -> dict[str, dict]:
    return {k: v for k, v in VARIANTS.items() if k not in SKIP.get(dtype, set())}


def stamp_of(layers: int, seed: int, dtype: str) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(Path(mkc.__file__).read_bytes())
    h.update(f"{layers}:{seed}:{dtype}:{mx.__version__}".encode())
    return h.hexdigest()


def save(out: Path, name: str, model, cfg: dict) -> None:
    tmp = out / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    save_model(tmp, model)
    save_config(cfg, tmp / "config.json")
    atomic_replace_dir(tmp, out / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quant_e2b.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=mkc.DEFAULT_SEED)
    ap.add_argument("--dtype", choices=sorted(SOURCE_NAME), default="bfloat16")
    a = ap.parse_args(argv)
    out: Path = a.out.resolve()
    src_name = SOURCE_NAME[a.dtype]
    stamp = stamp_of(a.layers, a.seed, a.dtype)
    if (out / ".stamp").exists() and (out / ".stamp").read_text() == stamp and all((out / v).is_dir() for v in [src_name, *variants(a.dtype)]):
        print(f"[quant_e2b] {out}: up to date", flush=True)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / ".stamp").unlink(missing_ok=True)
    cfg = mkc.shape_config("e2b", a.layers)
    args = gemma4_text.ModelArgs.from_dict(cfg)
    print(f"[quant_e2b] e2b: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"shared {cfg['num_kv_shared_layers']}, {a.dtype} -> {out}", flush=True)
    # as make_checkpoints.build_shape: MLX's default init under the seed, cast to the dtype
    mx.random.seed(a.seed)
    model = gemma4_text.Model(args)
    dt = getattr(mx, a.dtype)
    model.update(tree_map(lambda v: v.astype(dt), model.parameters()))
    mx.eval(model.parameters())
    source = tree_flatten(model.parameters())
    del model
    # each checkpoint written is stamped, so a run killed part way (memory) resumes after it
    done = lambda name: (out / f".stamp-{name}").exists() and (out / f".stamp-{name}").read_text() == stamp and (out / name).is_dir()  # noqa: E731
    if not done(src_name):
        m = gemma4_text.Model(args)
        m.update(tree_unflatten(source))
        save(out, src_name, m, cfg)
        (out / f".stamp-{src_name}").write_text(stamp)
        print(f"[quant_e2b] {src_name} saved", flush=True)
    for name in SKIP.get(a.dtype, ()):
        print(f"[quant_e2b] {name}: not built from a {a.dtype} source (libmlx's CPU quantize needs too much memory)", flush=True)
    for name, q in variants(a.dtype).items():
        if done(name):
            print(f"[quant_e2b] {name}: up to date", flush=True)
            continue
        m = gemma4_text.Model(args)
        m.update(tree_unflatten(source))
        _, qcfg = quantize_model(m, json.loads(json.dumps(cfg)), q["group_size"], q["bits"], mode=q["mode"])
        # one parameter at a time: evaluated all at once, mxfp4 of the float32 source took over
        # 15 GB (the 262,144-row embeddings' temporaries side by side)
        for _, v in tree_flatten(m.parameters()):
            mx.eval(v)
            mx.clear_cache()
        save(out, name, m, qcfg)
        (out / f".stamp-{name}").write_text(stamp)
        print(f"[quant_e2b] {name} saved", flush=True)
        del m
        gc.collect()
        mx.clear_cache()
    (out / ".stamp").write_text(stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
