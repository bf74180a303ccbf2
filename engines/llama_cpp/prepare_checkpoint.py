"""Make a copy of a fixture checkpoint that llama.cpp's HF->GGUF converter accepts.

Usage: python prepare_checkpoint.py SRC_DIR DEST_DIR   (prints one JSON line: what was done)
       python prepare_checkpoint.py --upcast SRC_DIR DEST_DIR
         (a float32 copy: every bfloat16/float16 tensor widened exactly, config.json unchanged;
          the reference for a GGUF made with --outtype f32 from a bfloat16/float16 checkpoint,
          whose weights are those same float32 values)

Runs in the on-demand reference venv (.venv-reference: numpy, safetensors). The copy holds the
same weights as SRC_DIR; only what the converter needs is added (facts from reading the
converter shipped inside node-llama-cpp 3.21.1, conversion/gemma.py and gguf-py/gguf/vocab.py):

- config.json gains `architectures` (the converter picks its model class from it: without it,
  "Failed to detect model architecture") and `attn_logit_softcapping: null` (the converter
  asserts it is None). mlx-lm's ModelArgs ignores both keys, so mlx-lm loads the copy as it
  loads SRC_DIR (checked by dump.ts through the oracle: same logits, bit for bit).
- tokenizer.json + tokenizer_config.json: the converter needs a BPE tokenizer with
  byte_fallback, a Sequence decoder and at least one merge (llama.cpp's "gemma4" vocabulary
  refuses a file without merges), with exactly vocab_size tokens (else the embedding rows are
  cut). The fixtures have no tokenizer (the suite feeds token ids), so a synthetic one is
  written: its strings never matter, only that there are vocab_size of them.
- *.safetensors: byte-identical copies, except mlx-lm's MoE layout
  (`experts.switch_glu.{gate,up,down}_proj.weight`), which the converter cannot map: those
  become Hugging Face's layout (`experts.gate_up_proj` = gate and up stacked on axis -2,
  `experts.down_proj`), the layout mlx-lm's own sanitize() splits back into the same arrays.
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def synthetic_tokenizer(vocab_size: int) -> tuple[dict, dict]:
    """A BPE tokenizer.json of exactly vocab_size tokens, and its tokenizer_config.json."""
    vocab: dict[str, int] = {}

    def add(tok: str) -> None:
        if len(vocab) < vocab_size and tok not in vocab:
            vocab[tok] = len(vocab)

    for t in SPECIALS:
        add(t)
    add("<0x0A>")  # a byte token, so byte_fallback has something to fall back to
    add("\u2581")  # the SentencePiece space
    for c in range(0x21, 0x7F):
        add(chr(c))
    merges: list[list[str]] = []
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    for a in letters:
        for b in letters:
            if len(vocab) >= vocab_size:
                break
            merges.append([a, b])
            add(a + b)
    if len(vocab) != vocab_size or not merges:
        raise ValueError(f"cannot build a {vocab_size}-token BPE vocabulary with merges")
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in enumerate(SPECIALS)
        ],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
    }
    return tokenizer, config


def safetensors_names(path: Path) -> list[str]:
    """Tensor names from a safetensors header (no data read: numpy has no bfloat16)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


def mlx_moe_to_hf(src: Path, dest: Path) -> bool:
    """Rewrite mlx-lm's expert layout as HF's; False (nothing written) when there is none."""
    names = safetensors_names(src)
    # a quantized checkpoint (mlx's .scales/.biases) is left as it is: the converter refuses it
    if not any(".experts.switch_glu." in k for k in names) or any(k.endswith(".scales") for k in names):
        return False
    import numpy as np
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src))
    out = {}
    for k, v in tensors.items():
        if k.endswith(".experts.switch_glu.gate_proj.weight"):
            base = k.removesuffix(".switch_glu.gate_proj.weight")
            up = tensors[f"{base}.switch_glu.up_proj.weight"]
            out[f"{base}.gate_up_proj"] = np.ascontiguousarray(np.concatenate([v, up], axis=-2))
        elif k.endswith(".experts.switch_glu.up_proj.weight"):
            continue
        elif k.endswith(".experts.switch_glu.down_proj.weight"):
            out[k.removesuffix(".switch_glu.down_proj.weight") + ".down_proj"] = v
        else:
            out[k] = v
    save_file(out, str(dest), metadata={"format": "pt"})
    return True


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prepare(src: Path, dest: Path) -> dict:
    config = json.loads((src / "config.json").read_text())
    text = config.get("text_config", config)
    is_wrapper = "text_config" in config
    vocab_size = int(text["vocab_size"])
    dest.mkdir(parents=True, exist_ok=True)
    rewritten: list[str] = []
    for f in sorted(src.glob("*.safetensors")):
        target = dest / f.name
        if mlx_moe_to_hf(f, target):
            rewritten.append(f.name)
        else:
            shutil.copyfile(f, target)
    # An index names tensors per file; a rewritten file changes the names, and a one-file
    # checkpoint does not need one (every loader here reads *.safetensors when it is absent).
    index = src / "model.safetensors.index.json"
    if index.exists() and not rewritten:
        shutil.copyfile(index, dest / index.name)
    if "architectures" not in config:
        config["architectures"] = ["Gemma4ForConditionalGeneration" if is_wrapper else "Gemma4ForCausalLM"]
    text.setdefault("attn_logit_softcapping", None)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer, tok_config = synthetic_tokenizer(vocab_size)
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n")
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    files = {p.name: sha256(p) for p in sorted(dest.iterdir()) if p.name == "config.json" or p.suffix == ".safetensors"}
    return {"dest": str(dest), "rewritten_moe_layout": rewritten, "files": files}


def upcast(src: Path, dest: Path) -> dict:
    """config.json as it is; every *.safetensors with its bfloat16/float16 tensors widened to float32."""
    import numpy as np
    from safetensors.numpy import save_file

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "config.json", dest / "config.json")
    widened = 0
    for f in sorted(src.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            data = fh.read()
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            raw = data[a:b]
            shape = info["shape"]
            if info["dtype"] == "BF16":
                # a bfloat16 is the high half of the float32 with the same value
                bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
                out[name] = bits.view(np.float32).reshape(shape)
                widened += 1
            elif info["dtype"] == "F16":
                out[name] = np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
                widened += 1
            else:
                dt = {"F32": "<f4", "I32": "<i4", "U32": "<u4", "I64": "<i8", "U8": "u1", "BOOL": "?"}[info["dtype"]]
                out[name] = np.frombuffer(raw, dtype=dt).reshape(shape).copy()
        save_file(out, str(dest / f.name), metadata={"format": "pt"})
    return {"dest": str(dest), "widened_tensors": widened}


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "--upcast":
        print(json.dumps(upcast(Path(argv[2]), Path(argv[3]))))
        return 0
    if len(argv) != 3:
        sys.stderr.write("usage: prepare_checkpoint.py SRC_DIR DEST_DIR\n")
        return 2
    src, dest = Path(argv[1]), Path(argv[2])
    if not (src / "config.json").is_file():
        sys.stderr.write(f"prepare_checkpoint: {src}: no config.json\n")
        return 2
    print(json.dumps(prepare(src, dest)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
