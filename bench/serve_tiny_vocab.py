"""Build the bench's "tiny-vocab" checkpoint: the tokenizer fixture's tiny Gemma 4 text model
(2 layers, hidden 16, sliding window 8, bfloat16, seeded weights) over a SMALL vocabulary, with a
matching tokenizer both servers load, so that a decode step is not dominated by a 262,144-wide
output layer and the serving host (HTTP, scheduling, detokenizing) decides the throughput.

The tokenizer is a byte-fallback BPE in the Gemma (SentencePiece-style) layout: spaces normalized
to "▁", the Gemma special tokens (<pad> <eos> <bos> <unk> <mask>) and turn markers
(<start_of_turn> <end_of_turn>), the 256 byte pieces <0x00>..<0xFF>, then merges trained by the
`tokenizers` library on a fixed, seeded word corpus. Its decoder is the Gemma 3 one (Replace "▁",
ByteFallback, Fuse), so mlx-lm picks its SPM streaming detokenizer (no leading-space trim) and
serve/tokenizer.ts the same. Chat template: the tokenizer fixture's (Gemma 3 turn markers).

usage: python bench/serve_tiny_vocab.py --out DIR [--vocab N] [--seed S]
Built locally (in .cache/bench/), never committed. Exit codes: 0 ok, 2 bad usage.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "oracle" / "python"))

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
# The corpus the merges are learned from: ordinary English words (the bench's prompts among them),
# shuffled into lines by a seeded generator.
WORDS = (
    "the river runs past the mill and under the old stone bridge toward the sea request a an of to in is "
    "it that for on with as was he she they we you at by from or this be are have has had not but what all "
    "were when there can one which their said if do will each about how up out them then many some so "
    "these would other into more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just "
    "where most know get through back much before go good new write our used me man too any day same right "
    "look think also around another came come work three word must because does part even place well such "
    "here take why things help put years different away again off went old number great tell men say small "
    "every found still between name should home big give air line set own under read last never us left end "
    "along while might next sound below saw something thought both few those always looked show large often "
    "together asked house world going want school important until form food keep children feet land side "
    "without boy once animals life enough took sometimes four head above kind began almost live page got "
    "earth need far hand high year mother light parts country father let night following picture being "
    "study second eyes soon times story boys since white days ever paper hard near sentence better best "
    "across during today others however sure means knew its try told young miles sun ways thing whole hear "
    "example heard several change answer room against top turned learn point city play toward five using "
    "himself usually 0 1 2 3 4 5 6 7 8 9 10 100 , . : ; ! ? ' \" ( ) - \n"
).split(" ")


def corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    words = [w for w in WORDS if w]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 24)
        line = " ".join(rng.choice(words) for _ in range(n))
        out.append(line[0].upper() + line[1:] if rng.random() < 0.3 else line)
    return out


def build_tokenizer(vocab_size: int, seed: int) -> dict:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS + BYTES, show_progress=False,
                                  limit_alphabet=200)
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    tj = json.loads(tok.to_str())
    # the byte pieces are vocabulary entries (byte fallback looks them up there), not added tokens
    tj["added_tokens"] = [a for a in tj["added_tokens"] if a["content"] in SPECIALS]
    for a in tj["added_tokens"]:
        a.update(special=True, normalized=False)
    # <bos> first, as Gemma's tokenizer does (add_bos_token)
    bos = SPECIALS.index("<bos>")
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [bos], "tokens": ["<bos>"]}},
    }
    vocab = tj["model"]["vocab"]
    for i, s in enumerate(SPECIALS + BYTES):
        assert vocab[s] == i, (s, vocab[s])
    return tj


def tokenizer_config(template: str) -> dict:
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, s in enumerate(SPECIALS)}
    return {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added,
        "bos_token": "<bos>", "eos_token": "<end_of_turn>", "pad_token": "<pad>", "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False, "spaces_between_special_tokens": False,
        "model_max_length": 32768, "padding_side": "left",
        # the generic fast tokenizer over tokenizer.json (no class-specific rebuilding of the pipeline)
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vocab", type=int, default=1024, help="vocabulary size (default 1024)")
    ap.add_argument("--seed", type=int, default=0, help="weight and corpus seed (default 0)")
    ap.add_argument("--template-from", type=Path, required=True,
                    help="tokenizer_config.json whose chat_template is used (the tokenizer fixture's)")
    args = ap.parse_args(argv)
    if args.vocab < len(SPECIALS) + len(BYTES) + 64 or args.vocab > 65536:
        ap.error(f"--vocab must be in {len(SPECIALS) + len(BYTES) + 64}..65536")
    out: Path = args.out.resolve()
    stamp = hashlib.sha256(Path(__file__).read_bytes() + f"{args.vocab}:{args.seed}".encode()).hexdigest()
    if (out / ".stamp").exists() and (out / ".stamp").read_text() == stamp:
        print(f"[tiny-vocab] {out}: up to date", flush=True)
        return 0

    from make_checkpoints import TOKENIZER_FIXTURE, cast_model, init_weights
    from mlx_lm.models import gemma4_text
    from mlx_lm.utils import save_config, save_model

    template = json.loads(args.template_from.read_text())["chat_template"]
    tj = build_tokenizer(args.vocab, args.seed)
    n = len(tj["model"]["vocab"])
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    cfg = {**TOKENIZER_FIXTURE, "vocab_size": n, "vocab_size_per_layer_input": n}
    model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(cfg))
    init_weights(model, args.seed)
    cast_model(model, "bfloat16")
    save_model(tmp, model)
    save_config({**cfg, "eos_token_id": [SPECIALS.index("<eos>"), SPECIALS.index("<end_of_turn>")]}, tmp / "config.json")
    (tmp / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(template), indent=1))
    (tmp / ".stamp").write_text(stamp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    print(f"[tiny-vocab] built {out}: vocabulary {n}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
