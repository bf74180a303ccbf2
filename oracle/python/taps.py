"""The tap scheme (oracle/taps.json) expanded for one model call.

`expand(args, batch=B, length=L, cache=bool, step=bool)` returns the ordered tap names (without
the call prefix) that mlx-lm produces for that call; capture.py checks every recorded call
against it, and oracle/taps.ts implements the same expansion for the TS model. mlx-vlm's
language-model calls pass the keyword flags (ids / embed / embeds / pli_lookup / moe_batched);
`expand_media(...)` gives the taps of mlx-vlm's get_input_embeddings (the "embed/" call).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TAPS_JSON = Path(__file__).resolve().parents[1] / "taps.json"
_SPEC: dict | None = None


def spec() -> dict:
    global _SPEC
    if _SPEC is None:
        _SPEC = json.loads(TAPS_JSON.read_text())
    return _SPEC


def _get(args: Any, key: str, default=None):
    return args.get(key, default) if isinstance(args, dict) else getattr(args, key, default)


def layer_conditions(args: Any, i: int, *, batch: int, length: int, cache: bool, moe_batched: bool = True) -> set[str]:
    n = _get(args, "num_hidden_layers")
    shared = _get(args, "num_kv_shared_layers", 0) or 0
    lt = _get(args, "layer_types")[i]
    has_kv = i < n - shared
    conds: set[str] = set()
    conds.add("has_kv" if has_kv else "kv_shared")
    k_eq_v = bool(_get(args, "attention_k_eq_v", False)) and lt != "sliding_attention"
    if has_kv and not k_eq_v:
        conds.add("v_proj")
    if has_kv and cache:
        conds.add("cache")
    if _get(args, "enable_moe_block", False):
        conds.add("moe")
        if moe_batched:
            conds.add("moe_batched")
            if batch * length * _get(args, "top_k_experts") >= 64:
                conds.add("sorted")
    else:
        conds.add("dense")
    if _get(args, "hidden_size_per_layer_input", 0):
        conds.add("ple")
    return conds


def model_conditions(args: Any, *, step: bool, ids: bool = True, embed: bool = True, embeds: bool = False,
                     pli_lookup: bool = True) -> set[str]:
    conds: set[str] = {c for c, on in (("ids", ids), ("embed", embed), ("embeds", embeds), ("pli_lookup", pli_lookup)) if on}
    if _get(args, "hidden_size_per_layer_input", 0):
        conds.add("ple")
    if step:
        conds.add("step")
    return conds


def mask_types(args: Any) -> list[str]:
    seen: list[str] = []
    for t in _get(args, "layer_types"):
        if t not in seen:
            seen.append(t)
    return seen


def expand(args: Any, *, batch: int, length: int, cache: bool, step: bool, ids: bool = True, embed: bool = True,
           embeds: bool = False, pli_lookup: bool = True, moe_batched: bool = True) -> list[str]:
    entries = spec()["taps"]
    n = _get(args, "num_hidden_layers")
    mconds = model_conditions(args, step=step, ids=ids, embed=embed, embeds=embeds, pli_lookup=pli_lookup)
    out: list[str] = []
    idx = 0
    while idx < len(entries):
        e = entries[idx]
        if e["repeat"] == "layer":
            block = []
            while idx < len(entries) and entries[idx]["repeat"] == "layer":
                block.append(entries[idx])
                idx += 1
            for i in range(n):
                lconds = layer_conditions(args, i, batch=batch, length=length, cache=cache, moe_batched=moe_batched)
                for b in block:
                    if all(c in lconds for c in b["when"]):
                        out.append(b["name"].replace("{i}", str(i)))
            continue
        if e["repeat"] == "mask":
            for t in mask_types(args):
                out.append(e["name"].replace("{type}", t))
        elif all(c in mconds for c in e["when"]):
            out.append(e["name"])
        idx += 1
    return out


def observed_as_input() -> set[str]:
    """Template names whose value is recorded where it is consumed, not where it is made."""
    return {e["name"] for e in spec()["taps"] + spec()["media_taps"] if e["observed"] == "input"}


def media_conditions(text: Any, vision: Any, audio: Any, *, image: bool, with_audio: bool,
                     image_list: bool = False, unified: bool = False, video: bool = False) -> set[str]:
    """Conditions of one get_input_embeddings call (mlx-vlm's config objects or dicts).
    `unified`: a gemma4_unified model, whose images go through its encoder-free VisionEmbedder
    (condition "unified" instead of "image"). `video`: video frames through the vision tower, as
    one batch (condition "video"; not with images in the same call: the tower would run twice)."""
    if video and image:
        raise ValueError("the tap scheme covers an embed call with images or videos, not both")
    conds: set[str] = set()
    if _get(text, "hidden_size_per_layer_input", 0):
        conds.add("ple")
    if (image or video) and unified:
        conds.add("unified")
    elif image or video:
        conds.add("video" if video else "image")
        conds.add("tower")
        if not image_list:
            conds.add("image_batch")
        if _get(vision, "use_clipped_linears", False):
            conds.add("vision_clip")
    if with_audio and unified:
        conds.add("unified_audio")
    elif with_audio:
        conds.add("audio")
        if _get(audio, "use_clipped_linears", True):
            conds.add("audio_clip")
        if _get(audio, "output_proj_dims", 1536) is not None:
            conds.add("audio_proj")
    return conds


def expand_media(text: Any, vision: Any, audio: Any, *, image: bool, with_audio: bool,
                 image_list: bool = False, unified: bool = False, video: bool = False) -> list[str]:
    """Ordered tap names (without the "embed/" prefix) of one get_input_embeddings call."""
    conds = media_conditions(text, vision, audio, image=image, with_audio=with_audio, image_list=image_list,
                             unified=unified, video=video)
    layers = {"vision_layer": _get(vision, "num_hidden_layers", 0) if "image_batch" in conds else 0,
              "audio_layer": _get(audio, "num_hidden_layers", 0) if with_audio and not unified else 0}
    entries = spec()["media_taps"]
    out: list[str] = []
    idx = 0
    while idx < len(entries):
        e = entries[idx]
        if e["repeat"] in layers:
            block = []
            while idx < len(entries) and entries[idx]["repeat"] == e["repeat"]:
                block.append(entries[idx])
                idx += 1
            for i in range(layers[e["repeat"]]):
                out += [b["name"].replace("{i}", str(i)) for b in block if all(c in conds for c in b["when"])]
            continue
        if all(c in conds for c in e["when"]):
            out.append(e["name"])
        idx += 1
    if video and unified:
        # a gemma4_unified video: get_video_features runs the image path (the "unified" entries,
        # under their names); only its merge is the video one (taps.json's video_features and
        # merge/video names, at the unified merge's place)
        out = [{"image_features": "video_features", "merge/image": "merge/video"}.get(n, n) for n in out]
    return out
