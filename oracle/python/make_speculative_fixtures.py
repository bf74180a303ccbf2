#!/usr/bin/env python
"""Checkpoints for the speculative-decoding suites, built from the fixture checkpoints with the
oracles' own classes into `.cache/checkpoints/speculative/<name>/` (seeded, rebuilt only when
this file or a source checkpoint changes):

  <fx>_w64             the f32 fixture with sliding_window 64 (same weights): every cache stays
                       inside its window in short runs, where mlx-lm's speculative decoding is right
  <fx>_draft           a draft model for <fx>: its f32 weights + 0.002 * N(0, 1) (seeded), so the
                       target accepts some drafts and rejects others
  <fx>_w64_draft       the same draft with sliding_window 64
  c1_dense_vocab128    a draft whose vocabulary differs (bad-input test)
  tiny, tiny_draft     a 2-layer model (one sliding, one full layer; hidden 32, vocab 64) and its
                       perturbed draft, for the seeded properties (fast enough for hundreds of runs)
  <fx>_assistant       a gemma4_assistant MTP drafter for <fx> (mlx-vlm's Gemma4AssistantDraftModel,
                       saved with mlx-vlm's save_weights / save_config); see build_assistant
  c3_e2b_assistant_ordered   the same with the centroid-routed head (use_ordered_embeddings)
  c1_dense_unified_assistant the c1_dense assistant as a gemma4_unified_assistant (mlx-vlm's package of
                       that name: the same Gemma4AssistantDraftModel under its own model_type)
  <fx>_dflash          a gemma4_dflash drafter for <fx> (mlx-vlm's Gemma4DFlashDraftModel, saved with
                       mlx-vlm's save_weights / save_config; model_type "gemma4" + dflash_config, the
                       mask token left to Gemma4DFlashConfig's default 4); see build_dflash
  <fx>_dspark          a gemma4_dspark drafter for <fx> (mlx-vlm's Gemma4DSparkDraftModel: model_type
                       gemma4_text + the Gemma4DSparkModel architecture); see build_dspark

fx in c1_dense (dense), c3_e2b (E2B-like: per-layer inputs, KV sharing), c5_moe (MoE, k_eq_v).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from common import DEFAULT_CKPT_ROOT, atomic_replace_dir  # noqa: E402
from make_checkpoints import _init_value, _param_rng  # noqa: E402

OUT = DEFAULT_CKPT_ROOT / "speculative"
TARGETS = ["c1_dense", "c3_e2b", "c5_moe"]
SEED = 11
PERTURB = 0.002


def source(fx: str) -> Path:
    return DEFAULT_CKPT_ROOT / fx / "f32"


def stamp(name: str, fx: str) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update((source(fx) / ".stamp").read_bytes())
    h.update(f"{name}|{mx.__version__}".encode())
    return h.hexdigest()


def write_dir(name: str, fx: str, build) -> bool:
    final = OUT / name
    want = stamp(name, fx)
    if (final / ".stamp").exists() and (final / ".stamp").read_text() == want:
        return False
    tmp = OUT / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    build(tmp)
    (tmp / ".stamp").write_text(want)
    atomic_replace_dir(tmp, final)
    return True


def text_variant(fx: str, *, window: int | None = None, perturb: float = 0.0, vocab: int | None = None):
    """A copy of the fixture's f32 checkpoint with config changes and/or perturbed weights."""

    def build(tmp: Path) -> None:
        cfg = json.loads((source(fx) / "config.json").read_text())
        weights = mx.load(str(source(fx) / "model.safetensors"))
        if window is not None:
            cfg["sliding_window"] = window
        if perturb:
            for k in sorted(weights):
                rng = _param_rng(SEED, f"perturb:{k}")
                noise = rng.standard_normal(weights[k].shape).astype(np.float32)
                weights[k] = weights[k] + mx.array(noise) * perturb
        if vocab is not None:
            cfg["vocab_size"] = cfg["vocab_size_per_layer_input"] = vocab
            for k in sorted(weights):
                if "embed_tokens" in k:
                    weights[k] = weights[k][:vocab]
        mx.save_safetensors(str(tmp / "model.safetensors"), dict(sorted(weights.items())), metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=4, sort_keys=True) + "\n")

    return build


def seeded_weights(model, tag: str, shape=lambda name, v, p: v) -> None:
    """Every parameter of `model` seeded (make_checkpoints' _init_value under "<tag>:<name>"), then
    passed through shape(name, value, parameter); set on the model and evaluated."""
    new = []
    for name, p in tree_flatten(model.parameters()):
        v = mx.array(_init_value(SEED, f"{tag}:{name}", tuple(p.shape)))
        new.append((name, shape(name, v, p)))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def save_vlm(tmp: Path, model, cfg: dict) -> None:
    """mlx-vlm's own save_weights and save_config."""
    from mlx_vlm.utils import save_config, save_weights

    save_weights(tmp, model)
    save_config(cfg, tmp / "config.json")


def mask_direction(fx: str, tag: str, cfg: dict, mask_token_id: int):
    """The target's embedding table and the unit direction of the mask token's embedding as layer
    0 of the drafter sees it (scaled by sqrt(H), RMS-normed with that layer's seeded input norm)."""
    H = cfg["hidden_size"]
    emb = mx.load(str(source(fx) / "model.safetensors"))["model.embed_tokens.weight"]
    ln0 = mx.array(_init_value(SEED, f"{tag}:layers.0.input_layernorm.weight", (H,)))
    xm = mx.fast.rms_norm(emb[mask_token_id] * (H ** 0.5), ln0, cfg["rms_norm_eps"])
    return emb, xm / mx.sqrt(mx.sum(xm * xm))


TINY = dict(model_type="gemma4_text", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
            layer_types=["sliding_attention", "full_attention"], sliding_window=8, vocab_size=64,
            vocab_size_per_layer_input=64, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
            final_logit_softcapping=30.0, tie_word_embeddings=True, use_double_wide_mlp=False,
            rms_norm_eps=1e-6, max_position_embeddings=4096,
            rope_parameters={"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
                             "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 1e4, "rope_type": "default"}})


def tiny_model(perturb: float):
    """The 2-layer property model, built with mlx-lm's classes and seeded weights."""

    def build(tmp: Path) -> None:
        from mlx_lm.models import gemma4_text
        from mlx_lm.utils import save_config, save_model

        model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(TINY))

        def shape(name, v, p):
            if perturb:
                v = v + mx.array(_param_rng(SEED, f"tiny-perturb:{name}").standard_normal(p.shape).astype(np.float32)) * perturb
            return v

        seeded_weights(model, "tiny", shape)
        save_model(tmp, model)
        save_config(dict(TINY), tmp / "config.json")

    return build


def assistant_config(fx: str, ordered: bool, model_type: str = "gemma4_assistant") -> dict:
    t = json.loads((source(fx) / "config.json").read_text())
    text = dict(
        model_type="gemma4_text", hidden_size=t["hidden_size"], num_hidden_layers=2, intermediate_size=64,
        num_attention_heads=4, head_dim=t["head_dim"], global_head_dim=t["global_head_dim"],
        num_key_value_heads=t["num_key_value_heads"], layer_types=["sliding_attention", "full_attention"],
        sliding_window=t["sliding_window"], rope_parameters=t["rope_parameters"], vocab_size=t["vocab_size"],
        vocab_size_per_layer_input=t["vocab_size"], hidden_size_per_layer_input=0, num_kv_shared_layers=0,
        rms_norm_eps=1e-6, use_double_wide_mlp=False, enable_moe_block=False, attention_k_eq_v=False,
        final_logit_softcapping=None, tie_word_embeddings=True,
    )
    cfg = dict(model_type=model_type, backbone_hidden_size=t["hidden_size"], block_size=4,
               tie_word_embeddings=True, use_ordered_embeddings=ordered, text_config=text)
    if ordered:
        cfg.update(num_centroids=16, centroid_intermediate_top_k=8)
    return cfg


def build_assistant(fx: str, ordered: bool, model_type: str = "gemma4_assistant"):
    """A gemma4_assistant drafter built with mlx-vlm's classes.

    Random seeded weights give a drafter that the target (almost) never agrees with, so the
    weights are shaped into a "repeat the last token" drafter instead: its embedding table is the
    target's, pre_projection passes the (scaled) target embedding of the bonus token through, and
    the post-attention / post-feed-forward norms are small, so the layers (attention over the
    target's K/V, MLP) perturb rather than dominate. The target accepts its drafts wherever
    greedy decoding repeats a token and rejects them elsewhere: both kinds of rounds occur.
    """

    def build(tmp: Path) -> None:
        import importlib

        pkg = importlib.import_module(f"mlx_vlm.speculative.drafters.{model_type}")
        cfg = assistant_config(fx, ordered, model_type)
        model = pkg.Model(pkg.ModelConfig.from_dict(json.loads(json.dumps(cfg))))
        target = mx.load(str(source(fx) / "model.safetensors"))
        H = cfg["backbone_hidden_size"]

        def shape(name, v, p):
            if name == "model.embed_tokens.weight":
                return target["model.embed_tokens.weight"]
            if name == "pre_projection.weight":
                return mx.concatenate([mx.eye(H) * 4.0, v[:, H:]], axis=1)
            if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
                return v * 0.1
            if name == "masked_embedding.token_ordering":
                return mx.array(_param_rng(SEED, "token_ordering").permutation(p.shape[0]).astype(np.int32))
            return v

        seeded_weights(model, "assistant", shape)
        save_vlm(tmp, model, cfg)

    return build


def block_drafter_config(fx: str, **own) -> dict:
    """The 2-layer block drafter both DFlash-loop kinds share (hidden size and vocabulary of the
    target, 4 heads, window 4, target layers 1, n/2 and n-1), with each kind's own keys on top
    (mlx-vlm's save_config sorts the keys, so their order does not reach the file)."""
    t = json.loads((source(fx) / "config.json").read_text())
    n = t["num_hidden_layers"]
    base = dict(hidden_size=t["hidden_size"], intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, head_dim=t["hidden_size"] // 4, rms_norm_eps=1e-6, vocab_size=t["vocab_size"],
                max_position_embeddings=4096, sliding_window=4, dflash_config={"target_layer_ids": [1, n // 2, n - 1]})
    dflash = {**base["dflash_config"], **own.pop("dflash_config", {})}
    return {**base, **own, "dflash_config": dflash}


def dflash_config(fx: str) -> dict:
    return block_drafter_config(fx, model_type="gemma4", architectures=["DFlashDraftModel"], rope_theta=10000.0,
                                tie_word_embeddings=True, block_size=6, layer_types=["sliding_attention", "full_attention"])


def build_dflash(fx: str):
    """A gemma4_dflash drafter built with mlx-vlm's classes (it binds the target's embedding).

    Seeded weights are shaped into a "repeat the bonus token" drafter, so that rounds with
    accepted and with rejected drafts both occur: layer 0's queries are damped (q_norm x 0.01:
    near-uniform attention), its value projection removes the mask token's (normed) embedding
    direction and its output projection is 30 x identity, so the mask positions take the bonus
    token's embedding from position 0 of the block; the target context (hidden_norm x 0.05) and
    the other layers (o_proj, down_proj x 0.1) perturb the logits without dominating them.
    """

    def build(tmp: Path) -> None:
        from mlx_vlm.speculative.drafters.gemma4_dflash import Gemma4DFlashConfig, Gemma4DFlashDraftModel

        cfg = dflash_config(fx)
        model = Gemma4DFlashDraftModel(Gemma4DFlashConfig.from_dict(json.loads(json.dumps(cfg))))
        H = cfg["hidden_size"]
        _, u = mask_direction(fx, "dflash", cfg, model.config.mask_token_id)

        def shape(name, v, p):
            if name == "layers.0.self_attn.v_proj.weight":
                return mx.eye(H) - u[:, None] * u[None, :]
            if name == "layers.0.self_attn.o_proj.weight":
                return mx.eye(H) * 30.0
            if name == "layers.0.self_attn.q_norm.weight":
                return v * 0.01
            if name == "hidden_norm.weight":
                return v * 0.05
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                return v * 0.1
            return v

        seeded_weights(model, "dflash", shape)
        save_vlm(tmp, model, cfg)

    return build


def dspark_config(fx: str) -> dict:
    t = json.loads((source(fx) / "config.json").read_text())
    return block_drafter_config(fx, model_type="gemma4_text", architectures=["Gemma4DSparkModel"],
                                global_head_dim=t["hidden_size"] // 4, num_global_key_value_heads=4, attention_k_eq_v=False,
                                layer_types=["full_attention", "sliding_attention"], final_logit_softcapping=30.0,
                                rope_parameters=t["rope_parameters"],
                                dflash_config={"num_target_layers": t["num_hidden_layers"], "mask_token_id": 4,
                                               "block_size": 5, "markov_rank": 8})


def build_dspark(fx: str):
    """A gemma4_dspark drafter built with mlx-vlm's Gemma4DSparkDraftModel (own untied embed_tokens
    and lm_head: both the target's embedding here; attention_k_eq_v off, see below).

    Shaped like build_dflash's "repeat the bonus" drafter: layer 0's queries damped, its value
    projection without the mask token's direction, an identity output projection whose (normed)
    output post_attention_layernorm scales by 3; the context and layer 1 perturb; the Markov head
    (x 12: a correction of std ~1 against a top-logit gap of ~2) changes some drafts.
    attention_k_eq_v (Gemma4DsparkConfig's default) is off because mlx-vlm 0.7.10 fails on it at the
    first draft (DFlashDraftModel._project_context_kv reads the v_proj the attention leaves out).
    """

    def build(tmp: Path) -> None:
        from mlx_vlm.speculative.drafters.gemma4_dspark import Gemma4DsparkConfig, Gemma4DSparkDraftModel

        cfg = dspark_config(fx)
        model = Gemma4DSparkDraftModel(Gemma4DsparkConfig.from_dict(json.loads(json.dumps(cfg))))
        H = cfg["hidden_size"]
        emb, u = mask_direction(fx, "dspark", cfg, model.config.mask_token_id)

        def shape(name, v, p):
            if name in ("embed_tokens.weight", "lm_head.weight"):
                return emb
            if name.endswith("layer_scalar"):
                return mx.ones(p.shape)
            if name == "layers.0.self_attn.v_proj.weight":
                return mx.eye(H) - u[:, None] * u[None, :]
            if name == "layers.0.self_attn.o_proj.weight":
                return mx.eye(H)
            if name == "layers.0.self_attn.q_norm.weight":
                return v * 0.01
            if name == "layers.0.post_attention_layernorm.weight":
                return mx.full(p.shape, 3.0)
            if name == "hidden_norm.weight":
                return v * 0.05
            if name.endswith("post_feedforward_layernorm.weight") or name == "layers.1.post_attention_layernorm.weight":
                return v * 0.1
            if name.startswith("markov_head."):
                return v * 12.0  # a correction of std ~1 (the seeded init gives ~7e-3): it changes some drafts
            return v

        seeded_weights(model, "dspark", shape)
        save_vlm(tmp, model, cfg)

    return build


def plan() -> list[tuple[str, str, object]]:
    out: list[tuple[str, str, object]] = []
    for fx in TARGETS:
        out.append((f"{fx}_w64", fx, text_variant(fx, window=64)))
        out.append((f"{fx}_draft", fx, text_variant(fx, perturb=PERTURB)))
        out.append((f"{fx}_w64_draft", fx, text_variant(fx, window=64, perturb=PERTURB)))
        out.append((f"{fx}_assistant", fx, build_assistant(fx, ordered=False)))
        out.append((f"{fx}_dflash", fx, build_dflash(fx)))
        out.append((f"{fx}_dspark", fx, build_dspark(fx)))
    out.append(("c3_e2b_assistant_ordered", "c3_e2b", build_assistant("c3_e2b", ordered=True)))
    out.append(("c1_dense_unified_assistant", "c1_dense", build_assistant("c1_dense", False, "gemma4_unified_assistant")))
    out.append(("c1_dense_vocab128", "c1_dense", text_variant("c1_dense", perturb=PERTURB, vocab=128)))
    out.append(("tiny", "c1_dense", tiny_model(0.0)))
    out.append(("tiny_draft", "c1_dense", tiny_model(0.01)))
    return out


def main() -> int:
    t0 = time.time()
    built = 0
    for name, fx, build in plan():
        if not (source(fx) / ".stamp").exists():
            print(f"{name}: source checkpoint {source(fx)} missing (run make_checkpoints.py first)", file=sys.stderr)
            return 2
        if write_dir(name, fx, build):
            built += 1
            print(f"{name}: built", flush=True)
    print(f"{built} speculative fixtures built in {time.time() - t0:.1f}s -> {OUT}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
