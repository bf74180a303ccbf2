"""Deterministic golden files: uncompressed .npz archives of taps + a JSON index.

A full dump is one .npz per (checkpoint, scenario), entries named `<tap>.npy`; the logits-only
scenarios of a checkpoint share one `logits.npz`, entries named `<scenario>/<tap>.npy`
(np.load(...)[name] works for both); in the JSON index an array tap's record leaves out
"kind" ("array") and a stored one "stored" (true): index_record. Zip entries carry a
fixed timestamp and no compression, so identical tensors give byte-identical files. bfloat16
tensors are stored as uint16 .npy; the manifest's per-tap "dtype" says "bfloat16".

Tap digests (`call_digests`, form DIGEST_FORM; oracle/tap_digest.ts computes the same on the TS
side): a logits-only multimodal entry stores, besides its few taps, a digest of EVERY tap it
recorded, so a suite can check every tap bit for bit without storing it. One tap's digest is the
sha256 of
  b"gemma4-parity tap v1\n" + kind + "\n" + name + "\n"
  + for an array: dtype + "\n" + shape joined by "," + "\n" + ("python_int\n" when the value was
    a Python int, meta python_int true) + its raw bytes: C order, little-endian, bfloat16 as its
    uint16 bit patterns, bool one byte per element
  + for a str (mask "causal"): value + "\n"
(the header text UTF-8; name with its call prefix, "step3/logits"; the rest of meta is not
covered). Per call: {"call": prefix, "taps": n, "sha256": sha256 of the n tap digests (32 bytes
each) concatenated in order, "short": the first 6 bytes of each tap digest, base64, 8 characters
per tap, in order}. The call hash is the full-strength check; the short ones name the first tap
that differs (a 48-bit prefix: a missed difference there still fails on the call hash).
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from common import npy_bytes

DIGEST_FORM = "tap-sha256-v1"
SHORT_BYTES = 6

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


def index_record(r: dict) -> dict:
    """A tap record as a golden index lists it: "kind" left out for an array and "stored" left
    out when true (the readers' defaults, oracle/golden.ts IndexTap: a logits index already lists
    only stored arrays that way). Only the index is compacted; live captures keep every field."""
    return {k: v for k, v in r.items() if not ((k == "kind" and v == "array") or (k == "stored" and v is True))}


def tap_digest(t: Any) -> bytes:
    """sha256 of one tap's canonical form (module docstring); an array tap needs its data."""
    head = f"gemma4-parity tap v1\n{t.kind}\n{t.name}\n"
    data = None
    if t.kind == "array":
        if t.data is None:
            raise ValueError(f"tap {t.name}: no data to digest (capture in full mode)")
        head += f"{t.dtype}\n{','.join(str(int(d)) for d in t.shape)}\n"
        if (t.meta or {}).get("python_int") is True:
            head += "python_int\n"
        a = np.ascontiguousarray(t.data).reshape(np.shape(t.data))  # (ascontiguousarray makes 0-d 1-d)
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and np.little_endian is False):
            a = a.astype(a.dtype.newbyteorder("<"))
        if list(a.shape) != [int(d) for d in t.shape]:
            raise ValueError(f"tap {t.name}: data shape {list(a.shape)} is not the tap's {t.shape}")
        data = a.tobytes(order="C")
    elif t.kind == "str":
        head += f"{t.value}\n"
    h = hashlib.sha256(head.encode("utf-8"))
    if data is not None:
        h.update(data)
    return h.digest()


def call_digests(calls: list[Any]) -> dict:
    """Digests of every tap of every call (module docstring), for a scenario's index entry."""
    out = []
    for c in calls:
        ds = [tap_digest(t) for t in c.taps.values()]
        out.append({"call": c.prefix, "taps": len(ds), "sha256": hashlib.sha256(b"".join(ds)).hexdigest(),
                    "short": "".join(base64.b64encode(d[:SHORT_BYTES]).decode("ascii") for d in ds)})
    return {"form": DIGEST_FORM, "calls": out}


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
