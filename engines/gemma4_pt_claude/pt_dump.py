#!/usr/bin/env python
"""Conformance engine: the third-party PyTorch port gemma4-pt-claude 0.2.0 (PyPI, Apache-2.0).

Runs in .venv-reference (torch + gemma4-pt-claude; requirements-reference.txt). Called by
engines/gemma4_pt_claude/dump.ts with a job file {"dir", "args" (mlx-lm's resolved ModelArgs),
"tokens", "dtype"} and an output folder. Its from_pretrained knows only the released shapes
(load.py _VARIANT_BY_SHAPE), so the TextConfig is built here by hand from the resolved config;
weights load through the port's own `load_weights(model, dir, format="hf", strict=...)`. One
forward with an explicit causal attention mask (bool [B, L, S], True = attend; the port adds the
sliding window itself), level 1 read through hooks: `embed_scaled` = the input of text_decoder,
`layers.{i}/output` = text_decoder.blocks[i]'s output x, `norm` = final_norm, `logits` = the
forward's logits. Writes <out>/tensors.safetensors and prints one JSON line: versions, the
strict load's refusal (message) if any, what the non-strict load left out, and notes on config
fields the port has no place for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def rope_of(p: dict) -> tuple[float, float, float]:
    """(base, proportion, scale factor) of one rope_parameters entry as mlx-lm reads it: only the
    proportional type rotates partial_rotary_factor of the head (rope_utils.initialize_rope)."""
    typ = p.get("type") or p.get("rope_type", "default")
    prop = float(p.get("partial_rotary_factor", 1.0)) if typ == "proportional" else 1.0
    return float(p.get("rope_theta", 10000.0)), prop, float(p.get("factor", 1.0))


def text_config(a: dict):
    """The port's TextConfig from mlx-lm's resolved args (every field explicit)."""
    from gemma4_pt_claude import AttentionType, KVCacheSharingConfig, MoEConfig, TextConfig

    n = a["num_hidden_layers"]
    types = a["layer_types"]
    local = rope_of(a["rope_parameters"].get("sliding_attention", {}))
    glob = rope_of(a["rope_parameters"].get("full_attention", {}))
    if local[2] != 1.0:
        raise ValueError("the port scales only global RoPE (sliding_attention has a factor)")
    shared = a["num_kv_shared_layers"]
    kv = KVCacheSharingConfig(frac_shared_layers=shared / n, share_global=True, share_local=True) if shared else None
    moe = (MoEConfig(num_experts=a["num_experts"], top_k=a["top_k_experts"], expert_dim=a["moe_intermediate_size"],
                     # 0: the dense branch takes the block's hidden size (doubled on KV-shared layers)
                     dense_hidden_dim=0) if a["enable_moe_block"] else None)
    return TextConfig(
        vocab_size=a["vocab_size"],
        embed_dim=a["hidden_size"],
        hidden_dim=a["intermediate_size"],
        num_heads=a["num_attention_heads"],
        head_dim=a["head_dim"],
        num_kv_heads=a["num_key_value_heads"],
        num_layers=n,
        sliding_window_size=a["sliding_window"],
        final_logit_softcap=None if a["final_logit_softcapping"] is None else float(a["final_logit_softcapping"]),
        attn_logits_soft_cap=None,
        local_rope_base=local[0],
        global_rope_base=glob[0],
        global_rope_scale_factor=glob[2],
        rope_proportion=local[1],
        global_rope_proportion=glob[1],
        per_layer_input_dim=a["hidden_size_per_layer_input"] or 0,
        attention_pattern=tuple(AttentionType.LOCAL_SLIDING if t == "sliding_attention" else AttentionType.GLOBAL for t in types),
        kv_sharing=kv,
        moe=moe,
        k_eq_v=False,  # mlx-lm: K = V on full-attention layers only
        k_eq_v_global=bool(a["attention_k_eq_v"]),
        num_global_kv_heads=a["num_global_key_value_heads"] if a["attention_k_eq_v"] else None,
        global_head_dim=a["global_head_dim"] or None,
        override_kv_shared_ffw_hidden=2 * a["intermediate_size"] if (a["use_double_wide_mlp"] and shared) else None,
    )


def hf_layout_copy(src: Path, dst: Path) -> Path:
    """The checkpoint with mlx-lm's MoE expert keys (experts.switch_glu.*) rewritten in
    transformers' layout (experts.gate_up_proj / down_proj), which the port's HF loader reads;
    every value unchanged. Uses the independent reference's mapping (reference_export.mlx_to_hf_keys)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracle" / "python"))
    import reference_export as ref
    from safetensors.torch import load_file, save_file

    w = ref.mlx_to_hf_keys(load_file(str(src / "model.safetensors")), lambda x, y: torch.cat([x, y], dim=-2))
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in w.items()}, str(dst / "model.safetensors"))
    return dst


def dump_one(job: dict, out: Path) -> dict:
    from gemma4_pt_claude import Gemma4Config, Gemma4Model, load_weights
    from safetensors import safe_open
    from safetensors.torch import save_file

    a = job["args"]
    dtype = DTYPES[job["dtype"]]
    notes: list[str] = []
    if a["rms_norm_eps"] != 1e-6:
        notes.append(f"the port fixes RMSNorm eps at 1e-6; this config has {a['rms_norm_eps']}")
    src = Path(job["dir"])
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    if "lm_head.weight" in keys and not a["tie_word_embeddings"]:
        notes.append("untied lm_head.weight: the port always decodes with the token embedding (Embedder.decode_logits) "
                     "and its HF loader drops lm_head.weight without a word (_hf_key_to_ours returns None)")
    load_dir = src
    if any(".experts.switch_glu." in k for k in keys):
        load_dir = hf_layout_copy(src, out / "hf_layout")
        notes.append("MoE experts given to the loader in transformers' layout (a copy, same values)")

    cfg = Gemma4Config(text=text_config(a))
    torch.manual_seed(0)
    model = Gemma4Model(cfg, dtype=dtype).eval()
    n = a["num_hidden_layers"]
    first_shared = n - a["num_kv_shared_layers"]
    if model.text_decoder.kv_sharing_patterns[:first_shared] != list(range(first_shared)) or any(
            p == i for i, p in enumerate(model.text_decoder.kv_sharing_patterns) if i >= first_shared):
        raise ValueError(f"the port's KV sharing pattern {model.text_decoder.kv_sharing_patterns} does not share layers {first_shared}.. as mlx-lm does")
    refusal = None
    try:
        load_weights(model, str(load_dir), format="hf", strict=True, dtype=dtype)
    except Exception as e:  # the refusal is a result: recorded with its message
        refusal = f"{type(e).__name__}: {' '.join(line.strip() for line in str(e).splitlines())[:600]}"
        model = Gemma4Model(cfg, dtype=dtype).eval()
    missing, unexpected = load_weights(model, str(load_dir), format="hf", strict=False, dtype=dtype)
    if unexpected:
        raise ValueError(f"the port's loader gave unexpected keys: {unexpected[:8]}")

    def unused(k: str) -> bool:  # K/V of KV-shared layers (the port builds them, mlx-lm reuses an earlier layer's)
        p = k.split(".")
        return (len(p) > 4 and p[0] == "text_decoder" and p[1] == "blocks" and int(p[2]) >= first_shared
                and p[3] == "attn" and p[4] in ("k_proj", "v_proj", "k_norm", "v_norm"))
    used_missing = [k for k in missing if not unused(k)]
    if used_missing:
        raise ValueError(f"the port's loader left parameters a forward uses at their initial values: {used_missing[:8]}")

    taps: dict[str, torch.Tensor] = {}
    handles = []
    dec = model.text_decoder

    def put(name, t):
        taps[name] = t.detach().clone().contiguous()
    handles.append(dec.register_forward_pre_hook(lambda _m, args: put("embed_scaled", args[0])))
    for i, block in enumerate(dec.blocks):
        handles.append(block.register_forward_hook(lambda _m, _i, o, i=i: put(f"layers.{i}/output", o[1])))
    handles.append(dec.final_norm.register_forward_hook(lambda _m, _i, o: put("norm", o)))
    ids = torch.tensor([job["tokens"]])
    L = ids.shape[1]
    mask = torch.ones(L, L, dtype=torch.bool).tril().unsqueeze(0)  # [B, L, S], True = attend
    try:
        with torch.no_grad():
            logits, _ = model(ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    put("logits", logits)
    names = ["logits", "embed_scaled", *[f"layers.{i}/output" for i in range(n)], "norm"]
    save_file({k: taps[k] for k in names}, str(out / "tensors.safetensors"))
    return {"written": names, "strict_refusal": refusal, "missing_unused": sorted(missing), "notes": notes}


def main(argv: list[str]) -> int:
    job_file, out = Path(argv[0]), Path(argv[1])
    from importlib.metadata import version

    torch.set_num_threads(1)
    job = json.loads(job_file.read_text())
    res = dump_one(job, out)
    versions = {"gemma4-pt-claude": version("gemma4-pt-claude"), "torch": torch.__version__, "python": sys.version.split()[0]}
    print(json.dumps({"versions": versions, **res}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
