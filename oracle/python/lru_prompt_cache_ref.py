"""mlx-lm 0.32.2's own LRUPromptCache (mlx_lm/models/cache.py, unmodified) on a list of operations
read as JSON from stdin, with stand-in caches (one object per entry: its id, nbytes, whether it is
trimmable, and the tokens trimmed from it), so that the class's behaviour (nearest prefix, copies,
trims, LRU order by kind, evictions by count and bytes) can be compared with serve/prompt_cache.ts.

Operations: {"op": "insert", "tokens": [...], "id": n, "nbytes": n, "trimmable": bool, "type": "assistant"|"user"|"system"}
            {"op": "fetch", "tokens": [...]}
            {"op": "trim_to", "n_sequences": n | null, "n_bytes": n | null}
Input: {"max_size", "max_bytes", "ops"} or {"runs": [such objects]} (then a list of outputs).
Output (stdout, JSON): one record per operation: for fetch {"cache": {"id", "trimmed"} | null,
"rest": [...]}; after every operation the state {"len", "nbytes", "order": {type: [tokens...]},
"stats": {type: {"n_sequences", "n_bytes"}}}. Exit codes: 0 ok, 2 bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import device_env  # noqa: E402,F401

from mlx_lm.models.cache import LRUPromptCache  # noqa: E402

MODEL = "m"


class StandIn:
    def __init__(self, id_: int, nbytes: int, trimmable: bool):
        self.id = id_
        self.nbytes = nbytes
        self.trimmable = trimmable
        self.trimmed = 0

    def is_trimmable(self) -> bool:
        return self.trimmable

    def trim(self, n: int) -> int:
        self.trimmed += n
        return n


def state(c: LRUPromptCache) -> dict:
    return {"len": len(c), "nbytes": c.nbytes,
            "order": {k: [list(t) for (_, t) in q] for k, q in c._lru._lrus.items()},
            "stats": c.stats_by_type()}


def main() -> int:
    try:
        spec = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(f"lru_prompt_cache_ref: bad JSON: {e}", file=sys.stderr)
        return 2
    if "runs" in spec:
        results = []
        for run in spec["runs"]:
            r = run_one(run)
            if r is None:
                return 2
            results.append(r)
        print(json.dumps(results))
        return 0
    r = run_one(spec)
    if r is None:
        return 2
    print(json.dumps(r))
    return 0


def run_one(spec: dict) -> list | None:
    c = LRUPromptCache(max_size=int(spec["max_size"]), max_bytes=int(spec.get("max_bytes") or (1 << 63)))
    out = []
    for op in spec["ops"]:
        rec: dict = {}
        if op["op"] == "insert":
            c.insert_cache(MODEL, list(op["tokens"]), [StandIn(op["id"], op["nbytes"], op["trimmable"])], cache_type=op["type"])
        elif op["op"] == "fetch":
            cache, rest = c.fetch_nearest_cache(MODEL, list(op["tokens"]))
            rec["cache"] = None if cache is None else {"id": cache[0].id, "trimmed": cache[0].trimmed}
            rec["rest"] = list(rest)
        elif op["op"] == "trim_to":
            c.trim_to(n_sequences=op.get("n_sequences"), n_bytes=op.get("n_bytes"))
        else:
            print(f"lru_prompt_cache_ref: unknown op {op['op']!r}", file=sys.stderr)
            return None
        rec["state"] = state(c)
        out.append(rec)
    return out


if __name__ == "__main__":
    sys.exit(main())
