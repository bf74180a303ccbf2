#!/usr/bin/env python
"""Live oracle: one long-lived Python process answering JSON-lines requests on stdio.

Protocol (one JSON object per line):
  startup  -> {"event": "ready", "pid", "versions", "tmpdir"}
  request  <- {"id": N, "cmd": NAME, ...fields}
  reply    -> {"id": N, "ok": true, ...result}
            | {"id": N, "ok": false, "error": {"type", "message", "traceback"}}
Arrays travel as .npy files: {"npy": PATH, "dtype": NAME, "shape": [...]}; bfloat16 data is
stored as uint16 and tagged "bfloat16". Output files go to the run's tmpdir (--tmpdir, or a
fresh temp dir removed at exit). Anything printed by libraries goes to stderr: the protocol
owns the real stdout. Commands: see HANDLERS below and oracle/README.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Keep the protocol channel private before anything can print to fd 1.
_PROTO = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx_lm  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models import base as mbase  # noqa: E402
from mlx_lm.models import cache as mcache  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

import capture as cap  # noqa: E402
import device_env  # noqa: E402
import golden_io  # noqa: E402
import make_checkpoints as mkc  # noqa: E402
from common import (  # noqa: E402
    DEFAULT_CKPT_ROOT,
    NP_DTYPES,
    REPO,
    from_numpy,
    load_scenarios,
    npy_bytes,
    sha256_bytes,
    to_numpy,
)

# the gemma4_unified scenarios (their media specs travel with them)
UNIFIED_SCENARIOS = REPO / "fixtures" / "unified_scenarios.json"


class Server:
    def __init__(self, tmpdir: Path, ckpt_root: Path, ops_module: str | None):
        self.tmpdir = tmpdir
        self.ckpt_root = ckpt_root
        self.ops_module = ops_module
        self._ops = None
        self._models: dict[str, Any] = {}
        self._seq = 0

    # ------------------------------------------------------------ arrays
    def out_array(self, a: mx.array, tag: str = "a") -> dict:
        data, dtype = to_numpy(a)
        return self.out_numpy(data, dtype, tag)

    def out_numpy(self, data: np.ndarray, dtype: str, tag: str = "a") -> dict:
        self._seq += 1
        p = self.tmpdir / f"out-{self._seq}-{tag}.npy"
        p.write_bytes(npy_bytes(data))
        return {"npy": str(p), "dtype": dtype, "shape": list(data.shape)}

    @staticmethod
    def in_array(spec: dict) -> mx.array:
        arr = np.load(spec["npy"], allow_pickle=False)
        return from_numpy(arr, spec["dtype"])

    def in_value(self, spec: dict) -> Any:
        if "npy" in spec:
            return self.in_array(spec)
        if "scalar" in spec:
            kind = spec.get("kind", "float")
            v = spec["scalar"]
            if kind == "int":
                return int(v)
            if kind == "bool":
                return bool(v)
            if kind == "float":
                return float(v)
            raise ValueError(f"unknown scalar kind {kind!r}")
        raise ValueError(f"input must have 'npy' or 'scalar': {spec!r}")

    # ------------------------------------------------------------ models
    def checkpoint_dir(self, ref: str) -> Path:
        """A path, or an id like 'c1_dense/f32' (built into the checkpoint cache on demand)."""
        p = Path(ref)
        if p.is_absolute() or (p / "config.json").exists():
            if not (p / "config.json").exists():
                raise FileNotFoundError(f"no config.json in checkpoint dir {p}")
            return p
        ids = set(mkc.all_ids())
        if ref not in ids:
            raise FileNotFoundError(f"unknown checkpoint {ref!r} (not a dir, not one of {len(ids)} matrix ids)")
        d = self.ckpt_root / ref
        stamp = d / ".stamp"
        if not stamp.exists() or stamp.read_text() != mkc.stamp_for(ref, mkc.DEFAULT_SEED):
            mkc.main(["--out", str(self.ckpt_root), "--only", ref])
        return d

    def model(self, ref: str, vlm: bool = False):
        """mlx-lm's load_model, or mlx-vlm's (`vlm`: the multimodal scenarios)."""
        d = self.checkpoint_dir(ref)
        key = f"{'vlm:' if vlm else ''}{d.resolve()}"
        stamp = (d / "model.safetensors").stat().st_mtime_ns if (d / "model.safetensors").exists() else 0
        hit = self._models.get(key)
        if hit is None or hit[0] != stamp:
            if len(self._models) >= 8:
                self._models.pop(next(iter(self._models)))
            if vlm:
                import capture_mm

                self._models[key] = (stamp, capture_mm.load_mm(d))
            else:
                self._models[key] = (stamp, cap.load(d))
        return self._models[key][1]

    @staticmethod
    def is_mm(scn: dict) -> bool:
        """A multimodal scenario (fixtures/mm_scenarios.json, or an inline one with `media` or `videos`)."""
        return scn.get("id", "").startswith("mm_") or "media" in scn or "needs" in scn or "videos" in scn

    @staticmethod
    def scenario(req: dict) -> dict:
        s = req.get("scenario")
        if isinstance(s, dict):
            return s
        for scn in load_scenarios():
            if scn["id"] == s:
                return scn
        if isinstance(s, str) and s.startswith("mm_"):
            import capture_mm

            return capture_mm.mm_scenario(s)
        if isinstance(s, str) and s.startswith("u_"):
            # gemma4_unified (fixtures/unified_scenarios.json): the scenario with its media specs,
            # as the TS side passes it inline (oracle/unified_fixtures.ts inlineScenario)
            spec = json.loads(UNIFIED_SCENARIOS.read_text())
            for scn in spec["scenarios"]:
                if scn["id"] == s:
                    return {**scn, "media": spec["media"]}
        raise KeyError(f"unknown scenario {s!r}")

    def run_capture(self, ref: str, scn: dict, mode: str, spill=None, only=None):
        """capture.capture under mlx-lm, or capture_mm.mm_capture under mlx-vlm for media scenarios.
        only (mlx-lm, streamed captures): copy out just these taps' data (names or globs)."""
        if self.is_mm(scn):
            import capture_mm

            return capture_mm.mm_capture(self.model(ref, vlm=True), scn, mode, spill, model_dir=self.checkpoint_dir(ref))
        return cap.capture(self.model(ref), scn, mode, spill, only)

    # ------------------------------------------------------------ commands
    def cmd_ping(self, req: dict) -> dict:
        return {"pong": True, "pid": os.getpid(), "versions": versions()}

    def cmd_fingerprint(self, req: dict) -> dict:
        return {"versions": versions(), "fingerprint": fingerprint()}

    def cmd_sleep(self, req: dict) -> dict:
        time.sleep(float(req.get("seconds", 0)))
        return {"slept": float(req.get("seconds", 0))}

    def cmd_op(self, req: dict) -> dict:
        ops = self.ops_table()
        inputs = [self.in_value(x) for x in req.get("inputs", [])]
        outs = ops.run_op(req["name"], inputs, req.get("params") or {})
        mx.eval(outs)
        return {"outputs": [self.out_array(o, f"op{i}") for i, o in enumerate(outs)]}

    def ops_table(self):
        if self._ops is None:
            path = Path(self.ops_module) if self.ops_module else Path(__file__).with_name("ops_table.py")
            if not path.exists():
                raise FileNotFoundError(f"ops table {path} does not exist")
            spec = importlib.util.spec_from_file_location("ops_table", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
            self._ops = mod
        return self._ops

    def cmd_forward(self, req: dict) -> dict:
        model = self.model(req["checkpoint"])
        logits = cap.run_forward(model, req["tokens"])
        return {"logits": self.out_array(logits, "logits")}

    def cmd_generate(self, req: dict) -> dict:
        """Plain mlx_lm generate_step (no taps): yielded tokens and logprobs per step."""
        model = self.model(req["checkpoint"])
        cache = mcache.make_prompt_cache(model)
        gen = cap.mlg.generate_step(mx.array(req["prompt"], dtype=mx.int32), model,
                                    max_tokens=int(req.get("max_tokens", 20)),
                                    prefill_step_size=int(req.get("prefill_step_size", 2048)),
                                    prompt_cache=cache)
        tokens, logprobs = [], []
        for t, lp in gen:
            tokens.append(int(t))
            logprobs.append(self.out_array(lp, "logprobs"))
        return {"tokens": tokens, "logprobs": logprobs,
                "cache": [dict(layer=i, **cap.cache_meta(c)) for i, c in enumerate(cache)],
                "cache_sha256": [cache_sha256(c) for c in cache]}

    def cmd_capture(self, req: dict) -> dict:
        """All taps of a scenario; each stored tap comes back as an .npy file."""
        scn = self.scenario(req)
        # stream: every kept tap is written to its .npy as soon as it is recorded, so the
        # server never holds a whole capture in memory (real-size checkpoints).
        stream = bool(req.get("stream", False))
        spill = (lambda data, dtype: self.out_numpy(data, dtype, "tap")) if stream else None
        want = req.get("only")
        # streamed: `only` decides what is written at all (unstreamed: what is shipped, below)
        calls, meta = self.run_capture(req["checkpoint"], scn, req.get("mode", "full"), spill, want if stream else None)
        taps = []
        for r, t in zip(golden_io.tap_records(calls), (t for c in calls for t in c.taps.values())):
            if t.file is not None:
                r.update(t.file)
            elif t.data is not None and (want is None or any(fnmatch.fnmatchcase(t.name, g) for g in want)):
                r.update(self.out_numpy(t.data, t.dtype, "tap"))
            taps.append(r)
        return {"meta": meta, "calls": golden_io.call_records(calls), "taps": taps}

    def cmd_golden(self, req: dict) -> dict:
        """Capture scenarios of one checkpoint into one golden .npz + .json index (used by regen).

        req: checkpoint, items [{scenario, mode}], npz, index, prefix (true: tap names are
        prefixed "<scenario>/", used when several scenarios share a file)."""
        prefixed = bool(req.get("prefix", False))
        groups, scenarios, taps, stored = [], [], [], 0
        seen: dict[str, str] = {}
        for item in req["items"]:
            scn = self.scenario(item)
            mode = item["mode"]
            key = json.dumps([mode, same_work_key(scn)])
            if prefixed and key in seen:  # identical computation (e.g. P=1 for any prefill size)
                orig = next(e for e in scenarios if e["scenario"] == seen[key])
                # (calls and digests are read from the entry it is the same as)
                scenarios.append({**{k: v for k, v in orig.items() if k not in ("calls", "digests")}, "scenario": scn["id"],
                                  "same_as": orig["scenario"], "stored": 0})
                continue
            seen[key] = scn["id"]
            digests = None
            if mode == "logits" and self.is_mm(scn):
                # every tap's data is kept for its digest (golden_io.call_digests), then only the
                # logits-mode taps stay stored: the same taps as a logits capture, plus the digests
                import capture_mm

                calls, meta = self.run_capture(req["checkpoint"], scn, "full")
                digests = golden_io.call_digests(calls)
                for c in calls:
                    for short, t in c.taps.items():
                        if not capture_mm.logits_only(c, short):
                            t.data = None
                meta["mode"] = mode
            else:
                calls, meta = self.run_capture(req["checkpoint"], scn, mode)
            pre = f"{scn['id']}/" if prefixed else ""
            groups.append((pre, calls))
            recs = golden_io.tap_records(calls, pre)
            entry = {"scenario": scn["id"], "mode": mode, "meta": meta, "tap_count": len(recs),
                     "stored": sum(1 for r in recs if r.get("stored"))}
            if digests is not None:
                entry["digests"] = digests
            if mode == "full":
                entry["calls"] = golden_io.call_records(calls)
                taps += [golden_io.index_record(r) for r in recs]
            else:  # logits-only: list just what is stored
                taps += [{k: r[k] for k in ("name", "dtype", "shape")} for r in recs if r.get("stored")]
            stored += entry["stored"]
            scenarios.append(entry)
        npz = Path(req["npz"])
        golden_io.write_npz(npz, groups)
        text = index_json({"checkpoint": req["checkpoint"], "scenarios": scenarios, "taps": taps})
        ip = Path(req["index"])
        tmp = ip.with_name(f".{ip.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, ip)
        return {"npz_sha256": sha256_bytes(npz.read_bytes()), "npz_bytes": npz.stat().st_size,
                "index_sha256": sha256_bytes(text.encode()), "index_bytes": len(text.encode()),
                "scenarios": [{"scenario": e["scenario"], "mode": e["mode"], "taps": e["tap_count"],
                               "stored": e["stored"], "same_as": e.get("same_as")} for e in scenarios]}

    def cmd_make_checkpoints(self, req: dict) -> dict:
        if req.get("tokenizer_from"):  # the tokenizer fixture (issue 15) at req["out"]
            mkc.build_tokenizer_fixture(Path(req["tokenizer_from"]), Path(req["out"]), mkc.DEFAULT_SEED)
            return {"dir": req["out"]}
        out = Path(req.get("out") or self.ckpt_root)
        argv = ["--out", str(out)]
        for g in req.get("only") or []:
            argv += ["--only", g]
        if req.get("force"):
            argv.append("--force")
        rc = mkc.main(argv)
        if rc != 0:
            raise RuntimeError(f"make_checkpoints exited with {rc}")
        return {"index": json.loads((out / "index.json").read_text())}

    def cmd_plan(self, req: dict) -> dict:
        import make_mm_checkpoints as mmc

        mm_ck = []
        for cid, fixture, variant, _, _ in mmc.mm_matrix_ids():
            d = mmc.describe_mm(fixture, variant, "", None)
            mm_ck.append({"id": cid, "fixture": fixture, "variant": variant,
                          "towers": [t for t in ("vision", "audio") if t in d["features"]]})
        mm_sc = json.loads(mmc.FIXTURES.joinpath("mm_scenarios.json").read_text())["scenarios"]
        return {"checkpoints": [{"id": t[0], "fixture": t[1], "variant": t[2],
                                 "moe": mkc.is_moe(t[1])} for t in mkc.matrix_ids()],
                "scenarios": [{k: v for k, v in s.items() if k in ("id", "kind", "applies_to")}
                              for s in load_scenarios()],
                "mm_checkpoints": mm_ck,
                "mm_scenarios": [{k: v for k, v in s.items() if k in ("id", "kind", "needs")} for s in mm_sc],
                # gemma4_unified fixtures (fixtures/unified_configs; scenarios: fixtures/unified_scenarios.json, inline)
                "unified_checkpoints": [{"id": t[0], "fixture": t[1], "variant": t[2],
                                         "towers": [p for p in ("vision", "audio") if p in mmc.describe_mm(t[1], t[2], "", None)["features"]]}
                                        for t in mmc.unified_matrix_ids()],
                "unified_scenarios": [{k: v for k, v in s.items() if k in ("id", "kind", "needs")}
                                      for s in json.loads(UNIFIED_SCENARIOS.read_text())["scenarios"]]}

    def cmd_make_mask(self, req: dict) -> dict:
        """base.create_attention_mask(h, cache, window_size, return_array) with h of length N,
        or base.create_causal_mask(N, offset, window_size) when fn == "create_causal_mask"."""
        n = int(req["N"])
        fn = req.get("fn", "create_attention_mask")
        if fn == "create_causal_mask":
            out = mbase.create_causal_mask(n, int(req.get("offset", 0)), window_size=req.get("window_size"))
        elif fn == "create_attention_mask":
            c = make_cache(req["cache"]) if req.get("cache") else None
            out = mbase.create_attention_mask(mx.zeros((1, n, 1)), c, window_size=req.get("window_size"),
                                              return_array=bool(req.get("return_array", False)))
        else:
            raise ValueError(f"unknown make_mask fn {fn!r}")
        return {"mask": mask_value(self, out)}

    # ------------------------------------------------------------ batched generation (batch.py)
    def cmd_batch_run(self, req: dict) -> dict:
        """mlx-lm's BatchGenerator on a batch scenario, recorded after every next() call."""
        import batch

        return batch.run_scenario(self.model(req["checkpoint"]), req["scenario"], self.out_array)

    def cmd_batch_generate(self, req: dict) -> dict:
        """mlx-lm's batch_generate (a stub tokenizer: eos_token_ids, decode): token ids and logprobs."""
        import batch

        return batch.run_batch_generate(self.model(req["checkpoint"]), req)

    def cmd_batch_of_one(self, req: dict) -> dict:
        """One prompt through BatchGenerator and generate_step: the batch's steps and how the two agree."""
        import batch

        return batch.run_batch_of_one(self.model(req["checkpoint"]), req, self.out_array)

    def cmd_stop_match(self, req: dict) -> dict:
        """mlx-lm's StopSequences automaton over token streams: the positions where a stop completed."""
        import batch

        return batch.stop_match(req)

    def cmd_batch_cache_ops(self, req: dict) -> dict:
        """A sequence of BatchKVCache / BatchRotatingKVCache calls; results and state after each."""
        import batch

        return {"results": batch.batch_cache_ops(req["ops"], self.in_array, self.out_array,
                                                 lambda m: mask_value(self, m))}

    def cmd_cache_ops(self, req: dict) -> dict:
        """Run a sequence of cache calls; every result and the cache state after each op."""
        caches: dict[str, Any] = {}
        results = []
        for op in req["ops"]:
            name = op.get("cache", "c")
            kind = op["op"]
            r: dict[str, Any] = {"op": kind}
            if kind == "new":
                caches[name] = make_cache(op)
            else:
                c = caches[name]
                if kind == "update_and_fetch":
                    k, v = c.update_and_fetch(self.in_array(op["keys"]), self.in_array(op["values"]))
                    r["keys"], r["values"] = self.out_array(k, "k"), self.out_array(v, "v")
                elif kind == "make_mask":
                    r["mask"] = mask_value(self, c.make_mask(int(op["N"]), window_size=op.get("window_size"),
                                                             return_array=bool(op.get("return_array", False))))
                elif kind == "trim":
                    r["trimmed"] = int(c.trim(int(op["n"])))
                elif kind in ("size", "is_trimmable", "empty"):
                    r["value"] = getattr(c, kind)()
                elif kind == "state":
                    st = c.state
                    r["state"] = [self.out_array(x, "s") if isinstance(x, mx.array)
                                  else (None if x is None else int(x)) for x in st]
                elif kind == "from_state":  # clone: rebuild `to` from the state of this cache
                    caches[op["to"]] = type(c).from_state(c.state)
                else:
                    raise ValueError(f"unknown cache op {kind!r}")
            r["meta"] = cap.cache_meta(caches[name]) if name in caches else None
            results.append(r)
        return {"results": results}

    def cmd_mm_masks(self, req: dict) -> dict:
        """mlx-vlm's Gemma4TextModel._make_masks on synthetic layouts. cases: [{layer_types, window,
        bidirectional ("vision" | null), B, N, types [[int]] | null (mm_token_type_ids), offset (the
        cache prefix; null: no cache)}] -> results [{layer_type: mask}] (first layer of each type)."""
        import types as pytypes

        import capture_mm

        v = capture_mm._vlm()
        tm = v.lang.Gemma4TextModel
        results = []
        for c in req["cases"]:
            obj = pytypes.SimpleNamespace(
                config=pytypes.SimpleNamespace(use_bidirectional_attention=c.get("bidirectional")),
                layers=[pytypes.SimpleNamespace(layer_type=t) for t in c["layer_types"]], window_size=int(c["window"]))
            obj._block_sequence_ids_for_mask = pytypes.MethodType(tm._block_sequence_ids_for_mask, obj)
            obj._apply_blockwise_bidirectional_overlay = pytypes.MethodType(tm._apply_blockwise_bidirectional_overlay, obj)
            caches = [None] * len(obj.layers)
            if c.get("offset") is not None:
                caches = []
                for t in c["layer_types"]:
                    cc = v.cache.KVCache() if t == "full_attention" else v.cache.RotatingKVCache(max_size=int(c["window"]), keep=0)
                    cc.offset = int(c["offset"])
                    if t != "full_attention":
                        cc._idx = min(int(c["offset"]), int(c["window"]))
                    caches.append(cc)
            h = mx.zeros((int(c.get("B", 1)), int(c["N"]), 1))
            mm = mx.array(c["types"], dtype=mx.int32) if c.get("types") is not None else None
            masks = tm._make_masks(obj, h, caches, mm)
            out: dict[str, Any] = {}
            for layer, m in zip(obj.layers, masks):
                if layer.layer_type not in out:
                    out[layer.layer_type] = mask_value(self, m)
            results.append(out)
        return {"results": results}

    # ------------------------------------------------------------ media (mlx-vlm preprocessing)
    def cmd_media(self, req: dict) -> dict:
        """`fn` of oracle/python/media.py with `args`; .npy inputs in, numpy results out."""
        import media  # lazy: imports mlx_vlm / PIL only when asked

        fn = media.FUNCTIONS.get(req.get("fn"))
        if fn is None:
            raise LookupError(f"unknown media function {req.get('fn')!r} (have {sorted(media.FUNCTIONS)})")
        args = {k: np.load(v["npy"], allow_pickle=False) if isinstance(v, dict) and "npy" in v else v
                for k, v in (req.get("args") or {}).items()}
        out = fn(**args)
        names = {np.dtype(t): n for n, t in NP_DTYPES.items() if n != "bfloat16"}
        return {k: self.out_numpy(v, names[v.dtype], k) if isinstance(v, np.ndarray) else v for k, v in out.items()}

    # ------------------------------------------------------------ training API (nn.Module, autodiff)
    def fresh_model(self, req: dict):
        """A newly loaded model of req["checkpoint"] (not the cached one: steps mutate it), with
        req["steps"] applied: [{op: freeze|unfreeze|train|eval, path (named module, "" = root),
        recurse, keys, strict, mode}]."""
        model = cap.load(self.checkpoint_dir(req["checkpoint"]))
        named = dict(model.named_modules())
        for st in req.get("steps") or []:
            target, op = named[st.get("path", "")], st["op"]
            if op in ("freeze", "unfreeze"):
                getattr(target, op)(**{k: st[k] for k in ("recurse", "keys", "strict") if k in st})
            elif op == "train":
                target.train(st.get("mode", True))
            elif op == "eval":
                target.eval()
            else:
                raise ValueError(f"unknown module step {op!r}")
        return model

    def cmd_module_api(self, req: dict) -> dict:
        """The nn.Module structure after the steps: named_modules [[path, class, training]],
        parameters / trainable_parameters / children trees (array leaves as "dtype[shape]",
        module leaves as their class name), leaf_modules paths."""
        model = self.fresh_model(req)

        def show(t):
            if isinstance(t, mx.array):
                return f"{str(t.dtype).split('.')[-1]}{list(t.shape)}"
            if isinstance(t, dict):
                return {k: show(v) for k, v in t.items()}
            if isinstance(t, (list, tuple)):
                return [show(v) for v in t]
            return type(t).__name__

        def show_children(t):
            if isinstance(t, nn.Module):
                return type(t).__name__
            if isinstance(t, dict):
                return {k: show_children(v) for k, v in t.items()}
            return [show_children(v) for v in t]

        return {"named_modules": [[k, type(m).__name__, m.training] for k, m in model.named_modules()],
                "parameters": show(model.parameters()),
                "trainable_parameters": show(model.trainable_parameters()),
                "children": show_children(model.children()),
                "leaf_modules": [k for k, _ in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)]}

    def cmd_module_grad(self, req: dict) -> dict:
        """nn.value_and_grad(model, loss)(tokens) on a fresh model after the steps, with
        loss = (model(tokens) * weights).sum(); the loss and every gradient, by parameter path.
        `checkpoint_layers`: under mlx-lm's grad_checkpoint (a class-wide patch of the decoder
        layer's __call__, undone afterwards)."""
        from mlx_lm.tuner.trainer import grad_checkpoint

        model = self.fresh_model(req)
        w = self.in_array(req["weights"])
        layer_cls = type(model.layers[0])
        call = layer_cls.__call__
        try:
            if req.get("checkpoint_layers"):
                grad_checkpoint(model.layers[0])
            lvg = nn.value_and_grad(model, lambda x: (model(x) * w).sum())
            loss, grads = lvg(mx.array(req["tokens"], dtype=mx.int32))
            mx.eval(loss, grads)
        finally:
            layer_cls.__call__ = call
        return {"loss": self.out_array(loss, "loss"),
                "grads": [{"path": k, **self.out_array(g, "grad")} for k, g in tree_flatten(grads)]}

    def cmd_optimizer(self, req: dict) -> dict:
        """mlx.optimizers on a parameter tree: `optimizer` {name, args (keyword arguments; a
        learning_rate may be a schedule spec {name, args} or {name: "join_schedules", schedules,
        boundaries})}, `params` [{path, npy}] (tree_unflatten'ed), `grads` one such list per
        step. Each step is params = opt.apply_gradients(grads, params), then mx.eval; the reply
        has, per step, tree_flatten(params) and tree_flatten(opt.state) as [{path, npy}]."""
        from mlx.utils import tree_unflatten

        def tree(items):
            return tree_unflatten([(x["path"], self.in_array(x)) for x in items])

        opt = make_optimizer(req["optimizer"])
        params = tree(req["params"])
        steps = []
        for g in req["grads"]:
            params = opt.apply_gradients(tree(g), params)
            mx.eval(params, opt.state)
            steps.append({"params": self.out_flat(params, "p"), "state": self.out_flat(opt.state, "s")})
        return {"steps": steps}

    def out_flat(self, tree, tag: str) -> list:
        return [{"path": k, **self.out_array(a, tag)} for k, a in tree_flatten(tree)]

    def cmd_train_steps(self, req: dict) -> dict:
        """`n` training steps on a fresh model after the module steps: loss = (model(tokens) *
        weights).sum(), nn.value_and_grad, optimizer.update(model, grads) with `optimizer` (as in
        cmd_optimizer); `compiled`: the step under mx.compile with inputs = outputs =
        [model.state, optimizer.state, mx.random.state], as mlx-lm's trainer. Every step's loss,
        then tree_flatten of the trainable parameters and of the optimizer state."""
        from functools import partial

        model = self.fresh_model(req)
        w = self.in_array(req["weights"])
        x = mx.array(req["tokens"], dtype=mx.int32)
        opt = make_optimizer(req["optimizer"])
        lvg = nn.value_and_grad(model, lambda t: (model(t) * w).sum())

        def step(t):
            loss, grads = lvg(t)
            opt.update(model, grads)
            return loss

        if req.get("compiled"):
            state = [model.state, opt.state, mx.random.state]
            step = partial(mx.compile, inputs=state, outputs=state)(step)
        losses = []
        for _ in range(int(req["n"])):
            loss = step(x)
            mx.eval(loss, model.parameters(), opt.state)
            losses.append(self.out_array(loss, "loss"))
        return {"losses": losses, "params": self.out_flat(model.trainable_parameters(), "p"),
                "state": self.out_flat(opt.state, "s")}

    # ------------------------------------------------------------ speculative decoding, prompt caches
    def out_tree(self, v: Any) -> Any:
        """Every mx.array inside dicts/lists becomes an .npy reference."""
        if isinstance(v, mx.array):
            return self.out_array(v)
        if isinstance(v, dict):
            return {k: self.out_tree(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self.out_tree(x) for x in v]
        return v

    def cmd_speculative(self, req: dict) -> dict:
        """mlx-lm speculative_generate_step (greedy, fresh caches): tokens, logprobs, from_draft, caches."""
        import speculative as spec
        r = spec.run_speculative(self.model(req["checkpoint"]), self.model(req["draft"]), req["prompt"],
                                 int(req.get("num_draft_tokens", 2)), int(req.get("max_tokens", 20)),
                                 int(req.get("prefill_step_size", 512)))
        return self.out_tree(r)

    def cmd_prompt_cache_save(self, req: dict) -> dict:
        """mlx_lm.cache_prompt's prefill + save_prompt_cache(file, cache, metadata)."""
        import speculative as spec
        r = spec.prompt_cache_save(self.model(req["checkpoint"]), req["prompt"], req["file"],
                                   req.get("metadata") or {}, int(req.get("prefill_step_size", 2048)))
        return self.out_tree(r)

    def cmd_prompt_cache_continue(self, req: dict) -> dict:
        """load_prompt_cache(file) + generate_step(suffix, prompt_cache=...) (greedy)."""
        import speculative as spec
        r = spec.prompt_cache_continue(self.model(req["checkpoint"]), req["file"], req["suffix"],
                                       int(req.get("max_tokens", 8)), int(req.get("prefill_step_size", 2048)))
        return self.out_tree(r)

    def cmd_mtp(self, req: dict) -> dict:
        """mlx-vlm's MTP speculative decoding (gemma4_assistant drafter), recorded round by round."""
        import speculative as spec
        r = spec.run_mtp(self.checkpoint_dir(req["checkpoint"]), Path(req["drafter"]), req["prompt"],
                         int(req.get("max_tokens", 20)), req.get("draft_block_size"),
                         int(req.get("prefill_step_size", 2048)), req.get("sampling"))
        return self.out_tree(r)

    def cmd_dflash(self, req: dict) -> dict:
        """mlx-vlm's DFlash speculative decoding (gemma4_dflash drafter), recorded round by round."""
        import speculative_dflash as sdf
        r = sdf.run_dflash(self.checkpoint_dir(req["checkpoint"]), Path(req["drafter"]), req["prompt"],
                           int(req.get("max_tokens", 20)), req.get("draft_block_size"), req.get("sampling"))
        return self.out_tree(r)

    def cmd_dflash_block_sizes(self, req: dict) -> dict:
        """mlx-vlm's _dflash_next_block_size on many acceptance histories."""
        import speculative_dflash as sdf
        return {"sizes": sdf.block_sizes(req["cases"])}

    def cmd_exact_verify(self, req: dict) -> dict:
        """mlx-vlm's Gemma4ExactSpeculativeVerifier on a block after a prefilled prompt."""
        import speculative as spec
        return self.out_tree(spec.run_exact_verify(self.checkpoint_dir(req["checkpoint"]), req["prompt"], req["block"]))

    # ------------------------------------------------------------ tokenizers (issue 15)
    def tokenizer(self, d: str):
        """mlx_lm.utils.load_tokenizer(dir): mlx-lm's TokenizerWrapper around transformers' tokenizer."""
        from mlx_lm.utils import load_tokenizer

        self._tokenizers = getattr(self, "_tokenizers", {})
        if d not in self._tokenizers:
            self._tokenizers[d] = load_tokenizer(Path(d))
        return self._tokenizers[d]

    def cmd_tokenize(self, req: dict) -> dict:
        """Token ids of `strings` with and without special tokens, and of `chats` (message lists
        through the chat template, as mlx_lm.generate tokenizes a chat prompt)."""
        tok = self.tokenizer(req["dir"])
        out = {"with_special": [tok.encode(s) for s in req.get("strings", [])],
               "without_special": [tok.encode(s, add_special_tokens=False) for s in req.get("strings", [])]}
        chats = []
        for c in req.get("chats", []):
            ids = tok.apply_chat_template(c["messages"], add_generation_prompt=c.get("add_generation_prompt", True))
            chats.append([int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)])
        out["chats"] = chats
        return out

    def cmd_chat_template(self, req: dict) -> dict:
        """tokenizer.apply_chat_template(messages, tokenize=False, ...) of each conversation, or its error."""
        tok = self.tokenizer(req["dir"])
        rendered = []
        for c in req["conversations"]:
            try:
                rendered.append({"text": tok.apply_chat_template(c["messages"], tokenize=False,
                                                                 add_generation_prompt=c.get("add_generation_prompt", True))})
            except Exception as e:  # a template's raise_exception: reported, compared with TS's
                rendered.append({"error": f"{type(e).__name__}: {e}"})
        return {"rendered": rendered}

    def cmd_shutdown(self, req: dict) -> dict:
        return {"bye": True}


def make_optimizer(spec: dict):
    """mlx.optimizers.<name>(**args); a learning_rate may be a schedule spec {name, args} or
    {name: "join_schedules", schedules, boundaries}."""
    import mlx.optimizers as optim

    def schedule(s):
        if not isinstance(s, dict):
            return s
        if s["name"] == "join_schedules":
            return optim.join_schedules([schedule(x) for x in s["schedules"]], s["boundaries"])
        return getattr(optim, s["name"])(*s["args"])

    args = dict(spec.get("args") or {})
    if "learning_rate" in args:
        args["learning_rate"] = schedule(args["learning_rate"])
    return getattr(optim, spec["name"])(**args)


def same_work_key(scn: dict) -> list:
    """Scenarios with equal keys run the exact same model calls (so they have equal goldens)."""
    if Server.is_mm(scn):
        return ["mm", scn["id"]]
    if scn["kind"] == "forward":
        return ["forward", scn["tokens"]]
    return ["generate", scn["prompt"], cap.prefill_schedule(len(scn["prompt"]), scn["prefill_step_size"]),
            scn["max_tokens"]]


def cache_sha256(c: Any) -> dict:
    """A cache's contents: sha256 of its key and value buffers (the state mlx-lm saves), raw bytes."""
    def digest(a: mx.array | None) -> str | None:
        if a is None:
            return None
        if a.dtype == mx.bfloat16:
            a = a.view(mx.uint16)
        mx.eval(a)
        return hashlib.sha256(np.array(a).tobytes()).hexdigest()
    return {"dtype": None if c.keys is None else str(c.keys.dtype).split(".")[-1],
            "keys": digest(c.keys), "values": digest(c.values)}


def make_cache(spec: dict):
    t = spec.get("type", "KVCache")
    if t == "KVCache":
        c = mcache.KVCache()
    elif t == "RotatingKVCache":
        c = mcache.RotatingKVCache(max_size=int(spec["max_size"]), keep=int(spec.get("keep", 0)))
        if "idx" in spec:
            c._idx = int(spec["idx"])
    else:
        raise ValueError(f"unknown cache type {t!r}")
    if "offset" in spec:
        c.offset = int(spec["offset"])
    return c


def mask_value(server: Server, m: Any) -> dict:
    if m is None:
        return {"kind": "none"}
    if isinstance(m, str):
        return {"kind": m}
    return {"kind": "array", **server.out_array(m, "mask")}


def index_json(index: dict) -> str:
    """Readable, diff-friendly JSON: one tap / one call per line."""
    head = {k: v for k, v in index.items() if k not in ("taps", "calls", "scenarios")}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)},")
    for key in ("scenarios", "calls", "taps"):
        if key not in index:
            continue
        v = index.get(key)
        if v is None:
            lines.append(f"  {json.dumps(key)}: null,")
            continue
        lines.append(f"  {json.dumps(key)}: [")
        lines += [f"    {json.dumps(x, sort_keys=True)}," for x in v]
        if v:
            lines[-1] = lines[-1][:-1]
        lines.append("  ],")
    lines[-1] = lines[-1][:-1]
    lines.append("}")
    return "\n".join(lines) + "\n"


# Python packages whose code computes or prepares what the goldens hold (requirements.txt pins
# them for that reason): the text oracle, the multimodal oracle, its audio reader and image and
# feature processors, and numpy (checkpoint weights, processor arithmetic). Read from the installed
# distributions' metadata (no import); None where a package is not installed.
_GOLDEN_PACKAGES = {"mlx_vlm": "mlx-vlm", "mlx_audio": "mlx-audio", "miniaudio": "miniaudio",
                    "pillow": "pillow", "transformers": "transformers"}


def versions() -> dict:
    from importlib import metadata

    def installed(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    return {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "numpy": np.__version__,
            **{k: installed(d) for k, d in _GOLDEN_PACKAGES.items()}, "python": platform.python_version()}


def fingerprint() -> dict:
    """What decides the goldens' bits besides the package versions (versions()).

    - machine, os, libc: the CPU backend's libmlx and its bundled BLAS are built for the baseline
      ISA of the machine kind, with no runtime dispatch (no cpuid, no IFUNC, no AVX instruction in
      libmlx.so of the mlx-cpu 0.32.4 wheel); what MLX's CPU kernels call from the C library
      (glibc's libm: logf, sinf, powf, ...) comes with the libc. glibc's libm does pick FMA/AVX2
      variants at run time, but forcing its SSE2 variants (GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA)
      gave the same bits on 4,194,304 inputs of 17 MLX ops (log, sin, tan, power, erf, compiled
      kernels, ...), so the CPU model and its ISA extensions are not part of it.
    - os_release on macOS only: Accelerate (BLAS) and libm come with the OS release there. The
      Linux kernel release decides no bits.
    - mlx_backend, device, gpu, metal: which kernels run at all.
    - compiler: MLX's CPU compile() builds its fused kernels with g++ (-O3, no -march), so the
      compiler's version decides the fused kernels' code; compile_enabled: whether fusion runs.
    """
    cxx = shutil.which("g++") or shutil.which("c++")
    compiler = None
    if cxx:
        try:
            compiler = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            compiler = cxx
    system = platform.system()
    return {"os": system, **({"os_release": platform.mac_ver()[0] or platform.release()} if system == "Darwin" else {}),
            "libc": "-".join(platform.libc_ver()), "machine": platform.machine(),
            "mlx_backend": device_env.backend(), "device": device_env.DEVICE,
            "gpu": mx.device_info(mx.gpu).get("device_name") if mx.is_available(mx.gpu) else None,
            "metal": bool(mx.metal.is_available()) if hasattr(mx, "metal") else False,
            "compiler": compiler, "compile_enabled": not bool(os.environ.get("MLX_DISABLE_COMPILE"))}


def reply(obj: dict) -> None:
    _PROTO.write(json.dumps(obj) + "\n")
    _PROTO.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="server.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tmpdir", type=Path, help="where output .npy files go (default: a fresh temp dir, removed at exit)")
    ap.add_argument("--checkpoints", type=Path, default=DEFAULT_CKPT_ROOT, help="checkpoint cache root")
    ap.add_argument("--ops-module", default=os.environ.get("ORACLE_OPS_TABLE"),
                    help="python file providing run_op (default oracle/python/ops_table.py)")
    args = ap.parse_args(argv)
    own_tmp = args.tmpdir is None
    tmpdir = Path(tempfile.mkdtemp(prefix="oracle-")) if own_tmp else args.tmpdir
    tmpdir.mkdir(parents=True, exist_ok=True)
    server = Server(tmpdir, args.checkpoints, args.ops_module)
    reply({"event": "ready", "pid": os.getpid(), "versions": versions(), "tmpdir": str(tmpdir), "repo": str(REPO)})
    try:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            rid = None
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("request must be a JSON object")
                rid = req.get("id")
                cmd = req.get("cmd")
                handler: Callable | None = getattr(server, f"cmd_{cmd}", None) if isinstance(cmd, str) else None
                if handler is None:
                    raise LookupError(f"unknown command {cmd!r}")
                result = handler(req)
                reply({"id": rid, "ok": True, **result})
                if cmd == "shutdown":
                    break
            except Exception as e:  # noqa: BLE001 - every failure goes back to the caller
                reply({"id": rid, "ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                                          "traceback": traceback.format_exc()}})
    finally:
        if own_tmp:
            shutil.rmtree(tmpdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
