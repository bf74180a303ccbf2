#!/usr/bin/env python
"""Measures how far the goldens are from mlx-lm run on this machine's backend and device.

The goldens (golden/manifest.json) were recorded on one platform fingerprint, e.g. the CPU of the
machine that ran `npm run golden:regen`. On another backend (CUDA, Metal) the same scenarios give
other bits. This script re-runs every golden entry with mlx-lm here, on the device MLX_DEVICE names
(default: MLX's default device), and reports, per tap kind and dtype, the largest ULP distance and
the largest absolute difference from the golden. `npm run golden:regen -- --cross-backend FILE`
then records the result in the manifest as that backend's measured budget.

    .venv/bin/python -I oracle/python/golden_distance.py --out report/golden-distance-cuda.json [--only 'c1_dense/*']

Taps are compared only up to the first generated token that differs (after it, the two runs
compute different things); such entries are listed in "diverged".
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import capture as cap  # noqa: E402
import device_env  # noqa: E402
from common import DEFAULT_CKPT_ROOT, REPO  # noqa: E402
from server import Server, fingerprint, versions  # noqa: E402

GOLDEN = REPO / "golden"


def ordered_bits(a: np.ndarray, dtype: str) -> np.ndarray | None:
    """Float bit patterns as integers whose difference is the ULP distance (None: not a float)."""
    if dtype == "float32":
        i = a.view(np.int32).astype(np.int64)
        lo = np.int64(-(2**31))
    elif dtype in ("bfloat16", "float16"):
        i = a.view(np.int16).astype(np.int64)
        lo = np.int64(-(2**15))
    else:
        return None
    return np.where(i < 0, lo - i, i)


def as_float64(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def tap_kind(name: str) -> str:
    """The tap name without its call prefix and layer index, e.g. 'self_attn/q_norm'."""
    parts = name.split("/")
    if parts and (parts[0].startswith("step") or parts[0].startswith("prefill") or parts[0] == "forward"):
        parts = parts[1:]
    if len(parts) > 1 and parts[0].startswith("layers."):
        parts = parts[1:]
    return "/".join(parts) or name


def distance(here: np.ndarray, gold: np.ndarray, dtype: str) -> tuple[int, float, int]:
    """(max ULP, max abs, mismatched elements); ULP is -1 for non-float dtypes."""
    if here.shape != gold.shape or here.dtype != gold.dtype:
        raise ValueError(f"{here.dtype}{list(here.shape)} vs golden {gold.dtype}{list(gold.shape)}")
    here, gold = here.reshape(-1), gold.reshape(-1)
    if here.tobytes() == gold.tobytes():
        return 0, 0.0, 0
    w = here.dtype.itemsize
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[w]
    mism = int((here.view(bits) != gold.view(bits)).sum())
    ob, og = ordered_bits(here, dtype), ordered_bits(gold, dtype)
    ulp = int(np.abs(ob - og).max()) if ob is not None else -1
    with np.errstate(invalid="ignore"):
        d = np.abs(as_float64(here, dtype) - as_float64(gold, dtype))
    mabs = float(np.nanmax(d)) if d.size and not np.all(np.isnan(d)) else 0.0
    return ulp, mabs, mism


def golden_files_digest(files: dict) -> str:
    """Identifies the golden set a measurement was made against (as oracle/golden.ts does)."""
    text = "".join(f"{k}:{files[k]['sha256']}\n" for k in sorted(files))
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON result (written atomically)")
    ap.add_argument("--only", action="append", default=[], help="entry id glob (checkpoint/variant/scenario, e.g. 'c1_dense/*')")
    args = ap.parse_args(argv)
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    server = Server(Path(tempfile.mkdtemp(prefix="golden-distance-")), DEFAULT_CKPT_ROOT, None)
    kinds: dict[str, dict[str, dict]] = {}
    per_dtype: dict[str, dict] = {}
    diverged, entries, taps = [], 0, 0
    t0 = time.time()
    for eid, e in manifest["entries"].items():
        if e.get("same_as") or (args.only and not any(fnmatch.fnmatchcase(eid, g) for g in args.only)):
            continue
        model = server.model(e["checkpoint"])
        scn = server.scenario({"scenario": e["scenario"]})
        calls, meta = cap.capture(model, scn, e["mode"])
        index = json.loads((GOLDEN / e["index"]).read_text())
        gold_tokens = next((s["meta"].get("generated") for s in index["scenarios"] if s["scenario"] == e["scenario"]), None)
        here_tokens = meta.get("generated")
        # compare the calls up to the first differing generated token (the calls after it differ)
        last_call = len(calls)
        if gold_tokens is not None and here_tokens is not None and gold_tokens != here_tokens:
            first = next(i for i, (a, b) in enumerate(zip(gold_tokens + [None], here_tokens + [None])) if a != b)
            diverged.append({"entry": eid, "first_differing_token": first, "golden": gold_tokens[:first + 3], "here": here_tokens[:first + 3]})
            last_call = sum(1 for c in calls if c.kind == "prefill") + first + 1
        entries += 1
        with zipfile.ZipFile(GOLDEN / e["npz"]) as zf:
            names = set(zf.namelist())
            for c in calls[:last_call]:
                for t in c.taps.values():
                    if t.data is None:
                        continue
                    key = f"{e['prefix']}{t.name}.npy"
                    if key not in names:
                        continue
                    with zf.open(key) as f:
                        gold = np.lib.format.read_array(f, allow_pickle=False)
                    here = t.data
                    ulp, mabs, mism = distance(here, gold, t.dtype)
                    taps += 1
                    k = kinds.setdefault(tap_kind(t.name), {}).setdefault(t.dtype, {"taps": 0, "taps_differing": 0, "max_ulp": 0, "max_abs": 0.0})
                    for agg in (k, per_dtype.setdefault(t.dtype, {"taps": 0, "taps_differing": 0, "max_ulp": 0, "max_abs": 0.0})):
                        agg["taps"] += 1
                        agg["taps_differing"] += 1 if mism else 0
                        agg["max_ulp"] = max(agg["max_ulp"], ulp)
                        agg["max_abs"] = max(agg["max_abs"], mabs)
        print(f"[golden-distance] {eid}: done ({taps} taps so far, {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    out = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": device_env.backend(), "device": device_env.DEVICE,
        "fingerprint": fingerprint(), "versions": versions(),
        "golden_fingerprint": manifest["fingerprint"], "golden_files": golden_files_digest(manifest["files"]),
        "entries": entries, "taps": taps, "diverged": diverged,
        "per_dtype": per_dtype, "per_kind": kinds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, args.out)
    print(f"[golden-distance] {entries} entries, {taps} taps, {len(diverged)} with other tokens -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
