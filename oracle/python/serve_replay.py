"""Replays a schedule recorded by `npm run serve -- --record-schedule FILE` through mlx-lm 0.32.2's
own, unmodified BatchGenerator (and generate_step for the seeded requests the server ran alone),
and writes what each request generated there.

The schedule is JSON lines (serve/engine.ts writes them):
  open    {session, rng_seed, prefill_batch_size, completion_batch_size, prefill_step_size}
          a new BatchGenerator; mx.random.seed(rng_seed) (unseeded sampling draws from it)
  insert  {session, step, uid, request, tag, prompt, segments, max_tokens, sampler, stop_sequences}
          insert_segments([segments]) before the generator's next() call number `step` (0-based),
          with make_sampler(**sampler) (one sampler per request, as mlx_lm.server makes them)
  remove  {session, step, uids}     BatchGenerator.remove(uids) before call `step`
  leave   {session, step, uid, request, reason, tokens, logprobs, logprobs_sha256}
          the server's side: what the request got (read here only to know how far to run)
  close   {session, step}           the generator closed after `step` calls
  single  {request, prompt, max_tokens, seed, sampler, prefill_step_size, tokens, ...}
          mx.random.seed(seed), then generate_step for as many tokens as the server produced

Prompt cache: when the open events carry prompt_cache_size (the server's --prompt-cache-size), the
replay keeps mlx-lm's own LRUPromptCache and uses it as mlx_lm.server's ResponseGenerator does:
fetch_nearest_cache before each insert (the cached tokens leave the front segments, the cache goes
to insert_segments with all_tokens), the caches at segment ends (BatchGenerator.extract_cache)
and at each finish stored, trim_to(prompt_cache_bytes - prompt_cache_nbytes) after an insert, and
for a single: the fetched cache to generate_step, then stored under the prompt and its tokens. With
prompt_cache_snapshots N (the server's --prompt-cache-snapshots), the caches of sequences at the
other prefill chunk ends are extracted too (BatchGenerator.extract_cache) and kept as the server
keeps them (serve/prefix_cache.ts: up to N, least recently used out, a deeper one preferred to
the LRU's nearest, evicted before LRU entries under prompt_cache_bytes). The
number of cached tokens must equal the schedule's `cached` (exit 1 otherwise). One difference, the
server's: an exact hit (nothing left to prefill) is taken as a miss (mlx_lm.server fails on it).

Output (JSON, stdout or --out): {"requests": {"<request>": {"tokens": [...], "logprobs": [...],
"logprobs_sha256": [...], "reason": ...}}, "sessions": n, "calls": total next() calls}: per
generated token its id, the logprob of that token (a Python float from the float32/bf16 row) and
the sha256 of the step's whole logprobs row (its raw bytes, the dtype mlx-lm computes in).
Exit codes: 0 ok, 1 the prompt cache disagrees with the schedule, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import device_env  # noqa: E402,F401  (MLX_DEVICE, as on the TS side)

import mlx.core as mx  # noqa: E402
from mlx_lm.generate import BatchGenerator, StopSequences, generate_step  # noqa: E402
from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

from common import to_numpy  # noqa: E402


def row_sha(row: mx.array) -> str:
    data, _ = to_numpy(row)
    return hashlib.sha256(data.tobytes()).hexdigest()


def sampler_of(s: dict):
    return make_sampler(float(s["temp"]), top_p=float(s["top_p"]), min_p=float(s["min_p"]), top_k=int(s["top_k"]))


MODEL_KEY = "served"


class CacheMismatch(Exception):
    pass


def cache_bytes(cache) -> int:
    return sum(c.nbytes for c in cache)


class Reuse:
    """The server's prefix reuse (serve/prefix_cache.ts) over mlx-lm's own LRUPromptCache: the LRU
    cache as mlx_lm.server uses it and, with prompt_cache_snapshots, the chunk-boundary snapshots
    (up to N, least recently used first out, evicted before LRU entries under prompt_cache_bytes)."""

    def __init__(self, size: int, n_bytes, snapshots: int):
        self.lru = LRUPromptCache(size)
        self.n_bytes = n_bytes
        self.max_snapshots = snapshots
        self.snaps: list[tuple[list[int], list, int]] = []  # (tokens, cache, nbytes), oldest first

    def snap_bytes(self) -> int:
        return sum(n for _, _, n in self.snaps)

    def fetch(self, prompt: list[int]):
        cache, rest = self.lru.fetch_nearest_cache(MODEL_KEY, prompt)
        if cache is not None and not rest:
            cache, rest = None, prompt
        n = len(prompt) - len(rest)
        if self.max_snapshots > 0:
            best = None
            for s in self.snaps:
                if len(s[0]) >= len(prompt) or (best is not None and len(s[0]) <= len(best[0])):
                    continue
                if prompt[: len(s[0])] == s[0]:
                    best = s
            if best is not None:
                self.snaps.remove(best)
                self.snaps.append(best)
                if len(best[0]) > n:
                    cache, n = copy.deepcopy(best[1]), len(best[0])
        return cache, n

    def snapshot(self, tokens: list[int], cache, active: int) -> None:
        if self.max_snapshots <= 0 or any(t == tokens for t, _, _ in self.snaps):
            return
        self.snaps.append((tokens, cache, cache_bytes(cache)))
        while len(self.snaps) > self.max_snapshots:
            self.snaps.pop(0)
        self.enforce(active)

    def enforce(self, active: int) -> None:
        if self.n_bytes is None:
            return
        room = max(0, self.n_bytes - active - self.lru.nbytes)
        while self.snaps and self.snap_bytes() > room:
            self.snaps.pop(0)
        self.lru.trim_to(n_bytes=self.n_bytes - active - self.snap_bytes())


def fetch(pc, prompt: list[int], ev: dict):
    """The server's fetch (an exact LRU hit is a miss; a deeper snapshot wins); checks the count."""
    cache, n = (None, 0) if pc is None else pc.fetch(prompt)
    if n != int(ev.get("cached", 0)):
        raise CacheMismatch(f"request {ev['request']}: {n} cached tokens in the replay, {ev.get('cached')} in the schedule")
    return cache, n


def replay_session(model, opened: dict, events: list[dict], out: dict, pc=None) -> int:
    mx.random.seed(int(opened["rng_seed"]))
    gen = BatchGenerator(model, completion_batch_size=int(opened["completion_batch_size"]),
                         prefill_batch_size=int(opened["prefill_batch_size"]),
                         prefill_step_size=int(opened["prefill_step_size"]))
    inserts: dict[int, list[dict]] = defaultdict(list)
    removes: dict[int, list[dict]] = defaultdict(list)
    for ev in events:
        if ev["event"] == "insert":
            inserts[int(ev["step"])].append(ev)
        elif ev["event"] == "remove":
            removes[int(ev["step"])].append(ev)
    calls = max([int(ev["step"]) for ev in events] + [0])
    request_of: dict[int, int] = {}
    segment_types: dict[int, list[str]] = {}
    live: set[int] = set()  # inserted, not finished or removed
    for k in range(calls + 1):
        for ev in inserts.get(k, []):
            segments = [list(x) for x in ev.get("segments") or [ev["prompt"]]]
            if [t for seg in segments for t in seg] != list(ev["prompt"]):
                raise SystemExit(f"replay: request {ev['request']}'s segments are not its prompt")
            types = list(ev.get("segment_types") or ["assistant"] * len(segments))
            prompt = list(ev["prompt"])
            cache, n = fetch(pc, prompt, ev)
            while n > 0:
                if n >= len(segments[0]):
                    n -= len(segments.pop(0))
                    types.pop(0)
                else:
                    segments[0] = segments[0][n:]
                    break
            cached = int(ev.get("cached", 0))
            (uid,) = gen.insert_segments([segments], max_tokens=[int(ev["max_tokens"])],
                                         caches=[cache] if cache is not None else None,
                                         all_tokens=[prompt[:cached]] if cache is not None else None,
                                         samplers=[sampler_of(ev["sampler"])],
                                         stop_sequences=[StopSequences(ev["stop_sequences"])])
            segment_types[uid] = types[::-1]
            live.add(uid)
            del cache
            if pc is not None:
                pc.enforce(gen.prompt_cache_nbytes)
            if uid != int(ev["uid"]):
                raise SystemExit(f"replay: uid {uid} where the schedule has {ev['uid']}")
            request_of[uid] = int(ev["request"])
            out[str(ev["request"])] = {"tokens": [], "logprobs": [], "logprobs_sha256": [], "reason": None}
        for ev in removes.get(k, []):
            gen.remove([int(u) for u in ev["uids"]])
            live.difference_update(int(u) for u in ev["uids"])
            for u in ev["uids"]:
                out[str(request_of[int(u)])]["reason"] = "cancelled"
        if k == calls:
            break
        prompts, responses = gen.next()
        if pc is not None:
            eos = [r.uid for r in prompts if r.end_of_segment and not r.end_of_prompt and segment_types[r.uid]]
            for uid, (c, key) in gen.extract_cache(eos).items():
                pc.lru.insert_cache(MODEL_KEY, key[:], c, cache_type=segment_types[uid].pop())
            if pc.max_snapshots > 0:
                stored = set(eos)
                ends = [r.uid for r in prompts if not r.end_of_prompt and r.uid not in stored and r.uid in live]
                if ends:
                    active = gen.prompt_cache_nbytes
                    for c, key in gen.extract_cache(ends).values():
                        pc.snapshot(list(key), c, active)
        for r in responses:
            rec = out[str(request_of[r.uid])]
            rec["tokens"].append(int(r.token))
            rec["logprobs"].append(r.logprobs[r.token].item())
            rec["logprobs_sha256"].append(row_sha(r.logprobs))
            if r.finish_reason is not None:
                rec["reason"] = r.finish_reason
                if pc is not None:
                    pc.lru.insert_cache(MODEL_KEY, r.all_tokens[:], r.prompt_cache, cache_type="assistant")
                live.discard(r.uid)
    gen.close()
    return calls


def replay_single(model, ev: dict, out: dict, pc=None) -> None:
    n = len(ev["tokens"])
    rec = {"tokens": [], "logprobs": [], "logprobs_sha256": [], "reason": None}
    out[str(ev["request"])] = rec
    prompt = list(ev["prompt"])
    cache, cached = fetch(pc, prompt, ev)
    if cache is None:
        cache = make_prompt_cache(model)
    if n == 0:
        return
    mx.random.seed(int(ev["seed"]))
    steps = generate_step(mx.array(prompt[cached:], dtype=mx.int32), model, max_tokens=int(ev["max_tokens"]),
                          sampler=sampler_of(ev["sampler"]), prefill_step_size=int(ev["prefill_step_size"]),
                          prompt_cache=cache)
    for token, logprobs in steps:
        t = int(token)
        rec["tokens"].append(t)
        rec["logprobs"].append(logprobs[t].item())
        rec["logprobs_sha256"].append(row_sha(logprobs))
        if len(rec["tokens"]) == n:
            break
    rec["reason"] = ev["reason"]
    if pc is not None:
        pc.lru.insert_cache(MODEL_KEY, prompt + rec["tokens"], cache)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="serve_replay.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the checkpoint the server served")
    ap.add_argument("--schedule", required=True, help="the JSON-lines file of --record-schedule")
    ap.add_argument("--out", help="write the JSON here (default: stdout)")
    args = ap.parse_args(argv)
    try:
        lines = [json.loads(line) for line in Path(args.schedule).read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        print(f"serve_replay: cannot read the schedule: {e}", file=sys.stderr)
        return 2
    model, _ = load_model(Path(args.model))
    out: dict = {}
    sessions = 0
    total_calls = 0
    current: tuple[dict, list[dict]] | None = None
    sizes = {ev.get("prompt_cache_size") for ev in lines if ev.get("event") == "open"}
    size = next((s for s in sizes if s is not None), None)
    opens = [ev for ev in lines if ev.get("event") == "open" and ev.get("prompt_cache_size") is not None]
    pc = None
    if size is not None:
        first = opens[0] if opens else {}
        pc = Reuse(int(size), first.get("prompt_cache_bytes"), int(first.get("prompt_cache_snapshots") or 0))
    try:
        for ev in lines + [{"event": "end"}]:
            kind = ev.get("event")
            if kind in ("open", "single", "end") and current is not None:
                total_calls += replay_session(model, current[0], current[1], out, pc)
                sessions += 1
                current = None
            if kind == "open":
                current = (ev, [])
            elif kind == "single":
                replay_single(model, ev, out, pc)
            elif kind in ("insert", "remove", "leave", "close"):
                if current is None or int(ev["session"]) != int(current[0]["session"]):
                    print(f"serve_replay: a {kind} event outside its session: {json.dumps(ev)[:200]}", file=sys.stderr)
                    return 2
                current[1].append(ev)
            elif kind != "end":
                print(f"serve_replay: unknown event {kind!r}", file=sys.stderr)
                return 2
    except CacheMismatch as e:
        print(f"serve_replay: the prompt cache disagrees: {e}", file=sys.stderr)
        return 1
    text = json.dumps({"requests": out, "sessions": sessions, "calls": total_calls})
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
