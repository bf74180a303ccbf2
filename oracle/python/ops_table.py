"""Every @mlx-bun/mlx binding op name -> its mlx.core call, for the op-level parity suite.

`run_op(name, inputs, params)` runs one op exactly as Python code would call it:
- `name` is the mlx.core name (snake_case; `fast.*` and `random.*` for the submodules),
  the same name the TS case table (suites/ops/cases.ts) sends;
- `inputs` are mx.array or Python scalars (int / float / bool), in the op's argument order;
  Python scalars reach mlx.core as Python scalars, so the weak-scalar rule applies exactly as
  in user code (`mx.add(x, 2.5)`, `mx.subtract(2, x)`);
- `params` are the keyword arguments. Reserved keys consumed here:
  - `_views`: one entry per input (null or a view) applied before the op, to feed the op
    non-contiguous inputs: {"transpose": axes} or {"slice": {"start", "stop", "strides"}};
  - ops with optional array arguments say which inputs are present through their own params
    (documented per op below);
  - `_vjp`: {"inputs": k, "diff": [indices]} turns the call into mx.vjp of the op: the first k
    inputs are the op's, the rest its cotangents (one per output); the inputs at `diff` are the
    primals (the others stay constants). Returns the op's outputs, then one vjp per primal.
Returns a list of mx.array (single-output ops give a one-element list). Nothing is evaluated
here; the caller evaluates and serialises.
"""

from __future__ import annotations

import copy as _copy
from typing import Any, Callable

import mlx.core as mx

Input = Any  # mx.array | int | float | bool

UNARY = [
    "abs", "negative", "sign", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
    "square", "reciprocal", "sin", "cos", "tan", "tanh", "sinh", "cosh", "arcsin", "arccos",
    "arctan", "erf", "erfinv", "sigmoid", "floor", "ceil", "logical_not", "isnan", "isinf",
    "isfinite", "stop_gradient", "bitwise_invert", "copy", "zeros_like", "ones_like", "arcsinh",
    "arccosh", "arctanh", "degrees", "radians", "isposinf", "isneginf",
]

BINARY = [
    "add", "subtract", "multiply", "divide", "power", "floor_divide", "remainder", "maximum",
    "minimum", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "logical_and", "logical_or", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift",
    "right_shift", "logaddexp", "arctan2", "matmul", "logical_xor", "outer", "inner", "kron",
]

REDUCE = ["sum", "mean", "max", "min", "prod", "all", "any", "logsumexp", "var", "std"]


def _dt(name: str | None):
    if name is None:
        return None
    return getattr(mx, "bool_" if name == "bool" else name)


def _apply_view(x: Input, view: dict | None) -> Input:
    if view is None:
        return x
    if "transpose" in view:
        axes = view["transpose"]
        return mx.transpose(x) if axes is None else mx.transpose(x, axes)
    if "slice" in view:
        s = view["slice"]
        idx = tuple(slice(a, b, c) for a, b, c in zip(s["start"], s["stop"], s["strides"]))
        return x[idx]
    raise ValueError(f"unknown view {view!r}")


def _opt(inputs: list, i: int, present: bool):
    """The i-th input if present, else None; returns (value, next index)."""
    if present:
        return inputs[i], i + 1
    return None, i


def _static_slice(a, start, stop, strides):
    return a[tuple(slice(b, e, s) for b, e, s in zip(start, stop, strides))]


def _slice_update(src, upd, start, stop, strides):
    out = mx.array(src)  # a new array node sharing src; __setitem__ rebinds it, not src
    out[tuple(slice(b, e, s) for b, e, s in zip(start, stop, strides))] = upd
    return out


def _reduce(name: str) -> Callable:
    def f(a, axis=None, keepdims=False, ddof=0):
        fn = getattr(mx, name)
        if name in ("var", "std"):
            return fn(a, axis=axis, keepdims=keepdims, ddof=ddof)
        return fn(a, axis=axis, keepdims=keepdims)

    return f


def _rope(inputs, dims, traditional, base, scale, offset=None, has_freqs=False):
    x = inputs[0]
    i = 1
    off = offset
    if offset is None:  # array offset is the next input
        off, i = inputs[1], 2
    freqs = inputs[i] if has_freqs else None
    return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale, offset=off, freqs=freqs)


def _sdpa(inputs, scale, mask=None, has_sinks=False):
    q, k, v = inputs[:3]
    i = 3
    m = None
    if mask == "causal":
        m = "causal"
    elif mask == "array":
        m, i = inputs[3], 4
    sinks = inputs[i] if has_sinks else None
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=m, sinks=sinks)


def _gather_mm(inputs, lhs=False, rhs=False, sorted_indices=False):
    a, b = inputs[:2]
    i = 2
    li, i = _opt(inputs, i, lhs)
    ri, i = _opt(inputs, i, rhs)
    return mx.gather_mm(a, b, lhs_indices=li, rhs_indices=ri, sorted_indices=sorted_indices)


def _quant_kw(p: dict) -> dict:
    kw = {"mode": p.get("mode", "affine")}
    if p.get("group_size") is not None:
        kw["group_size"] = p["group_size"]
    if p.get("bits") is not None:
        kw["bits"] = p["bits"]
    return kw


def _gather_qmm(inputs, has_biases=True, lhs=False, rhs=False, transpose=True, sorted_indices=False,
                has_global_scale=False, **q):
    x, w, scales = inputs[:3]
    i = 3
    biases, i = _opt(inputs, i, has_biases)
    li, i = _opt(inputs, i, lhs)
    ri, i = _opt(inputs, i, rhs)
    gs, i = _opt(inputs, i, has_global_scale)
    kw = _quant_kw(q)
    if gs is not None:
        kw["global_scale"] = gs
    return mx.gather_qmm(x, w, scales, biases, lhs_indices=li, rhs_indices=ri, transpose=transpose,
                         sorted_indices=sorted_indices, **kw)


def _quantized_matmul(inputs, has_biases=True, transpose=True, **q):
    x, w, scales = inputs[:3]
    biases = inputs[3] if has_biases else None
    return mx.quantized_matmul(x, w, scales, biases, transpose=transpose, **_quant_kw(q))


def _dequantize(inputs, has_biases=True, dtype=None, has_global_scale=False, **q):
    w, scales = inputs[:2]
    biases = inputs[2] if has_biases else None
    kw = _quant_kw(q)
    if has_global_scale:
        kw["global_scale"] = inputs[3 if has_biases else 2]
    if dtype is not None:
        kw["dtype"] = _dt(dtype)
    return mx.dequantize(w, scales, biases, **kw)


def _key_or_none(inputs, i):
    return inputs[i] if len(inputs) > i else None


def _seeded_uniform(seed, shape):
    mx.random.seed(seed)
    a = mx.random.uniform(shape=shape)
    b = mx.random.normal(shape=shape)
    return [a, b]


# name -> handler(inputs: list, **params) -> mx.array | list[mx.array]
OPS: dict[str, Callable[..., Any]] = {}

for _n in UNARY:
    OPS[_n] = (lambda n: lambda inputs: getattr(mx, n)(inputs[0]))(_n)
# mlx.core has no `copy` function: Python's copy.copy(a) (array.__copy__) is the Copy primitive.
OPS["copy"] = lambda inputs: _copy.copy(inputs[0])
# binding-only: a second handle to the same array (no graph node); Python's equivalent is the array itself
OPS["alias"] = lambda inputs: inputs[0]
for _n in BINARY:
    OPS[_n] = (lambda n: lambda inputs: getattr(mx, n)(inputs[0], inputs[1]))(_n)
for _n in REDUCE:
    OPS[_n] = (lambda n: lambda inputs, **p: _reduce(n)(inputs[0], **p))(_n)

OPS.update({
    # elementwise with options
    "where": lambda inputs: mx.where(inputs[0], inputs[1], inputs[2]),
    # clip: params lo/hi in {"none", "input"}; present bounds are the next inputs in order
    "clip": lambda inputs, lo="input", hi="input": mx.clip(
        inputs[0],
        inputs[1] if lo == "input" else None,
        (inputs[2] if lo == "input" else inputs[1]) if hi == "input" else None,
    ),
    "round": lambda inputs, decimals=0: mx.round(inputs[0], decimals),
    # creation
    "arange": lambda inputs, start, stop, step, dtype=None: mx.arange(start, stop, step, dtype=_dt(dtype)),
    "linspace": lambda inputs, start, stop, num, dtype="float32": mx.linspace(start, stop, num, dtype=_dt(dtype)),
    "eye": lambda inputs, n, m, k, dtype="float32": mx.eye(n, m, k, dtype=_dt(dtype)),
    "zeros": lambda inputs, shape, dtype="float32": mx.zeros(shape, dtype=_dt(dtype)),
    "ones": lambda inputs, shape, dtype="float32": mx.ones(shape, dtype=_dt(dtype)),
    "full": lambda inputs, shape, dtype=None: mx.full(shape, inputs[0], dtype=_dt(dtype)),
    "array": lambda inputs, dtype=None: mx.array(inputs[0], dtype=_dt(dtype)),
    "astype": lambda inputs, dtype: inputs[0].astype(_dt(dtype)),
    "view": lambda inputs, dtype: inputs[0].view(_dt(dtype)),
    "tri": lambda inputs, n, m, k, dtype="float32": mx.tri(n, m, k, dtype=_dt(dtype)),
    "tril": lambda inputs, k=0: mx.tril(inputs[0], k),
    "triu": lambda inputs, k=0: mx.triu(inputs[0], k),
    # reductions and friends
    "argmax": lambda inputs, axis=None, keepdims=False: mx.argmax(inputs[0], axis=axis, keepdims=keepdims),
    "argmin": lambda inputs, axis=None, keepdims=False: mx.argmin(inputs[0], axis=axis, keepdims=keepdims),
    "softmax": lambda inputs, axis=None, precise=False: mx.softmax(inputs[0], axis=axis, precise=precise),
    "cumsum": lambda inputs, axis, reverse=False, inclusive=True: mx.cumsum(inputs[0], axis=axis, reverse=reverse, inclusive=inclusive),
    "cumprod": lambda inputs, axis, reverse=False, inclusive=True: mx.cumprod(inputs[0], axis=axis, reverse=reverse, inclusive=inclusive),
    "cummax": lambda inputs, axis, reverse=False, inclusive=True: mx.cummax(inputs[0], axis=axis, reverse=reverse, inclusive=inclusive),
    "cummin": lambda inputs, axis, reverse=False, inclusive=True: mx.cummin(inputs[0], axis=axis, reverse=reverse, inclusive=inclusive),
    "logcumsumexp": lambda inputs, axis, reverse=False, inclusive=True: mx.logcumsumexp(inputs[0], axis=axis, reverse=reverse, inclusive=inclusive),
    "sort": lambda inputs, axis=-1: mx.sort(inputs[0], axis=axis),
    "argsort": lambda inputs, axis=-1: mx.argsort(inputs[0], axis=axis),
    "partition": lambda inputs, kth, axis=-1: mx.partition(inputs[0], kth, axis=axis),
    "argpartition": lambda inputs, kth, axis=-1: mx.argpartition(inputs[0], kth, axis=axis),
    "topk": lambda inputs, k, axis=-1: mx.topk(inputs[0], k, axis=axis),
    # shapes and indexing
    "reshape": lambda inputs, shape: mx.reshape(inputs[0], shape),
    "flatten": lambda inputs, start_axis=0, end_axis=-1: mx.flatten(inputs[0], start_axis, end_axis),
    "unflatten": lambda inputs, axis, shape: mx.unflatten(inputs[0], axis, shape),
    "transpose": lambda inputs, axes=None: mx.transpose(inputs[0]) if axes is None else mx.transpose(inputs[0], axes),
    "swapaxes": lambda inputs, axis1, axis2: mx.swapaxes(inputs[0], axis1, axis2),
    "moveaxis": lambda inputs, source, destination: mx.moveaxis(inputs[0], source, destination),
    "expand_dims": lambda inputs, axis: mx.expand_dims(inputs[0], axis),
    "squeeze": lambda inputs, axis=None: mx.squeeze(inputs[0], axis),
    "broadcast_to": lambda inputs, shape: mx.broadcast_to(inputs[0], shape),
    "concatenate": lambda inputs, axis=0: mx.concatenate(inputs, axis=axis),
    "stack": lambda inputs, axis=0: mx.stack(inputs, axis=axis),
    "split": lambda inputs, indices_or_sections, axis=0: mx.split(inputs[0], indices_or_sections, axis=axis),
    "slice": lambda inputs, start, stop, strides: _static_slice(inputs[0], start, stop, strides),
    # dynamic: mx.slice(a, start_indices: array, axes, slice_size)
    "slice_dynamic": lambda inputs, axes, slice_size: mx.slice(inputs[0], inputs[1], axes, slice_size),
    "slice_update": lambda inputs, start, stop, strides: _slice_update(inputs[0], inputs[1], start, stop, strides),
    "slice_update_dynamic": lambda inputs, axes: mx.slice_update(inputs[0], inputs[1], inputs[2], axes),
    "take": lambda inputs, axis=None: mx.take(inputs[0], inputs[1], axis=axis),
    "take_along_axis": lambda inputs, axis: mx.take_along_axis(inputs[0], inputs[1], axis=axis),
    "put_along_axis": lambda inputs, axis: mx.put_along_axis(inputs[0], inputs[1], inputs[2], axis=axis),
    "roll": lambda inputs, shift, axis=None: mx.roll(inputs[0], shift, axis=axis),
    "contiguous": lambda inputs, allow_col_major=False: mx.contiguous(inputs[0], allow_col_major),
    "repeat": lambda inputs, repeats, axis=None: mx.repeat(inputs[0], repeats, axis=axis),
    "tile": lambda inputs, reps: mx.tile(inputs[0], reps),
    "pad": lambda inputs, pad_width: mx.pad(inputs[0], [tuple(w) for w in pad_width], constant_values=inputs[1]),
    # matmul and quantization
    # params: n_inputs (the rest of the inputs are dependencies)
    "depends": lambda inputs, n_inputs: mx.depends(inputs[:n_inputs], inputs[n_inputs:]),
    "addmm": lambda inputs, alpha=1.0, beta=1.0: mx.addmm(inputs[0], inputs[1], inputs[2], alpha=alpha, beta=beta),
    # params: has_global_scale (then inputs[1] is the global scale)
    "quantize": lambda inputs, has_global_scale=False, **q: list(
        mx.quantize(inputs[0], **_quant_kw(q), **({"global_scale": inputs[1]} if has_global_scale else {}))
    ),
    "dequantize": _dequantize,
    "quantized_matmul": _quantized_matmul,
    "gather_mm": _gather_mm,
    "gather_qmm": _gather_qmm,
    # fast
    "fast.rms_norm": lambda inputs, eps, has_weight=True: mx.fast.rms_norm(inputs[0], inputs[1] if has_weight else None, eps),
    "fast.layer_norm": lambda inputs, eps, has_weight=True, has_bias=True: mx.fast.layer_norm(
        inputs[0],
        inputs[1] if has_weight else None,
        (inputs[2] if has_weight else inputs[1]) if has_bias else None,
        eps,
    ),
    "fast.rope": _rope,
    "fast.scaled_dot_product_attention": _sdpa,
    # random (explicit keys, except random.seed which drives the global sequence)
    "random.key": lambda inputs, seed: mx.random.key(seed),
    "random.seed": lambda inputs, seed, shape: _seeded_uniform(seed, shape),
    "random.split": lambda inputs, num=2: mx.random.split(inputs[0], num),
    "random.uniform": lambda inputs, shape, dtype="float32", low=0.0, high=1.0: mx.random.uniform(
        low, high, shape, dtype=_dt(dtype), key=inputs[0]
    ),
    "random.normal": lambda inputs, shape, dtype="float32", loc=0.0, scale=1.0: mx.random.normal(
        shape, dtype=_dt(dtype), loc=loc, scale=scale, key=inputs[0]
    ),
    "random.categorical": lambda inputs, axis=-1, shape=None, num_samples=None: mx.random.categorical(
        inputs[0], axis=axis, shape=shape, num_samples=num_samples, key=inputs[1]
    ),
    "random.bits": lambda inputs, shape, width=4: mx.random.bits(shape, width, key=inputs[0]),
    # tuner: nn.Dropout's mask (p a Python float, or an array with the key last), GPU cross-entropy
    "random.bernoulli": lambda inputs, p=None, shape=None: (
        mx.random.bernoulli(p, shape, key=inputs[0]) if p is not None else mx.random.bernoulli(inputs[0], key=inputs[1])
    ),
    "fast.cross_entropy": lambda inputs: mx.fast.cross_entropy(inputs[0], inputs[1]),
})


def _run_vjp(fn: Callable, inputs: list, params: dict, k: int, diff: list[int]) -> list[mx.array]:
    """mx.vjp of op `fn` w.r.t. inputs[i] for i in diff; inputs[k:] are the cotangents."""
    args, cotangents = inputs[:k], inputs[k:]

    def f(*primals):
        full = list(args)
        for i, p in zip(diff, primals):
            full[i] = p
        out = fn(full, **params)
        return list(out) if isinstance(out, (list, tuple)) else out

    outs, vjps = mx.vjp(f, [args[i] for i in diff], cotangents)
    return list(outs) + list(vjps)


def op_names() -> list[str]:
    return sorted(OPS)


def run_op(name: str, inputs: list, params: dict) -> list[mx.array]:
    """Runs binding op `name` through mlx.core; see the module docstring."""
    fn = OPS.get(name)
    if fn is None:
        raise KeyError(f"unknown op {name!r}")
    params = dict(params or {})
    views = params.pop("_views", None)
    vjp = params.pop("_vjp", None)
    if views is not None:
        if len(views) != len(inputs):
            raise ValueError(f"_views has {len(views)} entries for {len(inputs)} inputs")
        inputs = [_apply_view(x, v) for x, v in zip(inputs, views)]
    if vjp is not None:
        return _run_vjp(fn, list(inputs), params, vjp["inputs"], vjp["diff"])
    out = fn(list(inputs), **params)
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]
