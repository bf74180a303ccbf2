#!/usr/bin/env python
"""Minimal reproducer of gemma4-pt-claude 0.2.0's MoE divergence (engines/RESULTS.md).

The port's TransformerBlock feeds its MoE router the expert branch's *normalized* input
(`self.moe(self.pre_ffw_norm(x))`, and MoELayer.forward routes on what it is given), while
transformers (Gemma4TextDecoderLayer: `self.router(residual)`) and mlx-lm (DecoderLayer:
`self.router(h)`, h = the residual) route on the residual stream before
pre_feedforward_layernorm_2. The two agree only when that norm's weight is all ones.

Usage (in .venv-reference):  python engines/gemma4_pt_claude/repro_router.py JOB.json
with JOB.json = {"dir": <an MoE checkpoint, e.g. c5_moe/f32>, "args": <mlx-lm's resolved args>,
"tokens": [...]}, as engines/gemma4_pt_claude/dump.ts writes it. Prints the relative L2 error of
layer 0's output against transformers: with the port as shipped, and with only the router's input
changed to the residual (a monkeypatch of MoELayer.forward's caller), then the final norm and the
logits of that fixed run. Measured on c5_moe/f32: 6.0e-2, then 2.3e-7, the fixed run's logits
1.4e-6 from transformers (within the noise floor); c6_sink/f32 (untied head): 6.6e-2, then 2.8e-7,
final norm 2.6e-6, logits still 1.42 off (the port decodes with the token embedding).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "oracle" / "python"))

import pt_dump  # noqa: E402
import reference_export as ref  # noqa: E402


def layer0_output(model_call, hook_module, pick) -> torch.Tensor:
    got = {}

    def hook(_m, _i, o):  # returns None: a forward hook's return value would replace the output
        got.setdefault("x", pick(o).detach().clone())
    h = hook_module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            model_call()
    finally:
        h.remove()
    return got["x"]


def main(argv: list[str]) -> int:
    import tempfile

    from gemma4_pt_claude import Gemma4Config, Gemma4Model, load_weights
    from gemma4_pt_claude.transformer import TransformerBlock

    torch.set_num_threads(1)
    job = json.loads(Path(argv[0]).read_text())
    ids = torch.tensor([job["tokens"]])
    L = ids.shape[1]
    hf, _ = ref.build_model({**job, "id": job["dir"]})
    want = layer0_output(lambda: hf(ids, use_cache=False), hf.model.layers[0], lambda o: o)

    port = Gemma4Model(Gemma4Config(text=pt_dump.text_config(job["args"]))).eval()
    with tempfile.TemporaryDirectory() as tmp:
        load_weights(port, str(pt_dump.hf_layout_copy(Path(job["dir"]), Path(tmp))), format="hf", strict=False)
    mask = torch.ones(L, L, dtype=torch.bool).tril().unsqueeze(0)
    run = lambda: port(ids, attention_mask=mask)  # noqa: E731
    rel = lambda a: float((a - want).norm() / want.norm())  # noqa: E731
    shipped = rel(layer0_output(run, port.text_decoder.blocks[0], lambda o: o[1]))

    # the one change: route on the residual (the block's input to the FFN part), experts on the normed input
    orig = TransformerBlock.forward

    def forward(self, x, *a, **k):
        if not self.is_moe:
            return orig(self, x, *a, **k)
        moe = self.moe
        saved = moe.forward
        residual_box = {}
        def keep(_m, inp):
            residual_box.setdefault("r", inp[0])
        pre = self.pre_ffw_norm.register_forward_pre_hook(keep)

        def routed(xn):
            w, idx = moe.router(residual_box["r"])
            return moe.experts(xn, w, idx)
        moe.forward = routed
        try:
            return orig(self, x, *a, **k)
        finally:
            moe.forward = saved
            pre.remove()
    TransformerBlock.forward = forward
    try:
        fixed = rel(layer0_output(run, port.text_decoder.blocks[0], lambda o: o[1]))
        # the whole forward with the router fixed: the final norm, then the logits (an untied
        # checkpoint's lm_head.weight is dropped by the port's loader: it decodes with the embedding)
        want = layer0_output(lambda: hf(ids, use_cache=False), hf.model.norm, lambda o: o)
        norm_fixed = rel(layer0_output(run, port.text_decoder.final_norm, lambda o: o))
        with torch.no_grad():
            want = hf(ids, use_cache=False).logits
            logits_fixed = rel(port(ids, attention_mask=mask)[0])
    finally:
        TransformerBlock.forward = orig
    print(json.dumps({"layer0_rel_l2_shipped": shipped, "layer0_rel_l2_router_on_residual": fixed,
                      "norm_rel_l2_router_on_residual": norm_fixed, "logits_rel_l2_router_on_residual": logits_fixed,
                      "tie_word_embeddings": job["args"]["tie_word_embeddings"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
