"""Prompt-cache files holding mlx-vlm 0.7.10 quantized caches (TurboQuantKVCache), both ways.

Neither pinned package can round-trip such a file: mlx-vlm has no prompt-cache functions, and
mlx-lm 0.32.2's save_prompt_cache writes only each cache's `state` (no meta_state: this version
dropped it), while its load_prompt_cache looks the class name up in mlx_lm.models.cache and raises
KeyError('TurboQuantKVCache') (bench/kvquant/prompt_cache_repro.py). mlx-vlm's own caches
(mlx_vlm.models.cache.KVCache / RotatingKVCache, which its gemma4 uses) keep keep/max_size/offset/
_idx in meta_state, so without it even their sliding layers do not load back.

The interop format, defined here and written by the port (model/cache/prompt_cache.ts):
- exactly what mlx_lm.models.cache.save_prompt_cache(file, cache, metadata) writes from mlx-vlm's
  cache objects (tensors "{layer}.{path}" from tree_flatten of the states, class names "1.{layer}",
  the scalar table "2.*"), called unmodified;
- plus one user-metadata entry, "mlx_vlm_meta_state": JSON, the list of every cache's meta_state
  (a list of strings, or "" for a cache without one), which mlx-lm 0.32.2 has no place for.
Loading (load_vlm_prompt_cache) parses the file as mlx-lm's load_prompt_cache does (mx.load,
tree_unflatten, the scalar table), then builds each cache with mlx-vlm's own
`cls.from_state(state, meta_state)`, the class looked up in mlx_vlm.models.cache or
mlx_vlm.turboquant; a TurboQuant state's tuples get their NamedTuple type back
(TurboQuantMSEState), as mlx-vlm's _restore_kv_state does. A Split-codec state is refused: its
outlier index sets live in the codec, not in state or meta_state, so mlx-vlm itself cannot restore
it from state + meta_state.

Commands (one JSON job on argv[1] or stdin, one JSON reply on stdout):
- write {checkpoint, prompt, file, kv_bits, kv_quant_scheme, quantized_kv_start, prefill_step_size,
  suffix, max_tokens}: mlx-vlm's generate_step(prompt, max_tokens=1) on the fixture (mlx-vlm's gemma4
  Model), the cache saved to `file` as above; then generation continues in memory from that cache
  with `suffix`: per step the token, logprobs sha256 and cache records (kv_quant_ref.cache_record).
- from_state_probe {}: mlx-vlm's own from_state on TurboQuantKVCache and HybridQuantKVCache, then an
  update: their errors.
- continue {checkpoint, file, suffix, max_tokens, kv_bits, ...}: load_vlm_prompt_cache(file), the
  loaded caches' records, then generation continues from it with `suffix`, recorded the same way.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_unflatten

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kv_quant_codecs import cache_record  # noqa: E402

META_KEY = "mlx_vlm_meta_state"


def save_vlm_prompt_cache(file: str, cache: list, metadata: dict | None = None) -> None:
    from mlx_lm.models.cache import save_prompt_cache
    metas = [list(c.meta_state) if c.meta_state else "" for c in cache]
    save_prompt_cache(file, cache, {**(metadata or {}), META_KEY: json.dumps(metas)})


def _restore_turbo_state(s):
    from mlx_vlm.turboquant import TurboQuantMSEState
    if s is None:
        return None
    if len(s) == 2 and all(isinstance(x, mx.array) for x in s):
        return TurboQuantMSEState(*s)
    raise ValueError("a TurboQuant state other than the MSE codec's (norms, indices) cannot be restored from state + meta_state "
                     "(the Split codec's outlier indices are not in either)")


def load_vlm_prompt_cache(file: str):
    from mlx_vlm.models import cache as vcache
    from mlx_vlm import turboquant

    arrays, raw = mx.load(file, return_metadata=True)
    metadata, classes, scalars = tree_unflatten(list(raw.items()))
    for pos, kind in scalars[1:]:  # as mlx-lm's load_prompt_cache
        if kind == "scalar":
            arrays[pos] = arrays[pos].item()
        elif kind == "string":
            arrays[pos] = "".join(chr(i) for i in arrays[pos].tolist())
        elif kind == "none":
            arrays[pos] = None
        else:
            raise ValueError(f"[load_prompt_cache] Unknown type {kind}")
    states = tree_unflatten(list(arrays.items()))
    if META_KEY not in metadata:
        raise ValueError(f"{file}: no {META_KEY} entry: not a prompt-cache file of mlx-vlm cache objects")
    metas = json.loads(metadata.pop(META_KEY))
    out = []
    for cls_name, state, meta in zip(classes, states, metas):
        cls = getattr(turboquant, cls_name, None) if cls_name in ("TurboQuantKVCache",) else getattr(vcache, cls_name)
        if cls is turboquant.TurboQuantKVCache:
            # mlx-vlm's inherited from_state (cls.__new__, no __init__) leaves the codec attributes
            # unset, and the first update fails (cmd_from_state_probe): build it with __init__, then
            # set state and meta_state, as mlx-vlm's own prefix_cache_restore path does.
            obj = cls(bits=float(meta[1]))
            obj.state = (_restore_turbo_state(state[0]), _restore_turbo_state(state[1]))
            obj.meta_state = tuple(meta)
            out.append(obj)
        else:
            out.append(cls.from_state(tuple(state), tuple(meta) if meta else ""))
    return out, metadata


def _steps(model, tokens, cache, job) -> list:
    from mlx_vlm.generate.ar import generate_step
    steps = []
    gen = generate_step(mx.array([tokens], dtype=mx.int32), model, None, None, max_tokens=job["max_tokens"],
                        kv_bits=job["kv_bits"], kv_quant_scheme=job.get("kv_quant_scheme", "turboquant"),
                        kv_group_size=job.get("kv_group_size", 64), quantized_kv_start=job["quantized_kv_start"],
                        prefill_step_size=job.get("prefill_step_size", 2048), prompt_cache=cache)
    for tok, lp in gen:
        lp32 = np.array(lp.astype(mx.float32))
        steps.append({"token": int(tok), "logprobs_sha256": hashlib.sha256(lp32.tobytes()).hexdigest(),
                      "cache": [cache_record(c) for c in cache]})
    return steps


def _model(job):
    from speculative import vlm_target
    return vlm_target(Path(job["checkpoint"]))


def cmd_write(job: dict) -> dict:
    from mlx_vlm.models import cache as vcache
    model = _model(job)
    cache = vcache.make_prompt_cache(model.language_model)
    first = _steps(model, job["prompt"], cache, {**job, "max_tokens": 1})
    save_vlm_prompt_cache(job["file"], cache, {"model": job["checkpoint"]})
    saved = [cache_record(c) for c in cache]
    return {"first": first, "saved": saved, "continued": _steps(model, job["suffix"], cache, job)}


def cmd_continue(job: dict) -> dict:
    model = _model(job)
    cache, metadata = load_vlm_prompt_cache(job["file"])
    loaded = [cache_record(c) for c in cache]
    return {"metadata": metadata, "loaded": loaded, "continued": _steps(model, job["suffix"], cache, job)}


def cmd_from_state_probe(job: dict) -> dict:
    """mlx-vlm's own from_state(state, meta_state) on its two quantized caches (TurboQuantKVCache,
    HybridQuantKVCache with uniform keys and TurboQuant values), then one update: the error, if any."""
    from mlx_vlm.kv_quant import from_legacy
    from mlx_vlm.turboquant import HybridQuantKVCache, TurboQuantKVCache
    out = {}
    for name, make in (("TurboQuantKVCache", lambda: TurboQuantKVCache(bits=4)),
                       ("HybridQuantKVCache", lambda: HybridQuantKVCache(from_legacy(4, "uniform", 32, None, None, None, "turboquant")))):
        mx.random.seed(0)
        c = make()
        c.update_and_fetch(mx.random.normal((1, 2, 5, 32)), mx.random.normal((1, 2, 5, 32)))
        try:
            r = type(c).from_state(c.state, c.meta_state)
            r.update_and_fetch(mx.random.normal((1, 2, 1, 32)), mx.random.normal((1, 2, 1, 32)))
            out[name] = None
        except Exception as e:  # noqa: BLE001 - the failure is the finding
            out[name] = {"type": type(e).__name__, "message": str(e)}
    return out


def cmd_many(job: dict) -> dict:
    return {"results": [COMMANDS[j["command"]](j) for j in job["jobs"]]}


COMMANDS = {"write": cmd_write, "continue": cmd_continue, "from_state_probe": cmd_from_state_probe, "many": cmd_many}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read())
    fn = COMMANDS.get(job.get("command"))
    if fn is None:
        print(json.dumps({"error": {"type": "UsageError", "message": f"unknown command {job.get('command')!r}"}}))
        sys.exit(2)
    print(json.dumps(fn(job)))


if __name__ == "__main__":
    main()
