"""Shared helpers for the oracle scripts: repo paths, fixtures, raw-byte array I/O.

Arrays leave MLX as raw bytes, never rounded: bfloat16 is viewed as uint16 (numpy has no
bfloat16) and tagged "bfloat16" next to the .npy; every other dtype maps 1:1 onto numpy.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

import device_env  # noqa: F401  (MLX_DEVICE: the run's device, as on the TS side)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
CONFIGS = FIXTURES / "configs"
SCENARIOS = FIXTURES / "scenarios.json"
DEFAULT_CKPT_ROOT = REPO / ".cache" / "checkpoints"

# MLX dtype name <-> mx.Dtype. Names are the ones the TS side uses.
MX_DTYPES: dict[str, Any] = {
    "bool": mx.bool_,
    "uint8": mx.uint8,
    "uint16": mx.uint16,
    "uint32": mx.uint32,
    "uint64": mx.uint64,
    "int8": mx.int8,
    "int16": mx.int16,
    "int32": mx.int32,
    "int64": mx.int64,
    "float16": mx.float16,
    "float32": mx.float32,
    "float64": mx.float64,
    "bfloat16": mx.bfloat16,
    "complex64": mx.complex64,
}
NP_DTYPES: dict[str, Any] = {
    "bool": np.bool_,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
    "bfloat16": np.uint16,  # raw bits
    "complex64": np.complex64,
}


def dtype_name(dt) -> str:
    for name, d in MX_DTYPES.items():
        if d == dt:
            return name
    raise ValueError(f"unsupported mlx dtype {dt}")


def to_numpy(a: mx.array) -> tuple[np.ndarray, str]:
    """Evaluated, C-contiguous numpy COPY of `a`, bit for bit, plus the MLX dtype name."""
    name = dtype_name(a.dtype)
    if name == "bfloat16":
        a = a.view(mx.uint16)
    mx.eval(a)
    arr = np.array(a, copy=True)
    # np.ascontiguousarray returns ndim >= 1: keep 0-d arrays 0-d.
    return np.ascontiguousarray(arr).reshape(arr.shape), name


def from_numpy(arr: np.ndarray, name: str) -> mx.array:
    """Inverse of to_numpy: rebuild an mx.array from raw numpy data and its MLX dtype name."""
    if name == "bfloat16":
        if arr.dtype != np.uint16:
            raise ValueError(f"bfloat16 data must be stored as uint16, got {arr.dtype}")
        return mx.array(arr).view(mx.bfloat16)
    want = NP_DTYPES[name]
    if arr.dtype != want:
        raise ValueError(f"dtype tag {name} does not match npy dtype {arr.dtype}")
    return mx.array(arr)


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(arr).reshape(np.shape(arr)), allow_pickle=False)
    return buf.getvalue()


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_fixture(name: str) -> dict:
    """Fixture text config (the `_comment` key stripped)."""
    cfg = json.loads((CONFIGS / f"{name}.json").read_text())
    cfg.pop("_comment", None)
    return cfg


def fixture_names() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.json"))


def load_scenarios() -> list[dict]:
    return json.loads(SCENARIOS.read_text())["scenarios"]


def scenario(sid: str) -> dict:
    for s in load_scenarios():
        if s["id"] == sid:
            return s
    raise KeyError(f"unknown scenario {sid!r}")


def module_path_to_tap(path: str) -> str:
    """`language_model.model.layers.4.self_attn.k_norm` -> `layers.4/self_attn/k_norm`.

    The text-model prefix (`model.` / `language_model.model.`) is dropped so every layout
    yields the same names; `lm_head` keeps its name. A dot followed by a digit stays (list index).
    """
    for pre in ("language_model.model.", "language_model.", "model."):
        if path.startswith(pre):
            path = path[len(pre):]
            break
    return re.sub(r"\.(?!\d)", "/", path)


def atomic_replace_dir(tmp: Path, final: Path) -> None:
    """Move a fully written temp dir into place; the old dir (if any) is removed afterwards."""
    import shutil

    final.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
