"""numpy's values of the conformance metrics (suites/conform/metrics.test.ts): reads cases from
stdin as JSON ({name, kind: "tensor"|"logits", a, b, k?} with a/b = {dtype, shape, b64}: the raw
little-endian bytes), writes one JSON object of results per case name. The conventions where
numpy gives NaN (zero norms) are the ones oracle/conform/metrics.ts states."""
import base64
import json
import sys

import numpy as np


def values(t):
    raw = base64.b64decode(t["b64"])
    if t["dtype"] == "bfloat16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        x = bits.view(np.float32)
    else:
        x = np.frombuffer(raw, dtype={"float32": "<f4", "float16": "<f2", "float64": "<f8"}[t["dtype"]])
    return x.astype(np.float64).reshape(t["shape"])


def ordered_f32(x):
    bits = x.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def tensor(a, b):
    a, b = a.ravel(), b.ravel()
    nd, na, nb = np.linalg.norm(a - b), np.linalg.norm(a), np.linalg.norm(b)
    rel = nd / nb if nb > 0 else (np.inf if nd > 0 else 0.0)
    cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == 0 and nb == 0 else 0.0)
    return {"n": int(a.size), "maxAbs": float(np.max(np.abs(a - b))),
            "maxUlp": int(np.max(np.abs(ordered_f32(a) - ordered_f32(b)))),
            "relL2": float(rel), "cosine": cos}


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def logits(a, b, k):
    V = b.shape[-1]
    la, lb = log_softmax(a.reshape(-1, V)), log_softmax(b.reshape(-1, V))
    pa, pb = np.exp(la), np.exp(lb)
    kl = np.sum(np.where(pb > 0, pb * (lb - la), 0.0), axis=-1)
    k = min(k, V)
    ta = np.argsort(-la, axis=-1, kind="stable")[:, :k]
    tb = np.argsort(-lb, axis=-1, kind="stable")[:, :k]
    overlap = [len(set(x.tolist()) & set(y.tolist())) / k for x, y in zip(ta, tb)]
    top = np.argmax(lb, axis=-1)
    rows = np.arange(lb.shape[0])
    dp = np.abs(pa[rows, top] - pb[rows, top])
    return {"rows": int(lb.shape[0]), "vocab": int(V), "klMean": float(kl.mean()), "klMax": float(kl.max()),
            "top1": float(np.mean(np.argmax(la, axis=-1) == top)), "k": k,
            "topkOverlap": float(np.mean(overlap)), "dpTopMean": float(dp.mean()), "dpTopMax": float(dp.max())}


def finite(x):
    """JSON has no Infinity: an infinite value travels as the string "Infinity"."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    return "Infinity" if isinstance(x, float) and np.isinf(x) else x


out = {}
for c in json.load(sys.stdin):
    a, b = values(c["a"]), values(c["b"])
    out[c["name"]] = finite(tensor(a, b) if c["kind"] == "tensor" else logits(a, b, c.get("k", 10)))
json.dump(out, sys.stdout)
