"""mlx-lm's decode-step graph, primitive by primitive, for the TS graph parity test.

stdin: {"runs": [{"checkpoint": dir, "prompt": [...]}]}
stdout: {"runs": [{"primitives": {name: count}}]}

Per run: the prompt but its last token is prefilled in one call (cache states evaluated), the last
token is one generate_step `_step` (evaluated), and the graph of the next `_step` (mlx-lm 0.32.2's
generate.py: `model(y[None], cache)`, `logits[:, -1, :]`, `logits - logsumexp(logits,
keepdims=True)`, the greedy sampler's argmax, `logprobs.squeeze(0)`), with every cache state as a
root, is exported with mx.export_to_dot and its primitive nodes counted.
Run with the venv python and -I (the repo's mlx/ folder would shadow the mlx package).
"""
import collections
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import device_env  # noqa: E402,F401  (MLX_DEVICE: the run's device, as on the TS side)
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402


def primitives(*roots) -> dict:
    fd, path = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(path, *roots)
        text = Path(path).read_text()
    finally:
        os.remove(path)
    # primitive nodes: `{ <id> [label ="Name", shape=rectangle]; }`; arrays are the other nodes
    return dict(collections.Counter(re.findall(r'\[label ="([^"]+)", shape=rectangle\]', text)))


def run(spec: dict) -> dict:
    model = load_model(Path(spec["checkpoint"]))[0]
    cache = make_prompt_cache(model)

    def step(tokens):
        logits = model(tokens[None], cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return mx.argmax(logprobs, axis=-1), logprobs.squeeze(0)

    prompt = mx.array(spec["prompt"], dtype=mx.int32)
    model(prompt[:-1][None], cache=cache)
    mx.eval([c.state for c in cache])
    y, lp = step(prompt[-1:])
    mx.eval(y, lp)
    y, lp = step(y)
    states = [a for c in cache for a in c.state if isinstance(a, mx.array)]
    return {"primitives": primitives(y, lp, *states)}


def main() -> int:
    req = json.load(sys.stdin)
    print(json.dumps({"runs": [run(s) for s in req["runs"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
