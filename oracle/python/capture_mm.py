#!/usr/bin/env python
"""Record every tap of oracle/taps.json while mlx-vlm itself runs multimodal Gemma 4.

The same run-time wrapping as capture.py (nothing in mlx-vlm is edited; every wrapper is
restored on exit), for mlx-vlm's classes: the vision tower, the audio tower, the multimodal
embedders, masked_scatter, and mlx-vlm's own language model (language.py), caches and
generate_step. Calls:
  "embed/"       Model.get_input_embeddings (taps.json "media_taps")
  ""             the language model of a single forward (Model.__call__)
  "prefill{k}/"  the chunk calls of mlx_vlm.generate.generate_step (taps.json "taps")
  "step{n}/"     its _step calls
The media inputs are built here (fixtures/mm_scenarios.json: seeded images through mlx-vlm's
Gemma4ImageProcessor, seeded waveforms through Gemma4AudioFeatureExtractor); they are taps of
the embed call (pixel_values, input_features, input_mask), so a TS run reads them from the
capture or the golden.

  capture_mm.py CHECKPOINT_DIR SCENARIO_ID [--mode full|logits]
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

import capture as cap  # noqa: E402
import taps as tapspec  # noqa: E402
from common import FIXTURES  # noqa: E402

MM_SCENARIOS = FIXTURES / "mm_scenarios.json"
SAMPLE_RATE = 16000


def _vlm():
    """mlx-vlm's modules, imported on first use (the server starts without them)."""
    from mlx_vlm.models import base as vbase
    from mlx_vlm.models import cache as vcache
    from mlx_vlm.models import switch_layers as vswitch
    from mlx_vlm.models.gemma4 import audio as vaudio
    from mlx_vlm.models.gemma4 import gemma4 as vgemma4
    from mlx_vlm.models.gemma4 import language as vlang
    from mlx_vlm.models.gemma4 import vision as vvision
    from mlx_vlm.models.gemma4_unified import gemma4_unified as vunified

    return SimpleNamespace(base=vbase, cache=vcache, switch=vswitch, audio=vaudio, gemma4=vgemma4, lang=vlang,
                           vision=vvision, unified=vunified, generate=importlib.import_module("mlx_vlm.generate"))


# -------------------------------------------------------------------- scenarios and media

def load_mm_scenarios() -> dict:
    return json.loads(MM_SCENARIOS.read_text())


def mm_scenario(sid: str) -> dict:
    for s in load_mm_scenarios()["scenarios"]:
        if s["id"] == sid:
            return s
    raise KeyError(f"unknown multimodal scenario {sid!r}")


def pattern_image(seed: int, height: int, width: int) -> np.ndarray:
    """The fixture image: uint8 (H, W, 3) from a 32-bit integer hash of (seed, y, x, c), so that
    the TS suites rebuild the same pixels without storing them (suites/multimodal/media.ts)."""
    y, x, c = np.meshgrid(np.arange(height, dtype=np.uint64), np.arange(width, dtype=np.uint64),
                          np.arange(3, dtype=np.uint64), indexing="ij")
    m = np.uint64(0xFFFFFFFF)
    v = (np.uint64(seed) * np.uint64(0x9E3779B1) + y * np.uint64(0x85EBCA77) + x * np.uint64(0xC2B2AE3D)
         + c * np.uint64(0x27D4EB2F)) & m
    v ^= v >> np.uint64(15)
    v = (v * np.uint64(0x2C1B3C6D)) & m
    v ^= v >> np.uint64(12)
    v = (v * np.uint64(0x297A2D39)) & m
    v ^= v >> np.uint64(15)
    return (v >> np.uint64(24)).astype(np.uint8)


def pattern_wave(seed: int, samples: int) -> np.ndarray:
    """A gemma4_unified fixture waveform: float32 in [-0.5, 0.5) from the same 32-bit integer hash
    as pattern_image over (seed, i) (channel 0), exact in float32, so the TS side rebuilds it."""
    i = np.arange(samples, dtype=np.uint64)
    m = np.uint64(0xFFFFFFFF)
    v = (np.uint64(seed) * np.uint64(0x9E3779B1) + i * np.uint64(0xC2B2AE3D)) & m
    v ^= v >> np.uint64(15)
    v = (v * np.uint64(0x2C1B3C6D)) & m
    v ^= v >> np.uint64(12)
    v = (v * np.uint64(0x297A2D39)) & m
    v ^= v >> np.uint64(15)
    return ((v >> np.uint64(8)).astype(np.float32) / np.float32(2 ** 24) - np.float32(0.5)).astype(np.float32)


def file_processor(model_dir: str | Path | None) -> SimpleNamespace:
    """The image processor, feature extractor and audio token counts that mlx-vlm's
    `load_processor(model_dir)` builds (`Gemma4Processor.from_pretrained`, which reads
    processor_config.json / preprocessor_config.json). A checkpoint without a tokenizer (the
    fixtures) runs the same from_pretrained body with the tokenizer stubbed out, so that the
    config files are still read by mlx-vlm's own code; no directory at all: the defaults."""
    from mlx_vlm.models.gemma4 import processing_gemma4 as pg

    if model_dir is not None:
        try:
            import media

            p = media.processor(str(model_dir))
            return SimpleNamespace(image=p.image_processor, audio=p.feature_extractor,
                                   ms=p.audio_ms_per_token, seq=p.audio_seq_length)
        except Exception:  # noqa: BLE001 - no tokenizer: the body below, tokenizer-free
            pass
    import transformers

    got: dict[str, Any] = {}

    class Capture:
        def __init__(self, **kw):
            got.update(kw)

    saved = (transformers.AutoTokenizer.from_pretrained, pg.load_chat_template)
    transformers.AutoTokenizer.from_pretrained = lambda *a, **k: SimpleNamespace(chat_template=None)
    pg.load_chat_template = lambda *a, **k: None
    try:
        pg.Gemma4Processor.from_pretrained.__func__(Capture, str(model_dir) if model_dir is not None else "/nonexistent")
    finally:
        transformers.AutoTokenizer.from_pretrained, pg.load_chat_template = saved
    return SimpleNamespace(image=got["image_processor"], audio=got["feature_extractor"],
                           ms=got["audio_ms_per_token"], seq=got["audio_seq_length"])


def unified_file_image_processor(model_dir: str | Path | None):
    """The Gemma4UnifiedImageProcessor that mlx-vlm's load_processor builds for a gemma4_unified
    checkpoint (Gemma4UnifiedProcessor.from_pretrained reads processor_config.json /
    preprocessor_config.json): that same from_pretrained body, run with the tokenizer stubbed out
    (a checkpoint may have none: --tokens), so that mlx-vlm's own code reads the config files."""
    return unified_file_processor(model_dir)["image_processor"]


def unified_file_processor(model_dir: str | Path | None) -> dict:
    """Everything Gemma4UnifiedProcessor.from_pretrained(model_dir) builds from the config files
    (image_processor, video_processor, feature_extractor, audio_ms_per_token, audio_seq_length),
    its own body run with the tokenizer stubbed out; no directory: the classes' defaults."""
    import transformers
    from mlx_vlm.models.gemma4_unified import processing_gemma4_unified as pu

    if model_dir is None:
        return {"image_processor": pu.Gemma4UnifiedImageProcessor(), "video_processor": pu.Gemma4UnifiedVideoProcessor(),
                "feature_extractor": pu.Gemma4UnifiedAudioFeatureExtractor(), "audio_ms_per_token": 40, "audio_seq_length": 750}
    got: dict[str, Any] = {}

    class Capture:
        def __init__(self, **kw):
            got.update(kw)

    saved = (transformers.AutoTokenizer.from_pretrained, pu.load_chat_template)
    transformers.AutoTokenizer.from_pretrained = lambda *a, **k: SimpleNamespace(chat_template=None)
    pu.load_chat_template = lambda *a, **k: None
    try:
        pu.Gemma4UnifiedProcessor.from_pretrained.__func__(Capture, str(model_dir))
    finally:
        transformers.AutoTokenizer.from_pretrained, pu.load_chat_template = saved
    return got


def build_media(spec: dict, proc: SimpleNamespace | None = None, unified: bool = False,
                model_dir: str | Path | None = None) -> dict:
    """One image or audio clip, through mlx-vlm's own processor classes: a fixture spec (seeded
    pattern image, seeded tone; default processor settings), or a file (`path`:
    mlx_vlm.utils.load_image / load_audio, then the checkpoint's processor `proc`). Audio gives
    the waveform; build_inputs runs the feature extractor over all clips at once, as
    Gemma4Processor does."""
    from mlx_vlm.models.gemma4.audio_feature_extractor import Gemma4AudioFeatureExtractor
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4ImageProcessor, Gemma4Processor
    from mlx_vlm.utils import load_audio, load_image

    if spec["kind"] == "image" and unified:
        # gemma4_unified: Gemma4UnifiedImageProcessor's model patches and 2-D positions (-1 = padding)
        from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedImageProcessor

        # a file: the checkpoint's processor (its config files, as load_processor reads them); a
        # fixture image: the default settings
        if "path" in spec:
            img, ip = load_image(spec["path"]), unified_file_image_processor(model_dir)
        else:
            img, ip = pattern_image(spec["seed"], spec["height"], spec["width"]), Gemma4UnifiedImageProcessor()
        kw = {"max_soft_tokens": spec["max_soft_tokens"]} if spec.get("max_soft_tokens") is not None else {}
        data, n = ip(img, **kw)
        return {"kind": "image", "pixels": data["pixel_values"][0], "positions": data["image_position_ids"][0], "n": int(n[0])}
    if spec["kind"] == "audio" and unified:
        # gemma4_unified: raw 640-sample frames (Gemma4UnifiedAudioFeatureExtractor, run over all
        # clips in build_inputs); the placeholder count as Gemma4Processor counts it
        from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor

        if "path" in spec:
            # a file: mlx_vlm.utils.load_audio at the checkpoint's extractor rate, counted with its
            # processor's audio_ms_per_token / audio_seq_length (Gemma4UnifiedProcessor.from_pretrained)
            up = unified_file_processor(model_dir)
            fe = up["feature_extractor"]
            wave = load_audio(spec["path"], sr=fe.sampling_rate)
            counts = SimpleNamespace(audio_ms_per_token=up["audio_ms_per_token"], audio_seq_length=up["audio_seq_length"])
        else:
            fe = Gemma4UnifiedAudioFeatureExtractor()
            wave = pattern_wave(spec["seed"], spec["samples"])
            counts = SimpleNamespace(audio_ms_per_token=40, audio_seq_length=750)
        n = Gemma4Processor._compute_audio_num_tokens(counts, wave, fe.sampling_rate)
        return {"kind": "audio", "wave": wave, "extractor": fe, "n": int(n)}
    if spec["kind"] == "image":
        if "path" in spec:
            img, ip = load_image(spec["path"]), (proc.image if proc else Gemma4ImageProcessor())
        else:
            img, ip = pattern_image(spec["seed"], spec["height"], spec["width"]), Gemma4ImageProcessor()
        kw = {"max_soft_tokens": spec["max_soft_tokens"]} if spec.get("max_soft_tokens") is not None else {}
        data, n = ip(img, **kw)
        return {"kind": "image", "pixels": data["pixel_values"][0], "n": int(n[0])}
    if spec["kind"] == "audio":
        if "path" in spec:
            fe = proc.audio if proc else Gemma4AudioFeatureExtractor()
            wave = load_audio(spec["path"], sr=fe.sampling_rate)
            counts = SimpleNamespace(audio_ms_per_token=proc.ms, audio_seq_length=proc.seq) if proc else \
                SimpleNamespace(audio_ms_per_token=40, audio_seq_length=750)
        else:
            fe = Gemma4AudioFeatureExtractor()
            rng = np.random.default_rng(spec["seed"])
            t = np.arange(int(round(spec["seconds"] * SAMPLE_RATE)))
            wave = (0.4 * np.sin(2 * np.pi * 330.0 * t / SAMPLE_RATE) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)
            counts = SimpleNamespace(audio_ms_per_token=40, audio_seq_length=750)
        n = Gemma4Processor._compute_audio_num_tokens(counts, wave, fe.sampling_rate)
        return {"kind": "audio", "wave": wave, "extractor": fe, "n": int(n)}
    raise ValueError(f"unknown media kind {spec['kind']!r}")


def build_inputs(scn: dict, config: dict, model_dir: str | Path | None = None, unified: bool = False) -> dict:
    """input_ids, mm_token_type_ids and the processor outputs of a scenario prompt, as mx arrays.
    Media files (`path`) go through the processor of `model_dir` (mlx-vlm's load_processor).
    `unified` (gemma4_unified): images through Gemma4UnifiedImageProcessor (default settings; the
    scenario's max_soft_tokens), stacked as the processor stacks them (pixel_values (B, N, p*p*3)
    float32 and image_position_ids (B, N, 2) int64); every image of a prompt needs the same N."""
    media_specs = {**load_mm_scenarios()["media"], **scn.get("media", {})}
    proc = None
    if not unified and any("path" in media_specs[i] for i in scn["prompt"] if isinstance(i, str)):
        proc = file_processor(model_dir)
    ids: list[int] = []
    images, audios = [], []
    for item in scn["prompt"]:
        if isinstance(item, int):
            ids.append(item)
            continue
        m = build_media(media_specs[item], proc, unified, model_dir)
        if m["kind"] == "image":
            images.append(m if unified else m["pixels"])
            ids += [config["boi_token_id"]] + [config["image_token_id"]] * m["n"] + [config["eoi_token_id"]]
        else:
            audios.append(m)
            ids += [config["boa_token_id"]] + [config["audio_token_id"]] * m["n"] + [config["eoa_token_id"]]
    arr = np.array(ids)
    tt = np.zeros(len(ids), np.int32)
    tt[arr == config["image_token_id"]] = 1
    tt[arr == config["audio_token_id"]] = 3
    if scn.get("videos"):
        # video (the tap-level video capture): the prompt's ids come expanded (per frame its
        # timestamp ids, boi, video_token * n, eoi); each file decoded by mlx_vlm.utils.load_video
        # (OpenCV), its first `frames` sampled frames through Gemma4VideoProcessor (gemma4_unified:
        # Gemma4UnifiedVideoProcessor, below)
        import video_media

        if config.get("video_token_id") is None:
            raise ValueError("a video scenario needs a checkpoint whose config sets video_token_id")
        tt[arr == config["video_token_id"]] = 2
        pvs, poss = [], []
        if unified:
            # gemma4_unified: the checkpoint's Gemma4UnifiedVideoProcessor (from_pretrained's, or
            # the scenario's processor_config) on every video at once, as Gemma4Processor.__call__
            # calls it: the frames' model patches concatenated, (sum T, N, p*p*3) and (sum T, N, 2)
            from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedVideoProcessor

            vps = {json.dumps(v.get("processor_config"), sort_keys=True) for v in scn["videos"]}
            if len(vps) != 1:
                raise ValueError("gemma4_unified video scenario: one processor_config for every video of a prompt")
            pc = scn["videos"][0].get("processor_config")
            vp = Gemma4UnifiedVideoProcessor(**pc) if pc is not None else unified_file_processor(model_dir)["video_processor"]
            frames_list, rates = [], []
            for vspec in scn["videos"]:
                sampling = {k: vspec.get(k) for k in ("fps", "nframes", "min_frames", "max_frames")}
                got = video_media.video_load(vspec["path"], owner=vp, **sampling)
                frames_list.append(got["frames"][: vspec.get("frames")])
                rates.append(got["sampled_fps"])
            data = vp(frames_list, fps=rates)
            out_v = {"pixel_values_videos": mx.array(np.ascontiguousarray(data["pixel_values_videos"], np.float32)),
                     "video_position_ids": mx.array(np.ascontiguousarray(data["video_position_ids"], np.int64))}
        else:
            for vspec in scn["videos"]:
                sampling = {k: vspec.get(k) for k in ("fps", "nframes", "min_frames", "max_frames")}
                got = video_media.video_load(vspec["path"], processor_config=vspec.get("processor_config"), **sampling)
                frames = got["frames"][: vspec.get("frames")]
                proc = video_media.video_process(frames, got["sampled_fps"], processor_config=vspec.get("processor_config"))
                pvs.append(proc["pixel_values_videos"][0])
                poss.append(proc["video_position_ids"][0])
            if len({p.shape for p in pvs}) != 1:
                raise ValueError("video scenario: every video of a prompt needs the same frame count and size (one stacked batch)")
            out_v = {"pixel_values_videos": mx.array(np.stack(pvs)), "video_position_ids": mx.array(np.stack(poss))}
    else:
        out_v = {}
    out: dict[str, Any] = {"input_ids": mx.array([ids], dtype=mx.int32), "mm_token_type_ids": mx.array(tt[None]), **out_v}
    if images and unified:
        if len({im["pixels"].shape for im in images}) != 1:
            raise ValueError("gemma4_unified scenario: every image of a prompt needs the same max_soft_tokens (one stacked batch)")
        out["pixel_values"] = mx.array(np.stack([im["pixels"] for im in images]))
        out["image_position_ids"] = mx.array(np.stack([im["positions"] for im in images]))
    elif images:
        if len({im.shape for im in images}) == 1:
            out["pixel_values"] = mx.array(np.stack(images))
        else:
            out["pixel_values"] = [mx.array(im) for im in images]
    if audios:
        fe = audios[0]["extractor"]
        feats = fe([a["wave"] for a in audios])
        out["input_features"] = mx.array(np.asarray(feats["input_features"], np.float32))  # (unified: raw frames)
        out["input_features_mask"] = mx.array(np.asarray(feats["input_features_mask"], bool))
    return out


# -------------------------------------------------------------------- recorder

class MMRecorder(cap.Recorder):
    """Recorder for mlx-vlm's gemma4 Model: calls are created as mlx-vlm makes them."""

    def __init__(self, model, keep: Callable[[cap.Call, str], bool] = lambda c, n: True,
                 spill: Callable[[np.ndarray, str], dict] | None = None, kind: str = "forward"):
        self.v = _vlm()
        v = self.v
        self.LM = SimpleNamespace(DecoderLayer=v.lang.DecoderLayer, Attention=v.lang.Attention, Router=v.lang.Router,
                                  GeGLU=v.lang.GeGLU, SwitchGLU=v.switch.SwitchGLU, Experts=v.lang.Experts)
        self.model = model
        self.spill = spill
        self.keep = keep
        self.kind = kind
        self.args = model.language_model.config
        self.calls: list[cap.Call] = []
        # a module reachable under several paths (relative_k_proj is also _rel_pos.pos_proj):
        # the path without private ("_x") segments names it
        self.paths: dict[int, str] = {}
        for p, m in model.named_modules():
            if id(m) not in self.paths or re.search(r"(^|\.)_", self.paths[id(m)]):
                self.paths[id(m)] = p
        self._saved = []
        self._stack = []
        self._attn = []
        self._ids = {}
        self._quiet = 0
        self._counts = {"prefill": 0, "step": 0}
        self._meta: dict[int, dict] = {}  # call index -> flags for verify
        self._last_media: str | None = None
        self._video_pixels: Any = None  # the embed call's pixel_values_videos (the tower's video call)
        self._unified_video = False  # inside gemma4_unified's get_video_features
        self._vision_ropes: dict[str, int] = {}

    # ---------------------------------------------------------------- patching
    def __enter__(self) -> "MMRecorder":
        v = self.v
        self._patch_module_classes()
        self._patch(v.gemma4.Model, "get_input_embeddings", self._wrap_embed(v.gemma4.Model.__dict__["get_input_embeddings"]))
        self._patch(v.gemma4, "masked_scatter", self._wrap_scatter(v.gemma4.masked_scatter))
        # gemma4_unified: its own get_input_embeddings, and masked_scatter imported into its module
        self._patch(v.unified.Model, "get_input_embeddings", self._wrap_embed(v.unified.Model.__dict__["get_input_embeddings"]))
        self._patch(v.unified, "masked_scatter", self._wrap_scatter(v.unified.masked_scatter))
        self._patch(v.unified.Model, "get_audio_features", self._wrap_unified_audio(v.unified.Model.__dict__["get_audio_features"]))
        self._patch(v.unified.Model, "get_video_features", self._wrap_unified_video(v.unified.Model.__dict__["get_video_features"]))
        self._patch(v.lang, "scaled_dot_product_attention", self._wrap_sdpa(v.lang.scaled_dot_product_attention))
        self._patch(v.lang, "geglu", self._wrap_geglu(v.lang.geglu))
        self._patch(nn, "gelu_approx", self._wrap_gelu(nn.gelu_approx))
        self._patch(v.switch, "_gather_sort", self._wrap_gather_sort(v.switch._gather_sort))
        self._patch(v.switch, "_scatter_unsort", self._wrap_unsort(v.switch._scatter_unsort))
        for cls in (v.cache.KVCache, v.cache.RotatingKVCache):
            self._patch(cls, "update_and_fetch", self._wrap_cache(cls.__dict__["update_and_fetch"]))
        tm = v.lang.Gemma4TextModel
        self._patch(tm, "get_per_layer_inputs", self._wrap_method(tm.__dict__["get_per_layer_inputs"], "per_layer_token_inputs"))
        self._patch(tm, "project_per_layer_inputs", self._wrap_project(tm.__dict__["project_per_layer_inputs"]))
        self._patch(tm, "_make_masks", self._wrap_make_masks(tm.__dict__["_make_masks"]))
        for cls in (nn.Embedding, nn.QuantizedEmbedding):
            self._patch(cls, "as_linear", self._wrap_method(cls.__dict__["as_linear"], "lm_head"))
        pe = v.vision.VisionPatchEmbedder
        self._patch(pe, "_position_embeddings", self._wrap_method(pe.__dict__["_position_embeddings"], "vision_tower/patch_embedder/position_embeddings"))
        self._patch(pe, "embed_patches", self._wrap_embed_patches(pe.__dict__["embed_patches"]))
        vp = v.vision.VisionPooler
        self._patch(vp, "_avg_pool_by_positions", self._wrap_pool(vp.__dict__["_avg_pool_by_positions"]))
        ae = v.audio.AudioEncoder
        self._patch(ae, "_build_causal_valid_mask", self._wrap_method(ae.__dict__["_build_causal_valid_mask"], "audio_tower/causal_valid_mask"))
        self._patch(v.vision, "apply_multidimensional_rope", self._wrap_vision_rope(v.vision.apply_multidimensional_rope))
        self._patch(v.base, "ensure_fused_sdpa", self._wrap_vision_sdpa(v.base.ensure_fused_sdpa))
        self._patch(v.generate, "make_sampler", self._wrap_make_sampler(v.generate.make_sampler))
        return self

    # ---------------------------------------------------------------- calls
    def begin(self, prefix: str, kind: str, index: int, ids: Any, length: int, batch: int, cache: Any, flags: dict) -> None:
        c0 = cache[0] if cache else None
        self.calls.append(cap.Call(prefix=prefix, kind=kind, index=index, batch=batch, length=length,
                                   tokens=np.array(ids).tolist() if ids is not None else [],
                                   cache=cache is not None, offset_before=int(c0.offset) if c0 is not None else 0))
        self._meta[len(self.calls) - 1] = flags
        self._ids.clear()

    def verify(self) -> None:
        cfg = self.model.config
        for k, call in enumerate(self.calls):
            f = self._meta[k]
            if call.kind == "embed":
                want = tapspec.expand_media(cfg.text_config, cfg.vision_config, cfg.audio_config,
                                            image=f["image"], with_audio=f["audio"], image_list=f["image_list"],
                                            unified=f["unified"], video=f["video"])
            else:
                want = tapspec.expand(self.args, batch=call.batch, length=call.length, cache=call.cache,
                                      step=call.kind == "step", ids=f["ids"], embed=f["embed"], embeds=f["embeds"],
                                      pli_lookup=f["pli_lookup"], moe_batched=f["moe_batched"])
            # mlx-vlm's Attention updates the cache before it ropes the queries (mlx-lm the other
            # way round; no op depends on the other): the cache taps keep mlx-lm's place
            self.check_call(call, want, lambda n: n.endswith(("/cache_keys", "/cache_values")))

    # ---------------------------------------------------------------- wrappers
    def _wrap_embed(self, orig: Callable) -> Callable:
        rec = self

        def wrapper(model, input_ids=None, pixel_values=None, *args, **kwargs):
            unified = isinstance(model, rec.v.unified.Model)
            tower = model.vision_embedder if unified else model.vision_tower
            has_img = pixel_values is not None and tower is not None
            has_aud = (kwargs.get("input_features") is not None or kwargs.get("audio_features") is not None) and \
                (model.embed_audio if unified else model.audio_tower) is not None
            videos = kwargs.get("pixel_values_videos")
            has_vid = videos is not None and tower is not None and getattr(model.config, "video_token_id", None) is not None
            rec._video_pixels = videos if has_vid and not unified else None
            rec.begin("embed/", "embed", 0, input_ids, int(input_ids.shape[1]), int(input_ids.shape[0]), None,
                      {"image": has_img, "audio": has_aud, "image_list": isinstance(pixel_values, list), "unified": unified,
                       "video": has_vid})
            rec.record("inputs", input_ids)
            out = orig(model, input_ids, pixel_values, *args, **kwargs)
            if "embed_scaled" not in rec.call.taps:
                rec.record("embed_scaled", out.inputs_embeds)
            return out
        return wrapper

    def _lm_call(self, mod, orig: Callable, args: tuple, kwargs: dict):
        inputs = args[0] if args else kwargs.get("inputs")
        embeds = kwargs.get("inputs_embeds")
        cache = kwargs.get("cache")
        h = embeds if embeds is not None else inputs
        L = int(h.shape[1])
        if "n_to_process" in kwargs:
            kind = "prefill"
        elif self.kind == "forward":
            kind = "forward"
        else:
            kind = "step"
        if kind == "forward":
            prefix, index = "", 0
        else:
            index = self._counts[kind]
            self._counts[kind] += 1
            prefix = f"{kind}{index}/"
        cfg = self.args
        moe_batched = not (cfg.enable_moe_block and 1 < L <= self.v.switch.DECODE_BLOCK_SIZE)
        self.begin(prefix, kind, index, inputs, L, int(h.shape[0]), cache,
                   {"ids": inputs is not None, "embed": embeds is None, "embeds": embeds is not None,
                    "pli_lookup": kwargs.get("per_layer_inputs") is None, "moe_batched": moe_batched})
        if inputs is not None:
            self.record("inputs", inputs)
        if embeds is not None:
            self.record("inputs_embeds", embeds)
        self._stack.append((id(mod), ""))
        try:
            out = orig(mod, *args, **kwargs)
            self.record("logits", out.logits)
        finally:
            self._stack.pop()
        self.end_call(cache)
        return out

    def _on_module(self, mod, name: str, orig: Callable, args: tuple, kwargs: dict):
        v = self.v
        if isinstance(mod, (v.gemma4.Model, v.unified.Model)):
            return orig(mod, *args, **kwargs)
        if isinstance(mod, v.lang.LanguageModel):
            return self._lm_call(mod, orig, args, kwargs)
        x = args[0] if args else None
        self._stack.append((id(mod), name))
        try:
            out = self._on_layer_module(mod, name, orig, args, kwargs, x)
            if out is not cap.NOT_HANDLED:
                return out
            return self._on_media_module(mod, name, orig, args, kwargs, x)
        finally:
            self._stack.pop()

    def record(self, short: str, value: Any, meta: dict | None = None) -> None:
        if not self._quiet:  # quiet: inside a call whose inner values are no taps
            super().record(short, value, meta)

    def _switch_glu_quiet(self, x: Any) -> bool:
        return x.ndim == 3 and 1 < x.shape[1] <= self.v.switch.DECODE_BLOCK_SIZE

    def _on_media_module(self, mod, name: str, orig: Callable, args: tuple, kwargs: dict, x: Any):
        v = self.v
        if isinstance(mod, v.vision.ClippableLinear):
            self._input_taps(name, x)
            if not mod.use_clipping:
                self._quiet += 1
            try:
                out = orig(mod, *args, **kwargs)
            finally:
                if not mod.use_clipping:
                    self._quiet -= 1
            self.record(name, out)
            return out
        if isinstance(mod, v.vision.VisionModel):
            if isinstance(x, list):  # one tower call per image: only the concatenated output is a tap
                self._quiet += 1
                try:
                    out = orig(mod, *args, **kwargs)
                finally:
                    self._quiet -= 1
            else:
                self.record("vision_tower/pixel_values", x)
                out = orig(mod, *args, **kwargs)
            self.record("vision_tower", out)
            # _encode_video calls the same tower on the frames (the embed call's pixel_values_videos)
            self._last_media = "video" if x is not None and x is self._video_pixels else "image"
            return out
        if isinstance(mod, v.unified.VisionEmbedder):
            # gemma4_unified: the processor's patches and positions are the embedder's inputs; its
            # LayerNorms and Linear are leaf taps, the position sum the input of pos_norm
            self.record("vision_embedder/pixel_values", x)
            self.record("vision_embedder/image_position_ids", args[1] if len(args) > 1 else kwargs["image_position_ids"])
            out = orig(mod, *args, **kwargs)
            # (get_video_features runs the same embedder on the frames: _wrap_unified_video)
            self._last_media = "video" if self._unified_video else "image"
            return out
        if isinstance(mod, v.vision.VisionPatchEmbedder):
            # (video frames come through embed_patches instead: _wrap_embed_patches)
            self.record("vision_tower/patch_positions", args[1])
            out = orig(mod, *args, **kwargs)
            self.record(name, out)
            return out
        if isinstance(mod, v.vision.VisionTransformerModel):
            self.record("vision_tower/attn_mask", args[2])
            return orig(mod, *args, **kwargs)
        if isinstance(mod, v.vision.VisionTransformerBlock):
            out = orig(mod, *args, **kwargs)
            self.record(f"{name}/output", out)
            return out
        if isinstance(mod, v.vision.VisionPooler):
            out = orig(mod, *args, **kwargs)
            self.record(name, out[0])
            return out
        if isinstance(mod, v.audio.AudioEncoder):
            self.record("audio_tower/input_features", x)
            self.record("audio_tower/input_mask", args[1])
            out = orig(mod, *args, **kwargs)
            self.record("audio_tower", out[0])
            self.record("audio_tower/mask", out[1])
            self._last_media = "audio"
            return out
        if isinstance(mod, v.audio.SSCPConvBlock):
            out = orig(mod, *args, **kwargs)
            self.record(name, out[0])
            self.record(f"{name}/mask", out[1])
            return out
        if isinstance(mod, (v.audio.ConformerFeedForward, v.audio.ConformerLightConv1d, v.audio.AudioRelativePositionEmbedding)):
            if isinstance(mod, v.audio.ConformerLightConv1d):
                self.record(f"{name.rsplit('/', 1)[0]}/attn_residual", x)
            out = orig(mod, *args, **kwargs)
            self.record(name, out)
            return out
        leaf = (nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding, nn.RMSNorm, nn.LayerNorm, nn.Conv2d,
                v.lang.RMSNormNoScale, v.lang.RMSNormZeroShift, v.switch.SwitchLinear, v.switch.QuantizedSwitchLinear,
                v.vision.VisionRMSNorm, v.vision.VisionRMSNormNoScale, v.vision.RMSNorm, v.audio.AudioRMSNorm)
        if isinstance(mod, leaf):
            self._input_taps(name, x)
            out = orig(mod, *args, **kwargs)
            self.record(name, out)
            return out
        return orig(mod, *args, **kwargs)  # containers whose output is a child's tap

    def _input_taps(self, name: str, x: Any) -> None:
        if self.call.kind != "embed":
            return super()._input_taps(name, x)
        leaf = name.rsplit("/", 1)[-1]
        parent = name.rsplit("/", 1)[0]
        if name == "embed_tokens_per_layer":
            self.record("per_layer_input_ids", x)
        elif name == "vision_embedder/pos_norm":
            self.record("vision_embedder/position_added", x)
        elif name == "vision_tower/patch_embedder/input_proj":
            self.record("vision_tower/patch_embedder/patches", x)
        elif name.startswith("vision_tower/encoder/") and leaf == "pre_feedforward_layernorm":
            self.record(f"{parent}/attn_residual", x)
        elif name.startswith("vision_tower/encoder/") and name.endswith("mlp/down_proj"):
            self.record(f"{parent}/gated", x)
        elif name.startswith("audio_tower/layers.") and leaf in ("ffw_layer_2", "linear_end"):
            self.record(f"{parent}/silu", x)
        elif name.startswith("audio_tower/layers.") and leaf == "conv_norm":
            self.record(f"{parent}/depthwise_conv1d", x)
        elif name.startswith("audio_tower/layers.") and name.endswith("self_attn/post"):
            self.record(f"{parent}/context", x)

    def _wrap_embed_patches(self, orig: Callable) -> Callable:
        def wrapper(obj, pixel_values, patch_positions, padding_positions):
            # video frames (patches given, (N*T, L, D)): the positions and the patch embedding are
            # recorded under the image batch's names (patch_positions, patch_embedder); inside,
            # input_proj's input is the "patches" tap (2 * (x - 0.5), cast)
            self.record("vision_tower/patch_positions", patch_positions)
            out = orig(obj, pixel_values, patch_positions, padding_positions)
            self.record("vision_tower/patch_embedder", out)
            return out
        return wrapper

    def _wrap_unified_video(self, orig: Callable) -> Callable:
        def wrapper(model, *args, **kwargs):
            # gemma4_unified: the frames' model patches through the image path (get_image_features);
            # the embedder's taps keep their names, the merge is video_features / merge/video
            self._unified_video = True
            try:
                return orig(model, *args, **kwargs)
            finally:
                self._unified_video = False
        return wrapper

    def _wrap_unified_audio(self, orig: Callable) -> Callable:
        def wrapper(model, input_features, input_features_mask=None):
            # gemma4_unified: the raw frames go straight into embed_audio (no tower)
            self.record("embed_audio/input_features", input_features)
            self.record("embed_audio/input_features_mask", input_features_mask)
            self._last_media = "audio"
            return orig(model, input_features, input_features_mask)
        return wrapper

    def _wrap_scatter(self, orig: Callable) -> Callable:
        def wrapper(input_tensor, mask, source):
            if "embed_scaled" not in self.call.taps:
                self.record("embed_scaled", input_tensor)
            media = self._last_media
            self.record(f"{media}_features", source)
            out = orig(input_tensor, mask, source)
            self.record(f"merge/{media}", out)
            return out
        return wrapper

    def _wrap_project(self, orig: Callable) -> Callable:
        def wrapper(obj, inputs_embeds, per_layer_inputs=None):
            if per_layer_inputs is not None and "per_layer_token_inputs" not in self.call.taps:
                self.record("per_layer_token_inputs", per_layer_inputs)
            out = orig(obj, inputs_embeds, per_layer_inputs)
            self.record("per_layer_inputs", out)
            return out
        return wrapper

    def _wrap_make_masks(self, orig: Callable) -> Callable:
        def wrapper(obj, h, cache, mm_token_type_ids=None):
            masks = orig(obj, h, cache, mm_token_type_ids)
            seen = set()
            for layer, m in zip(obj.layers, masks):
                if layer.layer_type in seen:
                    continue
                seen.add(layer.layer_type)
                kind = "none" if m is None else ("causal" if isinstance(m, str) else "array")
                self.record(f"mask/{layer.layer_type}", m, {"mask": kind})
            return masks
        return wrapper

    def _wrap_pool(self, orig: Callable) -> Callable:
        def wrapper(obj, x, patch_positions, length):
            out = orig(obj, x, patch_positions, length)
            self.record("vision_tower/pooler/pooled", out[0])
            self.record("vision_tower/pooler/mask", out[1])
            return out
        return wrapper

    def _wrap_vision_rope(self, orig: Callable) -> Callable:
        def wrapper(inputs, positions, base_frequency=100.0):
            out = orig(inputs, positions, base_frequency)
            attn = self.current()
            n = self._vision_ropes.get(attn, 0)
            self._vision_ropes[attn] = n + 1
            self.record(f"{attn}/{'rope_q' if n % 2 == 0 else 'rope_k'}", out)
            return out
        return wrapper

    def _wrap_vision_sdpa(self, orig: Callable) -> Callable:
        def wrapper(q, k, v, scale, mask=None):
            out = orig(q, k, v, scale, mask=mask)
            self.record(f"{self.current()}/sdpa", out, {"scale": scale})
            return out
        return wrapper

    def _wrap_gelu(self, orig: Callable) -> Callable:
        base = super()._wrap_gelu(orig)

        def wrapper(x):
            cur = self.current()
            if self._quiet or not self.calls or not cur.startswith("vision_tower/"):
                return base(x)
            out = orig(x)
            self.record(f"{cur}/gelu", out)
            return out
        return wrapper

    def _wrap_make_sampler(self, orig: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            return self._wrap_sampler(orig(*args, **kwargs))
        return wrapper


# -------------------------------------------------------------------- running

MEDIA_INPUTS = ("inputs", "audio_tower/input_features", "audio_tower/input_mask")


def logits_only(call: cap.Call, short: str) -> bool:
    """Logits mode: the logits of the forward and of every _step call, plus the embed call's ids
    and audio features (a TS run rebuilds the fixture images from their spec: pattern_image)."""
    if call.kind == "embed":
        return short in MEDIA_INPUTS
    return call.kind in ("forward", "step") and short == "logits"


def mm_capture(model, scn: dict, mode: str = "full",
               spill: Callable[[np.ndarray, str], dict] | None = None,
               model_dir: str | Path | None = None) -> tuple[list[cap.Call], dict]:
    """Run one multimodal scenario under the recorder; the verified calls and scenario meta
    (media files go through the processor of `model_dir`)."""
    v = _vlm()
    cfg = {k: getattr(model.config, k, None) for k in ("image_token_id", "audio_token_id", "boi_token_id", "eoi_token_id",
                                                       "boa_token_id", "eoa_token_id", "video_token_id")}
    inputs = build_inputs(scn, cfg, model_dir, unified=isinstance(model, v.unified.Model))
    keep = (lambda c, n: True) if mode == "full" else logits_only
    rec = MMRecorder(model, keep, spill, kind=scn["kind"])
    meta: dict[str, Any] = {"scenario": scn["id"], "kind": scn["kind"], "mode": mode}
    kw = {k: inputs[k] for k in ("mm_token_type_ids", "input_features", "input_features_mask", "image_position_ids",
                                 "pixel_values_videos", "video_position_ids") if k in inputs}
    with rec:
        if scn["kind"] == "forward":
            out = model(inputs["input_ids"], pixel_values=inputs.get("pixel_values"), **kw)
            mx.eval(out.logits)
        else:
            gen = v.generate.generate_step(inputs["input_ids"], model, inputs.get("pixel_values"), None,
                                           max_tokens=scn["max_tokens"], prefill_step_size=scn["prefill_step_size"],
                                           temperature=0.0, **kw)
            meta["generated"] = [int(t) for t, _ in gen]
            meta["prefill_chunks"] = [c.length for c in rec.calls if c.kind == "prefill"]
    rec.verify()
    return rec.calls, meta


def load_mm(path: str | Path):
    from mlx_vlm.utils import load_model

    return load_model(Path(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="capture_mm.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="multimodal checkpoint dir (gemma4 config.json with vision_config)")
    ap.add_argument("scenario", help="scenario id from fixtures/mm_scenarios.json")
    ap.add_argument("--mode", choices=("full", "logits"), default="full")
    args = ap.parse_args(argv)
    calls, meta = mm_capture(load_mm(args.checkpoint), mm_scenario(args.scenario), args.mode, model_dir=args.checkpoint)
    for c in calls:
        print(f"{c.prefix or 'forward':10s} {c.kind:8s} L={c.length:3d} taps={len(c.taps)}")
    if "generated" in meta:
        print("generated:", meta["generated"], "chunks:", meta["prefill_chunks"])
    for t in list(calls[0].taps.values())[:400]:
        print(f"  {t.name:70s} {t.kind:6s} {t.dtype or t.value or '':9s} {t.shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
