"""Oracle side of KV-cache quantization (mlx-vlm 0.7.10's kv_quant.py / turboquant.py, CPU path).

Commands (one JSON job on argv[1] or stdin, one JSON reply on stdout):
- codebooks {dims, bits}: mlx_vlm.turboquant._codebook(dim, bits) for each pair (float32 bits as
  hex), with the numpy build and CPU features they were computed under (numpy float32 SIMD
  paths move some entries by a few ULP between CPUs: the data is this machine's).
- signs {dims, seeds}: _rht_sign_vector(dim, seed) (numpy's PCG64 choice).
- policy {cases}: kv_quant.from_legacy(...) per case: the policy or the error (type, message).
- generate {checkpoint, prompt, max_tokens, kv_bits, kv_quant_scheme, kv_group_size,
  quantized_kv_start, prefill_step_size}: mlx-vlm's own generate_step (greedy) on a text fixture
  held by mlx-vlm's gemma4 Model (oracle/python/speculative.py vlm_target); per step the token,
  the sha256 of its logprobs (float32 bytes) and of every cache array (type, offset, sha256 of
  each state leaf in order), the first logprobs row's values for diagnostics; or the error.
- generate_many {cases}: generate for each case, one process.
- batch_generate {checkpoint, prompts, max_tokens [int], kv_bits, kv_quant_scheme, kv_group_size,
  quantized_kv_start, prefill_step_size}: mlx-vlm's own BatchGenerator (the batch path of
  batch_generate: every prompt admitted at once, prefill_batch_size = completion_batch_size = the
  number of prompts; per-row prompt kwargs from Model.get_input_embeddings) on model.language_model
  with a recording greedy sampler; after every next() call: the sha256 of each logprobs matrix the
  sampler saw (float32), the responses (uid, token, float32 bits of its logprob, finish reason), and
  every batch cache (type, offsets, left padding, meta_state, each state leaf's shape/dtype/sha256);
  or the error.
- relayered_fixture {src, dst, layer_types, copy}: a text fixture with other layer types, layers'
  weights copied where a layer changes type (test data: an all-full-attention c1_dense; an
  E2B-like c3_e2b whose first layer is full attention and not a KV-sharing donor).
- cache_ops {seed, heads, dim, prompt, more, trim, bits}: a TurboQuantKVCache driven directly
  (update, trim, update, decode and prefill attention, a copy restored from state + meta_state).
- many {jobs}: any of the above, one process.

Nothing in mlx-vlm is edited; quantize_cache_fn runs as generate_step calls it.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def sha(a) -> str:
    a = np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def leaves(x):
    if x is None:
        return []
    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, (tuple, list)):
        out = []
        for y in x:
            out += leaves(y)
        return out
    raise TypeError(type(x))


def cache_record(c) -> dict:
    from mlx_vlm.models.cache import QuantizedKVCache
    from mlx_vlm.turboquant import TurboQuantKVCache
    d = {"type": type(c).__name__, "offset": int(c.offset)}
    if isinstance(c, QuantizedKVCache):
        ks, vs = (None, None) if c.keys is None else c.state
        d["keys"] = [{"shape": list(a.shape), "dtype": str(a.dtype).replace("mlx.core.", ""), "sha256": sha(a)} for a in leaves(ks)]
        d["values"] = [{"shape": list(a.shape), "dtype": str(a.dtype).replace("mlx.core.", ""), "sha256": sha(a)} for a in leaves(vs)]
        d["meta_state"] = list(c.meta_state)
    elif isinstance(c, TurboQuantKVCache):
        ks, vs = c.state
        d["keys"] = [{"shape": list(a.shape), "dtype": str(a.dtype).replace("mlx.core.", ""), "sha256": sha(a)} for a in leaves(ks)]
        d["values"] = [{"shape": list(a.shape), "dtype": str(a.dtype).replace("mlx.core.", ""), "sha256": sha(a)} for a in leaves(vs)]
        d["meta_state"] = list(c.meta_state)
    else:
        k, v = c.state[0], c.state[1]
        d["keys"] = [] if k is None else [{"shape": list(k.shape), "dtype": str(k.dtype).replace("mlx.core.", ""), "sha256": sha(k)}]
        d["values"] = [] if v is None else [{"shape": list(v.shape), "dtype": str(v.dtype).replace("mlx.core.", ""), "sha256": sha(v)}]
    return d


def cpu_features() -> list[str]:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as f  # numpy >= 2
    except ImportError:
        from numpy.core._multiarray_umath import __cpu_features__ as f
    return sorted(k for k, v in f.items() if v)


def cmd_codebooks(job: dict) -> dict:
    from mlx_vlm.turboquant import _codebook
    out = {}
    for d in job["dims"]:
        for b in job["bits"]:
            cb = np.array(_codebook(int(d), int(b))).astype(np.float32)
            out[f"{d}:{b}"] = [f"{int(x):08x}" for x in cb.view(np.uint32)]
    import mlx_vlm
    return {"provenance": {"computed_by": "mlx_vlm.turboquant._codebook (numpy float32)", "mlx_vlm": mlx_vlm.__version__,
                           "numpy": np.__version__, "machine": platform.machine(), "numpy_cpu_features": cpu_features()},
            "codebooks": out}


def cmd_signs(job: dict) -> dict:
    from mlx_vlm.turboquant import _rht_sign_vector
    return {f"{d}:{s}": [int(x) for x in np.array(_rht_sign_vector(int(d), int(s)))] for d in job["dims"] for s in job["seeds"]}


def cmd_policy(job: dict) -> dict:
    from mlx_vlm.kv_quant import from_legacy
    res = []
    for c in job["cases"]:
        try:
            p = from_legacy(c.get("kv_bits"), c.get("kv_quant_scheme"), c.get("kv_group_size", 64), c.get("kv_key_bits"),
                            c.get("kv_value_bits"), c.get("kv_key_scheme"), c.get("kv_value_scheme"))
            res.append(None if p is None else {"bits": p.bits, "key": [p.key.scheme, p.key.bits, p.key.group_size],
                                                "value": [p.value.scheme, p.value.bits, p.value.group_size],
                                                "split_override": p.has_split_override})
        except Exception as e:  # noqa: BLE001 - the error is the answer
            res.append({"error": type(e).__name__, "message": str(e)})
    return {"results": res}


_MODELS: dict = {}


def cmd_generate_many(job: dict) -> dict:
    """generate for each of job["cases"] in one process (models loaded once per checkpoint)."""
    return {"results": [cmd_generate(c) for c in job["cases"]]}


def cmd_generate(job: dict) -> dict:
    from mlx_vlm.generate.ar import generate_step
    from speculative import vlm_target

    if job["checkpoint"] not in _MODELS:
        _MODELS[job["checkpoint"]] = vlm_target(Path(job["checkpoint"]))
    model = _MODELS[job["checkpoint"]]
    prompt = mx.array([job["prompt"]], dtype=mx.int32)
    from mlx_vlm.models import cache as vcache
    cache = vcache.make_prompt_cache(model.language_model)
    steps = []
    error = None
    try:
        gen = generate_step(prompt, model, None, None, max_tokens=job["max_tokens"], kv_bits=job["kv_bits"],
                            kv_quant_scheme=job.get("kv_quant_scheme", "uniform"), kv_group_size=job.get("kv_group_size", 64),
                            quantized_kv_start=job["quantized_kv_start"], prefill_step_size=job.get("prefill_step_size", 2048),
                            prompt_cache=cache)
        for tok, lp in gen:
            lp32 = np.array(lp.astype(mx.float32))
            steps.append({"token": int(tok), "logprobs_sha256": hashlib.sha256(lp32.tobytes()).hexdigest(),
                          "logprobs_head": [float(x) for x in lp32[:4]],
                          "cache": [cache_record(c) for c in cache]})
    except Exception as e:  # noqa: BLE001 - mlx-vlm's failure is part of the reference
        error = {"type": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}
    return {"steps": steps, "error": error}


def cmd_cache_ops(job: dict) -> dict:
    """A TurboQuantKVCache driven directly: mx.random.seed(seed); keys/values (1, H, P, D) normal;
    update; trim(n); update with (1, H, S, D) more; then a decode attention (q (1, 2H, 1, D)) and a
    prefill one (q (1, 2H, 3, D), "causal"); a second cache restored from state + meta_state attends
    the same. Returns sha256 of each state array, of each output, meta_state, offsets, trim's value;
    for a head dim that is not a power of two, the key/value rotation matrices (float32 hex)."""
    from mlx_vlm.models.base import scaled_dot_product_attention
    from mlx_vlm.turboquant import TurboQuantKVCache

    H, D, P, S = job["heads"], job["dim"], job["prompt"], job["more"]
    mx.random.seed(job["seed"])
    k1 = mx.random.normal((1, H, P, D))
    v1 = mx.random.normal((1, H, P, D))
    k2 = mx.random.normal((1, H, S, D))
    v2 = mx.random.normal((1, H, S, D))
    q1 = mx.random.normal((1, 2 * H, 1, D))
    q3 = mx.random.normal((1, 2 * H, 3, D))
    c = TurboQuantKVCache(bits=job["bits"])
    c.update_and_fetch(k1, v1)
    trimmed = c.trim(job["trim"])
    ks, vs = c.update_and_fetch(k2, v2)
    out1 = scaled_dot_product_attention(q1, ks, vs, c, 1.0, None)
    out3 = scaled_dot_product_attention(q3, ks, vs, c, 1.0, "causal")
    r = TurboQuantKVCache(bits=1)
    r.state = c.state
    r.meta_state = c.meta_state
    r._ensure_codecs(k1, v1)
    out1r = scaled_dot_product_attention(q1, r.state[0], r.state[1], r, 1.0, None)
    st = c.state
    rotations = {}
    if D & (D - 1):
        # _rotation_matrix (numpy LAPACK QR): not portable, so the port takes it as an input
        from mlx_vlm.turboquant import _rotation_matrix
        for seed in (0, 1):
            m = np.array(_rotation_matrix(D, seed)).astype(np.float32)
            rotations[str(seed)] = m.tobytes().hex()
    return {"rotations": rotations, "trimmed": trimmed, "offset": c.offset, "meta_state": list(c.meta_state), "restored_meta_state": list(r.meta_state),
            "state": [sha(a) for a in leaves(st[0]) + leaves(st[1])], "decode": sha(out1), "prefill": sha(out3), "restored_decode": sha(out1r)}


class _StopNone:
    """tokenizer.stopping_criteria for BatchGenerator: no stop tokens (runs end on max_tokens)."""

    def __init__(self):
        self.eos = set()

    def add_eos_token_ids(self, ids):
        if ids:
            self.eos |= set(ids)

    def __call__(self, token):
        return token in self.eos


class _Processor:
    def __init__(self):
        self.tokenizer = type("Tok", (), {})()
        self.tokenizer.stopping_criteria = _StopNone()


def _leaf_records(x) -> list[dict]:
    out = []
    for a in leaves(x):
        out.append({"shape": list(a.shape), "dtype": str(a.dtype).replace("mlx.core.", ""), "sha256": sha(a)})
    return out


def batch_cache_record(c) -> dict:
    from mlx_vlm.turboquant import BatchTurboQuantKVCache
    d = {"type": type(c).__name__, "offset": [int(x) for x in c.offset.tolist()],
         "left_padding": [int(x) for x in c.left_padding.tolist()]}
    st = c.state
    d["state"] = _leaf_records(list(st[:2]))
    if isinstance(c, BatchTurboQuantKVCache) or type(c).__name__ == "BatchQuantizedKVCache":
        d["meta_state"] = list(c.meta_state)
    elif hasattr(c, "meta_state"):
        d["meta_state"] = list(c.meta_state)
    return d


def cmd_batch_generate(job: dict) -> dict:
    from mlx_vlm.generate.ar import BatchGenerator
    from speculative import vlm_target

    if job["checkpoint"] not in _MODELS:
        _MODELS[job["checkpoint"]] = vlm_target(Path(job["checkpoint"]))
    model = _MODELS[job["checkpoint"]]
    seen = []

    def sampler(logprobs):
        seen.append(hashlib.sha256(np.array(logprobs.astype(mx.float32)).tobytes()).hexdigest())
        return mx.argmax(logprobs, axis=-1)

    prompts = job["prompts"]
    calls = []
    error = None
    try:
        gen = BatchGenerator(model.language_model, _Processor(), sampler=sampler, prefill_batch_size=len(prompts),
                             completion_batch_size=len(prompts), prefill_step_size=job.get("prefill_step_size", 2048),
                             kv_bits=job["kv_bits"], kv_quant_scheme=job.get("kv_quant_scheme", "uniform"),
                             kv_group_size=job.get("kv_group_size", 64), quantized_kv_start=job["quantized_kv_start"])
        kws = []
        for p in prompts:
            emb = model.get_input_embeddings(mx.array([p], dtype=mx.int32))
            kws.append({k: v for k, v in emb.to_dict().items() if v is not None})
        gen.insert(prompts, job["max_tokens"], prompt_kwargs=kws)
        while gen.has_work and len(calls) < 10_000:
            seen.clear()
            _, responses = gen.next()
            batch = gen._prompt_batch if gen._prompt_batch is not None else gen._generation_batch
            calls.append({
                "logprobs_sha256": list(seen),
                "responses": [{"uid": r.uid, "token": int(r.token),
                               "logprob": f"{int(np.array(r.token_logprob, dtype=np.float32).view(np.uint32)):08x}",
                               "finish": r.finish_reason} for r in responses],
                "cache": [batch_cache_record(c) for c in batch.prompt_cache],
            })
        gen.close()
    except Exception as e:  # noqa: BLE001 - mlx-vlm's failure is part of the reference
        error = {"type": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}
    return {"calls": calls, "error": error}


def cmd_relayered_fixture(job: dict) -> dict:
    """Test data: a copy of a text fixture with other layer types. job: src, dst, layer_types (the new
    list), copy {dst layer: src layer} (that layer's weights, all of them, at dst's index instead of
    its own; a layer that becomes full attention takes a full-attention layer's weights: their head
    dims differ). Written to dst (config.json, model.safetensors)."""
    import re
    src, dst = Path(job["src"]), Path(job["dst"])
    cfg = json.loads((src / "config.json").read_text())
    w = mx.load(str(src / "model.safetensors"))
    copy = {int(d): int(s_) for d, s_ in job["copy"].items()}
    pat = re.compile(r"(^|\.)layers\.(\d+)\.")
    out = {}
    for k, v in w.items():
        m = pat.search(k)
        if m is None:
            out[k] = v
            continue
        i = int(m.group(2))
        if i not in copy:
            out[k] = v
        for d, s_ in copy.items():
            if s_ == i:
                out[k[:m.start()] + f"{m.group(1)}layers.{d}." + k[m.end():]] = v
    if len(job["layer_types"]) != cfg["num_hidden_layers"]:
        raise ValueError("layer_types must have num_hidden_layers entries")
    cfg["layer_types"] = job["layer_types"]
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(str(dst / "model.safetensors"), out, metadata={"format": "mlx"})
    return {"layers": cfg["num_hidden_layers"], "tensors": len(out)}


def cmd_many(job: dict) -> dict:
    """Several jobs in one process: {"jobs": [...]} -> {"results": [...]}."""
    return {"results": [COMMANDS[j["command"]](j) for j in job["jobs"]]}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read())
    fn = COMMANDS.get(job.get("command"))
    if fn is None:
        print(json.dumps({"error": {"type": "UsageError", "message": f"unknown command {job.get('command')!r}"}}))
        sys.exit(2)
    print(json.dumps(fn(job)))


COMMANDS = {"codebooks": cmd_codebooks, "signs": cmd_signs, "policy": cmd_policy, "generate": cmd_generate,
            "generate_many": cmd_generate_many, "cache_ops": cmd_cache_ops, "batch_generate": cmd_batch_generate, "relayered_fixture": cmd_relayered_fixture, "many": cmd_many}

if __name__ == "__main__":
    main()
