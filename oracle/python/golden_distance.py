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

The result is rewritten after every entry ("complete": false until the last), so a run stopped
early keeps what it measured. Parts measured apart (--only) combine into one result:

    .venv/bin/python -I oracle/python/golden_distance.py --merge a.json b.json --out all.json
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


def write_atomic(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def measured_entries(manifest: dict) -> list[str]:
    """The entries a measurement runs (those stored under another entry's name are skipped)."""
    return [eid for eid, e in manifest["entries"].items() if not e.get("same_as")]


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
                "max_ulp": max(a["max_ulp"] for a in aggs), "max_abs": max(a["max_abs"] for a in aggs)}
    overlap = sum(len(p["entry_ids"]) for p in parts) - len(done)
    if overlap:
        raise SystemExit(f"the parts share {overlap} entries: measure disjoint --only sets")
    dtypes = sorted({d for p in parts for d in p["per_dtype"]})
    kinds = sorted({k for p in parts for k in p["per_kind"]})
    return {
        **{k: parts[0][k] for k in (*same, "fingerprint", "golden_fingerprint")},
        "measured": max(p["measured"] for p in parts),
        "entry_ids": done, "entries": len(done), "complete": set(done) >= set(measured_entries(manifest)),
        "taps": sum(p["taps"] for p in parts), "diverged": [d for p in parts for d in p["diverged"]],
        "per_dtype": {d: fold([p["per_dtype"][d] for p in parts if d in p["per_dtype"]]) for d in dtypes},
        "per_kind": {k: {d: fold([p["per_kind"][k][d] for p in parts if d in p["per_kind"].get(k, {})]) for d in sorted({d for p in parts for d in p["per_kind"].get(k, {})})} for k in kinds},
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
    server = Server(Path(tempfile.mkdtemp(prefix="golden-distance-")), DEFAULT_CKPT_ROOT, None)
    kinds: dict[str, dict[str, dict]] = {}
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
            "per_dtype": per_dtype, "per_kind": kinds,
        }

    for eid in selected:
        e = manifest["entries"][eid]
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
        done.append(eid)
        write_atomic(args.out, result())
        print(f"[golden-distance] {eid}: done ({len(done)}/{len(selected)} entries, {taps} taps so far, {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    write_atomic(args.out, result())
    print(f"[golden-distance] {len(done)} entries, {taps} taps, {len(diverged)} with other tokens -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
