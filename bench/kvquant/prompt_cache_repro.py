"""Reproducer: a prompt-cache file holding an mlx-vlm 0.7.10 TurboQuantKVCache does not load back.

Run: .venv/bin/python bench/kvquant/prompt_cache_repro.py

mlx-vlm has no prompt-cache file functions of its own; mlx-lm 0.32.2's save_prompt_cache writes the
file (the TurboQuant state is a tuple of NamedTuples, flattened), but load_prompt_cache looks the
class name up in mlx_lm.models.cache and raises KeyError('TurboQuantKVCache'). So there is no
reference behaviour for the port to interoperate with: the port keeps state/metaState/trim (checked
against mlx-vlm in suites/kvquant) and writes no such files. Prints one JSON line.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx_lm.models import cache as mcache
from mlx_vlm.turboquant import TurboQuantKVCache


def main() -> None:
    c = TurboQuantKVCache(bits=4)
    mx.random.seed(0)
    c.update_and_fetch(mx.random.normal((1, 2, 5, 32)), mx.random.normal((1, 2, 5, 32)))
    with tempfile.TemporaryDirectory() as d:
        f = str(Path(d) / "cache.safetensors")
        mcache.save_prompt_cache(f, [c])
        arrays, metadata = mx.load(f, return_metadata=True)
        out = {"saved_arrays": sorted(arrays), "metadata": metadata}
        try:
            mcache.load_prompt_cache(f)
            out["load"] = "ok"
        except Exception as e:  # noqa: BLE001 - the failure is the finding
            out["load"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
