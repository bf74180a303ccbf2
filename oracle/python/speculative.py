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
import sys
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

    mlg = sys.modules["mlx_lm.generate"]  # (the package attribute `generate` is the function)
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


# ------------------------------------------------------------------ mlx-vlm: Gemma 4 MTP

TINY_VISION = dict(model_type="gemma4_vision", hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                   num_attention_heads=1, num_key_value_heads=1, head_dim=8, global_head_dim=8)


def vlm_target(ckpt: Path):
    """mlx-vlm's gemma4 Model holding a text fixture's weights (language_model.*); the (unused)
    vision tower is a tiny stand-in: speculative decoding of a text prompt never calls it. A
    quantized fixture (a `quantization` block) has its language model quantized first as mlx-vlm's
    loader does it: nn.quantize on the modules whose .scales the checkpoint holds, with the
    config's group size, bits and mode, or the per-module entry (its own parameters, or false)
    where the config has one."""
    import mlx.nn as nn
    from mlx_vlm.models.gemma4 import Model, ModelConfig, TextConfig, VisionConfig

    tcfg = json.loads((ckpt / "config.json").read_text())
    if tcfg.get("model_type") != "gemma4_text" or tcfg.get("tie_word_embeddings") is False:
        raise ValueError(f"{ckpt}: the speculative oracles take a flat gemma4_text checkpoint with tied embeddings")
    cfg = ModelConfig.from_dict({"model_type": "gemma4", "text_config": tcfg, "vision_config": TINY_VISION,
                                 "vocab_size": tcfg["vocab_size"]})
    cfg.text_config = TextConfig.from_dict(tcfg)
    cfg.vision_config = VisionConfig.from_dict(TINY_VISION)
    cfg.audio_config = None
    model = Model(cfg)
    weights = mx.load(str(ckpt / "model.safetensors"))
    q = tcfg.get("quantization")
    if q:
        nn.quantize(model.language_model, group_size=q["group_size"], bits=q["bits"], mode=q.get("mode", "affine"),
                    class_predicate=lambda p, m: q[p] if p in q else f"{p}.scales" in weights)
    model.language_model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model


def vlm_cache_states(cache: list) -> list[dict]:
    out = []
    for c in cache:
        d: dict[str, Any] = {"type": type(c).__name__, "offset": int(c.offset),
                             "keys": None if c.keys is None else mx.array(c.keys),
                             "values": None if c.values is None else mx.array(c.values)}
        for a in ("_idx", "start_position", "buffer_size", "max_size"):
            if hasattr(c, a):
                d[a.lstrip("_")] = int(getattr(c, a))
        out.append(d)
    return out


@contextmanager
def patched(owner: Any, attr: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    orig = getattr(owner, attr)
    setattr(owner, attr, make(orig))
    try:
        yield
    finally:
        setattr(owner, attr, orig)


def round_recorders(cur: dict, rounds: list, after_commit: Callable[[dict], None] | None = None):
    """The wrappers every recorded round loop shares (MTP here, DFlash in speculative_dflash.py):
    _record_speculative_round keeps the accepted count in `cur`; commit_speculative_round adds
    every target cache after the rollback (and whatever `after_commit` adds), appends the round
    to `rounds` and starts the next."""

    def on_record(orig):
        def f(dm, accepted, draft_count):
            cur["accepted"] = int(accepted)
            return orig(dm, accepted, draft_count)
        return f

    def on_commit(orig):
        def f(lm, caches, state, accepted, block_size):
            out = orig(lm, caches, state, accepted, block_size)
            cur["cache"] = vlm_cache_states(caches)
            if after_commit is not None:
                after_commit(cur)
            rounds.append(dict(cur))
            cur.clear()
            return out
        return f

    return on_record, on_commit


def drain(gen, prompt_cache: list) -> tuple[list[int], dict]:
    """Every token of an mlx-vlm generate_step, and the first one's token, logprobs and the
    target caches right after it (the prefill's)."""
    tokens: list[int] = []
    first: dict[str, Any] = {}
    for i, (t, lp) in enumerate(gen):
        tokens.append(int(t))
        if i == 0:
            first = {"token": int(t), "logprobs": mx.array(lp), "cache": vlm_cache_states(prompt_cache)}
    return tokens, first


def target_and_drafter(ckpt: Path, drafter: Path, kind: str):
    """vlm_target, mlx-vlm's load_drafter (which must resolve to `kind`) and a fresh prompt cache."""
    from mlx_vlm.models import cache as vcache
    from mlx_vlm.speculative.drafters import load_drafter

    model = vlm_target(ckpt)
    draft, resolved = load_drafter(str(drafter))
    if resolved != kind:
        raise ValueError(f"{drafter}: drafter kind {resolved!r}, expected {kind!r}")
    return model, draft, vcache.make_prompt_cache(model.language_model)


def sampling_kwargs(sampling: dict | None) -> dict:
    """generate_step's sampling arguments for a recorded run, as mlx_vlm.generate --temp / --top-p /
    --top-k / --min-p / --seed passes them: the seed goes to mx.random.seed here (not to
    generate_step), so the sampler is make_sampler's over the global random state; or, with
    `positioned`, the seed goes to generate_step, as mlx-vlm's API and server pass it, selecting its
    _PositionedTargetSampler. None: greedy (temperature 0)."""
    if not sampling:
        return {"temperature": 0.0}
    kwargs = {"temperature": float(sampling["temp"]), "top_p": float(sampling.get("top_p", 0.0)),
              "top_k": int(sampling.get("top_k", 0)), "min_p": float(sampling.get("min_p", 0.0))}
    if sampling.get("positioned"):
        # generate_step(seed=S): its _PositionedTargetSampler (mlx-vlm's API and server path)
        kwargs["seed"] = int(sampling["seed"])
    else:
        mx.random.seed(int(sampling["seed"]))
    return kwargs


def rng_after_round(sampling: dict | None):
    """round_recorders' after_commit for runs on the global key: that key after the round's walk
    (positioned runs never touch it)."""
    return (lambda c: c.update(rng=mx.array(mx.random.state[0]))) if sampling and not sampling.get("positioned") else None


def run_mtp(ckpt: Path, drafter: Path, prompt: list[int], max_tokens: int, draft_block_size: int | None,
            prefill_step_size: int, sampling: dict | None = None) -> dict:
    """mlx-vlm generate_step(draft_kind="mtp") on one prompt, greedy or sampled (sampling_kwargs),
    recorded per round: block size, drafted tokens, the drafter's logits per step, the target's
    logits at every walked position, the accepted count, every target cache after the round's
    rollback and, when sampling, the global random key after the round."""
    from mlx_vlm.generate.ar import generate_step as vlm_generate_step
    from mlx_vlm.speculative import mtp as vmtp
    from mlx_vlm.speculative.drafters.gemma4_assistant import Gemma4AssistantDraftModel

    model, draft, prompt_cache = target_and_drafter(ckpt, drafter, "mtp")
    rounds: list[dict] = []
    cur: dict[str, Any] = {}

    def on_call(orig):
        def f(self, *a, **k):
            out = orig(self, *a, **k)
            cur.setdefault("draft_logits", []).append(mx.array(out[1]))
            return out
        return f

    def on_block(orig):
        def f(last_bonus, hidden, cache, block_size, *a, **k):
            toks = orig(last_bonus, hidden, cache, block_size, *a, **k)
            cur.update(block_size=int(block_size), drafted=[int(x) for x in toks.reshape(-1).tolist()])
            return toks
        return f

    def on_logits(orig):
        def f(lm, hidden):
            out = orig(lm, hidden)
            cur.setdefault("target_logits", []).append(mx.array(out[:, 0, :] if out.ndim == 3 else out))
            return out
        return f

    on_record, on_commit = round_recorders(cur, rounds, rng_after_round(sampling))
    with patched(Gemma4AssistantDraftModel, "__call__", on_call), patched(draft, "draft_block", on_block), \
            patched(vmtp, "_mtp_logits_from_hidden", on_logits), \
            patched(vmtp, "_record_speculative_round", on_record), \
            patched(vmtp, "commit_speculative_round", on_commit):
        gen = vlm_generate_step(mx.array([prompt], dtype=mx.int32), model, None, None, max_tokens=max_tokens,
                                draft_model=draft, draft_kind="mtp", draft_block_size=draft_block_size,
                                prefill_step_size=prefill_step_size, prompt_cache=prompt_cache,
                                **sampling_kwargs(sampling))
        tokens, first = drain(gen, prompt_cache)
    return {"tokens": tokens, "first": first, "rounds": rounds, "accept_lens": list(draft.accept_lens)}


def run_exact_verify(ckpt: Path, prompt: list[int], block: list[int]) -> dict:
    """Gemma4ExactSpeculativeVerifier through mlx-vlm's LanguageModel (exact_speculative_verify=True,
    speculative_verify=True): the prompt through an ordinary forward into a fresh cache, then the
    block through the verifier. Returns the block's logits and the caches after it, and the
    block's logits from the ordinary forward on a copy of the prefilled cache."""
    from mlx_vlm.models import cache as vcache

    model = vlm_target(ckpt)
    lm = model.language_model
    lm.config.exact_speculative_verify = True
    out = {}
    for name, verify in (("verifier", True), ("forward", False)):
        cache = vcache.make_prompt_cache(lm)
        if len(prompt):
            lm(mx.array([prompt], dtype=mx.int32), cache=cache)
            mx.eval([c.state for c in cache])
        logits = lm(mx.array([block], dtype=mx.int32), cache=cache, speculative_verify=verify).logits
        out[name] = {"logits": logits, "cache": vlm_cache_states(cache)}
    return out
