"""Regenerates the pinned Python results of tests/mlx/weak_scalars.test.ts.

Run from anywhere except the repo root:  ../../.venv/bin/python weak_scalars_gen.py
Prints the JSON table the test embeds (PINNED). Each case: an array of VALUES in `dtype`,
combined with a Python scalar exactly as user code writes it.
"""

import json

import mlx.core as mx

VALUES = [-2.5, -1.0, -0.1, 0.0, 0.3, 1.0, 1.7, 3.14159, 100.5, 1e-3]
V_INT = [-7, -1, 0, 1, 2, 3, 5, 11, 100, 1000]
TINY = 1.0 + 2.0**-8 + 2.0**-30  # double->bf16 directly rounds up, via float32 rounds to 1.0

CASES = [
    # (id, dtype, expression over x)
    ("add_float", "x + 0.1"),
    ("radd_float", "0.1 + x"),
    ("mul_float", "x * 2.5"),
    ("rmul_half", "0.5 * x"),
    ("rsub_int", "2 - x"),
    ("sub_float", "x - 1e-3"),
    ("div_int", "x / 3"),
    ("rdiv_float", "1.0 / x"),
    ("pow_int", "x ** 3"),
    ("pow_float", "x ** 0.5"),
    ("rpow_float", "2.0 ** x"),
    ("mul_third", "x * (1 / 3)"),
    ("add_tiny", "x * 0 + TINY"),
    ("mul_big", "x * 70000.0"),
    ("max_float", "mx.maximum(x, 0.25)"),
    ("where_scalar", "mx.where(x > 0, x, -float('inf'))"),
    ("gt_float", "x > 0.3"),
    ("floordiv_int", "x // 2"),
    ("mod_float", "x % 0.7"),
]
FLOAT_DTYPES = ["float32", "float16", "bfloat16"]

INT_CASES = [
    ("int_add_float", "int32", "x + 0.5"),
    ("int_mul_int", "int32", "x * 3"),
    ("int_rsub_int", "int32", "2 - x"),
    ("int_div_int", "int32", "x / 2"),
    ("int_pow_int", "int32", "x ** 2"),
    ("int_rmul_float", "int32", "0.1 * x"),
    ("uint8_add_int", "uint8", "x + 7"),
    ("int16_mul_float", "int16", "x * 1.5"),
    ("bool_add_int", "bool", "x + 1"),
    ("bool_mul_float", "bool", "x * 0.5"),
]


def make(dtype):
    if dtype in FLOAT_DTYPES:
        return mx.array(VALUES, mx.float32).astype(getattr(mx, dtype))
    if dtype == "bool":
        return mx.array([v > 1 for v in V_INT])
    if dtype == "uint8":
        return mx.array([abs(v) % 200 for v in V_INT], mx.uint8)
    return mx.array(V_INT, getattr(mx, dtype))


def hexbits(a):
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    mx.eval(a)
    return bytes(memoryview(a)).hex()


def dname(dt):
    return str(dt).split(".")[-1]


out = {}
for cid, expr in CASES:
    for dt in FLOAT_DTYPES:
        x = make(dt)
        r = eval(expr, {"mx": mx, "x": x, "TINY": TINY})
        out[f"{cid}/{dt}"] = {"dtype": dname(r.dtype), "hex": hexbits(r)}
for cid, dt, expr in INT_CASES:
    x = make(dt)
    r = eval(expr, {"mx": mx, "x": x})
    out[f"{cid}/{dt}"] = {"dtype": dname(r.dtype), "hex": hexbits(r)}
print(json.dumps(out, indent=1))
