#!/usr/bin/env python
"""Conformance engine: Hugging Face transformers' Gemma 4 (PyTorch, CPU), one forward with its
intermediate values read through module hooks and named by the tap scheme (oracle/TAPS.md).

Runs in .venv-reference (torch + transformers; made by ensureVenv in oracle/reference_export.ts).
Called by engines/transformers/dump.ts with a job file:
  {"id", "dir", "args" (mlx-lm's resolved ModelArgs, as reference_export takes them),
   "tokens": [ids], "dtype": "float32" | "bfloat16" | "float64", "taps": [the tap names the scheme expands]}
and an output folder. The model is built exactly as the independent reference builds it
(oracle/python/reference_export.py: hf_config, build_model). Writes <out>/tensors.safetensors
(every tap it could read, in the dtype transformers computed it; token ids int32, the RoPE offset
an int32 scalar, masks as booleans, true = attended: transformers always builds an array) and prints one JSON line: versions, the names written, the
scheme's names it could not read, and what the checkpoint left out.

The module -> tap mapping is documented in engines/transformers/README.md. Values transformers has
no module for are read where they appear: a module's input (forward pre-hook), a method's return
(instance attribute wrapped), or apply_rotary_pos_emb (module global wrapped for the call). Layout
changes that mlx-lm's taps have and transformers' tensors do not (the head transpose before RoPE,
the flattened (B*L, H) of the MoE branch) are applied as views: no arithmetic is added.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "oracle" / "python"))

import torch  # noqa: E402

import reference_export as ref  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


class Recorder:
    """Collects taps by name; every value is detached and cloned when read (transformers updates
    some tensors in place later, e.g. `hidden_states *= layer_scalar`)."""

    def __init__(self, wanted: list[str]):
        self.wanted = set(wanted)
        self.taps: dict[str, torch.Tensor] = {}
        self.layer: int | None = None  # the decoder layer running now
        self.rope_calls = 0  # apply_rotary_pos_emb calls in this layer's attention (q, then k)
        self.ple_gelu_next = False  # the next GELU of this layer is the PLE gate's
        self.prefix = ""  # the call prefix: "" (forward), "prefill{k}/", "step{n}/"
        self.length = 0  # tokens of the running call
        self.masks = True  # read the masks (forward only: with a cache their layouts are the engine's own)

    def put(self, name: str, t: torch.Tensor) -> None:
        name = self.prefix + name
        if name in self.taps:
            raise RuntimeError(f"tap {name} read twice (the hook mapping no longer fits this transformers)")
        self.taps[name] = t.detach().clone().contiguous()

    def lp(self, tail: str) -> str:
        return f"layers.{self.layer}/{tail}"


def attach(model, rec: Recorder, args: dict):
    """Registers the hooks; returns a function that removes them all."""
    import transformers.models.gemma4.modeling_gemma4 as mg

    handles = []
    restores = []
    tm = model.model
    H = args["hidden_size"]

    def out_hook(module, name_fn, view=None):
        def hook(_m, _inp, out):
            rec.put(name_fn(), view(out) if view else out)
        handles.append(module.register_forward_hook(hook))

    def in_hook(module, name_fn, view=None):
        def hook(_m, inp):
            rec.put(name_fn(), view(inp[0]) if view else inp[0])
        handles.append(module.register_forward_pre_hook(hook))

    fixed = lambda n: (lambda: n)  # noqa: E731
    per_layer = lambda tail: (lambda: rec.lp(tail))  # noqa: E731
    as_blh = lambda t: t.reshape(1, rec.length, -1)  # noqa: E731  the MoE branch's (B*L, X) as (B, L, X)

    # model head
    out_hook(tm.embed_tokens, fixed("embed_scaled"))
    if args["hidden_size_per_layer_input"]:
        out_hook(tm.per_layer_model_projection, fixed("per_layer_model_projection"))
        in_hook(tm.per_layer_projection_norm, fixed("per_layer_projection_scaled"))
        out_hook(tm.per_layer_projection_norm, fixed("per_layer_projection_norm"))
        for meth, tap in (("get_per_layer_inputs", "per_layer_token_inputs"), ("project_per_layer_inputs", "per_layer_inputs")):
            orig = getattr(tm, meth)

            def wrapped(*a, _orig=orig, _tap=tap, **k):
                r = _orig(*a, **k)
                rec.put(_tap, r)
                return r
            setattr(tm, meth, wrapped)
            restores.append(lambda _m=meth: delattr(tm, _m))

    first_of_type: dict[str, int] = {}
    for i, t in enumerate(args["layer_types"]):
        first_of_type.setdefault(t, i)

    for i, layer in enumerate(tm.layers):
        def layer_pre(_m, a, k, _i=i):
            rec.layer, rec.rope_calls, rec.ple_gelu_next = _i, 0, False
            if args["hidden_size_per_layer_input"]:
                rec.put(rec.lp("per_layer_input"), a[1] if len(a) > 1 else k["per_layer_input"])
            typ = args["layer_types"][_i]
            if rec.masks and first_of_type[typ] == _i:
                m = k["attention_mask"]
                # eager masks are additive floats (0 = attend); the tap is mlx-lm's boolean (L, kL)
                if m is None:
                    raise RuntimeError(f"layer {_i}: transformers passed no attention mask")
                rec.put(f"mask/{typ}", m[0, 0] == 0)
            pos = k["position_ids"]
            rec.put(rec.lp("self_attn/offset"), pos[0, 0].to(torch.int32).reshape(()))
        handles.append(layer.register_forward_pre_hook(layer_pre, with_kwargs=True))
        out_hook(layer, per_layer("output"))
        out_hook(layer.input_layernorm, per_layer("input_layernorm"))
        at = layer.self_attn
        out_hook(at.q_proj, per_layer("self_attn/q_proj"))
        out_hook(at.q_norm, per_layer("self_attn/q_norm"))
        if not at.is_kv_shared_layer:
            out_hook(at.k_proj, per_layer("self_attn/k_proj"))
            if at.v_proj is not None:
                out_hook(at.v_proj, per_layer("self_attn/v_proj"))
            out_hook(at.k_norm, per_layer("self_attn/k_norm"))
            out_hook(at.v_norm, per_layer("self_attn/v_norm"))
        nh, hd = args["num_attention_heads"], at.head_dim
        in_hook(at.o_proj, per_layer("self_attn/sdpa"), lambda t, nh=nh, hd=hd: t.reshape(1, rec.length, nh, hd).transpose(1, 2))
        out_hook(at.o_proj, per_layer("self_attn/o_proj"))
        out_hook(layer.post_attention_layernorm, per_layer("post_attention_layernorm"))
        in_hook(layer.pre_feedforward_layernorm, per_layer("attn_residual"))
        out_hook(layer.pre_feedforward_layernorm, per_layer("pre_feedforward_layernorm"))
        out_hook(layer.mlp.gate_proj, per_layer("mlp/gate_proj"))
        out_hook(layer.mlp.up_proj, per_layer("mlp/up_proj"))
        in_hook(layer.mlp.down_proj, per_layer("mlp/geglu"))
        out_hook(layer.mlp.down_proj, per_layer("mlp/down_proj"))
        if args["enable_moe_block"]:
            out_hook(layer.post_feedforward_layernorm_1, per_layer("post_feedforward_layernorm_1"))
            in_hook(layer.router.proj, per_layer("router/norm"), as_blh)
            out_hook(layer.router.proj, per_layer("router/proj"), as_blh)

            def router_out(_m, _inp, out):
                _probs, weights, index = out
                # transformers' top-k order (descending probability), not mlx-lm's argpartition order
                rec.put(rec.lp("router/indices"), index.to(torch.int32).reshape(1, rec.length, -1))
                rec.put(rec.lp("router/weights"), weights.reshape(1, rec.length, -1))
            handles.append(layer.router.register_forward_hook(router_out))
            out_hook(layer.pre_feedforward_layernorm_2, per_layer("pre_feedforward_layernorm_2"), as_blh)
            attach_experts(layer.experts, rec, handles)
            out_hook(layer.experts, per_layer("experts"), as_blh)
            out_hook(layer.post_feedforward_layernorm_2, per_layer("post_feedforward_layernorm_2"))
            in_hook(layer.post_feedforward_layernorm, per_layer("ffw_sum"))
        out_hook(layer.post_feedforward_layernorm, per_layer("post_feedforward_layernorm"))
        if args["hidden_size_per_layer_input"]:
            in_hook(layer.per_layer_input_gate, per_layer("ffw_residual"))

            def gate_out(_m, _inp, out):
                rec.put(rec.lp("per_layer_input_gate"), out)
                rec.ple_gelu_next = True
            handles.append(layer.per_layer_input_gate.register_forward_hook(gate_out))

            def gelu_out(_m, _inp, out):
                if rec.ple_gelu_next:
                    rec.put(rec.lp("per_layer_gelu"), out)
                    rec.ple_gelu_next = False
            handles.append(layer.act_fn.register_forward_hook(gelu_out))
            in_hook(layer.per_layer_projection, per_layer("per_layer_gated"))
            out_hook(layer.per_layer_projection, per_layer("per_layer_projection"))
            out_hook(layer.post_per_layer_input_norm, per_layer("post_per_layer_input_norm"))

    # RoPE has no module: the attention calls the module-global apply_rotary_pos_emb, queries
    # first, then keys (layers with their own K/V); output (B, L, n, hd) -> the tap's (B, n, L, hd)
    orig_rope = mg.apply_rotary_pos_emb

    def rope(x, cos, sin, unsqueeze_dim=1):
        y = orig_rope(x, cos, sin, unsqueeze_dim)
        rec.put(rec.lp("self_attn/rope_q" if rec.rope_calls == 0 else "self_attn/rope_k"), y.transpose(1, 2))
        rec.rope_calls += 1
        return y
    mg.apply_rotary_pos_emb = rope
    restores.append(lambda: setattr(mg, "apply_rotary_pos_emb", orig_rope))

    out_hook(tm.norm, fixed("norm"))
    out_hook(model.lm_head, fixed("lm_head"))
    del H

    def detach_all():
        for h in handles:
            h.remove()
        for r in restores:
            r()
    return detach_all


def attach_experts(experts, rec: Recorder, handles: list) -> None:
    """Gemma4TextExperts (eager) loops over the experts hit, in ascending order; per expert one
    fused gate_up linear (gate = first half, up = second half), GELU(gate) * up, the down linear.
    The F.linear calls are read while the experts module runs and scattered back to mlx-lm's
    per-(token, k) layout (B, L, K, 1, X), k in transformers' top-k order."""
    F = torch.nn.functional
    state: dict = {}

    def pre(_m, inp):
        _x, index, _w = inp
        state["index"] = index
        state["calls"] = []
        orig = F.linear

        def linear(x, w, b=None):
            y = orig(x, w, b)
            state["calls"].append((x, y))
            return y
        state["orig"] = orig
        F.linear = linear

    def post(_m, _inp, _out):
        F.linear = state.pop("orig")
        index = state["index"]
        n_exp = experts.num_experts
        K = index.shape[-1]
        mask = F.one_hot(index, num_classes=n_exp + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        calls = state.pop("calls")
        im = experts.intermediate_dim
        length = rec.length
        up = gate = act = down = None
        c = 0
        for e in hit:
            e = int(e[0])
            if e == n_exp:
                continue
            top_k_pos, token_idx = torch.where(mask[e])
            (_x1, gu), (a_in, d) = calls[c], calls[c + 1]
            c += 2
            if up is None:
                up = gu.new_zeros(length, K, im)
                gate = gu.new_zeros(length, K, im)
                act = gu.new_zeros(length, K, im)
                down = d.new_zeros(length, K, d.shape[-1])
            g, u = gu.chunk(2, dim=-1)
            gate[token_idx, top_k_pos] = g
            up[token_idx, top_k_pos] = u
            act[token_idx, top_k_pos] = a_in
            down[token_idx, top_k_pos] = d
        if c != len(calls):
            raise RuntimeError(f"experts: {len(calls)} linear calls, {c} expected (the hook mapping no longer fits)")
        # On mlx-lm's sorted path (B*L*K >= 64) these four taps are in its expert-sorted row order,
        # which follows its argpartition order: not reproducible here, so not written (the dump
        # then lacks them and the sort taps, and says so)
        if rec.prefix + rec.lp("experts/switch_glu/sort_x") not in rec.wanted:
            for tap, t in (("up_proj", up), ("gate_proj", gate), ("activation", act), ("down_proj", down)):
                rec.put(rec.lp(f"experts/switch_glu/{tap}"), t.reshape(1, length, K, 1, -1))
        rec.put(rec.lp("experts/switch_glu"), down.reshape(1, length, K, -1))
    handles.append(experts.register_forward_pre_hook(pre))
    handles.append(experts.register_forward_hook(post))


def dump_one(job: dict, out: Path) -> dict:
    import numpy as np
    from safetensors.torch import save_file

    dtype = DTYPES[job["dtype"]]
    model, info = ref.build_model(job, dtype)
    args = job["args"]
    rec = Recorder(job["taps"])
    detach = attach(model, rec, args)
    schedule = job.get("schedule", {"kind": "forward"})
    generated: list[int] = []

    def call(prefix: str, ids: list[int], cache=None, step: bool = False):
        """One model call with its taps under `prefix`; returns the greedy token of its last row."""
        t = torch.tensor([ids])
        rec.prefix, rec.length = prefix, len(ids)
        with torch.no_grad():
            r = model(t, use_cache=cache is not None, cache=cache) if cache is not None else model(t, use_cache=False)
        rec.put("logits", r.logits)
        rec.put("inputs", t.to(torch.int32))
        # the lookups before any scaling (mlx-lm's embed_tokens / embed_tokens_per_layer taps): the
        # rows transformers' scaled embeddings read, taken from the same weights
        rec.put("embed_tokens", model.model.embed_tokens.weight[t])
        if args["hidden_size_per_layer_input"]:
            rec.put("embed_tokens_per_layer", model.model.embed_tokens_per_layer.weight[t])
        last = r.logits[:, -1, :]
        if step:  # generate_step's greedy sampler input and output, in the logits' dtype
            logprobs = last - torch.logsumexp(last, dim=-1, keepdim=True)
            rec.put("logprobs", logprobs)
            token = torch.argmax(logprobs, dim=-1)
            rec.put("token", token.to(torch.int32))
            return int(token[0])
        return int(torch.argmax(last[0]))

    try:
        if schedule["kind"] == "forward":
            call("", job["tokens"])
        else:
            # mlx-lm's generate_step: the prompt but its last token in chunks, then one call per
            # step fed the greedy token of the step before (max_tokens + 1 calls, the last one's
            # token never yielded); transformers' own cache (DynamicCache) carries the state
            from transformers import DynamicCache

            rec.masks = False
            cache = DynamicCache(config=model.config)
            prompt = job["tokens"]
            done, k = 0, 0
            while len(prompt) - done > 1:
                n = min(schedule["prefill_step_size"], len(prompt) - done - 1)
                call(f"prefill{k}/", prompt[done:done + n], cache)
                done, k = done + n, k + 1
            tok = prompt[-1]
            for n in range(schedule["max_tokens"] + 1):
                tok = call(f"step{n}/", [tok], cache, step=True)
                if n < schedule["max_tokens"]:
                    generated.append(tok)
    finally:
        detach()
    unknown = sorted(set(rec.taps) - rec.wanted)
    if unknown:
        raise RuntimeError(f"read taps the scheme does not name for this call: {unknown[:8]}")
    names = [n for n in job["taps"] if n in rec.taps]
    # float64 (the noise-floor measurement's exact reference, never a dump): MLX reads no F64
    # safetensors, so float64 values travel as their uint64 bit patterns, as in reference_export
    stored = {n: (rec.taps[n].view(torch.uint64) if rec.taps[n].dtype == torch.float64 else rec.taps[n]) for n in names}
    save_file(stored, str(out / "tensors.safetensors"))
    return {"written": names, "not_read": [n for n in job["taps"] if n not in rec.taps], "generated": generated,
            "missing_unused": sorted(info.missing_keys), "np": np.__version__}


def main(argv: list[str]) -> int:
    job_file, out = Path(argv[0]), Path(argv[1])
    import safetensors
    import transformers

    torch.set_num_threads(1)  # deterministic reductions, and polite on a shared machine
    job = json.loads(job_file.read_text())
    res = dump_one(job, out)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": res.pop("np"),
                "safetensors": safetensors.__version__, "python": sys.version.split()[0]}
    print(json.dumps({"versions": versions, **res}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
