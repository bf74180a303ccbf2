"""Reproducer: mlx-lm 0.32.2's speculative decoding leaves greedy decoding on Gemma 4 once a
sliding-window cache has filled.

speculative_generate_step rewinds rejected draft tokens with trim_prompt_cache, which trims all
caches or none; RotatingKVCache.is_trimmable() is `offset < max_size`, so once any sliding
window has filled, every rewind is a silent no-op and the rejected tokens stay in every cache.

For each case: the first index where speculative_generate_step's tokens (and logprob bytes)
differ from generate_step's greedy ones, and what trim_prompt_cache does on the target's caches
after a run of that length (offsets, trimmable flags, tokens trimmed).

stdin: {"cases": [{"target": dir, "draft": dir, "prompt": [...], "num_draft_tokens": k, "max_tokens": n}]}
stdout: {"cases": [{"first_token_diff", "first_logprobs_diff", "window", "trim": {...}}]}
Run with the venv python and -I (the repo's mlx/ folder would shadow the mlx package).
"""
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import load_model

models = {}


def model(d):
    if d not in models:
        models[d], _ = load_model(Path(d))
    return models[d]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def lp_bytes(lp):
    mx.eval(lp)
    return np.array(lp).tobytes()


def run(c):
    target, draft = model(c["target"]), model(c["draft"])
    prompt = mx.array(c["prompt"], dtype=mx.int32)
    n = c["max_tokens"]
    spec = list(speculative_generate_step(prompt, target, draft, num_draft_tokens=c["num_draft_tokens"], max_tokens=n))
    greedy = list(generate_step(prompt, target, max_tokens=n))
    # What a rewind does once the caches hold as many tokens as this run put there.
    cache = make_prompt_cache(target)
    target(mx.array([c["prompt"] + [t for t, _ in greedy]]), cache=cache)
    before = [int(x.offset) for x in cache]
    trimmable = [bool(x.is_trimmable()) for x in cache]
    trimmed = trim_prompt_cache(cache, 3)
    return {
        "window": target.args.sliding_window,
        "first_token_diff": first_diff([int(t) for t, _, _ in spec], [int(t) for t, _ in greedy]),
        "first_logprobs_diff": first_diff([lp_bytes(lp) for _, lp, _ in spec], [lp_bytes(lp) for _, lp in greedy]),
        "spec_tokens": [int(t) for t, _, _ in spec],
        "greedy_tokens": [int(t) for t, _ in greedy],
        "trim": {"offsets": before, "trimmable": trimmable, "can_trim": can_trim_prompt_cache(cache),
                 "trimmed_of_3": int(trimmed), "offsets_after": [int(x.offset) for x in cache]},
    }


print(json.dumps({"cases": [run(c) for c in json.load(sys.stdin)["cases"]]}))
