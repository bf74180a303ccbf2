"""mlx-vlm 0.7.10's gemma4_unified preprocessing, as the oracle of model/gemma4_unified/
processing_gemma4_unified.ts (served by server.py's `media` command through media.FUNCTIONS).

Every function returns a dict whose numpy arrays the server writes as .npy files. The classes are
mlx-vlm's own (Gemma4UnifiedImageProcessor, Gemma4UnifiedAudioFeatureExtractor); the processor
configuration is read by Gemma4UnifiedProcessor.from_pretrained's own body (the tokenizer stubbed,
as capture_mm.file_processor does for gemma4), not by mlx_vlm.load(), which replaces a unified
checkpoint's image processor with one built from defaults.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def unified_image(pixels: np.ndarray, kwargs: dict | None = None, config: dict | None = None) -> dict:
    """Gemma4UnifiedImageProcessor(**config)(Image.fromarray(pixels), **kwargs) on uint8 HWC pixels."""
    from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedImageProcessor
    from PIL import Image

    data, n = Gemma4UnifiedImageProcessor(**(config or {}))(Image.fromarray(pixels), **(kwargs or {}))
    return {"pixel_values": np.ascontiguousarray(data["pixel_values"]),
            "image_position_ids": np.ascontiguousarray(data["image_position_ids"]),
            "num_soft_tokens": [int(k) for k in n]}


def unified_audio(waveform: np.ndarray, config: dict | None = None, max_length: int | None = None) -> dict:
    """Gemma4UnifiedAudioFeatureExtractor(**config)([waveform], max_length=max_length)."""
    from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor

    out = Gemma4UnifiedAudioFeatureExtractor(**(config or {}))([waveform], max_length=max_length)
    return {"input_features": np.ascontiguousarray(out["input_features"]),
            "input_features_mask": np.ascontiguousarray(out["input_features_mask"])}


def unified_processor_config(model_dir: str) -> dict:
    """What Gemma4UnifiedProcessor.from_pretrained(model_dir) reads: the image processor's settings
    and the sequence lengths (the tokenizer stubbed out; the config files read by mlx-vlm's code)."""
    import transformers
    from mlx_vlm.models.gemma4_unified import processing_gemma4_unified as pu

    got: dict = {}

    class Capture:
        def __init__(self, **kw):
            got.update(kw)

    saved = (transformers.AutoTokenizer.from_pretrained, pu.load_chat_template)
    transformers.AutoTokenizer.from_pretrained = lambda *a, **k: SimpleNamespace(chat_template=None)
    pu.load_chat_template = lambda *a, **k: None
    try:
        pu.Gemma4UnifiedProcessor.from_pretrained.__func__(Capture, model_dir)
    finally:
        transformers.AutoTokenizer.from_pretrained, pu.load_chat_template = saved
    ip = got["image_processor"]
    fe = got["feature_extractor"]
    return {
        # mean / std as normalize broadcasts them over the 3 channels ([0.2] -> [0.2, 0.2, 0.2])
        "image_processor": {k: ([float(x) for x in np.broadcast_to(np.asarray(v, np.float64), (3,))] if isinstance(v, (list, tuple)) else v) for k, v in (
            ("do_resize", bool(ip.do_resize)), ("do_rescale", bool(ip.do_rescale)), ("rescale_factor", float(ip.rescale_factor)),
            ("do_normalize", bool(ip.do_normalize)), ("image_mean", ip.image_mean), ("image_std", ip.image_std),
            ("patch_size", int(ip.patch_size)), ("max_soft_tokens", int(ip.max_soft_tokens)),
            ("pooling_kernel_size", int(ip.pooling_kernel_size)), ("model_patch_size", int(ip.model_patch_size)),
            ("mm_posemb_size", ip.mm_posemb_size))},
        "audio_samples_per_token": int(fe.audio_samples_per_token),
        "image_seq_length": got["image_seq_length"],
        "audio_seq_length": got["audio_seq_length"],
        "audio_ms_per_token": got["audio_ms_per_token"],
    }


def unified_video(frames: np.ndarray, fps: float | None = None, config: dict | None = None,
                  frames_2: np.ndarray | None = None, fps_2: float | None = None) -> dict:
    """Gemma4UnifiedVideoProcessor(**config)(videos, fps=[...]) on uint8 (T, C, H, W) frames (one
    video, or two), as Gemma4Processor.__call__ calls it."""
    from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedVideoProcessor

    videos, rates = [frames], [fps]
    if frames_2 is not None:
        videos.append(frames_2)
        rates.append(fps_2)
    out = Gemma4UnifiedVideoProcessor(**(config or {}))(videos, fps=None if all(r is None for r in rates) else rates)
    return {"pixel_values_videos": np.ascontiguousarray(out["pixel_values_videos"], dtype=np.float32),
            "video_position_ids": np.ascontiguousarray(out["video_position_ids"], dtype=np.int64),
            "num_frames_per_video": [int(n) for n in out["num_frames_per_video"]],
            "num_soft_tokens_per_frame": [int(n) for n in out["num_soft_tokens_per_frame"]],
            "frame_timestamps": [[float(t) for t in ts] for ts in out["frame_timestamps"]]}


def unified_video_processor_config(model_dir: str) -> dict:
    """The Gemma4UnifiedVideoProcessor that Gemma4UnifiedProcessor.from_pretrained(model_dir)
    builds (its "video_processor" block, else the image block's keys), as its attributes."""
    import capture_mm

    vp = capture_mm.unified_file_processor(model_dir)["video_processor"]
    # mean / std as normalize broadcasts them over the 3 channels
    return {k: ([float(x) for x in np.broadcast_to(np.asarray(v, np.float64), (3,))] if isinstance(v, (list, tuple)) else v) for k, v in (
        ("patch_size", int(vp.patch_size)), ("max_soft_tokens", int(vp.max_soft_tokens)),
        ("pooling_kernel_size", int(vp.pooling_kernel_size)), ("num_frames", int(vp.num_frames)),
        ("do_resize", bool(vp.do_resize)), ("do_rescale", bool(vp.do_rescale)), ("rescale_factor", float(vp.rescale_factor)),
        ("do_normalize", bool(vp.do_normalize)), ("image_mean", vp.image_mean), ("image_std", vp.image_std),
        ("default_fps", float(vp.default_fps)), ("model_patch_size", int(vp.model_patch_size)), ("mm_posemb_size", vp.mm_posemb_size))}


def unified_prepare_video(model_dir: str, prompt: str, paths: list, fps: float | None = None, nframes: int | None = None,
                          min_frames: int | None = None, max_frames: int | None = None) -> dict:
    """mlx-vlm's own Gemma4UnifiedProcessor (from_pretrained(model_dir), the checkpoint's tokenizer)
    on a text prompt and video files: each file through load_video with the sampling
    prepare_inputs resolves (the caller's flags, then the processor's video_sampling_defaults),
    then Gemma4Processor.__call__ (the <|video|> expansion, the tokenizer, mm_token_type_ids).
    The expanded ids and token types, the model inputs' shapes."""
    import video_media
    from mlx_vlm.models.gemma4_unified import processing_gemma4_unified as pu

    proc = pu.Gemma4UnifiedProcessor.from_pretrained(model_dir)
    frames, rates = [], []
    for p in paths:
        got = video_media.video_load(p, fps=fps, nframes=nframes, min_frames=min_frames, max_frames=max_frames, owner=proc.video_processor)
        frames.append(got["frames"])
        rates.append(got["sampled_fps"])
    out = proc(text=prompt, videos=frames, fps=rates)
    return {"input_ids": [int(t) for t in np.array(out["input_ids"][0])],
            "mm_token_type_ids": [int(t) for t in np.array(out["mm_token_type_ids"][0])],
            "pixel_values_videos_shape": [int(d) for d in out["pixel_values_videos"].shape]}


FUNCTIONS = {f.__name__: f for f in (unified_image, unified_audio, unified_processor_config, unified_video,
                                     unified_video_processor_config, unified_prepare_video)}


_models: dict = {}


def unified_embed(model_dir: str, pixel_values: np.ndarray, image_position_ids: np.ndarray) -> dict:
    """mlx-vlm's gemma4_unified Model (mlx_vlm.utils.load_model) on given embedder inputs: the
    VisionEmbedder's output and get_image_features' (embed_vision, valid prefix rows), float32."""
    import mlx.core as mx
    from mlx_vlm.utils import load_model

    from pathlib import Path

    key = str(Path(model_dir).resolve())
    if key not in _models:
        _models[key] = load_model(Path(model_dir))
    model = _models[key]
    pv, pos = mx.array(pixel_values), mx.array(image_position_ids)
    emb = model.vision_embedder(pv, pos)
    feats = model.get_image_features(pv, pos)
    mx.eval(emb, feats)
    if emb.dtype != mx.float32 or feats.dtype != mx.float32:
        raise TypeError(f"expected float32 outputs, got {emb.dtype} and {feats.dtype}")
    return {"embedded": np.array(emb), "features": np.array(feats)}


FUNCTIONS["unified_embed"] = unified_embed
