"""Oracle side of speculative decoding and prompt-cache files (server commands `speculative`,
`prompt_cache_save`, `prompt_cache_continue`, `mtp`, `exact_verify`).

- mlx-lm 0.32.2: speculative_generate_step with a draft model; save_prompt_cache /
  load_prompt_cache after a cache_prompt-style prefill (generate_step with max_tokens=0).
- mlx-vlm 0.7.10 (imported lazily): the Gemma 4 MTP round loop with the gemma4_assistant drafter
  (run_speculative_rounds -> _mtp_rounds), recorded round by round with run-time wrappers that
  are removed again on exit, and Gemma4ExactSpeculativeVerifier.

Nothing in mlx-lm or mlx-vlm is edited; the wrappers only observe.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models import cache as mcache


def cache_states(cache: list) -> list[dict]:
    """Each cache's mlx-lm state: the buffers as held plus the integers."""
    out = []
    for c in cache:
        d: dict[str, Any] = {"type": type(c).__name__, "offset": int(c.offset), "keys": c.keys, "values": c.values}
        if isinstance(c, mcache.RotatingKVCache):
            d.update(keep=int(c.keep), max_size=int(c.max_size), idx=int(c._idx))
        out.append(d)
    return out


def run_speculative(model, draft, prompt: list[int], num_draft_tokens: int, max_tokens: int,
                    prefill_step_size: int) -> dict:
    """speculative_generate_step with fresh caches (prompt_cache=None); the caches are made
    here exactly as it makes them, so that they can be returned after the final rewind."""
    model_cache = mcache.make_prompt_cache(model)
    draft_cache = mcache.make_prompt_cache(draft)
    tokens, logprobs, from_draft = [], [], []
    calls = {"n": 0}
    orig = mcache.make_prompt_cache

    def make(m, *a, **k):  # hand speculative_generate_step our two lists
        calls["n"] += 1
        return model_cache if m is model else draft_cache

    import mlx_lm.generate as mlg
    mlg.make_prompt_cache = make
    try:
        for t, lp, fd in speculative_generate_step(mx.array(prompt, dtype=mx.int32), model, draft,
                                                   num_draft_tokens=num_draft_tokens, max_tokens=max_tokens,
                                                   prefill_step_size=prefill_step_size):
            tokens.append(int(t))
            logprobs.append(lp)
            from_draft.append(bool(fd))
    finally:
        mlg.make_prompt_cache = orig
    assert calls["n"] == 2
    return {"tokens": tokens, "logprobs": logprobs, "from_draft": from_draft,
            "cache": cache_states(model_cache), "draft_cache": cache_states(draft_cache)}


def prompt_cache_save(model, prompt: list[int], file: str, metadata: dict, prefill_step_size: int) -> dict:
    """mlx_lm.cache_prompt: the whole prompt through generate_step(max_tokens=0), then save."""
    cache = mcache.make_prompt_cache(model)
    for _ in generate_step(mx.array(prompt), model, max_tokens=0, prompt_cache=cache,
                           prefill_step_size=prefill_step_size):
        pass
    mcache.save_prompt_cache(file, cache, metadata)
    return {"cache": cache_states(cache)}


def prompt_cache_continue(model, file: str, suffix: list[int], max_tokens: int, prefill_step_size: int) -> dict:
    """load_prompt_cache(file) and generate_step(suffix, prompt_cache=...), greedy."""
    cache, metadata = mcache.load_prompt_cache(file, return_metadata=True)
    loaded = cache_states(cache)
    loaded = [{**d, "keys": None if d["keys"] is None else mx.array(d["keys"]),
               "values": None if d["values"] is None else mx.array(d["values"])} for d in loaded]
    tokens, logprobs = [], []
    for t, lp in generate_step(mx.array(suffix, dtype=mx.int32), model, max_tokens=max_tokens,
                               prompt_cache=cache, prefill_step_size=prefill_step_size):
        tokens.append(int(t))
        logprobs.append(lp)
    return {"metadata": metadata, "loaded": loaded, "tokens": tokens, "logprobs": logprobs, "cache": cache_states(cache)}
