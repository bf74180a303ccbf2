"""Deterministic golden files: uncompressed .npz archives of taps + a JSON index.

A full dump is one .npz per (checkpoint, scenario), entries named `<tap>.npy`; the logits-only
scenarios of a checkpoint share one `logits.npz`, entries named `<scenario>/<tap>.npy`
(np.load(...)[name] works for both). Zip entries carry a
fixed timestamp and no compression, so identical tensors give byte-identical files. bfloat16
tensors are stored as uint16 .npy; the manifest's per-tap "dtype" says "bfloat16".
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

from common import npy_bytes

_EPOCH = (1980, 1, 1, 0, 0, 0)


def tap_records(calls: list[Any], prefix: str = "") -> list[dict]:
    """Index entries for every tap, in execution order."""
    out = []
    for c in calls:
        for t in c.taps.values():
            r: dict[str, Any] = {"name": prefix + t.name, "kind": t.kind}
            if t.kind == "array":
                r["dtype"] = t.dtype
                r["shape"] = t.shape
                r["stored"] = t.data is not None or getattr(t, "file", None) is not None
            elif t.kind == "str":
                r["value"] = t.value
            if t.meta:
                r["meta"] = t.meta
            out.append(r)
    return out


def call_records(calls: list[Any]) -> list[dict]:
    return [{"prefix": c.prefix, "kind": c.kind, "index": c.index, "batch": c.batch, "length": c.length,
             "tokens": c.tokens, "offset_before": c.offset_before, "cache_after": c.cache_after,
             "taps": len(c.taps)} for c in calls]


def write_npz(path: Path, groups: list[tuple[str, list[Any]]]) -> int:
    """Write the stored taps of (name prefix, calls) groups; returns the entry count. Atomic."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    n = 0
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=False) as zf:
        for prefix, calls in groups:
            for c in calls:
                for t in c.taps.values():
                    if t.data is None:
                        continue
                    info = zipfile.ZipInfo(prefix + t.name + ".npy", date_time=_EPOCH)
                    info.compress_type = zipfile.ZIP_STORED
                    info.external_attr = 0o644 << 16
                    info.create_system = 3
                    zf.writestr(info, npy_bytes(t.data))
                    n += 1
    os.replace(tmp, path)
    return n
