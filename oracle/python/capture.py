#!/usr/bin/env python
"""Record every tap of oracle/taps.json while mlx-lm itself runs Gemma 4.

Nothing in mlx-lm is edited: module classes' __call__, a few methods and module-level free
functions are wrapped at run time inside `Recorder` (a context manager) and restored on exit.
Each recorded tensor is evaluated and copied to numpy at once (raw bits; bf16 as uint16), so
later in-place cache updates cannot alter it.

  capture.py CHECKPOINT_DIR SCENARIO_ID [--mode full|logits] [--out FILE.npz]
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import importlib  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models import cache as mcache  # noqa: E402
from mlx_lm.models import gemma4, gemma4_text, switch_layers  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

import taps as tapspec  # noqa: E402
from common import dtype_name, module_path_to_tap, to_numpy  # noqa: E402

# `mlx_lm.generate` the module (the package re-exports a function of the same name)
mlg = importlib.import_module("mlx_lm.generate")


@dataclass
class Tap:
    name: str  # full name, call prefix included
    kind: str  # "array" | "none" | "str"
    dtype: str | None = None
    shape: list[int] | None = None
    data: np.ndarray | None = None  # None when not kept (logits mode) or not an array
    value: str | None = None  # for kind "str" (mask "causal")
    meta: dict = field(default_factory=dict)
    file: dict | None = None  # where `spill` wrote the data (then `data` is dropped)


@dataclass
class Call:
    prefix: str
    kind: str  # "forward" | "prefill" | "step"
    index: int
    batch: int
    length: int
    tokens: list[list[int]]
    cache: bool
    offset_before: int
    taps: dict[str, Tap] = field(default_factory=dict)
    observed: list[str] = field(default_factory=list)  # short names in observation order
    cache_after: list[dict] = field(default_factory=list)


def cache_meta(c: Any) -> dict:
    """Scalars of a cache's state (mlx-lm 0.32.2 has no meta_state) plus buffer shapes."""
    d: dict[str, Any] = {"type": type(c).__name__, "offset": int(c.offset)}
    if isinstance(c, mcache.RotatingKVCache):
        d.update(keep=int(c.keep), max_size=int(c.max_size), idx=int(c._idx))
    if hasattr(c, "meta_state"):
        ms = c.meta_state
        d["meta_state"] = list(ms) if isinstance(ms, (tuple, list)) else ms
    d["keys_shape"] = None if c.keys is None else list(c.keys.shape)
    d["values_shape"] = None if c.values is None else list(c.values.shape)
    return d


LEAF_TYPES: tuple[type, ...] = (
    nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding, nn.RMSNorm,
    gemma4_text.RMSNormNoScale, switch_layers.SwitchLinear, switch_layers.QuantizedSwitchLinear,
)
ROPE_TYPES = ("RoPE", "ProportionalRoPE")
NOT_HANDLED = object()


def _layer_of(name: str) -> str:
    m = re.match(r"(layers\.\d+)", name)
    if not m:
        raise RuntimeError(f"tap {name!r} is not inside a layer")
    return m.group(1)


class Recorder:
    """Context manager: wrap mlx-lm at run time, record taps per model call, restore on exit.

    keep(call, short_name) decides which tensors are copied out; names are always tracked and
    checked against the taps.json expansion for the call.
    """

    def __init__(self, model: nn.Module, schedule: list[tuple[str, str, int]] | None = None,
                 keep: Callable[[Call, str], bool] = lambda c, n: True,
                 spill: Callable[[np.ndarray, str], dict] | None = None):
        self.model = model
        # spill(data, dtype) writes a kept tensor out at once (bounded memory for real-size
        # checkpoints); its return value is kept as Tap.file.
        self.spill = spill
        self.args = model.language_model.args if isinstance(model, gemma4.Model) else model.args
        self.schedule = schedule or [("", "forward", 0)]
        self.keep = keep
        self.calls: list[Call] = []
        self.paths = {id(m): p for p, m in model.named_modules()}
        self._saved: list[tuple[Any, str, Any]] = []
        self._stack: list[tuple[int, str]] = []
        self._attn: list[dict] = []
        self._ids: dict[int, tuple[str, Any]] = {}  # id(array) -> (short name, array ref)
        self._quiet = 0  # >0 while inside a compiled function's Python body or GeGLU

    # ---------------------------------------------------------------- patching
    def _patch(self, owner: Any, attr: str, new: Any) -> None:
        self._saved.append((owner, attr, owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)))
        setattr(owner, attr, new)

    def _patch_module_classes(self) -> None:
        """Wraps __call__ of every nn.Module class (and base class) in the model."""
        classes: list[type] = []
        for _, m in self.model.named_modules():
            for cls in type(m).__mro__:
                if cls in (nn.Module, object) or not issubclass(cls, nn.Module):
                    continue
                if "__call__" in cls.__dict__ and cls not in classes:
                    classes.append(cls)
        for cls in classes:
            self._patch(cls, "__call__", self._module_wrapper(cls.__dict__["__call__"]))

    def __enter__(self) -> "Recorder":
        self._patch_module_classes()
        self._patch(gemma4_text, "create_attention_mask", self._wrap_mask(gemma4_text.create_attention_mask))
        self._patch(gemma4_text, "scaled_dot_product_attention", self._wrap_sdpa(gemma4_text.scaled_dot_product_attention))
        self._patch(gemma4_text, "geglu", self._wrap_geglu(gemma4_text.geglu))
        self._patch(nn, "gelu_approx", self._wrap_gelu(nn.gelu_approx))
        self._patch(switch_layers, "_gather_sort", self._wrap_gather_sort(switch_layers._gather_sort))
        self._patch(switch_layers, "_scatter_unsort", self._wrap_unsort(switch_layers._scatter_unsort))
        for cls in (mcache.KVCache, mcache.RotatingKVCache):
            self._patch(cls, "update_and_fetch", self._wrap_cache(cls.__dict__["update_and_fetch"]))
        tm = gemma4_text.Gemma4TextModel
        self._patch(tm, "_get_per_layer_inputs", self._wrap_method(tm.__dict__["_get_per_layer_inputs"], "per_layer_token_inputs"))
        self._patch(tm, "_project_per_layer_inputs", self._wrap_method(tm.__dict__["_project_per_layer_inputs"], "per_layer_inputs"))
        for cls in (nn.Embedding, nn.QuantizedEmbedding):
            self._patch(cls, "as_linear", self._wrap_method(cls.__dict__["as_linear"], "lm_head"))
        self._patch(mlg, "greedy_sampler", self._wrap_sampler(mlg.greedy_sampler))
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._saved:
            owner, attr, orig = self._saved.pop()
            setattr(owner, attr, orig)
        self._ids.clear()

    # ---------------------------------------------------------------- recording
    @property
    def call(self) -> Call:
        if not self.calls:
            raise RuntimeError("tap recorded outside a model call")
        return self.calls[-1]

    def record(self, short: str, value: Any, meta: dict | None = None) -> None:
        call = self.call
        full = call.prefix + short
        if short in call.taps:
            raise RuntimeError(f"tap {full!r} recorded twice")
        call.observed.append(short)
        if value is None:
            tap = Tap(full, "none", meta=meta or {})
        elif isinstance(value, str):
            tap = Tap(full, "str", value=value, meta=meta or {})
        else:
            tap = Tap(full, "array", dtype=None, shape=list(value.shape), meta=meta or {})
            if self.keep(call, short):
                tap.data, tap.dtype = to_numpy(value)
                if self.spill is not None:
                    tap.file = self.spill(tap.data, tap.dtype)
                    tap.data = None
            else:
                tap.dtype = dtype_name(value.dtype)
            self._ids[id(value)] = (short, value)
        call.taps[short] = tap

    def ref(self, value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return None
        hit = self._ids.get(id(value))
        return hit[0] if hit is not None and hit[1] is value else None

    def current(self) -> str:
        return self._stack[-1][1] if self._stack else ""

    # ---------------------------------------------------------------- call groups
    def begin_call(self, inputs: mx.array, cache: Any) -> None:
        n = len(self.calls)
        if n >= len(self.schedule):
            raise RuntimeError(f"model called {n + 1} times, schedule has {len(self.schedule)} calls")
        prefix, kind, index = self.schedule[n]
        c0 = cache[0] if cache else None
        self.calls.append(Call(prefix=prefix, kind=kind, index=index, batch=int(inputs.shape[0]),
                               length=int(inputs.shape[1]), tokens=np.array(inputs).tolist(),
                               cache=cache is not None, offset_before=int(c0.offset) if c0 is not None else 0))
        self._ids.clear()

    def end_call(self, cache: Any) -> None:
        if cache is not None:
            self.call.cache_after = [dict(layer=i, **cache_meta(c)) for i, c in enumerate(cache)]

    def verify(self) -> None:
        """Every call recorded exactly the taps.json expansion, outputs in template order."""
        for call in self.calls:
            self.check_call(call, tapspec.expand(self.args, batch=call.batch, length=call.length, cache=call.cache,
                                                 step=call.kind == "step"))

    @staticmethod
    def check_call(call: Call, want: list[str], unordered: Callable[[str], bool] = lambda n: False) -> None:
        """The call recorded exactly `want`; every tap observed where it is made (and not
        `unordered`) came in `want`'s order. The call's taps are put in that order."""
        inputs = tapspec.observed_as_input()
        got = set(call.taps)
        missing = [n for n in want if n not in got]
        extra = sorted(got - set(want))
        if missing or extra:
            raise RuntimeError(f"call {call.prefix or 'forward'}: taps missing {missing[:8]}, unexpected {extra[:8]}")
        pos = {n: i for i, n in enumerate(want)}
        last = -1
        for n in call.observed:
            if re.sub(r"layers\.\d+", "layers.{i}", re.sub(r"^mask/.*", "mask/{type}", n)) in inputs or unordered(n):
                continue
            if pos[n] < last:
                raise RuntimeError(f"call {call.prefix or 'forward'}: tap {n!r} observed out of template order")
            last = pos[n]
        call.taps = {n: call.taps[n] for n in want}

    # ---------------------------------------------------------------- wrappers
    def _module_wrapper(self, orig: Callable) -> Callable:
        rec = self

        def wrapper(mod, *args, **kwargs):
            path = rec.paths.get(id(mod))
            if path is None or rec._quiet or (rec._stack and rec._stack[-1][0] == id(mod)):
                return orig(mod, *args, **kwargs)
            return rec._on_module(mod, module_path_to_tap(path), orig, args, kwargs)

        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        return wrapper

    def _on_module(self, mod, name: str, orig: Callable, args: tuple, kwargs: dict):
        if isinstance(mod, gemma4.Model):
            return orig(mod, *args, **kwargs)
        if isinstance(mod, gemma4_text.Model):
            inputs = args[0] if args else kwargs.get("inputs")
            cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
            self.begin_call(inputs, cache)
            self._stack.append((id(mod), ""))
            try:
                self.record("inputs", inputs)
                out = orig(mod, *args, **kwargs)
                self.record("logits", out)
            finally:
                self._stack.pop()
            self.end_call(cache)
            return out
        x = args[0] if args else None
        self._stack.append((id(mod), name))
        try:
            out = self._on_layer_module(mod, name, orig, args, kwargs, x)
            if out is not NOT_HANDLED:
                return out
            if isinstance(mod, LEAF_TYPES):
                self._input_taps(name, x)
                out = orig(mod, *args, **kwargs)
                self.record(name, out)
                return out
            return orig(mod, *args, **kwargs)  # MLP, Gemma4TextModel: covered by their children
        finally:
            self._stack.pop()

    # The language model's classes (capture_mm.py swaps in mlx-vlm's, which have the same taps).
    LM = SimpleNamespace(DecoderLayer=gemma4_text.DecoderLayer, Attention=gemma4_text.Attention, Router=gemma4_text.Router,
                         GeGLU=gemma4_text.GeGLU, SwitchGLU=switch_layers.SwitchGLU, Experts=gemma4_text.Experts)

    def _switch_glu_quiet(self, x: Any) -> bool:
        """Whether SwitchGLU runs without its inner taps (mlx-vlm's token-by-token path)."""
        return False

    def _on_layer_module(self, mod, name: str, orig: Callable, args: tuple, kwargs: dict, x: Any):
        """The taps of the decoder layers' modules; NOT_HANDLED for any other module."""
        lm = self.LM
        if isinstance(mod, lm.DecoderLayer):
            if name == "layers.0" and "inputs_embeds" not in self.call.taps:
                self.record("embed_scaled", x)
            pli = kwargs.get("per_layer_input")
            if pli is not None:
                self.record(f"{name}/per_layer_input", pli)
            out = orig(mod, *args, **kwargs)
            self.record(f"{name}/output", out[0])
            return out
        if isinstance(mod, lm.Attention):
            self._attn.append({"own_kv": kwargs.get("shared_kv") is None, "ropes": 0, "name": name})
            try:
                return orig(mod, *args, **kwargs)
            finally:
                self._attn.pop()
        if type(mod).__name__ in ROPE_TYPES:
            return self._on_rope(mod, name, orig, args, kwargs)
        if isinstance(mod, lm.Router):
            out = orig(mod, *args, **kwargs)
            self.record(f"{name}/indices", out[0])
            self.record(f"{name}/weights", out[1])
            return out
        if isinstance(mod, lm.GeGLU) or (isinstance(mod, lm.SwitchGLU) and self._switch_glu_quiet(x)):
            self._quiet += 1
            try:
                out = orig(mod, *args, **kwargs)
            finally:
                self._quiet -= 1
            self.record(name, out)
            return out
        if isinstance(mod, (lm.SwitchGLU, lm.Experts)):
            out = orig(mod, *args, **kwargs)
            self.record(name, out)
            return out
        return NOT_HANDLED

    def _input_taps(self, name: str, x: Any) -> None:
        leaf = name.rsplit("/", 1)[-1]
        if name == "per_layer_projection_norm":
            self.record("per_layer_projection_scaled", x)
        elif not name.startswith("layers."):
            return
        elif leaf == "pre_feedforward_layernorm":
            self.record(f"{_layer_of(name)}/attn_residual", x)
        elif leaf == "post_feedforward_layernorm" and self.args.enable_moe_block:
            self.record(f"{_layer_of(name)}/ffw_sum", x)
        elif leaf == "per_layer_input_gate":
            self.record(f"{_layer_of(name)}/ffw_residual", x)
        elif leaf == "per_layer_projection":
            self.record(f"{_layer_of(name)}/per_layer_gated", x)
        elif name.endswith("router/proj"):
            self.record(f"{_layer_of(name)}/router/norm", x)

    def _on_rope(self, mod, name: str, orig: Callable, args: tuple, kwargs: dict):
        att = self._attn[-1]
        which = "rope_k" if att["own_kv"] and att["ropes"] == 0 else "rope_q"
        att["ropes"] += 1
        base = att["name"]
        if which == "rope_k" or not att["own_kv"]:
            off = kwargs.get("offset", args[1] if len(args) > 1 else 0)
            if isinstance(off, mx.array):
                self.record(f"{base}/offset", off, {"python_int": False})
            else:
                self.record(f"{base}/offset", mx.array(off, dtype=mx.int32), {"python_int": True})
        out = orig(mod, *args, **kwargs)
        self.record(f"{base}/{which}", out, {"rope": type(mod).__name__})
        return out

    def _wrap_mask(self, orig: Callable) -> Callable:
        def wrapper(h, cache=None, window_size=None, return_array=False):
            out = orig(h, cache, window_size=window_size, return_array=return_array)
            kind = "none" if out is None else ("causal" if isinstance(out, str) else "array")
            name = "mask/sliding_attention" if window_size else "mask/full_attention"
            self.record(name, out, {"mask": kind, "window_size": window_size})
            return out
        return wrapper

    def _wrap_sdpa(self, orig: Callable) -> Callable:
        def wrapper(queries, keys, values, cache, scale, mask, sinks=None):
            out = orig(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
            kind = "none" if mask is None else ("causal" if isinstance(mask, str) else "array")
            meta = {"q": self.ref(queries), "k": self.ref(keys), "v": self.ref(values), "mask": kind,
                    "mask_tap": self.ref(mask) if kind == "array" else None, "scale": scale}
            self.record(f"{self._attn[-1]['name']}/sdpa", out, meta)
            return out
        return wrapper

    def _wrap_geglu(self, orig: Callable) -> Callable:
        def wrapper(gate, x):
            self._quiet += 1
            try:
                out = orig(gate, x)
            finally:
                self._quiet -= 1
            if not self._quiet:
                self.record(f"{self.current()}/geglu", out)
            return out
        return wrapper

    def _wrap_gelu(self, orig: Callable) -> Callable:
        def wrapper(x):
            if self._quiet or not self.calls:
                return orig(x)
            out = orig(x)
            self.record(f"{_layer_of(self.current())}/per_layer_gelu", out)
            return out
        return wrapper

    def _wrap_gather_sort(self, orig: Callable) -> Callable:
        def wrapper(x, indices):
            out = orig(x, indices)
            base = self.current()
            for n, v in zip(("sort_x", "sort_indices", "sort_inv_order"), out):
                self.record(f"{base}/{n}", v)
            return out
        return wrapper

    def _wrap_unsort(self, orig: Callable) -> Callable:
        def wrapper(x, inv_order, shape=None):
            out = orig(x, inv_order, shape)
            self.record(f"{self.current()}/unsort", out)
            return out
        return wrapper

    def _wrap_cache(self, orig: Callable) -> Callable:
        def wrapper(cache, keys, values):
            k, v = orig(cache, keys, values)
            base = self._attn[-1]["name"]
            meta = cache_meta(cache)
            self.record(f"{base}/cache_keys", k, meta)
            self.record(f"{base}/cache_values", v)
            return k, v
        return wrapper

    def _wrap_method(self, orig: Callable, short: str) -> Callable:
        def wrapper(obj, *args, **kwargs):
            out = orig(obj, *args, **kwargs)
            if self.calls:
                self.record(short, out)
            return out
        return wrapper

    def _wrap_sampler(self, orig: Callable) -> Callable:
        def wrapper(logprobs):
            y = orig(logprobs)
            self.record("logprobs", logprobs)
            self.record("token", y)
            return y
        return wrapper


# -------------------------------------------------------------------- running

def prefill_schedule(n_prompt: int, step: int) -> list[int]:
    """Chunk sizes generate_step prefills (all prompt tokens but the last)."""
    sizes, done = [], 0
    while n_prompt - done > 1:
        n = min(step, n_prompt - done - 1)
        sizes.append(n)
        done += n
    return sizes


def call_schedule(scn: dict) -> list[tuple[str, str, int]]:
    if scn["kind"] == "forward":
        return [("", "forward", 0)]
    chunks = prefill_schedule(len(scn["prompt"]), scn["prefill_step_size"])
    sched = [(f"prefill{k}/", "prefill", k) for k in range(len(chunks))]
    sched += [(f"step{n}/", "step", n) for n in range(scn["max_tokens"] + 1)]
    return sched


def run_forward(model: nn.Module, tokens: list[list[int]]) -> mx.array:
    out = model(mx.array(tokens, dtype=mx.int32))
    mx.eval(out)
    return out


def run_generate(model: nn.Module, prompt: list[int], prefill_step_size: int, max_tokens: int) -> list[int]:
    """mlx_lm.generate.generate_step exactly as a caller would use it (greedy, default cache)."""
    cache = make_prompt_cache(model)
    gen = mlg.generate_step(mx.array(prompt, dtype=mx.int32), model, max_tokens=max_tokens,
                            prefill_step_size=prefill_step_size, prompt_cache=cache)
    return [int(t) for t, _ in gen]


def logits_only(call: Call, short: str) -> bool:
    if call.kind == "forward":
        return short == "logits"
    return call.kind == "step" and short == "logits"


def capture(model: nn.Module, scn: dict, mode: str = "full",
            spill: Callable[[np.ndarray, str], dict] | None = None,
            only: list[str] | None = None) -> tuple[list[Call], dict]:
    """Run one scenario under the Recorder; returns the verified calls and scenario meta.
    only: full tap names or fnmatch globs; the data of any other tap is not copied out (every
    name is still recorded and verified), so a streamed capture writes only what is asked."""
    keep = (lambda c, n: True) if mode == "full" else logits_only
    if only is not None:
        exact = {g for g in only if not any(ch in g for ch in "*?[")}
        globs = [g for g in only if g not in exact]
        base = keep
        keep = lambda c, n: base(c, n) and (c.prefix + n in exact or any(fnmatch.fnmatchcase(c.prefix + n, g) for g in globs))  # noqa: E731
    rec = Recorder(model, call_schedule(scn), keep, spill)
    meta: dict[str, Any] = {"scenario": scn["id"], "kind": scn["kind"], "mode": mode}
    with rec:
        if scn["kind"] == "forward":
            run_forward(model, scn["tokens"])
        else:
            meta["generated"] = run_generate(model, scn["prompt"], scn["prefill_step_size"], scn["max_tokens"])
            meta["prefill_chunks"] = prefill_schedule(len(scn["prompt"]), scn["prefill_step_size"])
    if len(rec.calls) != len(rec.schedule):
        raise RuntimeError(f"expected {len(rec.schedule)} model calls, saw {len(rec.calls)}")
    rec.verify()
    return rec.calls, meta


def load(path: str | Path) -> nn.Module:
    model, _ = load_model(Path(path))
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="capture.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="checkpoint dir (config.json + model*.safetensors)")
    ap.add_argument("scenario", help="scenario id from fixtures/scenarios.json")
    ap.add_argument("--mode", choices=("full", "logits"), default="full")
    ap.add_argument("--out", type=Path, help="write the taps to this .npz (golden format)")
    args = ap.parse_args(argv)
    from common import scenario
    from golden_io import write_npz

    scn = scenario(args.scenario)
    calls, meta = capture(load(args.checkpoint), scn, args.mode)
    n = sum(len(c.taps) for c in calls)
    kept = sum(1 for c in calls for t in c.taps.values() if t.data is not None)
    print(f"{len(calls)} calls, {n} taps ({kept} stored)")
    if "generated" in meta:
        print("generated:", meta["generated"])
    for c in calls[:1]:
        for t in c.taps.values():
            print(f"  {t.name:55s} {t.kind:6s} {t.dtype or t.value or '':9s} {t.shape}")
    if args.out:
        write_npz(args.out, [("", calls)])
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
