"""mlx-vlm 0.7.10's own media preprocessing, as the oracle of model/media and the Gemma 4
processors (served by server.py's `media` command; imports mlx_vlm lazily).

Every function returns a dict whose numpy arrays the server writes as .npy files. The processor
is the one `mlx_vlm.load` builds: `load_processor(Path(model_dir))` after importing the gemma4
model package (which installs mlx-vlm's AutoProcessor patch), so config files are read exactly
as mlx-vlm reads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

_processors: dict[str, Any] = {}


def processor(model_dir: str):
    key = str(Path(model_dir).resolve())
    p = _processors.get(key)
    if p is None:
        import mlx_vlm.models.gemma4  # noqa: F401 - installs the gemma4 AutoProcessor patch
        from mlx_vlm.utils import load_processor

        p = load_processor(Path(model_dir))
        _processors[key] = p
    return p


def decode_image(path: str) -> dict:
    """`load_image(path)`: Image.open, exif_transpose, convert("RGB") -> uint8 HWC."""
    from mlx_vlm.utils import load_image

    return {"rgb": np.ascontiguousarray(np.asarray(load_image(path)))}


def image(model_dir: str, path: str | None = None, pixels: np.ndarray | None = None, kwargs: dict | None = None) -> dict:
    """The processor's image processor on one image: a file (through `load_image`) or uint8
    HWC pixels (through `Image.fromarray`, the same PIL RGB image a file gives)."""
    from mlx_vlm.utils import load_image
    from PIL import Image

    img = load_image(path) if path is not None else Image.fromarray(pixels)
    data, n_soft = processor(model_dir).image_processor(img, **(kwargs or {}))
    pv = data["pixel_values"]
    pv = pv if isinstance(pv, np.ndarray) else np.stack(pv)
    return {"pixel_values": np.ascontiguousarray(pv), "num_soft_tokens": [int(n) for n in n_soft]}


def pil_resize(pixels: np.ndarray, width: int, height: int) -> dict:
    """`Image.fromarray(pixels).resize((width, height), Image.BICUBIC)`: the resample the image
    processor runs, at any size."""
    from PIL import Image

    return {"resized": np.ascontiguousarray(np.asarray(Image.fromarray(pixels).resize((width, height), resample=Image.BICUBIC)))}


def target_sizes(cases: list) -> dict:
    """`get_aspect_ratio_preserving_size(h, w, patch, max_soft_tokens * pool**2, pool)` for
    each [h, w, patch, max_soft_tokens, pool], or the error it raises."""
    from mlx_vlm.models.gemma4.processing_gemma4 import get_aspect_ratio_preserving_size

    out = []
    for h, w, patch, mst, pool in cases:
        try:
            out.append(list(get_aspect_ratio_preserving_size(h, w, patch, mst * pool**2, pool)))
        except ValueError as e:
            out.append(str(e))
    return {"sizes": out}


def load_audio(path: str, sr: int = 16000) -> dict:
    """`mlx_vlm.utils.load_audio(path, sr)`: the float32 mono waveform."""
    from mlx_vlm.utils import load_audio as _load

    return {"waveform": np.ascontiguousarray(_load(path, sr=sr), dtype=np.float32)}


def audio(model_dir: str, path: str | None = None, waveform: np.ndarray | None = None) -> dict:
    """The feature extractor on one clip (a file through `load_audio`, or a float32 waveform),
    plus the processor's soft-token count for it."""
    p = processor(model_dir)
    fe = p.feature_extractor
    if path is not None:
        waveform = load_audio(path, fe.sampling_rate)["waveform"]
    out = fe([waveform], sampling_rate=fe.sampling_rate, return_attention_mask=True)
    return {
        "input_features": np.ascontiguousarray(out["input_features"][0], dtype=np.float32),
        "input_features_mask": np.ascontiguousarray(out["input_features_mask"][0]),
        "num_tokens": int(p._compute_audio_num_tokens(waveform, fe.sampling_rate)),
        "num_samples": int(len(waveform)),
    }


def prepare(model_dir: str, prompt: str, images: list[str] | None = None, audio: list[str] | None = None) -> dict:
    """`mlx_vlm.utils.prepare_inputs` as `mlx_vlm.generate` calls it: every model input."""
    import mlx.core as mx
    from mlx_vlm.utils import prepare_inputs

    out = prepare_inputs(processor(model_dir), images=images or None, audio=audio or None, prompts=prompt)
    res: dict = {}
    for k, v in out.items():
        if isinstance(v, mx.array):
            res[k] = np.array(v)
        elif isinstance(v, list) and v and all(isinstance(x, np.ndarray) for x in v):
            res[f"{k}_count"] = len(v)  # per-image arrays when the shapes differ
            res.update({f"{k}_{i}": np.ascontiguousarray(x) for i, x in enumerate(v)})
    return res


def processor_info(model_dir: str) -> dict:
    """What the loaded processor ended up with: the image processor's and the feature
    extractor's settings, the sequence lengths and the media token strings and ids."""
    p = processor(model_dir)
    ip, fe = p.image_processor, p.feature_extractor
    return {
        "image_processor": {k: getattr(ip, k) for k in ("do_resize", "do_rescale", "rescale_factor", "do_normalize", "image_mean",
                                                       "image_std", "patch_size", "max_soft_tokens", "pooling_kernel_size")},
        "feature_extractor": {
            **{k: getattr(fe, k) for k in ("feature_size", "sampling_rate", "padding_value", "min_frequency", "max_frequency",
                                           "preemphasis", "preemphasis_htk_flavor", "fft_overdrive", "dither", "input_scale_factor",
                                           "frame_length", "hop_length", "fft_length")},
            "mel_floor": float(fe.mel_floor),
            "per_bin_mean": None if fe.per_bin_mean is None else fe.per_bin_mean.reshape(-1).tolist(),
            "per_bin_stddev": None if fe.per_bin_stddev is None else fe.per_bin_stddev.reshape(-1).tolist(),
        },
        "image_seq_length": p.image_seq_length, "audio_seq_length": p.audio_seq_length, "audio_ms_per_token": p.audio_ms_per_token,
        "tokens": {k: getattr(p, k) for k in ("image_token", "boi_token", "eoi_token", "audio_token", "boa_token", "eoa_token", "video_token")},
        "ids": {k: getattr(p, k) for k in ("image_token_id", "audio_token_id", "video_token_id")},
    }


def rfft(frames: np.ndarray, n: int = 512) -> dict:
    """The extractor's numpy steps on float32 frames [T, L]: `np.fft.rfft(frames, n=n)` (complex64,
    returned as float32 (re, im) pairs) and its `np.abs`."""
    stft = np.fft.rfft(frames, n=n, axis=-1)
    return {"stft": np.ascontiguousarray(stft).view(np.float32), "magnitude": np.ascontiguousarray(np.abs(stft))}


def tables() -> dict:
    """The default extractor's constant tables: the float32 window and the float64 mel bank."""
    from mlx_vlm.models.gemma4.audio_feature_extractor import Gemma4AudioFeatureExtractor

    fe = Gemma4AudioFeatureExtractor()
    return {"window": np.ascontiguousarray(fe.window), "mel_filters": np.ascontiguousarray(fe.mel_filters)}


FUNCTIONS = {f.__name__: f for f in (decode_image, image, pil_resize, target_sizes, load_audio, audio, prepare, processor_info, rfft, tables)}

# the video path (video_media.py), served by the same command
from video_media import FUNCTIONS as _VIDEO_FUNCTIONS  # noqa: E402

FUNCTIONS.update(_VIDEO_FUNCTIONS)

# the gemma4_unified processor (unified_media.py), served by the same command
from unified_media import FUNCTIONS as _UNIFIED_FUNCTIONS  # noqa: E402

FUNCTIONS.update(_UNIFIED_FUNCTIONS)
