"""Oracle side of the TurboQuant codecs beyond MSE (mlx-vlm 0.7.10 turboquant.py, CPU path).

Commands (one JSON job on argv[1] or stdin, one JSON reply on stdout):
- reachability {}: which codecs a generation can build. An AST scan of every mlx_vlm module: each
  call that constructs _TurboQuantProdCodec, _TurboQuantPolarProdCodec, _PolarQuantUnitCodec,
  _SplitCodec (or from_indices), _build_codec, HybridQuantKVCache, with its enclosing function and
  its `mode` argument as written; and each `codec_cls = … if mode == "prod" else …` choice.
- generate {checkpoint, prompt, max_tokens, kv_bits, kv_quant_scheme, kv_key_bits, kv_value_bits,
  kv_key_scheme, kv_value_scheme, kv_group_size, quantized_kv_start, prefill_step_size}: mlx-vlm's
  generate_step (greedy) on a fixture held by mlx-vlm's gemma4 Model; per step the token, the
  sha256 of its logprobs (float32) and every cache: type, offset, and for a TurboQuantKVCache or
  HybridQuantKVCache the shape/dtype/sha256 of each leaf of its key and value state (in order) and
  its meta_state; or the error.
- split_ops {seed, heads, dim, prompt, more, trim, bits, key_bits, value_bits}: a TurboQuantKVCache
  driven directly (as kv_quant_ref.py's cache_ops): update, trim, update, a decode attention
  (q (1, 2H, 1, D)) and a prefill one (q (1, 2H, 3, D), causal); the codecs' outlier index sets,
  the state leaves' records, the outputs' sha256.
  For an MSE codec (or Split half) whose dim is not a power of two, its rotation matrix (numpy QR,
  float32 hex, keyed "dim:seed"): not portable, so the port takes it as an input.
- codebooks {dims, bits}: mlx-vlm's run-time codebooks (float32 hex), to check the carried ones.
- many {jobs}: several jobs, one process.
"""
from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))



def sha(a) -> str:
    """sha256 of an array's bytes (bfloat16 as float32, as kv_quant_ref.py hashes)."""
    a = np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def leaves(x) -> list:
    """The arrays of a (nested) state tuple, in order; None has none."""
    if x is None:
        return []
    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, (tuple, list)):
        return [a for y in x for a in leaves(y)]
    raise TypeError(type(x))


def arr_record(a) -> dict:
    return {"shape": list(a.shape), "dtype": str(a.dtype).replace("mlx.core.", ""), "sha256": sha(a)}


def cache_record(c) -> dict:
    from mlx_vlm.turboquant import HybridQuantKVCache, TurboQuantKVCache
    d = {"type": type(c).__name__, "offset": int(c.offset)}
    if isinstance(c, (TurboQuantKVCache, HybridQuantKVCache)):
        ks, vs = c.state
        d["keys"] = [arr_record(a) for a in leaves(ks)]
        d["values"] = [arr_record(a) for a in leaves(vs)]
        d["meta_state"] = list(c.meta_state)
    return d


WATCHED = {"_TurboQuantProdCodec", "_TurboQuantPolarProdCodec", "_PolarQuantUnitCodec", "_SplitCodec", "from_indices",
           "_build_codec", "HybridQuantKVCache", "_TurboQuantMSECodec"}


def cmd_reachability(job: dict) -> dict:
    import mlx_vlm
    root = Path(mlx_vlm.__file__).parent
    calls, choices = [], []

    class Scan(ast.NodeVisitor):
        def __init__(self, file: str):
            self.file, self.stack = file, []

        def _def(self, node):
            self.stack.append(node.name)
            self.generic_visit(node)
            self.stack.pop()

        visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

        def visit_Call(self, node):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in WATCHED:
                mode = next((ast.unparse(k.value) for k in node.keywords if k.arg == "mode"), None)
                if mode is None and name in ("_SplitCodec", "_build_codec", "from_indices") and len(node.args) >= 3:
                    mode = ast.unparse(node.args[2])
                calls.append({"file": self.file, "in": ".".join(self.stack), "callee": name, "mode": mode})
            self.generic_visit(node)

        def visit_Assign(self, node):
            if isinstance(node.value, ast.IfExp) and "_TurboQuantProdCodec" in ast.unparse(node.value):
                choices.append({"file": self.file, "in": ".".join(self.stack), "expr": ast.unparse(node.value)})
            self.generic_visit(node)

    for f in sorted(root.rglob("*.py")):
        text = f.read_text()
        if any(w in text for w in WATCHED):  # every file is read; only those naming a codec are parsed
            Scan(str(f.relative_to(root))).visit(ast.parse(text))
    return {"calls": calls, "choices": choices}


_MODELS: dict = {}


def cmd_generate(job: dict) -> dict:
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models import cache as vcache
    from speculative import vlm_target

    if job["checkpoint"] not in _MODELS:
        _MODELS[job["checkpoint"]] = vlm_target(Path(job["checkpoint"]))
    model = _MODELS[job["checkpoint"]]
    cache = vcache.make_prompt_cache(model.language_model)
    steps, error = [], None
    try:
        gen = generate_step(mx.array([job["prompt"]], dtype=mx.int32), model, None, None, max_tokens=job["max_tokens"],
                            kv_bits=job["kv_bits"], kv_quant_scheme=job.get("kv_quant_scheme", "turboquant"),
                            kv_group_size=job.get("kv_group_size", 64), quantized_kv_start=job["quantized_kv_start"],
                            prefill_step_size=job.get("prefill_step_size", 2048), prompt_cache=cache,
                            kv_key_bits=job.get("kv_key_bits"), kv_value_bits=job.get("kv_value_bits"),
                            kv_key_scheme=job.get("kv_key_scheme"), kv_value_scheme=job.get("kv_value_scheme"))
        for tok, lp in gen:
            lp32 = np.array(lp.astype(mx.float32))
            steps.append({"token": int(tok), "logprobs_sha256": hashlib.sha256(lp32.tobytes()).hexdigest(),
                          "cache": [cache_record(c) for c in cache]})
    except Exception as e:  # noqa: BLE001 - mlx-vlm's failure is part of the reference
        error = {"type": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}
    return {"steps": steps, "error": error}


def cmd_split_ops(job: dict) -> dict:
    from mlx_vlm.models.base import scaled_dot_product_attention
    from mlx_vlm.turboquant import TurboQuantKVCache, _SplitCodec

    H, D, P, S = job["heads"], job["dim"], job["prompt"], job["more"]
    mx.random.seed(job["seed"])
    k1 = mx.random.normal((1, H, P, D))
    v1 = mx.random.normal((1, H, P, D))
    k2 = mx.random.normal((1, H, S, D))
    v2 = mx.random.normal((1, H, S, D))
    q1 = mx.random.normal((1, 2 * H, 1, D))
    q3 = mx.random.normal((1, 2 * H, 3, D))
    c = TurboQuantKVCache(bits=job["bits"], key_bits=job.get("key_bits"), value_bits=job.get("value_bits"))
    c.update_and_fetch(k1, v1)
    trimmed = c.trim(job["trim"])
    ks, vs = c.update_and_fetch(k2, v2)
    out1 = scaled_dot_product_attention(q1, ks, vs, c, 1.0, None)
    out3 = scaled_dot_product_attention(q3, ks, vs, c, 1.0, "causal")

    def idx(codec):
        if isinstance(codec, _SplitCodec):
            return {"low": [int(i) for i in np.array(codec.low_idx)], "high": [int(i) for i in np.array(codec.high_idx)]}
        return None

    # the numpy-QR rotation of every MSE codec whose dim is not a power of two (not portable: the
    # port takes these as inputs), keyed "dim:seed"
    rotations = {}
    for codec, seed in ((c.key_codec, c.seed), (c.value_codec, c.seed + 1)):
        subs = [(codec.low_codec, seed), (codec.high_codec, seed + 97)] if isinstance(codec, _SplitCodec) else [(codec, seed)]
        for sub, s in subs:
            if sub.dim & (sub.dim - 1):
                rotations[f"{sub.dim}:{s}"] = np.array(sub.rotation).astype(np.float32).tobytes().hex()

    return {"rotations": rotations, "trimmed": trimmed, "offset": c.offset, "meta_state": list(c.meta_state), "cache": cache_record(c),
            "key_split": idx(c.key_codec), "value_split": idx(c.value_codec), "decode": sha(out1), "prefill": sha(out3)}


def cmd_codebooks(job: dict) -> dict:
    """mlx_vlm.turboquant._codebook(dim, bits) as float32 hex, per "dim:bits" (this machine's numpy)."""
    from mlx_vlm.turboquant import _codebook
    return {f"{d}:{b}": [f"{int(x):08x}" for x in np.array(_codebook(int(d), int(b))).astype(np.float32).view(np.uint32)]
            for d in job["dims"] for b in job["bits"]}


def cmd_many(job: dict) -> dict:
    return {"results": [COMMANDS[j["command"]](j) for j in job["jobs"]]}


COMMANDS = {"reachability": cmd_reachability, "generate": cmd_generate, "split_ops": cmd_split_ops, "codebooks": cmd_codebooks,
            "many": cmd_many}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read())
    fn = COMMANDS.get(job.get("command"))
    if fn is None:
        print(json.dumps({"error": {"type": "UsageError", "message": f"unknown command {job.get('command')!r}"}}))
        sys.exit(2)
    print(json.dumps(fn(job)))


if __name__ == "__main__":
    main()
