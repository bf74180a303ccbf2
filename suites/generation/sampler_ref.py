"""Reference draws from mlx-lm's make_sampler for the TS sampler parity test.

stdin: {"cases": [case, ...]}, case = {"logits": [[...]], "dtype": "float32"|"bfloat16"|"float16", "seed": int, "draws": int,
        "configs": [{"temp": f, "top_p": f, "min_p": f, "min_tokens_to_keep": i, "top_k": i}, ...]}
stdout: {"cases": [[{"tokens": [...], "top_p": hex|None, "min_p": hex|None, "top_k": hex|None}, ...]}
Run with the venv python and -I (the repo's mlx/ folder would shadow the mlx package).
"""
import json
import sys
from pathlib import Path

import mlx.core as mx
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import device_env  # noqa: E402,F401  (MLX_DEVICE: the run's device, as on the TS side)
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_sampler

DT = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def hexof(a):
    a = a.astype(mx.float32) if a.dtype == mx.bfloat16 else a
    mx.eval(a)
    return np.array(a).tobytes().hex()


def run_case(req):
    logits = mx.array(np.array(req["logits"], dtype=np.float32)).astype(DT[req["dtype"]])
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    out = []
    for c in req["configs"]:
        r = {}
        r["top_p"] = hexof(apply_top_p(logprobs, c["top_p"])) if 0 < c["top_p"] < 1 else None
        r["min_p"] = hexof(apply_min_p(logprobs, c["min_p"], c["min_tokens_to_keep"])) if c["min_p"] != 0 else None
        r["top_k"] = hexof(apply_top_k(logprobs, c["top_k"])) if c["top_k"] > 0 else None
        mx.random.seed(req["seed"])
        s = make_sampler(temp=c["temp"], top_p=c["top_p"], min_p=c["min_p"], min_tokens_to_keep=c["min_tokens_to_keep"], top_k=c["top_k"])
        toks = []
        for _ in range(req["draws"]):
            toks.append(s(logprobs).tolist())
        r["tokens"] = toks
        out.append(r)
    return out


def main():
    req = json.load(sys.stdin)
    json.dump({"cases": [run_case(c) for c in req["cases"]]}, sys.stdout)


main()
