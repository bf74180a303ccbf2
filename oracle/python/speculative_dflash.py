"""Oracle side of DFlash speculative decoding (server command `dflash`): mlx-vlm 0.7.10's
generate_step(draft_kind="dflash") with a gemma4_dflash or gemma4_dspark drafter
(speculative/utils.py run_speculative_rounds -> speculative/dflash.py _dflash_rounds), greedy
(temperature 0) or sampled as mlx_vlm.generate samples: mx.random.seed(seed) first, then
generate_step without a seed argument, so its sampler is make_sampler's (global random state) and
the round loop takes the non-positioned sampled path (draft_block with the sampler under
_SpeculativeSamplerRNG, then _sample_dflash_target_walk one position at a time). Recorded round
by round with run-time wrappers that are removed again on exit. Nothing in mlx-vlm is edited; the
wrappers only observe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx

from speculative import drain, patched, rng_after_round, round_recorders, sampling_kwargs, target_and_drafter, vlm_cache_states


def run_dflash(ckpt: Path, drafter: Path, prompt: list[int], max_tokens: int, draft_block_size: int | None,
               sampling: dict | None = None) -> dict:
    """Per round: block size, drafted tokens, the drafter's logits, the target's verify logits and
    captured hidden (concatenated), the accepted count, the walk's emitted tokens, every target
    cache after the commit and every drafter cache after the draft; when sampling, the global
    random key after the round. Also the prefill: first token, its logprobs, the target caches and
    the captured prompt hidden; and the drafter's resolved config. `sampling` = {temp, top_p,
    top_k, min_p, seed} (absent: greedy)."""
    from mlx_vlm.generate.ar import generate_step as vlm_generate_step
    from mlx_vlm.speculative import dflash as vdfl
    from mlx_vlm.speculative import utils as vutils

    model, draft, prompt_cache = target_and_drafter(ckpt, drafter, "dflash")
    rounds: list[dict] = []
    cur: dict[str, Any] = {}
    holder: dict[str, Any] = {}

    def on_rounds(orig):
        def f(m, d, pc, hidden, **k):
            holder["prefill_hidden"] = mx.array(hidden)
            return orig(m, d, pc, hidden, **k)
        return f

    def on_reset(orig):
        def f(target):
            holder["draft_cache"] = orig(target)
            return holder["draft_cache"]
        return f

    def on_block(orig):
        def f(last_bonus, hidden, cache, block_size, *a, **k):
            toks = orig(last_bonus, hidden, cache, block_size, *a, **k)
            mx.eval(toks)
            cur.update(block_size=int(block_size), drafted=[int(x) for x in toks.reshape(-1).tolist()],
                       draft_cache=vlm_cache_states(cache))
            return toks
        return f

    def on_logits(orig):
        def f(hidden):
            out = orig(hidden)
            cur["draft_logits"] = mx.array(out)
            return out
        return f

    def on_verify(orig):
        def f(lm, inputs, cache, capture_layer_ids):
            out, state = orig(lm, inputs, cache, capture_layer_ids)
            cur.update(verify_input=[int(x) for x in inputs.reshape(-1).tolist()], target_logits=mx.array(out.logits),
                       target_hidden=mx.concatenate(out.hidden_states, axis=-1))
            return out, state
        return f

    def on_walk(orig):
        def f(*a, **k):
            out = orig(*a, **k)
            if isinstance(out[0], list):  # _sample_dflash_target_walk: per-row lists, one row here
                cur["emitted"] = [int(x) for x in out[1][0]]
            else:
                cur["emitted"] = [int(x) for x in out[1]]
            return out
        return f

    on_record, on_commit = round_recorders(cur, rounds, rng_after_round(sampling))  # commit follows the walk
    with patched(vutils, "_dflash_rounds", on_rounds), patched(draft, "reset", on_reset), \
            patched(draft, "draft_block", on_block), patched(draft, "_logits", on_logits), \
            patched(vdfl, "_dflash_verify", on_verify), patched(vdfl, "_record_speculative_round", on_record), \
            patched(vdfl, "commit_speculative_round", on_commit), patched(vdfl, "_speculative_walk", on_walk), \
            patched(vdfl, "_sample_dflash_target_walk", on_walk):
        gen = vlm_generate_step(mx.array([prompt], dtype=mx.int32), model, None, None, max_tokens=max_tokens,
                                draft_model=draft, draft_kind="dflash", draft_block_size=draft_block_size,
                                prompt_cache=prompt_cache, **sampling_kwargs(sampling))
        tokens, first = drain(gen, prompt_cache)
    c = draft.config
    config = {"mask_token_id": int(c.mask_token_id), "target_layer_ids": list(c.target_layer_ids),
              "block_size": int(c.block_size), "layer_types": list(c.layer_types),
              "sliding_window": c.sliding_window, "is_causal": bool(c.is_causal), "num_target_layers": c.num_target_layers}
    return {"tokens": tokens, "first": first, "prefill_hidden": holder.get("prefill_hidden"), "rounds": rounds,
            "accept_lens": list(draft.accept_lens), "draft_lens": list(draft.draft_lens), "config": config}


def block_sizes(cases: list[dict]) -> list[int]:
    """mlx-vlm's _dflash_next_block_size on each case {requested, remaining, accept_lens,
    draft_lens, prefer, initial, min}, the drafter a plain namespace holding those attributes."""
    from types import SimpleNamespace

    from mlx_vlm.speculative.dflash import _dflash_next_block_size

    out = []
    for c in cases:
        dm = SimpleNamespace(accept_lens=list(c["accept_lens"]), draft_lens=list(c["draft_lens"]),
                             prefer_requested_block_size=bool(c.get("prefer", False)),
                             dflash_min_block_size=int(c.get("min", 4)))
        out.append(int(_dflash_next_block_size(dm, int(c["requested"]), int(c["remaining"]), c.get("initial"))))
    return out

