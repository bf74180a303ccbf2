"""Batched generation on the oracle side (mlx-lm 0.32.2, unmodified).

- run_scenario: mlx-lm's own BatchGenerator on a batch scenario, recorded after every next()
  call: the prompt-processing responses, the generation responses (token, logprobs, finish
  reason; on finish the extracted prompt cache and all_tokens) and the state of every batch cache
  of the generation batch and of the prompt batch (per-sequence offsets and left padding, the
  physical index, rotation, buffer shapes, sha256 of the key/value buffers).
- batch_cache_ops: a sequence of BatchKVCache / BatchRotatingKVCache calls (update_and_fetch,
  make_mask, prepare/finalize, filter, extend, extract, merge), the state after each.

A batch scenario (JSON):
  prompts [[int]]                      inserted before the first next() call
  max_tokens int | [int]               per prompt (default 16)
  join [{at, prompts, max_tokens}]     inserted before next() call number `at` (0-based)
  remove [{at, uids}]                  BatchGenerator.remove(uids) before call `at`
  stop_tokens [[int]] | null           BatchGenerator(stop_tokens=...)
  prefill_batch_size, completion_batch_size, prefill_step_size   BatchGenerator's options
  sampler {temp, top_p, top_k, min_p, seed} | null                make_sampler (seeded once)
  light bool                           cache states without the key/value buffer hashes
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, batch_generate
from mlx_lm.models import cache as mcache
from mlx_lm.sample_utils import make_sampler

from common import to_numpy

MAX_CALLS = 10_000


def sha(a: mx.array | None) -> str | None:
    if a is None:
        return None
    data, _ = to_numpy(a)
    return hashlib.sha256(data.tobytes()).hexdigest()


def ints(a: Any) -> Any:
    if isinstance(a, mx.array):
        return [int(x) for x in a.tolist()] if a.ndim else int(a.item())
    return int(a)


def cache_state(c: Any, light: bool = False) -> dict:
    """The full state of one cache (batch or single): scalars, per-sequence arrays, buffer hashes
    (`light`: without the hashes)."""
    d: dict[str, Any] = {"type": type(c).__name__}
    if isinstance(c, (mcache.BatchKVCache, mcache.BatchRotatingKVCache)):
        d["offset"] = ints(c.offset)
        d["left_padding"] = ints(c.left_padding)
        d["idx"] = int(c._idx)
        if isinstance(c, mcache.BatchRotatingKVCache):
            d.update(max_size=int(c.max_size), _offset=int(c._offset), rotated=bool(c.rotated))
    else:
        d["offset"] = int(c.offset)
        if isinstance(c, mcache.RotatingKVCache):
            d.update(keep=int(c.keep), max_size=int(c.max_size), idx=int(c._idx))
    d["keys_shape"] = None if c.keys is None else list(c.keys.shape)
    d["values_shape"] = None if c.values is None else list(c.values.shape)
    if not light:
        d["keys_sha"] = sha(c.keys)
        d["values_sha"] = sha(c.values)
    return d


def _sampler(spec: dict | None) -> Callable | None:
    if not spec:
        return None
    if spec.get("seed") is not None:
        mx.random.seed(int(spec["seed"]))
    return make_sampler(temp=float(spec.get("temp", 0.0)), top_p=float(spec.get("top_p", 0.0)),
                        min_p=float(spec.get("min_p", 0.0)), top_k=int(spec.get("top_k", 0)))


def _max_tokens(v: Any, n: int) -> list[int] | None:
    if v is None:
        return None
    return [int(x) for x in v] if isinstance(v, list) else [int(v)] * n


def make_generator(model: Any, scn: dict) -> BatchGenerator:
    kw: dict[str, Any] = {}
    for k in ("prefill_batch_size", "completion_batch_size", "prefill_step_size"):
        if scn.get(k) is not None:
            kw[k] = int(scn[k])
    return BatchGenerator(model, max_tokens=int(scn.get("default_max_tokens", 16)),
                          stop_tokens=scn.get("stop_tokens") or None, sampler=_sampler(scn.get("sampler")), **kw)


def run_scenario(model: Any, scn: dict, out_array: Callable[[mx.array, str], dict]) -> dict:
    gen = make_generator(model, scn)
    joins = {int(j["at"]): j for j in scn.get("join") or []}
    removes = {int(r["at"]): r for r in scn.get("remove") or []}
    last_event = max([*joins, *removes], default=-1)
    prompts = scn.get("prompts") or []
    light = bool(scn.get("light"))
    uids = gen.insert(prompts, _max_tokens(scn.get("max_tokens", 16), len(prompts))) if prompts else []
    calls = []
    for i in range(MAX_CALLS):
        events: dict[str, Any] = {}
        if i in joins:
            j = joins[i]
            events["joined"] = gen.insert(j["prompts"], _max_tokens(j.get("max_tokens", 16), len(j["prompts"])))
        if i in removes:
            gen.remove(removes[i]["uids"])
            events["removed"] = list(removes[i]["uids"])
        prompt_rs, gen_rs = gen.next()
        rec: dict[str, Any] = dict(events)
        rec["prompt"] = [{"uid": r.uid, "progress": list(r.progress), "end_of_segment": bool(r.end_of_segment),
                          "end_of_prompt": bool(r.end_of_prompt)} for r in prompt_rs]
        rec["generation"] = []
        for r in gen_rs:
            g: dict[str, Any] = {"uid": r.uid, "token": int(r.token), "finish_reason": r.finish_reason,
                                 "logprobs": out_array(r.logprobs, "logprobs")}
            if r.finish_reason is not None:
                g["all_tokens"] = [int(t) for t in r.all_tokens]
                g["prompt_cache"] = [cache_state(c, light) for c in r.prompt_cache]
            rec["generation"].append(g)
        rec["generation_batch"] = {"uids": list(gen._generation_batch.uids),
                                   "cache": [cache_state(c, light) for c in gen._generation_batch.prompt_cache]}
        rec["prompt_batch"] = {"uids": list(gen._prompt_batch.uids),
                               "cache": [cache_state(c, light) for c in gen._prompt_batch.prompt_cache]}
        calls.append(rec)
        if not prompt_rs and not gen_rs and i >= last_event:
            break
    else:
        raise RuntimeError(f"batch scenario did not finish within {MAX_CALLS} next() calls")
    stats = gen._counters
    gen.close()
    return {"uids": uids, "calls": calls,
            "counters": {"prompt_tokens": stats.prompt_tokens, "generation_tokens": stats.generation_tokens,
                         "generation_steps": stats.generation_steps}}


class _StubTokenizer:
    """batch_generate uses the tokenizer only for eos_token_ids and decode (docs: mlxlm-extras §5.1)."""

    def __init__(self, eos: list[int]):
        self.eos_token_ids = eos

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(i) for i in ids)


def run_batch_generate(model: Any, req: dict) -> dict:
    kw: dict[str, Any] = {}
    for k in ("prefill_batch_size", "completion_batch_size", "prefill_step_size"):
        if req.get(k) is not None:
            kw[k] = int(req[k])
    r = batch_generate(model, _StubTokenizer([int(t) for t in req.get("eos_token_ids") or []]), req["prompts"],
                       max_tokens=req.get("max_tokens", 128), return_token_ids=True, return_logprobs=True, **kw)
    return {"token_ids": r.token_ids, "logprobs": r.logprobs,
            "stats": {"prompt_tokens": r.stats.prompt_tokens, "generation_tokens": r.stats.generation_tokens}}


def cache_content(c: Any) -> tuple[int, bytes, bytes]:
    """A single-sequence cache's logical content: offset and the last size() key/value columns in temporal order."""
    n = c.size()
    kv = []
    for v in (c.keys, c.values):
        if isinstance(c, mcache.RotatingKVCache):
            v = c._temporal_order(v)
        v = v[..., v.shape[2] - n:, :] if isinstance(c, mcache.RotatingKVCache) else v[..., :n, :]
        kv.append(to_numpy(v)[0].tobytes())
    return int(c.offset), kv[0], kv[1]


def run_batch_of_one(model: Any, req: dict, out_array: Callable[[mx.array, str], dict]) -> dict:
    """One prompt through BatchGenerator: its steps; with `single` (default) also through
    generate_step, and whether the two agree: tokens, logprobs bytes, and the final caches'
    logical content (the batch's extracted cache against generate_step's cache, temporal order)."""
    from mlx_lm.generate import generate_step

    prompt, mt, ps = list(req["prompt"]), int(req["max_tokens"]), int(req.get("prefill_step_size", 2048))
    gen = BatchGenerator(model, max_tokens=mt, prefill_step_size=ps)
    gen.insert([prompt])
    steps, extracted = [], None
    while rs := gen.next_generated():
        for r in rs:
            steps.append((int(r.token), r.logprobs))
            if r.finish_reason is not None:
                extracted = r.prompt_cache
    gen.close()
    out: dict[str, Any] = {"tokens": [t for t, _ in steps], "logprobs": [out_array(lp, "logprobs") for _, lp in steps]}
    if not req.get("single", True):
        return out
    cache = mcache.make_prompt_cache(model)
    single = [(int(t), lp) for t, lp in generate_step(mx.array(prompt, dtype=mx.int32), model, max_tokens=mt,
                                                      prefill_step_size=ps, prompt_cache=cache)]
    raw = lambda a: to_numpy(a)[0].tobytes()  # noqa: E731
    out["relation"] = {"tokens": [t for t, _ in steps] == [t for t, _ in single],
                       "logprobs": len(steps) == len(single) and all(raw(a) == raw(b) for (_, a), (_, b) in zip(steps, single)),
                       "cache": [cache_content(e) == cache_content(s) for e, s in zip(extracted, cache)]}
    return out


def stop_match(req: dict) -> dict:
    """StopSequences over token streams: per stream, the positions where a stop sequence completed."""
    from mlx_lm.generate import StopSequences

    ss = StopSequences(req["stop_sequences"] or None)
    out = []
    for stream in req["streams"]:
        m = ss.matcher()
        out.append([i for i, t in enumerate(stream) if m.advance(int(t))])
    return {"matches": out}


# ------------------------------------------------------------------------------ cache ops

def _new_batch_cache(op: dict) -> Any:
    if op["type"] == "BatchKVCache":
        return mcache.BatchKVCache(list(op["left_padding"]))
    if op["type"] == "BatchRotatingKVCache":
        return mcache.BatchRotatingKVCache(int(op["max_size"]), list(op["left_padding"]))
    raise ValueError(f"unknown batch cache type {op['type']!r}")


def _new_single(op: dict) -> Any:
    return mcache.KVCache() if op["type"] == "KVCache" else mcache.RotatingKVCache(int(op["max_size"]))


def batch_cache_ops(ops: list[dict], in_array: Callable[[dict], mx.array],
                    out_array: Callable[[mx.array, str], dict], mask_value: Callable[[Any], dict]) -> list[dict]:
    """Runs the ops on named caches; every result and the state of the op's cache after it."""
    caches: dict[str, Any] = {}
    results = []
    for op in ops:
        name = op.get("cache", "c")
        kind = op["op"]
        r: dict[str, Any] = {"op": kind}
        if kind == "new":
            caches[name] = _new_batch_cache(op)
        elif kind == "new_single":
            caches[name] = _new_single(op)
        elif kind == "merge":  # caches[name] = type(first).merge([caches[s] for s in sources])
            srcs = [caches[s] for s in op["sources"]]
            caches[name] = type(srcs[0]).merge(srcs)
        else:
            c = caches[name]
            if kind == "update_and_fetch":
                k, v = c.update_and_fetch(in_array(op["keys"]), in_array(op["values"]))
                r["keys"], r["values"] = out_array(k, "k"), out_array(v, "v")
            elif kind == "make_mask":
                r["mask"] = mask_value(c.make_mask(int(op["N"]), window_size=op.get("window_size"),
                                                   return_array=bool(op.get("return_array", False))))
            elif kind == "prepare":
                c.prepare(left_padding=op.get("left_padding"), lengths=op.get("lengths"),
                          right_padding=op.get("right_padding"))
            elif kind == "finalize":
                c.finalize()
            elif kind == "filter":
                c.filter(list(op["indices"]))
            elif kind == "extend":
                c.extend(caches[op["other"]])
            elif kind == "extract":
                caches[op["to"]] = c.extract(int(op["index"]))
            elif kind == "trim":
                r["trimmed"] = int(c.trim(int(op["n"])))
            else:
                raise ValueError(f"unknown batch cache op {kind!r}")
        target = op.get("to", name) if kind == "extract" else name
        r["state"] = cache_state(caches[target])
        results.append(r)
    return results
