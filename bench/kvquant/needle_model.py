#!/usr/bin/env python
"""The needle model of the KV-quantization bench: a tiny Gemma 4 text model that retrieves.

The random-weight models of the other bench stages cannot retrieve anything, so a needle test on
them cannot tell a kept needle from a lost one. This script writes a model that can, for the task

    filler ... KEY n1 .. n8 ... filler ... KEY  ->  n1 .. n8

(a BOS = token 1 first; KEY = token 2, appearing only there; needle ids in [4, 256), filler ids in [256, 512)), by
writing an induction circuit into mlx-lm's gemma4_text.Model instead of training it: training
was measured at about 7 s per forward+backward of a 16 x 128-token batch in MLX on this 2-core
CPU (a few thousand steps would be needed), and the accelerator machine had no time left. The
circuit uses the architecture as it is (every RMSNorm, RoPE, the 1-KV-head attention, per-layer
inputs, tied embeddings, softcap); every number below is fixed, the random parts come from
mx.random.seed(SEED), so the checkpoint is the same on every run of the same build.

Residual stream (hidden 128): A = dims 0..47 holds the token's code (the embedding: a seeded
N(0, 1) vector per token, zero elsewhere, plus a constant 1 in dim 127); B = dims 48..95 is written
by layer 0.
- Layer 0 (sliding, window 128): a previous-token head. Its queries and keys read only the
  constant dim, so after q_norm/k_norm they are the same vectors at every position; they use the
  six highest-frequency RoPE pairs, phased so that q_i . k_j peaks at j = i - 1 (the margin over
  every other offset in the window is 45 nats with q_norm = k_norm weights 2). Its value is the
  token's code (v_norm normalizes it), written to B: "the token before me".
- Layer 4 (full attention, the layer TurboQuant converts): an induction head. The query reads A
  (my token), the key reads B (the token before that position), both placed in head dims 16..63,
  which the proportional RoPE (partial 0.25: pairs 0..15 rotate) leaves unrotated, so the match
  does not depend on distance; q_norm/k_norm weights 1 (Gemma's initial value). A match scores
  about 128, a non-match about 128 x N(0, 1/48). The value is the position's own token code,
  written back to A with post_attention_layernorm weight 20, so that the copied token outweighs
  the current one in the tied unembedding.
- Layers 1, 2, 3, 5: attention and MLP outputs zero (o_proj, down_proj = 0); every layer's
  per-layer-input projection is zero (their gates stay random and contribute nothing).
At the cue KEY the induction head finds the position after the first KEY (n1), then, with n1 as
the current token, the position after n1 (n2), and so on: greedy decoding copies the needle only
if layer 4's cache still ranks the right position first and returns its value well enough.

Usage: needle_model.py OUT [--match-gain G]   (G: layer 4's q_norm and k_norm weights, 1 by
default; a match then scores about 128 G^2, so a smaller G gives a less certain induction head;
writes config.json + model.safetensors with mlx-lm's save
functions, float32, unquantized, and needle_model.json with the teacher-forced retrieval
measured in MLX at 512, 1024 and 2048 tokens)
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import gemma4_text
from mlx_lm.utils import save_config, save_model

SEED = 20261202
WINDOW = 128
VOCAB = 512
KEY = 2
BOS = 1
NEEDLE_IDS = (4, 256)
FILLER_IDS = (256, 512)
NEEDLE = 8
CONFIG = dict(
    model_type="gemma4_text", vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=128,
    num_hidden_layers=6, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1,
    head_dim=64, global_head_dim=128, num_kv_shared_layers=0, hidden_size_per_layer_input=16,
    use_double_wide_mlp=True, attention_k_eq_v=False, enable_moe_block=False, sliding_window=WINDOW,
    max_position_embeddings=131072, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    layer_types=["sliding_attention"] * 4 + ["full_attention", "sliding_attention"],
    rope_parameters={"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
                     "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}},
)
A = slice(0, 48)
B = slice(48, 96)
CONST = 127
PREV_PAIRS = 6          # RoPE pairs 0..5 of the sliding head (the fastest rotating)
PREV_GAIN = 2.0         # layer 0 q_norm / k_norm weights
COPY_GAIN = 20.0        # layer 4 post_attention_layernorm weight
MATCH_GAIN = 1.0        # layer 4 q_norm / k_norm weights (--match-gain: a weaker, less certain induction head)


def build(match_gain: float = MATCH_GAIN) -> gemma4_text.Model:
    mx.random.seed(SEED)
    m = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(CONFIG))
    p = {k: np.array(v) for k, v in tree_flatten(m.parameters())}
    rng = np.random.default_rng(SEED)
    D, hd, gd, H = 128, 64, 128, 4

    emb = np.zeros((VOCAB, D), np.float32)
    emb[:, A] = rng.standard_normal((VOCAB, 48)).astype(np.float32)
    emb[:, CONST] = 1.0
    p["model.embed_tokens.weight"] = emb

    for i in range(6):
        pre = f"model.layers.{i}."
        p[pre + "self_attn.o_proj.weight"] = np.zeros_like(p[pre + "self_attn.o_proj.weight"])
        p[pre + "mlp.down_proj.weight"] = np.zeros_like(p[pre + "mlp.down_proj.weight"])
        p[pre + "per_layer_projection.weight"] = np.zeros_like(p[pre + "per_layer_projection.weight"])

    # layer 0: previous-token head (sliding, RoPE base 1e4 over 64 dims, non-traditional pairs m, m+32)
    a = "model.layers.0.self_attn."
    theta = 1e4 ** (-np.arange(0, hd, 2) / hd)
    qv, kv = np.zeros(hd), np.zeros(hd)
    for mm in range(PREV_PAIRS):
        kv[mm] = 1.0                      # z_k = 1
        qv[mm] = np.cos(theta[mm])        # z_q = exp(-i theta): q_i . k_j peaks at i - j = 1
        qv[mm + hd // 2] = -np.sin(theta[mm])
    wq = np.zeros((H * hd, D), np.float32)
    for h in range(H):
        wq[h * hd:(h + 1) * hd, CONST] = qv
    wk = np.zeros((hd, D), np.float32)
    wk[:, CONST] = kv
    wv = np.zeros((hd, D), np.float32)
    wv[0:48, A] = np.eye(48)
    wo = np.zeros((D, H * hd), np.float32)
    wo[B, 0:48] = np.eye(48)
    p[a + "q_proj.weight"], p[a + "k_proj.weight"], p[a + "v_proj.weight"], p[a + "o_proj.weight"] = wq, wk, wv, wo
    p[a + "q_norm.weight"] = np.full(hd, PREV_GAIN, np.float32)
    p[a + "k_norm.weight"] = np.full(hd, PREV_GAIN, np.float32)

    # layer 4: induction head (full attention; dims 16..63 of its 128 are not rotated)
    a = "model.layers.4.self_attn."
    wq = np.zeros((H * gd, D), np.float32)
    for h in range(H):
        wq[h * gd + 16:h * gd + 64, A] = np.eye(48)
    wk = np.zeros((gd, D), np.float32)
    wk[16:64, B] = np.eye(48)
    wv = np.zeros((gd, D), np.float32)
    wv[0:48, A] = np.eye(48)
    wo = np.zeros((D, H * gd), np.float32)
    wo[A, 0:48] = np.eye(48)
    p[a + "q_proj.weight"], p[a + "k_proj.weight"], p[a + "v_proj.weight"], p[a + "o_proj.weight"] = wq, wk, wv, wo
    p["model.layers.4.post_attention_layernorm.weight"] = np.full(D, COPY_GAIN, np.float32)
    p[a + "q_norm.weight"] = np.full(gd, match_gain, np.float32)
    p[a + "k_norm.weight"] = np.full(gd, match_gain, np.float32)

    m.update(tree_unflatten([(k, mx.array(v.astype(np.float32))) for k, v in p.items()]))
    mx.eval(m.parameters())
    return m


def needle_prompt(rng: np.random.Generator, length: int, depth: float) -> tuple[np.ndarray, np.ndarray]:
    """length ids: BOS, filler, [KEY, needle] at `depth` of the positions 1.. that keep the needle
    more than a window before the cue, filler, the cue KEY. (Without a BOS, a KEY at position 0
    would be its own "previous token" and match the cue too.)"""
    x = rng.integers(*FILLER_IDS, size=length)
    x[0] = BOS
    needle = rng.choice(np.arange(*NEEDLE_IDS), size=NEEDLE, replace=False)
    last = length - 1 - WINDOW - NEEDLE - 1
    s = 1 + int(round(depth * (last - 1)))
    x[s] = KEY
    x[s + 1:s + 1 + NEEDLE] = needle
    x[-1] = KEY
    return x.astype(np.int32), needle.astype(np.int32)


def main(argv: list[str]) -> int:
    gain = MATCH_GAIN
    if len(argv) == 3 and argv[1] == "--match-gain":
        gain = float(argv[2])
        argv = argv[:1]
    if len(argv) != 1:
        print("usage: needle_model.py OUT [--match-gain G]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    m = build(gain)
    rng = np.random.default_rng(SEED + 1)
    res = {}
    for L in (512, 1024, 2048):
        ok_tokens = 0
        ok_all = 0
        for depth in (0.0, 0.5, 1.0):
            x, needle = needle_prompt(rng, L, depth)
            full = np.concatenate([x, needle])  # teacher forcing: predictions at the cue and n1..n7
            logits = m(mx.array(full[None, :-1]))[0, -NEEDLE:, :]
            pred = np.array(mx.argmax(logits, axis=-1))
            ok_tokens += int((pred == needle).sum())
            ok_all += int((pred == needle).all())
        res[str(L)] = dict(prompts=3, tokens_right=ok_tokens, tokens=3 * NEEDLE, needles_whole=ok_all)
        print(f"[needle_model] MLX teacher-forced retrieval at {L}: {res[str(L)]}", flush=True)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_model(tmp, m)
    save_config(dict(CONFIG), tmp / "config.json")
    (tmp / "needle_model.json").write_text(json.dumps(dict(seed=SEED, match_gain=gain, teacher_forced=res), indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"[needle_model] written to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
