"""mlx-vlm 0.7.10's own Gemma 4 video path, as the oracle of the TS port (served through
server.py's `media` command: media.py merges FUNCTIONS below into its own).

  video_load     mlx_vlm.utils.load_video (OpenCV decoding) with the sampling prepare_inputs
                 resolves for a Gemma 4 processor (resolve_video_sampling: caller, then
                 Gemma4VideoProcessor.video_sampling_defaults, then DEFAULT_VIDEO_SAMPLING)
  video_process  Gemma4VideoProcessor.__call__ on given uint8 frames (T, C, H, W)
  video_expand   Gemma4Processor.__call__'s <|video|> expansion and mm_token_type_ids, run on
                 given per-video soft-token counts and timestamps (a stub video processor and a
                 character tokenizer stand in, so that only mlx-vlm's builder code runs)
  video_forward  Model.get_input_embeddings + Model.__call__ with pixel_values_videos: the
                 vision tower's output, the video features, the merged embeddings, the
                 per-layer inputs and the logits
  video_generate mlx_vlm.generate.generate_step on a video prompt: tokens and log-probs
  video_prepare  mlx_vlm.utils.prepare_inputs with videos (the whole mlx-vlm preprocessing)
  make_video_variant  a gemma4 fixture with a video_token_id (video_variant below; it is not in
                 make_mm_checkpoints.py because that file's bytes stamp every multimodal checkpoint)
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

_models: dict[str, Any] = {}


def _model(model_dir: str):
    key = str(Path(model_dir).resolve())
    m = _models.get(key)
    if m is None:
        from mlx_vlm.utils import load_model

        m = load_model(Path(model_dir))
        _models[key] = m
    return m


def video_load(path: str, fps: float | None = None, nframes: int | None = None, min_frames: int | None = None,
               max_frames: int | None = None, processor_config: dict | None = None, owner: Any = None,
               unified: bool = False) -> dict:
    """What prepare_inputs hands a Gemma 4 processor for one video file: the frames and fps.
    The sampling defaults come from `owner` (a video processor object) when given, else from a
    Gemma4VideoProcessor (Gemma4UnifiedVideoProcessor when `unified`) built from processor_config."""
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4VideoProcessor
    from mlx_vlm.utils import load_video, resolve_video_sampling

    overrides = {k: v for k, v in (("fps", fps), ("nframes", nframes), ("min_frames", min_frames),
                                   ("max_frames", max_frames)) if v is not None}
    if owner is None:
        if unified:
            from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedVideoProcessor as cls
        else:
            cls = Gemma4VideoProcessor
        owner = cls(**(processor_config or {}))
    owner = SimpleNamespace(video_processor=owner)
    sampling = resolve_video_sampling(owner, overrides)
    arr, meta = load_video(str(path), sampling)
    return {"frames": np.ascontiguousarray(arr), "frames_indices": [int(i) for i in meta.frames_indices],
            "total_num_frames": int(meta.total_num_frames), "source_fps": float(meta.fps),
            "sampled_fps": float(meta.sampled_fps)}


def video_process(frames: np.ndarray, fps: float | None = None, processor_config: dict | None = None) -> dict:
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4VideoProcessor

    vp = Gemma4VideoProcessor(**(processor_config or {}))
    out = vp([frames], fps=None if fps is None else [fps])
    return {"pixel_values_videos": np.ascontiguousarray(out["pixel_values_videos"], dtype=np.float32),
            "video_position_ids": np.ascontiguousarray(out["video_position_ids"], dtype=np.int64),
            "num_frames_per_video": [int(n) for n in out["num_frames_per_video"]],
            "num_soft_tokens_per_frame": [int(n) for n in out["num_soft_tokens_per_frame"]],
            "frame_timestamps": [[float(t) for t in ts] for ts in out["frame_timestamps"]]}


_SPECIALS = ("<|video|>", "<|image|>", "<|audio|>", "<|image>", "<image|>")


def video_expand(cases: list) -> dict:
    """cases: [{prompt, tokens: [n per video], timestamps: [[s]]}] -> [{text, types}] (or the
    error): Gemma4Processor.__call__ itself, on a stub whose video processor returns the given
    counts and timestamps and whose tokenizer maps each special token to its id (video 249,
    image 250, audio 251, boi 252, eoi 253) and every other character to ord(c) % 200."""
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4Processor

    ids = {"<|video|>": 249, "<|image|>": 250, "<|audio|>": 251, "<|image>": 252, "<image|>": 253}
    pat = re.compile("|".join(re.escape(s) for s in _SPECIALS))

    def tokenize(text, **_kw):
        rows = []
        for t in text:
            row, pos = [], 0
            for m in pat.finditer(t):
                row += [ord(c) % 200 for c in t[pos:m.start()]]
                row.append(ids[m.group(0)])
                pos = m.end()
            row += [ord(c) % 200 for c in t[pos:]]
            rows.append(row)
        return {"input_ids": rows}

    results = []
    for c in cases:
        got: dict[str, Any] = {}

        def video_processor(videos, fps=None, _c=c):
            return {"pixel_values_videos": np.zeros((1,), np.float32), "num_soft_tokens_per_frame": _c["tokens"],
                    "num_frames_per_video": [len(t) for t in _c["timestamps"]], "frame_timestamps": _c["timestamps"]}

        stub = SimpleNamespace(video_processor=video_processor, tokenizer=tokenize, video_token="<|video|>",
                               video_token_id=249, image_token_id=250, audio_token_id=251, boi_token="<|image>",
                               eoi_token="<image|>", image_token="<|image|>", audio_token="<|audio|>",
                               feature_extractor=None)

        def capture_tokenizer(text, **kw):
            got["text"] = text[0]
            return tokenize(text, **kw)

        stub.tokenizer = capture_tokenizer
        try:
            import mlx_vlm.models.gemma4.processing_gemma4 as pg

            saved = pg.to_mlx
            pg.to_mlx = lambda d: d  # keep the lists: nothing here needs MLX arrays
            try:
                out = Gemma4Processor.__call__(stub, text=c["prompt"], videos=[None] * len(c["tokens"]))
            finally:
                pg.to_mlx = saved
            results.append({"text": got["text"], "ids": out["input_ids"][0], "types": [int(t) for t in out["mm_token_type_ids"][0]]})
        except Exception as e:  # noqa: BLE001 - the builder's own error (too few videos for the placeholders)
            results.append({"error": f"{type(e).__name__}: {e}"})
    return {"results": results}


def _inputs(input_ids, pixel_values_videos, video_position_ids, mm_token_type_ids):
    import mlx.core as mx

    return (mx.array(input_ids.astype(np.int32)), mx.array(pixel_values_videos), mx.array(video_position_ids),
            mx.array(mm_token_type_ids.astype(np.int32)))


def _np(a) -> np.ndarray:
    import mlx.core as mx

    if a.dtype == mx.bfloat16:
        a = a.astype(mx.float32)  # exact: every bfloat16 is a float32
    return np.ascontiguousarray(np.array(a))


def video_forward(model_dir: str, input_ids: np.ndarray, pixel_values_videos: np.ndarray,
                  video_position_ids: np.ndarray, mm_token_type_ids: np.ndarray,
                  pixel_values_videos_2: np.ndarray | None = None, video_position_ids_2: np.ndarray | None = None) -> dict:
    """One forward of mlx-vlm's Model on a video prompt; the block outputs, recorded by
    wrapping VisionModel.__call__, gemma4.masked_scatter and Model.get_input_embeddings for the
    call (class attributes, restored afterwards)."""
    import mlx.core as mx
    from mlx_vlm.models.gemma4 import gemma4 as vg
    from mlx_vlm.models.gemma4 import vision as vv

    model = _model(model_dir)
    ids, pv, pos, tt = _inputs(input_ids, pixel_values_videos, video_position_ids, mm_token_type_ids)
    if pixel_values_videos_2 is not None:  # two videos of different shapes: the processor's list form
        pv, pos = [pv, mx.array(pixel_values_videos_2)], [pos, mx.array(video_position_ids_2)]
    got: dict[str, Any] = {}
    saved_vm, saved_ms = vv.VisionModel.__call__, vg.masked_scatter

    def vm_call(self, *a, **k):
        out = saved_vm(self, *a, **k)
        got["vision_tower"] = out  # the list form calls itself per video: the outermost call returns last
        return out

    def ms(inp, mask, source):
        out = saved_ms(inp, mask, source)
        got["video_features"], got["merged"] = source, out
        return out

    saved_gie = vg.Model.get_input_embeddings

    def gie(self, *a, **k):
        out = saved_gie(self, *a, **k)
        got["embeddings"] = out
        return out

    vv.VisionModel.__call__, vg.masked_scatter, vg.Model.get_input_embeddings = vm_call, ms, gie
    try:
        out = model(ids, pixel_values_videos=pv, video_position_ids=pos, mm_token_type_ids=tt)
        emb = got["embeddings"]
        mx.eval(out.logits, emb.inputs_embeds)
    finally:
        vv.VisionModel.__call__, vg.masked_scatter, vg.Model.get_input_embeddings = saved_vm, saved_ms, saved_gie
    res = {"inputs_embeds": _np(emb.inputs_embeds), "logits": _np(out.logits)}
    if emb.per_layer_inputs is not None:
        res["per_layer_inputs"] = _np(emb.per_layer_inputs)
    for k in ("vision_tower", "video_features", "merged"):
        if k in got:
            res[k] = _np(got[k])
    return res


def video_generate(model_dir: str, input_ids: np.ndarray, pixel_values_videos: np.ndarray,
                   video_position_ids: np.ndarray, mm_token_type_ids: np.ndarray, max_tokens: int = 20,
                   prefill_step_size: int = 2048) -> dict:
    """Greedy generate_step (mlx-vlm's) after a video prompt: the tokens and each step's log-probs."""
    from mlx_vlm.generate import generate_step

    model = _model(model_dir)
    ids, pv, pos, tt = _inputs(input_ids, pixel_values_videos, video_position_ids, mm_token_type_ids)
    toks, lps = [], []
    for t, lp in generate_step(ids, model, None, None, max_tokens=max_tokens, prefill_step_size=prefill_step_size,
                               temperature=0.0, pixel_values_videos=pv, video_position_ids=pos, mm_token_type_ids=tt):
        toks.append(int(t))
        lps.append(_np(lp).reshape(-1))
    return {"tokens": toks, "logprobs": np.stack(lps)}


def video_prepare(model_dir: str, prompt: str, videos: list, fps: float | None = None, nframes: int | None = None,
                  min_frames: int | None = None, max_frames: int | None = None) -> dict:
    """`mlx_vlm.utils.prepare_inputs(load_processor(model_dir), videos=..., prompts=prompt)` as
    mlx_vlm.generate calls it (OpenCV decoding, sampling, the processor, the tokenizer): every
    model input, and the expanded text the tokenizer saw."""
    import mlx.core as mx
    from mlx_vlm.utils import prepare_inputs

    import media

    proc = media.processor(model_dir)
    seen: dict[str, Any] = {}
    tok = proc.tokenizer
    saved = type(tok).__call__

    def spy(self, *a, **k):
        seen.setdefault("text", k.get("text", a[0] if a else None))
        return saved(self, *a, **k)

    type(tok).__call__ = spy
    try:
        kw = {k: v for k, v in (("fps", fps), ("nframes", nframes), ("min_frames", min_frames), ("max_frames", max_frames)) if v is not None}
        out = prepare_inputs(proc, videos=videos, prompts=prompt, **kw)
    finally:
        type(tok).__call__ = saved
    res: dict = {"text": seen.get("text")}
    for k, v in out.items():
        if isinstance(v, mx.array):
            res[k] = _np(v)
    return res


def make_video_variant(src: str, dst: str, video_token_id: int = 249) -> dict:
    return {"dir": str(video_variant(Path(src), Path(dst), video_token_id))}


def video_variant(src: Path, dst: Path, video_token_id: int) -> Path:
    """A copy of the multimodal checkpoint `src` whose config.json sets `video_token_id` (the
    fixtures leave it unset, gemma4's ModelConfig default None, under which mlx-vlm drops video
    features without a word). The weights are the same files (hard links where possible); the
    config is rewritten the way mlx_vlm.convert writes it (save_config)."""
    from mlx_vlm.utils import save_config

    cfg = json.loads((src / "config.json").read_text())
    if not 0 <= video_token_id < cfg["text_config"]["vocab_size"]:
        raise ValueError(f"video_token_id {video_token_id} outside the vocabulary ({cfg['text_config']['vocab_size']})")
    taken = {cfg.get(k) for k in ("image_token_id", "audio_token_id", "boi_token_id", "eoi_token_id", "boa_token_id", "eoa_token_id")}
    if video_token_id in taken:
        raise ValueError(f"video_token_id {video_token_id} is already another media token of {src}")
    cfg["video_token_id"] = video_token_id
    tmp = dst.parent / f".tmp-{dst.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.name == "config.json" or not f.is_file():
            continue
        try:
            os.link(f, tmp / f.name)
        except OSError:
            shutil.copy2(f, tmp / f.name)
    save_config(cfg, tmp / "config.json")
    from common import atomic_replace_dir

    atomic_replace_dir(tmp, dst)
    return dst


FUNCTIONS = {f.__name__: f for f in (video_load, video_process, video_expand, video_forward, video_generate,
                                     video_prepare, make_video_variant)}
