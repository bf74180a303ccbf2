#!/usr/bin/env python
"""The independent reference: Hugging Face transformers' Gemma 4 (PyTorch, float32, CPU).

Runs in .venv-reference (torch + transformers, no mlx; made by `npm run reference:export`).
Reads a job file written by oracle/reference_export.ts: for each float32 fixture checkpoint its
directory, its config already resolved by the TS loader (mlx-lm's ModelArgs after
__post_init__, so mlx-lm's defaults are explicit) and the token ids. For each it builds
Gemma4ForCausalLM from the mapped config, loads the mlx-layout weights (MoE experts re-fused
into transformers' gate_up_proj; build_model, shared with the conformance engine
engines/transformers/hf_dump.py), runs one forward with output_hidden_states and writes
<out>/<fixture>.safetensors: input_ids, logits and hidden_states.{i}. Prints one JSON line with
the versions and, per fixture, what load_state_dict left out.

Config mapping (shared/docs/independent-reference.md §A.2): transformers' Gemma4TextConfig has
other defaults than mlx-lm (final_logit_softcapping None vs 30, use_double_wide_mlp False vs
True, num_kv_shared_layers 0 vs 20, num_key_value_heads 4 vs 1, layer_types 5:1 with the last
forced to full), takes global_head_dim / num_global_key_value_heads as constructor-only
arguments, and reads hidden_activation (mlx-lm hard-wires the same tanh gelu). Every field is
therefore passed explicitly from the resolved args.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


# Fields both configs read alike (the other ones are mapped in hf_config).
SAME_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "num_global_key_value_heads", "max_position_embeddings",
               "tie_word_embeddings", "sliding_window", "vocab_size_per_layer_input", "attention_k_eq_v",
               "num_kv_shared_layers", "enable_moe_block", "use_double_wide_mlp", "num_experts", "top_k_experts",
               "moe_intermediate_size")


def rope_entry(p: dict) -> dict:
    """One rope_parameters entry with mlx-lm's reading made explicit (rope_utils.initialize_rope):
    the type is `type` or `rope_type` (default "default"), rope_theta defaults to 10000, and only
    the proportional type uses partial_rotary_factor: mlx-lm's default and linear RoPE rotate the
    whole head, while transformers' default RoPE would rotate partial_rotary_factor of it."""
    rope_type = p.get("type") or p.get("rope_type", "default")
    out = {"rope_type": rope_type, "rope_theta": float(p.get("rope_theta", 10000.0))}
    if rope_type == "proportional":
        out["partial_rotary_factor"] = float(p.get("partial_rotary_factor", 1.0))
    if "factor" in p:
        out["factor"] = float(p["factor"])
    return out


def hf_config(a: dict):
    from transformers import Gemma4TextConfig

    # JSON from TS carries 30.0 as 30: transformers' strict config wants floats
    fl = lambda v: None if v is None else float(v)  # noqa: E731
    rope = {t: rope_entry(p) for t, p in a["rope_parameters"].items()}
    if a["layer_types"][-1] != "full_attention":
        raise ValueError("transformers forces the last layer to full_attention; this fixture's last layer is sliding")
    return Gemma4TextConfig(
        **{k: a[k] for k in SAME_FIELDS},
        global_head_dim=a["global_head_dim"] or a["head_dim"],
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=fl(a["rms_norm_eps"]),
        rope_parameters=rope,
        layer_types=list(a["layer_types"]),
        final_logit_softcapping=fl(a["final_logit_softcapping"]),
        hidden_size_per_layer_input=a["hidden_size_per_layer_input"] or 0,
        attn_implementation="eager",
        experts_implementation="eager",  # the plain per-expert loop (grouped_mm has no float64 kernel)
    )


def mlx_to_hf_keys(w: dict, concat) -> dict:
    """mlx-lm gemma4_text keys/layout -> Gemma4ForCausalLM's (gemma4_text.sanitize, inverted); `concat`
    joins two arrays on axis -2 (numpy's or torch's, so float32 and bfloat16 checkpoints both load)."""
    out = {}
    for k, v in w.items():
        if k.endswith(".experts.switch_glu.gate_proj.weight"):
            base = k.removesuffix(".switch_glu.gate_proj.weight")
            out[base + ".gate_up_proj"] = concat(v, w[base + ".switch_glu.up_proj.weight"])
        elif k.endswith(".experts.switch_glu.up_proj.weight"):
            continue
        elif k.endswith(".experts.switch_glu.down_proj.weight"):
            out[k.removesuffix(".switch_glu.down_proj.weight") + ".down_proj"] = v
        else:
            out[k] = v
    return out


def build_model(job: dict, dtype=None):
    """Gemma4ForCausalLM from the job's resolved args, the checkpoint's weights loaded (torch tensors,
    so bfloat16 checkpoints load too) and cast to `dtype` (default float32). Returns (model, load info).
    Refuses keys transformers does not know and missing parameters that a forward uses."""
    import torch
    from safetensors.torch import load_file
    from transformers import Gemma4ForCausalLM

    a = job["args"]
    dtype = dtype or torch.float32
    torch.manual_seed(0)  # parameters left out by the checkpoint (unused ones) get fixed values
    model = Gemma4ForCausalLM(hf_config(a)).to(dtype).eval()
    raw = load_file(str(Path(job["dir"]) / "model.safetensors"))
    sd = {k: v.to(dtype) for k, v in mlx_to_hf_keys(raw, lambda x, y: torch.cat([x, y], dim=-2)).items()}
    info = model.load_state_dict(sd, strict=False)
    if info.unexpected_keys:
        raise ValueError(f"{job['id']}: keys transformers does not know: {info.unexpected_keys[:8]}")
    # left out may only be what neither side uses: the tied head, and K/V of KV-shared layers
    first_shared = a["num_hidden_layers"] - a["num_kv_shared_layers"]
    def unused(k: str) -> bool:
        if k == "lm_head.weight":
            return a["tie_word_embeddings"]
        parts = k.split(".")
        if len(parts) > 3 and parts[1] == "layers" and int(parts[2]) >= first_shared:
            return any(p in k for p in ("self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm"))
        return False
    used_missing = [k for k in info.missing_keys if not unused(k)]
    if used_missing:
        raise ValueError(f"{job['id']}: parameters missing from the checkpoint: {used_missing[:8]}")
    return model, info


def export_one(job: dict, out: Path) -> dict:
    import torch
    from safetensors.numpy import save_file

    model, info = build_model(job)
    ids = job["tokens"]

    def forward(dtype, np_dtype, name):
        m = model.to(dtype)
        with torch.no_grad():
            r = m(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        t = {"input_ids": np.array([ids], dtype=np.int32), "logits": r.logits.numpy().astype(np_dtype)}
        for i, h in enumerate(r.hidden_states):
            t[f"hidden_states.{i}"] = h.numpy().astype(np_dtype)
        # MLX reads no F64 tensors: float64 values travel as their uint64 bit patterns
        stored = {k: (v.view(np.uint64) if v.dtype == np.float64 else v) for k, v in t.items()}
        save_file(stored, str(out / name), metadata={"attn": "eager", "dtype": str(np_dtype.__name__)})
        return t

    t32 = forward(torch.float32, np.float32, f"{job['fixture']}.safetensors")
    # The same model in float64 (not kept): how far transformers' own float32 run is from the
    # exact computation, so the TS-vs-transformers difference can be judged as rounding or not.
    t64 = forward(torch.float64, np.float64, f"{job['fixture']}.f64.safetensors")
    def rel(a, b):
        return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))
    noise = {"logits_rel": rel(t32["logits"], t64["logits"]),
             "hidden_rel": max(rel(t32[k], t64[k]) for k in t32 if k.startswith("hidden_states."))}
    return {"missing_unused": sorted(info.missing_keys), "hf32_vs_hf64": noise}


def main(argv: list[str]) -> int:
    job_file, out = Path(argv[0]), Path(argv[1])
    import safetensors
    import torch
    import transformers

    torch.set_num_threads(1)  # deterministic reductions, and polite on a shared machine
    jobs = json.loads(job_file.read_text())
    results = {job["fixture"]: export_one(job, out) for job in jobs}
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
                "safetensors": safetensors.__version__, "python": sys.version.split()[0]}
    print(json.dumps({"versions": versions, "fixtures": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
