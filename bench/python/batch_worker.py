"""mlx-lm side of the batched-generation benchmark (bench/batch.ts): a JSON-lines worker, so TS
and mlx-lm runs alternate inside one benchmark run.

Requests (one JSON object per line on stdin), replies on stdout:
  {"cmd": "load", "path": DIR}                                   -> {"ok": true}
  {"cmd": "batch", "prompts": [[ids]], "max_tokens": N, "prefill_step_size": P}
      mlx-lm's batch_generate (no EOS), its BatchStats, peak memory after a reset
      -> {"ok": true, "prompt_tps", "generation_tps", "decode_tps", "generation_tokens", "peak_memory", "tokens"}
  {"cmd": "quit"}
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import batch_generate
from mlx_lm.utils import load_model

model = None


class NoEos:
    eos_token_ids: list = []

    def decode(self, ids):
        return ""


def cmd_load(req):
    global model
    model, _ = load_model(Path(req["path"]))
    return {}


def cmd_batch(req):
    mx.clear_cache()
    mx.reset_peak_memory()
    r = batch_generate(model, NoEos(), req["prompts"], max_tokens=int(req["max_tokens"]),
                       prefill_step_size=int(req["prefill_step_size"]), return_token_ids=True)
    s = r.stats
    return {"prompt_tps": s.prompt_tps, "generation_tps": s.generation_tps, "decode_tps": s.decode_tps,
            "generation_tokens": s.generation_tokens, "peak_memory": mx.get_peak_memory(), "tokens": r.token_ids}


def main():
    out = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            break
        try:
            res = {"ok": True, **{"load": cmd_load, "batch": cmd_batch}[req["cmd"]](req)}
        except Exception as e:  # noqa: BLE001 - every failure goes back to the caller
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(res) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
