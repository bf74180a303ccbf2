"""Sampled generate_step runs from mlx-lm for the TS generation parity test.

stdin: {"runs": [{"checkpoint": dir, "prompt": [...], "prefill_step_size": int, "max_tokens": int,
                  "seed": int, "temp": f, "top_p": f, "min_p": f, "min_tokens_to_keep": i, "top_k": i}]}
stdout: {"runs": [{"tokens": [...], "logprobs": [hex of float32 bytes per step], "dtype": str,
                   "cache": [{type, offset, keep?, max_size?, idx?, keys_shape, values_shape}],
                   "cache_sha256": [{dtype, keys, values}]}]}  (sha256 of each layer's key/value bytes)
Run with the venv python and -I (the repo's mlx/ folder would shadow the mlx package).
"""
import hashlib
import json
import sys
from pathlib import Path

import mlx.core as mx
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import device_env  # noqa: E402,F401  (MLX_DEVICE: the run's device, as on the TS side)
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models import cache as mcache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model


def meta(c):
    d = {"type": type(c).__name__, "offset": int(c.offset)}
    if isinstance(c, mcache.RotatingKVCache):
        d.update(keep=int(c.keep), max_size=int(c.max_size), idx=int(c._idx))
    d["keys_shape"] = None if c.keys is None else list(c.keys.shape)
    d["values_shape"] = None if c.values is None else list(c.values.shape)
    return d


def sha256_of(c):
    """As the oracle's generate reply (oracle/python/server.py cache_sha256): the buffers' raw bytes."""
    def digest(a):
        if a is None:
            return None
        if a.dtype == mx.bfloat16:
            a = a.view(mx.uint16)
        mx.eval(a)
        return hashlib.sha256(np.array(a).tobytes()).hexdigest()
    return {"dtype": None if c.keys is None else str(c.keys.dtype).split(".")[-1],
            "keys": digest(c.keys), "values": digest(c.values)}


def hexof(a):
    dt = str(a.dtype).split(".")[-1]
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    mx.eval(a)
    return dt, np.array(a).tobytes().hex()


models = {}


def run(r):
    ck = r["checkpoint"]
    if ck not in models:
        models[ck], _ = load_model(Path(ck))
    model = models[ck]
    cache = mcache.make_prompt_cache(model)
    mx.random.seed(int(r["seed"]))
    sampler = make_sampler(temp=r["temp"], top_p=r["top_p"], min_p=r["min_p"],
                           min_tokens_to_keep=r["min_tokens_to_keep"], top_k=r["top_k"])
    toks, lps, dt = [], [], None
    for t, lp in generate_step(mx.array(r["prompt"], dtype=mx.int32), model, max_tokens=r["max_tokens"],
                               sampler=sampler, prefill_step_size=r["prefill_step_size"], prompt_cache=cache):
        toks.append(int(t))
        dt, h = hexof(lp)
        lps.append(h)
    return {"tokens": toks, "logprobs": lps, "dtype": dt, "cache": [meta(c) for c in cache],
            "cache_sha256": [sha256_of(c) for c in cache]}


def main():
    req = json.load(sys.stdin)
    json.dump({"runs": [run(r) for r in req["runs"]]}, sys.stdout)


main()
