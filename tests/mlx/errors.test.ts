// Errors, never aborts: every bad call throws an MlxError naming the op and carrying MLX's own
// message, and the process (and the binding) keep working afterwards.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ptr } from "bun:ffi";
import { afterAll, describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { MlxArray, MlxError } from "@mlx-bun/mlx";
import { onDevice } from "../on_device.ts";
import { limit } from "../time_limit.ts";

const dir = mkdtempSync(join(tmpdir(), "mlx-errors-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const f32 = (shape: number[], fill = 1): MlxArray => mx.full(shape, mx.pyFloat(fill), "float32");

function validSafetensors(): string {
  const p = join(dir, `ok-${Math.random().toString(36).slice(2)}.safetensors`);
  using a = mx.arange(0, 64, 1, "float32");
  mx.saveSafetensors(p, { a }, { format: "mlx" });
  return p;
}

/** [name, bad call, op the error must name, pattern MLX's message must match]. */
type BadCall = [name: string, call: () => unknown, op: string, pattern: RegExp];
const BAD: BadCall[] = [
  ["shape mismatch (broadcast)", () => { using a = f32([2, 3]); using b = f32([4, 5]); return mx.add(a, b); }, "add", /broadcast/i],
  ["matmul inner dims", () => { using a = f32([2, 3]); using b = f32([4, 5]); return mx.matmul(a, b); }, "matmul", /matmul|shape|dimension/i],
  ["bad reduction axis", () => { using a = f32([2, 3]); return mx.sum(a, 5); }, "sum", /axis/i],
  ["bad transpose axes", () => { using a = f32([2, 3]); return mx.transpose(a, [0, 0]); }, "transpose", /axis|axes|transpose/i],
  ["bad reshape", () => { using a = f32([2, 3]); return mx.reshape(a, [4, 2]); }, "reshape", /reshape|size/i],
  ["concatenate mismatch", () => { using a = f32([2, 3]); using b = f32([2, 4]); return mx.concatenate([a, b], 0); }, "concatenate", /concatenate|shape|dimension/i],
  ["take with float indices", () => { using a = f32([4]); using i = f32([2]); return mx.take(a, i, 0); }, "take", /integral|indices|type/i],
  ["bitwise op on floats", () => { using a = f32([2]); using b = f32([2]); return mx.bitwiseAnd(a, b); }, "bitwise_and", /integ|bool|type/i],
  ["unknown dtype", () => { using a = f32([2]); return mx.astype(a, "float8" as mx.Dtype); }, "dtype", /unknown dtype/],
  ["disposed array", () => { const a = f32([2]); a.dispose(); return mx.exp(a); }, "array", /after dispose/],
  ["disposed array inside a list", () => { const a = f32([2]); a.dispose(); using b = f32([2]); return mx.concatenate([b, a]); }, "array", /after dispose/],
  ["foreign handle (JS memory)", () => { const junk = new Uint8Array(64).fill(7); return mx.exp(new MlxArray(ptr(junk) as unknown as number)); }, "exp", /invalid array handle/],
  ["foreign handle (arbitrary number)", () => mx.negative(new MlxArray(0x1234560)), "negative", /invalid array handle/],
  ["missing safetensors file", () => mx.loadSafetensors(join(dir, "nope.safetensors")), "load_safetensors", /no such file/],
  ["truncated safetensors", () => {
    const p = validSafetensors();
    const bytes = Bun.file(p);
    return bytes.arrayBuffer().then((b) => {
      const t = join(dir, "trunc.safetensors");
      writeFileSync(t, new Uint8Array(b).subarray(0, 40));
      const { arrays } = mx.loadSafetensors(t);
      for (const a of arrays.values()) mx.evaluate(a);
    });
  }, "load_safetensors", /./],
  ["garbage safetensors", () => {
    const t = join(dir, "garbage.safetensors");
    writeFileSync(t, Buffer.from("\xff\x00\x00\x00\x00\x00\x00\x00{{{{ this is not json", "latin1"));
    return mx.loadSafetensors(t);
  }, "load_safetensors", /./],
  ["safetensors header larger than file", () => {
    const t = join(dir, "huge.safetensors");
    const b = Buffer.alloc(16);
    b.writeBigUInt64LE(1n << 40n, 0);
    writeFileSync(t, b);
    return mx.loadSafetensors(t);
  }, "load_safetensors", /./],
  ["save into a missing directory", () => { using a = f32([2]); mx.saveSafetensors(join(dir, "no", "such", "dir.safetensors"), { a }); }, "save_safetensors", /./],
  ["wrong quantization group size", () => { using w = f32([8, 128]); return mx.quantize(w, { groupSize: 37, bits: 4 }); }, "quantize", /group/i],
  ["wrong quantization bits", () => { using w = f32([8, 128]); return mx.quantize(w, { groupSize: 64, bits: 7 }); }, "quantize", /bits/i],
  ["quantize bad mode", () => { using w = f32([8, 128]); return mx.quantize(w, { mode: "int3" as mx.QuantMode }); }, "quantize", /mode/i],
  ["quantized_matmul shape mismatch", () => {
    using w = f32([16, 128]);
    const [wq, s, b] = mx.quantize(w);
    using x = f32([2, 64]);
    try {
      return mx.quantizedMatmul(x, wq!, s!, b!);
    } finally {
      for (const a of [wq, s, b]) a?.dispose();
    }
  }, "quantized_matmul", /shape|dimension|match/i],
  ["dequantize wrong scales shape", () => {
    using w = f32([16, 128]);
    const [wq, s, b] = mx.quantize(w);
    using bad = f32([16, 3]);
    try {
      return mx.dequantize(wq!, bad, b!);
    } finally {
      for (const a of [wq, s, b]) a?.dispose();
    }
  }, "dequantize", /shape|scales|match/i],
  ["rope odd dims", () => { using x = f32([1, 1, 4, 16]); return mx.fast.rope(x, 7, { traditional: false, base: 10000, scale: 1, offset: 0 }); }, "fast.rope", /dims|even/i],
  ["rope base and freqs together", () => { using x = f32([1, 1, 4, 16]); using fr = f32([8]); return mx.fast.rope(x, 16, { traditional: false, base: 10000, freqs: fr, scale: 1, offset: 0 }); }, "fast.rope", /base|freqs/i],
  ["rope non-integer offset", () => { using x = f32([1, 1, 4, 16]); return mx.fast.rope(x, 16, { traditional: false, base: 10000, scale: 1, offset: 1.5 }); }, "fast.rope", /offset/],
  ["sdpa bad mask shape", () => {
    using q = f32([1, 2, 4, 8]);
    using m = mx.ones([3, 5], "bool");
    using o = mx.fast.scaledDotProductAttention(q, q, q, { scale: 1, mask: m });
    mx.evaluate(o);
  }, "fast.scaled_dot_product_attention", /mask|broadcast|shape/i],
  ["sdpa bad mask kind", () => { using q = f32([1, 2, 4, 8]); return mx.fast.scaledDotProductAttention(q, q, q, { scale: 1, mask: "sliding" as "causal" }); }, "fast.scaled_dot_product_attention", /mask must be/],
  ["rms_norm weight mismatch", () => { using x = f32([2, 8]); using w = f32([5]); return mx.fast.rmsNorm(x, w, 1e-5); }, "fast.rms_norm", /weight|dimension|shape/i],
  ["fromBytes length mismatch", () => mx.fromBytes(new Uint8Array(7), [2, 2], "float32"), "array", /bytes/],
  ["item() on a non-scalar", () => { using a = f32([3]); return a.item(); }, "item", /size-1/],
  ["split into unequal parts", () => { using a = f32([5]); return mx.split(a, 2); }, "split", /split|divide|equal/i],
  ["slice_update shape mismatch", () => { using a = f32([4, 4]); using u = f32([3, 3]); return mx.sliceUpdate(a, u, [0, 0], [2, 2]); }, "slice_update", /shape|broadcast/i],
  ["argpartition kth out of range", () => { using a = f32([4]); return mx.argpartition(a, 9); }, "argpartition", /kth|range|partition/i],
  ["broadcast_to incompatible", () => { using a = f32([3]); return mx.broadcastTo(a, [2, 4]); }, "broadcast_to", /broadcast/i],
  ["expand_dims bad axis", () => { using a = f32([3]); return mx.expandDims(a, 4); }, "expand_dims", /axis/i],
  ["stack of nothing", () => mx.stack([]), "stack", /./],
  // on the CPU device: a GPU's gather_mm takes float16
  ["gather_mm on float16 (CPU kernel is f32-only; raised at eval)", () => onDevice("cpu", () => {
    using a = mx.zeros([2, 1, 4], "float16");
    using b = mx.zeros([2, 4, 3], "float16");
    using idx = mx.array([1, 0], [2], "uint32");
    using o = mx.gatherMm(a, b, { rhsIndices: idx });
    mx.evaluate(o);
  }), "eval", /GatherMM/],
  ["random.key negative seed", () => mx.random.key(-1), "random.key", /seed/],
  ["default stream that does not exist", () => mx.setDefaultStream("cpu", 9999), "set_default_stream", /no stream/],
  ["int scalar overflowing an int8 array (Python's to_array check)", () => { using a = mx.array([1], [1], "int8"); return mx.add(a, 300); }, "add", /Converting 300 to int8 would result in overflow/],
  ["negative int scalar with a uint32 array", () => { using a = mx.array([1], [1], "uint32"); return mx.subtract(-1, a); }, "subtract", /overflow/],
  ["non-array operand", () => mx.exp("x" as unknown as MlxArray), "exp", /must be an MlxArray/],
  ["binary op without arrays", () => mx.add(1, 2), "add", /MlxArray operand/],
];

/** `call` throws one MlxError naming `op`, with MLX's message, and leaks no handles. */
async function expectBadCall(call: BadCall[1], op: string, pattern: RegExp): Promise<void> {
  const before = mx.liveHandles();
  let err: unknown;
  try {
    const r = call();
    if (r instanceof Promise) await r;
    else if (r instanceof MlxArray) r.dispose();
    else if (Array.isArray(r)) for (const a of r) (a as MlxArray).dispose?.();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(MlxError);
  const e = err as MlxError;
  expect(e.op).toBe(op);
  expect(e.message.startsWith(`[${op}] `)).toBe(true);
  expect(e.detail).toMatch(pattern);
  expect(e.detail.length).toBeGreaterThan(3);
  // failed calls leak no handles
  expect(mx.liveHandles()).toBeLessThanOrEqual(before);
}

describe("bad calls throw MlxError with the op name and MLX's message", () => {
  it(`has at least 25 bad calls (${BAD.length})`, () => {
    expect(BAD.length).toBeGreaterThanOrEqual(25);
  });

  for (const [name, call, op, pattern] of BAD) it(name, () => expectBadCall(call, op, pattern));

  // only a libmlx without a GPU backend refuses the GPU device (a CUDA or Metal build has one)
  it.skipIf(mx.isAvailable("gpu"))("gpu device on a CPU build", () => expectBadCall(() => mx.setDefaultDevice("gpu"), "set_default_device", /gpu/));

  it("a compiled function whose body throws rethrows that error, and keeps working", () => {
    let fail = true;
    const boom = new Error("boom from the traced body");
    const f = mx.compile((x: MlxArray) => {
      if (fail) throw boom;
      return mx.multiply(x, 2);
    });
    using x = f32([3], 1.5);
    expect(() => f(x)).toThrow(boom);
    fail = false;
    const y = f(x) as MlxArray;
    expect(y.toNumbers()).toEqual([3, 3, 3]);
    y.dispose();
    f.dispose();
    expect(() => f(x)).toThrow(MlxError);
  }, limit(10_000)); // compiles a kernel: 4.9 s on the H200 with cold kernels

  it("the process and the binding are still alive afterwards", () => {
    using a = f32([2, 2], 2);
    using b = mx.matmul(a, a);
    expect(b.toNumbers()).toEqual([8, 8, 8, 8]);
  });
});
