"""The tiny multimodal Gemma 4 fixtures, built with mlx-vlm's own classes and save functions.

make_checkpoints.py builds these next to the text matrix (same seed, stamps, index.json), so
`setup` and `--only 'm2_e2b/*'` cover them like any other checkpoint. A fixture is
`fixtures/mm_configs/<name>.json`: a text fixture of `fixtures/configs/` (+ overrides), a
vision_config, an audio_config (or null) and the media token ids. The checkpoint is what
mlx_vlm.convert writes: `gemma4` config.json (sorted, audio_config null when there is no audio
tower) + model.safetensors + model.safetensors.index.json, all keys as mlx-vlm's Model names
them (language_model.model.*, vision_tower.*, embed_vision.*, audio_tower.*, embed_audio.*).

  variant  dtype / quantization                                          fixtures
  f32      float32                                                       m1_dense m2_e2b m3_moe
  bf16     bfloat16                                                      m1_dense m2_e2b (*)
  q4g64    affine 4-bit g64 from bf16, mlx_vlm.convert's predicate:      m2_e2b m3_moe
           every path with a multimodal module name (vision_tower,
           audio_tower, embed_vision, ...) stays unquantized; the router
           8-bit g64; modules whose input dims are not a multiple of 64 stay

(*) MoE unquantized only in float32 (MLX's CPU GatherMM), as in the text matrix.

The gemma4_unified fixtures (fixtures/unified_configs/, mlx-vlm's models/gemma4_unified classes:
encoder-free vision, `vision_embedder.*` + `embed_vision.*` + `embed_audio.*` keys) are built by
the same functions (UNIFIED_MATRIX below; ids u1_dense/f32 etc.). They are listed apart
(unified_matrix_ids) so that the gemma4 multimodal plan (server `plan`) stays as it is.

  f32      float32                                                       u1_dense u2_e2b
  bf16     bfloat16                                                      u1_dense
  q4g64    affine 4-bit g64 from bf16, the same convert predicate        u1_dense
           (vision_embedder and embed_vision stay unquantized; embed_audio is quantized)

Weights: every parameter seeded on its name (make_checkpoints._init_value), the text model's
keyed on its flat-layout name so it equals the text fixture's; ClippableLinear bounds are ±inf
(mlx-vlm's init) except under the fixture's `finite_clip_bounds` prefixes, where they are
seeded finite values so that the clips really cut.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from common import FIXTURES, atomic_replace_dir, load_fixture

MM_CONFIGS = FIXTURES / "mm_configs"
UNIFIED_CONFIGS = FIXTURES / "unified_configs"

# (variant, dtype, quant spec or None, fixtures)
MM_MATRIX: list[tuple[str, str, dict | None, list[str]]] = [
    ("f32", "float32", None, ["m1_dense", "m2_e2b", "m3_moe"]),
    ("bf16", "bfloat16", None, ["m1_dense", "m2_e2b"]),
    ("q4g64", "bfloat16", {"group_size": 64, "bits": 4, "mode": "affine"}, ["m2_e2b", "m3_moe"]),
]


UNIFIED_MATRIX: list[tuple[str, str, dict | None, list[str]]] = [
    ("f32", "float32", None, ["u1_dense", "u2_e2b"]),
    ("bf16", "bfloat16", None, ["u1_dense"]),
    ("q4g64", "bfloat16", {"group_size": 64, "bits": 4, "mode": "affine"}, ["u1_dense"]),
]


def mm_fixture_names() -> list[str]:
    return sorted(p.stem for p in MM_CONFIGS.glob("*.json"))


def unified_fixture_names() -> list[str]:
    return sorted(p.stem for p in UNIFIED_CONFIGS.glob("*.json"))


def _spec_file(name: str) -> Path:
    u = UNIFIED_CONFIGS / f"{name}.json"
    return u if u.exists() else MM_CONFIGS / f"{name}.json"


def mm_fixture_spec(name: str) -> dict:
    spec = json.loads(_spec_file(name).read_text())
    spec.pop("_comment", None)
    return spec


def mm_config(name: str) -> dict:
    """The gemma4 config.json dict of a multimodal fixture (as mlx_vlm.convert would write it)."""
    spec = mm_fixture_spec(name)
    text = load_fixture(spec["text"])
    text.update(spec.get("text_overrides", {}))
    cfg = {"model_type": spec.get("model_type", "gemma4"), "text_config": text, "vision_config": spec["vision_config"],
           "audio_config": spec["audio_config"], "vocab_size": text["vocab_size"]}
    cfg.update(spec["tokens"])
    return cfg


def mm_matrix_ids() -> list[tuple[str, str, str, str, dict | None]]:
    """[(id, fixture, variant, dtype, quant)] in build order."""
    out = []
    names = mm_fixture_names()
    for variant, dtype, quant, which in MM_MATRIX:
        for fx in names:
            if fx in which:
                out.append((f"{fx}/{variant}", fx, variant, dtype, quant))
    return out


def unified_matrix_ids() -> list[tuple[str, str, str, str, dict | None]]:
    """[(id, fixture, variant, dtype, quant)] of the gemma4_unified fixtures, in build order."""
    out = []
    names = unified_fixture_names()
    for variant, dtype, quant, which in UNIFIED_MATRIX:
        for fx in names:
            if fx in which:
                out.append((f"{fx}/{variant}", fx, variant, dtype, quant))
    return out


def all_mm_matrix_ids() -> list[tuple[str, str, str, str, dict | None]]:
    """Both multimodal matrices (the builder's view: make_checkpoints.py builds and indexes both)."""
    return mm_matrix_ids() + unified_matrix_ids()


def mm_stamp_inputs(fixture: str) -> list[bytes]:
    """Files whose bytes decide a multimodal checkpoint (besides the builders themselves)."""
    spec = mm_fixture_spec(fixture)
    return [_spec_file(fixture).read_bytes(), (FIXTURES / "configs" / f"{spec['text']}.json").read_bytes(),
            Path(__file__).read_bytes()]


def build_mm_model(fixture: str):
    full = mm_config(fixture)
    if full["model_type"] == "gemma4_unified":
        from mlx_vlm.models.gemma4_unified import AudioConfig, Model, ModelConfig, TextConfig, VisionConfig
    else:
        from mlx_vlm.models.gemma4 import AudioConfig, Model, ModelConfig, TextConfig, VisionConfig

    cfg = ModelConfig.from_dict(copy.deepcopy(full))
    cfg.text_config = TextConfig.from_dict(full["text_config"])
    cfg.vision_config = VisionConfig.from_dict(full["vision_config"])
    cfg.audio_config = AudioConfig.from_dict(full["audio_config"]) if full["audio_config"] is not None else None
    return Model(cfg), full


def init_mm_weights(model, fixture: str, seed: int) -> None:
    from make_checkpoints import _init_value, _param_rng

    finite = tuple(mm_fixture_spec(fixture).get("finite_clip_bounds", []))
    new = []
    for name, p in tree_flatten(model.parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("input_min", "input_max", "output_min", "output_max"):
            if not name.startswith(finite):
                new.append((name, p))  # mlx-vlm's ±inf: the clip is a no-op
                continue
            rng = _param_rng(seed, name)
            mag = rng.uniform(1.0, 2.0) if leaf.startswith("input") else rng.uniform(0.3, 0.8)
            new.append((name, mx.array(np.float32(-mag if leaf.endswith("min") else mag))))
            continue
        canonical = name[len("language_model."):] if name.startswith("language_model.") else name
        v = _init_value(seed, canonical, tuple(p.shape))
        if leaf == "std_scale" or (name.startswith("vision_embedder.") and "_ln" in name and leaf == "weight"):
            # non-trivial multipliers (the unified embedder's LayerNorm scales as well)
            v = _param_rng(seed, name).uniform(0.5, 1.5, size=p.shape).astype(np.float32)
        new.append((name, mx.array(v)))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def convert_quant_predicate(model):
    """mlx_vlm.convert's base_quant_predicate (a closure there): multimodal modules stay unquantized."""
    from mlx_vlm.utils import skip_multimodal_module

    model_quant_predicate = getattr(model, "quant_predicate", None)

    def predicate(path, module):
        if skip_multimodal_module(path):
            return False
        if model_quant_predicate is not None:
            return model_quant_predicate(path, module)
        return True

    return predicate


def build_mm_one(fixture: str, variant: str, dtype: str, quant: dict | None, out_root: Path, seed: int) -> Path:
    from make_checkpoints import cast_model
    from mlx_vlm.quant_utils import quantize_model
    from mlx_vlm.utils import save_config, save_weights

    final = out_root / fixture / variant
    tmp = out_root / fixture / f".tmp-{variant}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model, cfg = build_mm_model(fixture)
    init_mm_weights(model, fixture, seed)
    cast_model(model, dtype)
    if quant is not None:
        model, cfg = quantize_model(model, cfg, quant["group_size"], quant["bits"], mode=quant["mode"],
                                    quant_predicate=convert_quant_predicate(model))
        mx.eval(model.parameters())
    save_weights(tmp, model)
    save_config(json.loads(json.dumps(cfg)), tmp / "config.json")
    atomic_replace_dir(tmp, final)
    return final


def describe_mm(fixture: str, variant: str, dtype: str, quant: dict | None) -> dict:
    cfg = mm_config(fixture)
    feats = ["vision"]
    if cfg["audio_config"] is not None:
        feats.append("audio")
    unified = cfg["model_type"] == "gemma4_unified"  # its TextConfig defaults to "vision"
    if cfg["text_config"].get("use_bidirectional_attention", "vision" if unified else None) == "vision":
        feats.append("bidirectional_vision")
    for k, f in (("hidden_size_per_layer_input", "ple"), ("num_kv_shared_layers", "kv_shared"),
                 ("attention_k_eq_v", "k_eq_v"), ("enable_moe_block", "moe")):
        if cfg["text_config"].get(k):
            feats.append(f)
    if unified:
        feats.insert(0, "unified")
    return {"fixture": fixture, "variant": variant, "layout": "gemma4_multimodal", "dtype": dtype,
            "quantization": quant, "features": feats}
