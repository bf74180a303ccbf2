// Tap digests (oracle/tap_digest.ts, the TS half of golden_io.call_digests): the Python and TS
// byte forms agree on one tap of every kind and the dtypes the taps use (computed by both sides
// here, not copied), and checkDigests fails, naming the tap, on a 1-ULP change, a changed stored
// digest, a tap missing or extra, and a list that covers nothing; the regeneration diff names
// the first tap whose digest changed.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { digestChange } from "../../oracle/golden_diff.ts";
import { checkDigests, DIGEST_FORM, type DigestableTap, formatDigestVerdict, type ScenarioDigests, tapDigest } from "../../oracle/tap_digest.ts";

const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/** One tap of each kind, and arrays of the dtypes taps have (bf16 as uint16 bits, a 0-d Python int). */
const TAPS: DigestableTap[] = [
  { name: "embed/inputs", kind: "array", dtype: "int32", shape: [1, 3], data: bytes(Int32Array.from([2, 255, 7])) },
  { name: "prefill0/layers.0/input_layernorm", kind: "array", dtype: "float32", shape: [2, 2], data: bytes(Float32Array.from([1.5, -0, 3e-39, Number.NaN])) },
  { name: "prefill0/layers.0/self_attn/offset", kind: "array", dtype: "int32", shape: [], data: bytes(Int32Array.from([0])), meta: { python_int: true } },
  { name: "prefill0/mask/sliding_attention", kind: "str", value: "causal" },
  { name: "prefill0/mask/full_attention", kind: "none" },
  { name: "step0/logits", kind: "array", dtype: "bfloat16", shape: [1, 1, 3], data: bytes(Uint16Array.from([0x3f80, 0xbf81, 0x7fc0])) },
  { name: "step0/router", kind: "array", dtype: "bool", shape: [3], data: Uint8Array.from([1, 0, 1]) },
  { name: "step1/h", kind: "array", dtype: "float16", shape: [2], data: bytes(Uint16Array.from([0x3c00, 0x8001])) },
];

/** The digests golden_io.call_digests writes for TAPS, split into calls by their prefix. */
function pythonDigests(): ScenarioDigests {
  const spec = TAPS.map((t) => ({ ...t, data: t.data ? Buffer.from(t.data).toString("hex") : undefined }));
  const script = `
import json, sys
from types import SimpleNamespace
import numpy as np
sys.path.insert(0, ${JSON.stringify(join(REPO_ROOT, "oracle", "python"))})
import golden_io
np_dtype = {"int32": np.int32, "float32": np.float32, "bfloat16": np.uint16, "bool": np.bool_, "float16": np.float16}
calls = {}
for t in json.loads(sys.stdin.read()):
    d = None
    if t["kind"] == "array":
        d = np.frombuffer(bytes.fromhex(t["data"]), dtype=np_dtype[t["dtype"]]).reshape(t["shape"])
    tap = SimpleNamespace(name=t["name"], kind=t["kind"], dtype=t.get("dtype"), shape=t.get("shape"), data=d, value=t.get("value"), meta=t.get("meta") or {})
    prefix = t["name"].split("/")[0] + "/"
    calls.setdefault(prefix, SimpleNamespace(prefix=prefix, taps={}))
    calls[prefix].taps[t["name"]] = tap
print(json.dumps(golden_io.call_digests(list(calls.values()))))
`;
  const r = spawnSync(process.env.ORACLE_PYTHON || DEFAULT_PYTHON, ["-c", script], { input: JSON.stringify(spec), encoding: "utf8" });
  if (r.status !== 0) throw new Error(`python digests failed: ${r.stderr}`);
  return JSON.parse(r.stdout) as ScenarioDigests;
}

describe("tap digests", () => {
  const py = pythonDigests();

  it("the Python and TS byte forms agree (every kind; int32, float32 with -0/subnormal/NaN, bfloat16, bool, float16; a 0-d Python int)", () => {
    expect(py.form).toBe(DIGEST_FORM);
    expect(py.calls.map((c) => [c.call, c.taps])).toEqual([["embed/", 1], ["prefill0/", 4], ["step0/", 2], ["step1/", 1]]);
    const v = checkDigests(TAPS, py);
    expect(v).toEqual({ ok: true, matched: TAPS.length });
  });

  it("a 1-ULP change in one tap fails, naming that tap", () => {
    const bf = TAPS.map((t) => ({ ...t, data: t.data?.slice() }));
    const logits = bf[5]!;
    logits.data![0]! ^= 1; // bfloat16 0x3f80 -> 0x3f81: one ULP
    const v = checkDigests(bf, py);
    expect(v.ok).toBe(false);
    expect(v.first).toMatchObject({ index: 5, name: "step0/logits", call: "step0/", reason: "digest" });
    expect(formatDigestVerdict("x", v)).toMatch(/^x: first tap whose digest differs #5 "step0\/logits" \(digest, call "step0\/"\): TS bfloat16\[1,1,3\]/);
    const f32 = TAPS.map((t) => ({ ...t, data: t.data?.slice() }));
    f32[1]!.data![0]! ^= 1;
    expect(checkDigests(f32, py).first).toMatchObject({ index: 1, name: "prefill0/layers.0/input_layernorm" });
  });

  it("a python_int flag, a dtype, a shape or a name that differs fails at that tap", () => {
    const alter = (i: number, change: Partial<DigestableTap>) => checkDigests(TAPS.map((t, k) => (k === i ? { ...t, ...change } : t)), py).first?.index;
    expect(alter(2, { meta: { python_int: false } })).toBe(2);
    expect(alter(7, { dtype: "bfloat16" })).toBe(7);
    expect(alter(1, { shape: [4] })).toBe(1);
    expect(alter(4, { name: "prefill0/mask/global" })).toBe(4);
    expect(alter(3, { value: "other" })).toBe(3);
  });

  it("a changed stored digest fails: a short one at its tap, the call's sha256 at its call", () => {
    const short = structuredClone(py);
    const c = short.calls[1]!;
    c.short = c.short.slice(0, 8) + (c.short[8] === "A" ? "B" : "A") + c.short.slice(9);
    expect(checkDigests(TAPS, short).first).toMatchObject({ index: 2, name: "prefill0/layers.0/self_attn/offset", reason: "digest" });
    const call = structuredClone(py);
    call.calls[2]!.sha256 = (call.calls[2]!.sha256[0] === "0" ? "1" : "0") + call.calls[2]!.sha256.slice(1);
    expect(checkDigests(TAPS, call).first).toMatchObject({ index: 5, call: "step0/", reason: "call" });
  });

  it("the regeneration diff (golden_diff digestChange) counts changed digests and names the first by call and place", () => {
    expect(digestChange(py, structuredClone(py))).toBeNull();
    const bf = TAPS.map((t) => ({ ...t, data: t.data?.slice() }));
    bf[6]!.data![1]! ^= 1;
    const after = structuredClone(py);
    const tap6 = tapDigest(bf[6]!);
    const c = after.calls[2]!;
    c.short = c.short.slice(0, 8) + tap6.subarray(0, 6).toString("base64");
    c.sha256 = "0".repeat(64);
    expect(digestChange(py, after)).toBe('digests: 1 of 8 taps changed, first #6 (call "step0/", its tap 1); 1 of 4 calls');
    expect(digestChange(undefined, py)).toBe("digests added (8 taps)");
  });

  it("a tap missing or extra fails; digests of nothing are refused", () => {
    expect(checkDigests(TAPS.slice(0, -1), py).first).toMatchObject({ index: 7, reason: "missing" });
    expect(checkDigests([...TAPS, TAPS[0]!], py).first).toMatchObject({ index: 8, reason: "extra" });
    expect(checkDigests([], { form: DIGEST_FORM, calls: [] })).toMatchObject({ ok: false, matched: 0 });
    expect(() => checkDigests(TAPS, { ...py, form: "tap-sha256-v0" })).toThrow(/digest form/);
  });
});
