#!/usr/bin/env python
"""Measures how far the goldens are from mlx-lm run on this machine's backend and device.

The goldens (golden/manifest.json) were recorded on one platform fingerprint, e.g. the CPU of the
machine that ran `npm run golden:regen`. On another backend (CUDA, Metal) the same scenarios give
other bits. This script re-runs every golden entry with mlx-lm here, on the device MLX_DEVICE names
(default: MLX's default device), and reports, per tap kind and dtype, the largest ULP distance and
the largest absolute difference from the golden, also per checkpoint and dtype (on CUDA some
checkpoints meet MLX bugs that others do not). It is a diagnosis, not a budget: the goldens are
compared only where the platform fingerprint and versions are the manifest's, bit for bit, and
anywhere else the suites compare against the live oracle (oracle/golden.ts goldenRule). Run on a
second machine of the goldens' kind, it shows whether they hold there (distance 0).

    .venv/bin/python -I oracle/python/golden_distance.py --out report/golden-distance-cuda.json [--only 'c1_dense/*']

Every entry is captured the way `npm run golden:regen` recorded it: through the oracle server's
scenario lookup and capture dispatch (Server.scenario, Server.run_capture), i.e. capture.capture
under mlx-lm for the text scenarios and capture_mm.mm_capture under mlx-vlm for the multimodal
ones (fixtures/mm_scenarios.json on the m* checkpoints).

Taps are compared only up to the first generated token that differs (after it, the two runs
compute different things); such entries are listed in "diverged".

The result is rewritten after every entry ("complete": false until the last), so a run stopped
early keeps what it measured. Parts measured apart (--only) combine into one result:

    .venv/bin/python -I oracle/python/golden_distance.py --merge a.json b.json --out all.json
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

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
    """The tap name without its call prefix and layer indices, e.g. 'self_attn/q_norm' (a media
    tower's taps keep their 'embed/' call: 'embed/vision_tower/encoder/self_attn/q_proj')."""
    parts = name.split("/")
    if parts and (parts[0].startswith("step") or parts[0].startswith("prefill") or parts[0] == "forward"):
        parts = parts[1:]
    parts = [p for k, p in enumerate(parts) if not (k < len(parts) - 1 and re.fullmatch(r"layers\.\d+", p))]
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
    """Identifies the golden set a measurement was made against (parts merge only when it is one)."""
    text = "".join(f"{k}:{files[k]['sha256']}\n" for k in sorted(files))
    return hashlib.sha256(text.encode()).hexdigest()


def json_safe(x):
    """Non-finite floats (a max |d| of inf, where one side holds inf) as null: JSON has no inf."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def write_atomic(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(json_safe(obj), indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)


def measured_entries(manifest: dict) -> list[str]:
    """The entries a measurement runs (those stored under another entry's name are skipped)."""
    return [eid for eid, e in manifest["entries"].items() if not e.get("same_as")]


def new_agg() -> dict:
    return {"taps": 0, "taps_differing": 0, "max_ulp": 0, "max_abs": 0.0}


def merge(files: list[Path], manifest: dict) -> dict:
    """One result from parts measured apart: the same backend, device, versions and goldens."""
    parts = [json.loads(f.read_text()) for f in files]
    same = ("backend", "device", "versions", "golden_files")
    for f, p in zip(files, parts):
        for k in same:
            if p[k] != parts[0][k]:
                raise SystemExit(f"{f}: {k} {p[k]!r} differs from {files[0]}'s {parts[0][k]!r}")
    done = sorted({e for p in parts for e in p["entry_ids"]})

    def fold(aggs: list[dict]) -> dict:
        return {"taps": sum(a["taps"] for a in aggs), "taps_differing": sum(a["taps_differing"] for a in aggs),
                "max_ulp": max(a["max_ulp"] for a in aggs),
                "max_abs": None if any(a["max_abs"] is None for a in aggs) else max(a["max_abs"] for a in aggs)}
    overlap = sum(len(p["entry_ids"]) for p in parts) - len(done)
    if overlap:
        raise SystemExit(f"the parts share {overlap} entries: measure disjoint --only sets")
    dtypes = sorted({d for p in parts for d in p["per_dtype"]})

    def fold_nested(field: str) -> dict:
        """{key: {dtype: agg}} folded over the parts (older parts may lack per_checkpoint)."""
        tables = [p.get(field, {}) for p in parts]
        keys = sorted({k for t in tables for k in t})
        return {k: {d: fold([t[k][d] for t in tables if d in t.get(k, {})])
                    for d in sorted({d for t in tables for d in t.get(k, {})})} for k in keys}
    return {
        **{k: parts[0][k] for k in (*same, "fingerprint", "golden_fingerprint")},
        "measured": max(p["measured"] for p in parts),
        "entry_ids": done, "entries": len(done), "complete": set(done) >= set(measured_entries(manifest)),
        "taps": sum(p["taps"] for p in parts), "diverged": [d for p in parts for d in p["diverged"]],
        "per_dtype": {d: fold([p["per_dtype"][d] for p in parts if d in p["per_dtype"]]) for d in dtypes},
        "per_kind": fold_nested("per_kind"),
        "per_checkpoint": fold_nested("per_checkpoint"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON result (written atomically, after every entry)")
    ap.add_argument("--only", action="append", default=[], help="entry id glob (checkpoint/variant/scenario, e.g. 'c1_dense/*')")
    ap.add_argument("--merge", type=Path, nargs="+", help="combine these results of disjoint --only runs into --out (measures nothing)")
    args = ap.parse_args(argv)
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    if args.merge:
        out = merge(args.merge, manifest)
        write_atomic(args.out, out)
        print(f"[golden-distance] merged {len(args.merge)} parts: {out['entries']} entries, {out['taps']} taps, complete: {out['complete']} -> {args.out}", file=sys.stderr)
        return 0
    # the capture server's scratch folder, removed at the end
    with tempfile.TemporaryDirectory(prefix="golden-distance-") as work:
        return measure(args, manifest, Server(Path(work), DEFAULT_CKPT_ROOT, None))


def measure(args: argparse.Namespace, manifest: dict, server: Server) -> int:
    kinds: dict[str, dict[str, dict]] = {}
    per_checkpoint: dict[str, dict[str, dict]] = {}
    per_dtype: dict[str, dict] = {}
    diverged, done, taps = [], [], 0
    selected = [eid for eid in measured_entries(manifest) if not args.only or any(fnmatch.fnmatchcase(eid, g) for g in args.only)]
    t0 = time.time()

    def result() -> dict:
        return {
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "backend": device_env.backend(), "device": device_env.DEVICE,
            "fingerprint": fingerprint(), "versions": versions(),
            "golden_fingerprint": manifest["fingerprint"], "golden_files": golden_files_digest(manifest["files"]),
            "entry_ids": done, "entries": len(done), "complete": set(done) >= set(measured_entries(manifest)),
            "taps": taps, "diverged": diverged,
            "per_dtype": per_dtype, "per_kind": kinds, "per_checkpoint": per_checkpoint,
        }

    for eid in selected:
        e = manifest["entries"][eid]
        # as Server.cmd_golden recorded it (mlx-vlm's capture for the multimodal scenarios)
        scn = server.scenario({"scenario": e["scenario"]})
        calls, meta = server.run_capture(e["checkpoint"], scn, e["mode"])
        index = json.loads((GOLDEN / e["index"]).read_text())
        gold_tokens = next((s["meta"].get("generated") for s in index["scenarios"] if s["scenario"] == e["scenario"]), None)
        here_tokens = meta.get("generated")
        # compare the calls up to the first differing generated token (the calls after it differ)
        last_call = len(calls)
        if gold_tokens is not None and here_tokens is not None and gold_tokens != here_tokens:
            first = next(i for i, (a, b) in enumerate(zip(gold_tokens + [None], here_tokens + [None])) if a != b)
            diverged.append({"entry": eid, "first_differing_token": first, "golden": gold_tokens[:first + 3], "here": here_tokens[:first + 3]})
            # up to the step call that produced token `first` (mm captures start with an embed call)
            last_call = next((i for i, c in enumerate(calls) if c.kind == "step" and c.index > first), len(calls))
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
                    for agg in (kinds.setdefault(tap_kind(t.name), {}).setdefault(t.dtype, new_agg()),
                                per_checkpoint.setdefault(e["checkpoint"], {}).setdefault(t.dtype, new_agg()),
                                per_dtype.setdefault(t.dtype, new_agg())):
                        agg["taps"] += 1
                        agg["taps_differing"] += 1 if mism else 0
                        agg["max_ulp"] = max(agg["max_ulp"], ulp)
                        agg["max_abs"] = max(agg["max_abs"], mabs)
        done.append(eid)
        write_atomic(args.out, result())
        print(f"[golden-distance] {eid}: done ({len(done)}/{len(selected)} entries, {taps} taps so far, {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    write_atomic(args.out, result())
    print(f"[golden-distance] {len(done)} entries, {taps} taps, {len(diverged)} with other tokens -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
