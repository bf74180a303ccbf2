#!/usr/bin/env python
"""mlx-lm's tuner as the oracle for model/tuner: adapters, fuse, and (kind "train") training runs.

stdin: a JSON list of jobs; each writes its results under job["out"] (safetensors + meta.json).
One process serves every job (importing mlx-lm dominates the run time). Nothing in mlx-lm is
modified; the jobs only call its public functions in the order its CLI and trainer call them.

kind "lora": load_model(ckpt) -> freeze -> mx.random.seed(seed) -> linear_to_lora_layers
  (or load_adapters(load) when "load" is given) and writes
    meta.json             named_modules order, trainable parameter names, or the error raised
    init.safetensors      every adapter parameter (lora_a, lora_b, m) right after conversion
    adapters/             with "perturb": every trainable tensor moved by 0.05 * normal(key(1000+i)),
                          saved as the trainer saves (adapters.safetensors + adapter_config.json)
    logits.safetensors    model.eval(); model(tokens)
    fused/                with "fuse": mlx_lm.fuse's steps (fuse every module, dequantize_model,
                          save_model, save_config), and fused_logits.safetensors = load_model(fused)(tokens)
  "load_fused": a fused directory (made by the TS side) -> load_model -> its logits in
  load_fused_logits.safetensors.
kind "train": the trainer's step for N steps with per-step dumps; "train_loop": mlx-lm's own
  trainer.train() with its reports; "batches", "permutation", "randint": iterate_batches (and
  default_loss), numpy's permutation and randint; "tokenizer", "datasets": a tiny tokenizer
  fixture and mlx-lm's datasets on it. Each function's docstring gives its fields.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters
from mlx_lm.utils import dequantize_model, load_model, save_config, save_model

ADAPTER_LEAVES = {"lora_a", "lora_b", "m"}


def adapter_params(model) -> dict:
    return {k: v for k, v in tree_flatten(model.parameters()) if k.rsplit(".", 1)[-1] in ADAPTER_LEAVES}


def logits_of(model, tokens) -> mx.array:
    out = model(mx.array(tokens, dtype=mx.int32))
    mx.eval(out)
    return out


def lora_job(job: dict) -> None:
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    meta: dict = {}
    model, config = load_model(Path(job["ckpt"]))
    ftype = job.get("fine_tune_type", "lora")
    try:
        if job.get("load"):
            load_adapters(model, job["load"])
        else:
            model.freeze()
            mx.random.seed(job["seed"])
            linear_to_lora_layers(model, job["num_layers"], job["lora_parameters"], use_dora=(ftype == "dora"))
    except (ValueError, KeyError) as e:
        meta["error"] = {"type": type(e).__name__, "message": str(e)}
        (out / "meta.json").write_text(json.dumps(meta))
        return
    meta["named_modules"] = [k for k, _ in model.named_modules()]
    meta["trainable"] = [k for k, _ in tree_flatten(model.trainable_parameters())]
    init = adapter_params(model)
    mx.eval(init)
    mx.save_safetensors(str(out / "init.safetensors"), init)
    if job.get("perturb"):
        moved = []
        for i, (k, v) in enumerate(tree_flatten(model.trainable_parameters())):
            noise = mx.random.normal(v.shape, key=mx.random.key(1000 + i)).astype(v.dtype)
            moved.append((k, v + 0.05 * noise))
        model.update(tree_unflatten(moved))
        adir = out / "adapters"
        adir.mkdir(exist_ok=True)
        weights = dict(tree_flatten(model.trainable_parameters()))
        mx.eval(weights)
        mx.save_safetensors(str(adir / "adapters.safetensors"), weights)
        save_config(
            {"fine_tune_type": ftype, "num_layers": job["num_layers"], "lora_parameters": job["lora_parameters"]},
            adir / "adapter_config.json",
        )
    model.eval()
    mx.save_safetensors(str(out / "logits.safetensors"), {"logits": logits_of(model, job["tokens"])})
    if job.get("fuse") is not None:
        dq = bool(job["fuse"].get("dequantize", False))
        fused = [(n, m.fuse(dequantize=dq)) for n, m in model.named_modules() if hasattr(m, "fuse")]
        if fused:
            model.update_modules(tree_unflatten(fused))
        if dq:
            model = dequantize_model(model)
            config.pop("quantization", None)
            config.pop("quantization_config", None)
        fdir = out / "fused"
        save_model(fdir, model)
        save_config(config, config_path=fdir / "config.json")
        back, _ = load_model(fdir)
        mx.save_safetensors(str(out / "fused_logits.safetensors"), {"logits": logits_of(back, job["tokens"])})
    (out / "meta.json").write_text(json.dumps(meta))


def load_fused_job(job: dict) -> None:
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    model, _ = load_model(Path(job["load_fused"]))
    mx.save_safetensors(str(out / "load_fused_logits.safetensors"), {"logits": logits_of(model, job["tokens"])})


def batches_job(job: dict) -> None:
    """iterate_batches over job["data"] ([tokens, offset] pairs, or records with "cache": true ->
    CacheDataset over pre-tokenized records), the first job["take"] batches; with "ckpt" also
    default_loss on each (model.eval(), optional LoRA as in "lora" jobs)."""
    import numpy as np
    from mlx_lm.tuner.trainer import default_loss, iterate_batches

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    if job.get("data_dir"):
        import types

        from mlx_lm.tokenizer_utils import load as load_tokenizer
        from mlx_lm.tuner.datasets import CacheDataset, load_local_dataset

        tokenizer = load_tokenizer(Path(job["tokenizer"]))
        data = CacheDataset(load_local_dataset(Path(job["data_dir"]), tokenizer, types.SimpleNamespace(**job.get("config", {})))[0])
    else:
        data = [(list(t), int(o)) for t, o in job["data"]]
    if job.get("np_seed") is not None:
        np.random.seed(job["np_seed"])
    model = None
    if job.get("ckpt"):
        model, _ = load_model(Path(job["ckpt"]))
        if job.get("lora_parameters"):
            model.freeze()
            mx.random.seed(job["seed"])
            linear_to_lora_layers(model, job["num_layers"], job["lora_parameters"])
        model.eval()
    it = iterate_batches(data, job["batch_size"], job["max_seq_length"], loop=job.get("loop", False), seed=job.get("seed_batches"))
    tensors = {}
    for i in range(job["take"]):
        try:
            b, l = next(it)
        except StopIteration:
            break
        tensors[f"{i}.batch"] = b
        tensors[f"{i}.lengths"] = l
        if model is not None:
            loss, ntoks = default_loss(model, b, l)
            tensors[f"{i}.loss"] = loss
            tensors[f"{i}.ntoks"] = ntoks
    mx.eval(tensors)
    mx.save_safetensors(str(out / "batches.safetensors"), tensors)
    (out / "meta.json").write_text(json.dumps({"count": len(tensors)}))


def permutation_job(job: dict) -> None:
    import numpy as np

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    res = []
    for seed, n, k in job["cases"]:
        np.random.seed(seed)
        res.append([np.random.permutation(n).tolist() for _ in range(k)])
    (out / "meta.json").write_text(json.dumps({"permutations": res}))


def build_job_model(job: dict, out: Path):
    """job["ckpt"] (load_model), or job["build"] = {"args", "seed", "dtype"}: gemma4_text.Model(args)
    made under mx.random.seed(seed) (mlxlm-extras §4.1), saved to out/model for the TS side."""
    if job.get("ckpt"):
        model, _ = load_model(Path(job["ckpt"]))
        return model
    from mlx_lm.models import gemma4_text

    b = job["build"]
    mx.random.seed(b.get("seed", 0))
    model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(b["args"]))
    if b.get("dtype"):
        model.set_dtype(getattr(mx, b["dtype"]))
    mx.eval(model.parameters())
    save_model(out / "model", model)
    save_config(dict(b["args"]), config_path=out / "model" / "config.json")
    return model


def make_optimizer(spec: dict):
    import mlx.optimizers as optim
    from mlx_lm.tuner.utils import build_schedule

    lr = build_schedule(spec["lr_schedule"]) if spec.get("lr_schedule") else spec["learning_rate"]
    cls = {"adam": optim.Adam, "adamw": optim.AdamW, "sgd": optim.SGD}[spec["name"]]
    return cls(learning_rate=lr, **spec.get("config", {}))


def train_job(job: dict) -> None:
    """The trainer's step (trainer.train, lines 236-261), eager or compiled, for job["steps"]
    iterations, after mlx_lm.lora.train_model's setup (seed, freeze, linear_to_lora_layers or
    unfreeze). Per step i it dumps {i}.loss, {i}.ntoks, and after the update every trainable
    parameter ({i}.param.<path>) and every optimizer state tensor ({i}.opt.<path>); the eager
    run also dumps the step's gradients ({i}.grad.<path>, before accumulation)."""
    from functools import partial

    import numpy as np
    from mlx.nn.utils import average_gradients
    from mlx.utils import tree_map
    from mlx_lm.tuner.trainer import default_loss, grad_checkpoint, iterate_batches

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    model = build_job_model(job, out)
    mx.random.seed(job.get("seed", 0))
    model.freeze()
    ftype = job.get("fine_tune_type", "lora")
    n = job["num_layers"]
    if ftype == "full":
        for l in model.layers[-max(n, 0):]:
            l.unfreeze()
    else:
        linear_to_lora_layers(model, n, job["lora_parameters"], use_dora=(ftype == "dora"))
    optimizer = make_optimizer(job["optimizer"])
    if job.get("grad_checkpoint"):
        grad_checkpoint(model.layers[0])
    loss_value_and_grad = nn.value_and_grad(model, default_loss)
    grad_accum_steps = job.get("grad_accumulation_steps", 1)
    compiled = job.get("compiled", False)
    state = [model.state, optimizer.state, mx.random.state]

    def step(batch, prev_grad, do_update):
        (lvalue, toks), grad = loss_value_and_grad(model, *batch)
        raw = grad
        if prev_grad is not None:
            grad = tree_map(lambda x, y: x + y, grad, prev_grad)
        if do_update:
            grad = average_gradients(grad)
            if grad_accum_steps > 1:
                grad = tree_map(lambda x: x / grad_accum_steps, grad)
            optimizer.update(model, grad)
            grad = None
        return lvalue, toks, grad, raw

    if compiled:

        @partial(mx.compile, inputs=state, outputs=state)
        def run(batch, prev_grad, do_update):
            lvalue, toks, grad, _ = step(batch, prev_grad, do_update)
            return lvalue, toks, grad

    if job.get("np_seed") is not None:
        np.random.seed(job["np_seed"])
    data = [(list(t), int(o)) for t, o in job["data"]]
    batches = iterate_batches(data, job["batch_size"], job.get("max_seq_length", 2048), loop=True, seed=job.get("seed_batches"))
    model.train()
    grad_accum = None
    tensors = {}
    first = None
    for it in range(1, job["steps"] + 1):
        # "same_batch": every step on the first batch (the doc's reference run, mlxlm-extras §11)
        batch = first if (job.get("same_batch") and first is not None) else next(batches)
        first = batch
        do_update = it % grad_accum_steps == 0
        if compiled:
            lvalue, toks, grad_accum = run(batch, grad_accum, do_update)
        else:
            lvalue, toks, grad_accum, raw = step(batch, grad_accum, do_update)
            for k, v in tree_flatten(raw):
                tensors[f"{it}.grad.{k}"] = v
        mx.eval(state, lvalue, toks, grad_accum)
        tensors[f"{it}.loss"] = lvalue
        tensors[f"{it}.ntoks"] = toks
        for k, v in tree_flatten(model.trainable_parameters()):
            tensors[f"{it}.param.{k}"] = v
        for k, v in tree_flatten(optimizer.state):
            tensors[f"{it}.opt.{k}"] = v
        mx.eval(tensors)
    mx.save_safetensors(str(out / "train.safetensors"), tensors)
    (out / "meta.json").write_text(json.dumps({"trainable": [k for k, _ in tree_flatten(model.trainable_parameters())]}))


WORDS = (
    "the a an of to in is was it for on that with as by at be this from or have not are but his they "
    "which one you had her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since against go "
    "came right used take three sky blue why cat dog red green tree water fire stone river hill"
).split()
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def tokenizer_job(job: dict) -> None:
    """A tiny word-level tokenizer (<= 256 ids, BOS added by the post-processor, a chat template),
    written as tokenizer.json + tokenizer_config.json into job["out"] (next to a checkpoint)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(SPECIALS + sorted(set(WORDS)) + list(".,?!\n"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", 2)])
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def datasets_job(job: dict) -> None:
    """mlx-lm's load_local_dataset on job["data"] (a dir of {train,valid,test}.jsonl) with the
    tokenizer of job["tokenizer"], wrapped in CacheDataset as train_model does: every example
    (tokens, offset) and itemlen, per split."""
    import types

    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_lm.tuner.datasets import CacheDataset, load_local_dataset

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(Path(job["tokenizer"]))
    cfg = types.SimpleNamespace(**job.get("config", {}))
    res = {}
    try:
        splits = load_local_dataset(Path(job["data"]), tokenizer, cfg)
    except ValueError as e:
        (out / "meta.json").write_text(json.dumps({"error": str(e)}))
        return
    for name, ds in zip(("train", "valid", "test"), splits):
        cd = CacheDataset(ds)
        res[name] = [{"tokens": list(cd[i][0]), "offset": int(cd[i][1]), "itemlen": cd.itemlen(i)} for i in range(len(cd))]
    (out / "meta.json").write_text(json.dumps({"splits": res, "eos_token_id": tokenizer.eos_token_id}))


def randint_job(job: dict) -> None:
    """np.random.RandomState(seed).randint(low, high, size=L) for each L (the doc's token lists)."""
    import numpy as np

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(job["seed"])
    arrays = [rng.randint(job["low"], job["high"], size=n).tolist() for n in job["sizes"]]
    (out / "meta.json").write_text(json.dumps({"arrays": arrays}))


def train_loop_job(job: dict) -> None:
    """mlx-lm's own trainer.train() (compiled step, validation, reports, adapter saves) after
    mlx_lm.lora's setup, with a training_callback recording every report; adapters are saved under
    out/adapters. meta.json: {"train": [...], "val": [...]} (wall-clock fields left out)."""
    import numpy as np
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.trainer import TrainingArgs, train

    out = Path(job["out"])
    (out / "adapters").mkdir(parents=True, exist_ok=True)
    model = build_job_model(job, out)
    np.random.seed(job.get("np_seed", 0))
    mx.random.seed(job.get("seed", 0))
    model.freeze()
    linear_to_lora_layers(model, job["num_layers"], job["lora_parameters"], use_dora=job.get("fine_tune_type") == "dora")
    optimizer = make_optimizer(job["optimizer"])
    reports = {"train": [], "val": []}

    class Recorder(TrainingCallback):
        def on_train_loss_report(self, info):
            reports["train"].append({k: info[k] for k in ("iteration", "train_loss", "learning_rate", "trained_tokens")})

        def on_val_loss_report(self, info):
            reports["val"].append({k: info[k] for k in ("iteration", "val_loss")})

    a = job["args"]
    args = TrainingArgs(adapter_file=str(out / "adapters" / "adapters.safetensors"), **a)
    train_set = [(list(t), int(o)) for t, o in job["data"]]
    val_set = [(list(t), int(o)) for t, o in job["val_data"]]
    train(model, optimizer, train_set, val_set, args=args, training_callback=Recorder())
    (out / "meta.json").write_text(json.dumps(reports))


def restoring_layer_call(fn):
    """grad_checkpoint patches the decoder layer class for the whole process: each job starts from
    (and leaves) the unpatched __call__."""

    def run(job: dict) -> None:
        from mlx_lm.models import gemma4_text

        call = gemma4_text.DecoderLayer.__call__
        try:
            fn(job)
        finally:
            gemma4_text.DecoderLayer.__call__ = call

    return run


JOBS = {
    "lora": lora_job,
    "load_fused": load_fused_job,
    "batches": batches_job,
    "train": restoring_layer_call(train_job),
    "train_loop": restoring_layer_call(train_loop_job),
    "tokenizer": tokenizer_job,
    "datasets": datasets_job,
    "randint": randint_job,
    "permutation": permutation_job,
}


def main() -> int:
    jobs = json.load(sys.stdin)
    status = 0
    for job in jobs:
        try:
            if job["kind"] not in JOBS:
                raise ValueError(f"unknown job kind {job['kind']!r}")
            JOBS[job["kind"]](job)
        except Exception:  # noqa: BLE001 - reported per job, the others still run
            Path(job["out"]).mkdir(parents=True, exist_ok=True)
            (Path(job["out"]) / "meta.json").write_text(json.dumps({"crash": traceback.format_exc()}))
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
