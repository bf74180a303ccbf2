"""mlx-lm side of the benchmarks: a JSON-lines worker the TS harness drives, so TS and mlx-lm
runs can alternate (A B A B ...) inside one benchmark run.

Requests (one JSON object per line on stdin), replies on stdout:
  {"cmd": "load", "path": DIR}                        -> {"ok": true, "seconds": s}
  {"cmd": "generate", "prompt": [ids], "max_tokens": N, "prefill_step_size": P}
      mlx-lm's stream_generate timing: the prompt clock stops at the first token, and
      generation_tps = (n + 1) / (time since the first token), peak memory after a reset.
      -> {"ok": true, "prompt_tps", "generation_tps", "prompt_seconds", "peak_memory", "tokens"}
  {"cmd": "graph_build", "prompt": [ids], "reps": R}
      prefill the prompt, then R times: build one decode step's graph (timed, no eval), then
      evaluate it synchronously (timed apart)
      -> {"ok": true, "seconds": [per-rep build times], "eval_seconds": [per-rep eval times]}
  {"cmd": "train_setup", "path": DIR, "tokens": [[ids]], "lengths": [[offset, length]], "compiled": bool,
   "grad_checkpoint": bool}
      mlx_lm.lora's setup (seed 0, freeze, LoRA rank 8 on all layers, AdamW 1e-5) and the
      trainer's step (compiled with inputs/outputs = state, or eager); two warm-up steps
      -> {"ok": true}
  {"cmd": "train_steps", "steps": N}
      N timed steps (step + one mx.eval of the state) -> {"ok": true, "seconds": median, "peak_memory"}
  {"cmd": "mtp_generate", "target": DIR, "drafter": DIR, "prompt": [ids], "max_tokens": N}
      mlx-vlm 0.7.10's MTP decoding (gemma4_assistant drafter, greedy) with the timing of
      "generate", plus the rounds -> {... , "rounds", "accepted", "drafted"}
  {"cmd": "quit"}
"""

import json
import sys
import time
from pathlib import Path

import mlx.core as mx
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import device_env  # noqa: E402,F401  (MLX_DEVICE: the run's device, as on the TS side)
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

model = None


def cmd_load(req):
    global model
    tic = time.perf_counter()
    model, _ = load_model(Path(req["path"]))
    return {"seconds": time.perf_counter() - tic}


def timed_generate(tokens_of, prompt_len, max_tokens):
    """mlx-lm's stream_generate timing of a token generator: the prompt clock stops at the first
    token, generation_tps = (n + 1) / (time since the first token), peak memory after a reset;
    the loop leaves at the max_tokens-th token."""
    mx.clear_cache()
    mx.reset_peak_memory()
    tokens = []
    tic = time.perf_counter()
    prompt_time = None
    n = 0
    for n, (token, _) in enumerate(tokens_of()):
        if n == 0:
            prompt_time = time.perf_counter() - tic
            tic = time.perf_counter()
        tokens.append(int(token))
        if (n + 1) == max_tokens:
            break
    gen_time = time.perf_counter() - tic
    return {
        "prompt_seconds": prompt_time,
        "prompt_tps": prompt_len / prompt_time,
        "generation_tps": (n + 1) / gen_time if gen_time > 0 else None,
        "peak_memory": mx.get_peak_memory(),
        "tokens": tokens,
    }


def cmd_generate(req):
    prompt = mx.array(req["prompt"], dtype=mx.int32)
    max_tokens = int(req["max_tokens"])
    return timed_generate(lambda: generate_step(prompt, model, max_tokens=max_tokens,
                                                prefill_step_size=int(req["prefill_step_size"])), prompt.size, max_tokens)


def cmd_graph_build(req):
    cache = make_prompt_cache(model)
    prompt = mx.array(req["prompt"], dtype=mx.int32)
    logits = model(prompt[None], cache=cache)
    y = mx.argmax(logits[:, -1, :], axis=-1)
    mx.eval(y, [c.state for c in cache])
    times, evals = [], []
    for _ in range(int(req["reps"])):
        tic = time.perf_counter()
        logits = model(y[None], cache=cache)
        toc = time.perf_counter()
        times.append(toc - tic)
        y = mx.argmax(logits[:, -1, :], axis=-1)
        mx.eval(y, [c.state for c in cache])
        evals.append(time.perf_counter() - toc)
    return {"seconds": times, "eval_seconds": evals}


mtp_pair = {}


def cmd_mtp_generate(req):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
    import speculative  # oracle/python/speculative.py: mlx-vlm's target built from a text fixture
    from mlx_vlm.generate.ar import generate_step as vlm_generate_step
    from mlx_vlm.speculative.drafters import load_drafter

    key = (req["target"], req["drafter"])
    if mtp_pair.get("key") != key:
        mtp_pair.update(key=key, target=speculative.vlm_target(Path(req["target"])), drafter=load_drafter(req["drafter"])[0])
    target, drafter = mtp_pair["target"], mtp_pair["drafter"]
    out = timed_generate(lambda: vlm_generate_step(mx.array([req["prompt"]], dtype=mx.int32), target, None, None,
                                                   max_tokens=int(req["max_tokens"]), temperature=0.0,
                                                   draft_model=drafter, draft_kind="mtp"), len(req["prompt"]),
                         int(req["max_tokens"]))
    out.update(rounds=len(drafter.accept_lens), accepted=int(sum(drafter.accept_lens)), drafted=int(sum(drafter.draft_lens)))
    return out


trainer = None


def cmd_train_setup(req):
    global trainer, model
    from functools import partial

    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm.models import gemma4_text
    from mlx_lm.tuner.trainer import default_loss, grad_checkpoint
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model = None
    trainer = None
    gemma4_text.DecoderLayer.__call__ = TRAIN_LAYER_CALL  # grad_checkpoint patches the class
    m, _ = load_model(Path(req["path"]))
    mx.random.seed(0)
    m.freeze()
    linear_to_lora_layers(m, -1, {"rank": 8, "scale": 20.0, "dropout": 0.0})
    opt = optim.AdamW(learning_rate=1e-5)
    if req["grad_checkpoint"]:
        grad_checkpoint(m.layers[0])
    lvg = nn.value_and_grad(m, default_loss)
    state = [m.state, opt.state, mx.random.state]

    def step(batch):
        (lvalue, toks), grad = lvg(m, *batch)
        opt.update(m, grad)
        return lvalue, toks

    fn = partial(mx.compile, inputs=state, outputs=state)(step) if req["compiled"] else step
    batch = (mx.array(req["tokens"], dtype=mx.int32), mx.array(req["lengths"], dtype=mx.int32))
    m.train()

    def one():
        tic = time.perf_counter()
        lvalue, toks = fn(batch)
        mx.eval(state, lvalue, toks)
        return time.perf_counter() - tic

    one()
    one()
    trainer = one
    return {}


def cmd_train_steps(req):
    mx.reset_peak_memory()
    ts = sorted(trainer() for _ in range(int(req["steps"])))
    return {"seconds": ts[len(ts) // 2], "peak_memory": mx.get_peak_memory()}


def _layer_call():
    from mlx_lm.models import gemma4_text

    return gemma4_text.DecoderLayer.__call__


TRAIN_LAYER_CALL = _layer_call()

COMMANDS = {"load": cmd_load, "generate": cmd_generate, "graph_build": cmd_graph_build, "mtp_generate": cmd_mtp_generate, "train_setup": cmd_train_setup, "train_steps": cmd_train_steps}


def main():
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("cmd") == "quit":
            break
        try:
            out = COMMANDS[req["cmd"]](req)
            out["ok"] = True
        except Exception as e:  # reported to the harness, which stops with the message
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
