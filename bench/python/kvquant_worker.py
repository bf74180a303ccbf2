"""mlx-vlm 0.7.10 side of the KV-quantization bench (bench/kvquant/run.ts): a JSON-lines worker
the TS harness drives, so TS and mlx-vlm runs alternate inside one run.

Requests (one JSON object per line), replies one JSON line ({ok, error?, ...}):
  {"cmd": "cache_bytes", "config": {...text config...}, "context": N, "chunk": C,
   "kv_bits": B|null, "kv_quant_scheme": S, "quantized_kv_start": Q}
      mlx-vlm's own gemma4 LanguageModel.make_cache (run on the config, no weights) and its
      maybe_quantize_kv_cache, then random bfloat16 keys/values of each layer's real shape fed
      as generate_step feeds a prompt (chunks of C for N - 1 tokens, then one token), one
      representative cache per (cache type, layer type) at a time so memory stays bounded;
      bytes = the sum of the state arrays' nbytes.
      -> {"layers": [{"index", "layer_type", "type", "count", "state_bytes", "offset"}], "total_state_bytes"}
      or {"error": {"type", "message"}} when mlx-vlm refuses (uniform on sliding layers).
  {"cmd": "shape_configs", "shapes": [names]}: make_checkpoints.py's shape_config (real layers).
  {"cmd": "load", "path": DIR}: a bench shape checkpoint (4-bit) into mlx-vlm's gemma4 Model.
  {"cmd": "generate", "prompt": [ids], "max_tokens": N, "kv_bits", "kv_quant_scheme",
   "kv_group_size" (default 64), "quantized_kv_start", "prefill_step_size"}
      mlx-vlm's generate_step (greedy) with mlx-lm's stream_generate timing (as
      bench/python/bench_worker.py) -> {"prompt_tps", "generation_tps", "peak_memory", "tokens", "caches"}
      (also the reference side of `npm run bench -- --kv-bits`, bench/kv_rows.ts)
  {"cmd": "quit"}
"""

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
import device_env  # noqa: E402,F401  (MLX_DEVICE, as on the TS side)

model = None


def leaves(x):
    if x is None:
        return []
    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, (tuple, list)):
        return [y for z in x for y in leaves(z)]
    raise TypeError(type(x))


def state_bytes(c) -> int:
    return sum(a.nbytes for a in leaves(c.state)) if c.offset > 0 else 0


def cmd_cache_bytes(req):
    from mlx_vlm.generate.common import maybe_quantize_kv_cache
    from mlx_vlm.models.gemma4.language import LanguageModel

    cfg = req["config"]
    types = cfg["layer_types"]
    n_cached = cfg["num_hidden_layers"] - cfg.get("num_kv_shared_layers", 0)
    # mlx-vlm's make_cache reads only these two attributes
    holder = SimpleNamespace(config=SimpleNamespace(layer_types=types, sliding_window=cfg["sliding_window"]),
                             model=SimpleNamespace(first_kv_shared_layer_idx=n_cached))
    kv_bits = req.get("kv_bits")
    q = dict(quantized_kv_start=req["quantized_kv_start"], kv_group_size=req.get("kv_group_size", 64), kv_bits=kv_bits,
             kv_quant_scheme=req.get("kv_quant_scheme", "uniform"))
    cache = LanguageModel.make_cache(holder)
    try:
        maybe_quantize_kv_cache(cache, **q)
    except Exception as e:  # noqa: BLE001 - mlx-vlm's refusal is the answer
        return {"error": {"type": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}}
    groups = {}
    for i, c in enumerate(cache):
        groups.setdefault((type(c).__name__, types[i]), []).append(i)
    N, C = int(req["context"]), int(req["chunk"])
    out = []
    mx.random.seed(0)
    for (tname, lt), idx in groups.items():
        i = idx[0]
        k_eq_v = cfg.get("attention_k_eq_v", False) and lt != "sliding_attention"
        heads = cfg["num_global_key_value_heads"] if (k_eq_v and cfg.get("num_global_key_value_heads")) else cfg["num_key_value_heads"]
        dim = cfg["global_head_dim"] if lt == "full_attention" else cfg["head_dim"]
        kc = mx.random.normal((1, heads, C, dim)).astype(mx.bfloat16)
        vc = mx.random.normal((1, heads, C, dim)).astype(mx.bfloat16)
        mx.eval(kc, vc)
        done = 0
        while done < N:
            n = min(C, N - 1 - done) if N - 1 - done > 0 else 1
            c = cache[i]
            c.update_and_fetch(kc[:, :, :n], vc[:, :, :n])
            maybe_quantize_kv_cache(cache, **q)
            mx.eval([a for a in leaves(cache[i].state)])
            done += n
        b = state_bytes(cache[i])
        out.append({"index": i, "layer_type": lt, "type": type(cache[i]).__name__, "count": len(idx), "state_bytes": b,
                    "offset": int(cache[i].offset), "heads": heads, "head_dim": dim})
        cache[i] = None
        mx.clear_cache()
    return {"layers": out, "total_state_bytes": sum(r["state_bytes"] * r["count"] for r in out)}


def cmd_load(req):
    global model
    from mlx_vlm.models.gemma4 import Model, ModelConfig, TextConfig, VisionConfig
    from speculative import TINY_VISION

    ckpt = Path(req["path"])
    tcfg = json.loads((ckpt / "config.json").read_text())
    cfg = ModelConfig.from_dict({"model_type": "gemma4", "text_config": tcfg, "vision_config": TINY_VISION, "vocab_size": tcfg["vocab_size"]})
    cfg.text_config = TextConfig.from_dict(tcfg)
    cfg.vision_config = VisionConfig.from_dict(TINY_VISION)
    cfg.audio_config = None
    m = Model(cfg)
    weights = mx.load(str(ckpt / "model.safetensors"))
    qc = tcfg.get("quantization")
    if qc:
        # quantize exactly the modules the checkpoint holds scales for (as mlx-lm's loader does)
        nn.quantize(m.language_model, group_size=qc["group_size"], bits=qc["bits"],
                    class_predicate=lambda p, mod: f"{p}.scales" in weights)
    m.language_model.load_weights(list(weights.items()), strict=True)
    mx.eval(m.parameters())
    model = m
    return {}


def cmd_generate(req):
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models import cache as vcache

    prompt = mx.array([req["prompt"]], dtype=mx.int32)
    max_tokens = int(req["max_tokens"])
    cache = vcache.make_prompt_cache(model.language_model)
    mx.clear_cache()
    mx.reset_peak_memory()
    gen = generate_step(prompt, model, None, None, max_tokens=max_tokens, kv_bits=req.get("kv_bits"),
                        kv_quant_scheme=req.get("kv_quant_scheme", "uniform"), kv_group_size=req.get("kv_group_size", 64),
                        quantized_kv_start=req.get("quantized_kv_start", 5000), prefill_step_size=req.get("prefill_step_size", 2048),
                        prompt_cache=cache)
    tokens = []
    tic = time.perf_counter()
    prompt_time = None
    n = 0
    for n, (tok, _) in enumerate(gen):
        if n == 0:
            prompt_time = time.perf_counter() - tic
            tic = time.perf_counter()
        tokens.append(int(tok))
        if n + 1 == max_tokens:
            break
    gen_time = time.perf_counter() - tic
    return {"prompt_tps": prompt.size / prompt_time, "generation_tps": (n + 1) / gen_time if gen_time > 0 else None,
            "peak_memory": mx.get_peak_memory(), "tokens": tokens, "caches": [type(c).__name__ for c in cache]}


def cmd_shape_configs(req):
    """make_checkpoints.shape_config of each full-width shape at its real layer count."""
    from make_checkpoints import shape_config
    return {"configs": {s: shape_config(s, None) for s in req["shapes"]}}


COMMANDS = {"shape_configs": cmd_shape_configs, "cache_bytes": cmd_cache_bytes, "load": cmd_load, "generate": cmd_generate}


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
