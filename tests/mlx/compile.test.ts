// compile(): the binding's compiled functions build and run the same fused kernels as Python's
// @partial(mx.compile, shapeless=True) helpers of mlx-lm's gemma4 (same kernel names, so the same
// cached .so; checked on what the helper process loaded, not on what its cache holds), and Python-style state capture (inputs=/outputs= mx.random.state) gives the
// same draws as mlx-lm's compiled samplers.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import pinnedKernels from "./compile_kernels.pinned.json";
import { onDevice } from "../on_device.ts";
import { limit } from "../time_limit.ts";

describe("compile", () => {
  it("generates the kernels Python generates for geglu, gelu_approx, logit_softcap, _complete_square, and runs them", () => {
    // Where the helper can list the kernel libraries its process loaded (Linux: /proc/self/maps),
    // a dedicated cache (per pinned list and MLX version) is seeded with the pinned kernels from
    // the default cache when present (built by anyone, Python included), so the binding reuses
    // them instead of running g++; the proof that it compiled and fused is then what it LOADED,
    // which must be exactly the pinned (Python's) kernels, and the cache must hold no other file
    // (a kernel named differently would be compiled into it). Elsewhere the cache starts empty,
    // so every kernel file in it was written by this run (slower: g++ for each).
    const canListLoaded = existsSync("/proc/self/maps");
    const key = createHash("sha256").update(JSON.stringify(pinnedKernels)).digest("hex").slice(0, 12);
    const dir = canListLoaded ? join(tmpdir(), `mlx-bun-kernel-check-${mx.version()}-${key}`) : mkdtempSync(join(tmpdir(), "mlx-bun-kernel-check-"));
    const cpu = join(dir, "mlx", mx.version(), "cpu");
    mkdirSync(cpu, { recursive: true });
    const shared = join(tmpdir(), "mlx", mx.version(), "cpu");
    if (canListLoaded) {
      for (const name of pinnedKernels) {
        if (!existsSync(join(cpu, name)) && existsSync(join(shared, name))) copyFileSync(join(shared, name), join(cpu, name));
      }
    }
    try {
      // These .so files are the CPU backend's JIT (CUDA compiles with NVRTC and writes none): the
      // helper runs on MLX's CPU device (MLX_DEVICE=cpu, applied by the tests' preload) everywhere.
      const bun = process.execPath;
      const preload = join(import.meta.dir, "..", "preload.ts");
      const r = spawnSync(bun, ["run", "--preload", preload, join(import.meta.dir, "compile_kernels_ts.ts")], {
        env: { ...process.env, TMPDIR: dir, MLX_DEVICE: "cpu" },
        encoding: "utf8",
        timeout: 300_000,
      });
      expect(r.stderr).toBe("");
      expect(r.status).toBe(0);
      const out = JSON.parse(r.stdout.trim()) as { mapped: string[] | null; listed: string[] };
      expect(out.mapped !== null).toBe(canListLoaded);
      if (out.mapped) expect(out.mapped).toEqual(pinnedKernels);
      expect(out.listed).toEqual(pinnedKernels);
    } finally {
      if (!canListLoaded) rmSync(dir, { recursive: true, force: true });
    }
  }, limit(300_000));

  // on the CPU device: the draws are pinned from Python on the CPU
  it("captures random.state like @partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)", () => onDevice("cpu", () => {
    // Python (mlx 0.32.4):
    //   mx.random.seed(7); logits = (mx.arange(40, dtype=mx.float32).reshape(2, 20) / 9.0).astype(mx.bfloat16)
    //   [categorical_sampling(logits, 0.7).tolist() for _ in range(4)], mx.random.uniform(shape=(2,)).tolist()
    mx.random.seed(7);
    const temp = 0.7;
    const sample = mx.compile((l: MlxArray) => mx.random.categorical(mx.multiply(l, 1.0 / temp)), {
      inputs: mx.random.state,
      outputs: mx.random.state,
    });
    using a = mx.arange(40, undefined, 1, "float32");
    using r = mx.reshape(a, [2, 20]);
    using d = mx.divide(r, mx.pyFloat(9));
    using logits = mx.astype(d, "bfloat16");
    const draws: number[][] = [];
    for (let i = 0; i < 4; i++) {
      using s = sample(logits) as MlxArray;
      draws.push(s.toNumbers());
    }
    expect(draws).toEqual([[15, 6], [18, 17], [19, 17], [17, 16]]);
    using u = mx.random.uniform({ shape: [2] });
    expect(u.toNumbers()).toEqual([0.38290998339653015, 0.3371226489543915]);
    sample.dispose();
  }), limit(60_000)); // the first run on a machine compiles the sampler's kernels

  it("is shapeless when asked, returns single or multiple outputs, and frees its trace handles", () => {
    const before = mx.liveHandles();
    const f = mx.compile((x: MlxArray, y: MlxArray) => [mx.add(x, y), mx.multiply(x, y)], { shapeless: true });
    for (const n of [3, 5]) {
      using x = mx.full([n], mx.pyFloat(2), "float32");
      using y = mx.full([n], mx.pyFloat(3), "float32");
      const [s, p] = f(x, y) as MlxArray[];
      expect(s!.toNumbers()).toEqual(new Array(n).fill(5));
      expect(p!.toNumbers()).toEqual(new Array(n).fill(6));
      s!.dispose();
      p!.dispose();
    }
    f.dispose();
    expect(mx.liveHandles()).toBe(before);
  }, limit(60_000)); // the first run on a machine compiles the fused kernel (CPU: g++; CUDA: NVRTC)
  it("inlines captured 1-element arrays and JS numbers into fused kernels as literals that keep their bits", () => {
    // The compiled decode closures of the model capture single-number parameters and Python-float
    // constants; MLX 0.32.4 prints them into the generated C++ with 9 significant digits, which
    // round-trips every float32 (7 digits would not: 0.70710677 would come back as 0.70710683).
    using k = mx.random.key(7);
    using x = mx.random.normal({ shape: [4096], key: k });
    let seed = 12345;
    const differing: number[] = [];
    for (let i = 0; i < 8; i++) { // each value is a new kernel (one g++ run, ~1 s, then cached)
      seed = (seed * 1103515245 + 12345) % 2147483648;
      const v = Math.fround((seed / 2147483648) * 4 - 2) + (i === 0 ? Math.fround(Math.SQRT1_2) : 0);
      using c = mx.array(new Float32Array([v]), [1]);
      const body = (a: MlxArray, s: MlxArray | number) => {
        using t = mx.add(a, 1);
        using th = mx.tanh(t);
        return mx.multiply(th, s);
      };
      using plain = body(x, c);
      using plainNum = body(x, v);
      using captured = mx.compile((a: MlxArray) => body(a, c));
      using capturedNum = mx.compile((a: MlxArray) => body(a, v));
      using viaArray = captured(x) as MlxArray;
      using viaNum = capturedNum(x) as MlxArray;
      if (!Buffer.from(viaArray.toBytes()).equals(Buffer.from(plain.toBytes()))) differing.push(v);
      if (!Buffer.from(viaNum.toBytes()).equals(Buffer.from(plainNum.toBytes()))) differing.push(v);
    }
    expect(differing).toEqual([]);
  }, limit(60_000));
});
