// FFI benchmark (not a test): graph-building cost per op call, TS binding vs Python MLX, in
// one run. A chain of 10,000 small adds and multiplies is built but never evaluated.
//   bun run bench/ffi.ts [--reps N]
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { lib } from "../mlx/src/native.ts";

const N = 10_000;
const repsArg = process.argv.indexOf("--reps");
const REPS = repsArg > 0 ? Number(process.argv[repsArg + 1]) : 15;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

// --- TS variants
using x0 = mx.ones([4], "float32");
using c = mx.full([4], mx.pyFloat(1.0001), "float32");

/** x = x + c / x * c alternating, each intermediate handle disposed as soon as it is replaced. */
function chainDisposed(): void {
  let x: MlxArray = mx.alias(x0);
  for (let i = 0; i < N; i++) {
    const y = i & 1 ? mx.add(x, c) : mx.multiply(x, c);
    x.dispose();
    x = y;
  }
  x.dispose();
}

/** The same chain written like Python, leaving every intermediate to the GC (FinalizationRegistry). */
function chainGc(): void {
  let x: MlxArray = x0;
  for (let i = 0; i < N; i++) x = i & 1 ? mx.add(x, c) : mx.multiply(x, c);
}

/** Weak-scalar operands: x = x + 0.5 / x * 1.0001. */
function chainScalar(): void {
  let x: MlxArray = mx.alias(x0);
  for (let i = 0; i < N; i++) {
    const y = i & 1 ? mx.add(x, 0.5) : mx.multiply(x, 1.0001);
    x.dispose();
    x = y;
  }
  x.dispose();
}

/** Lower bound: the raw FFI calls alone (no MlxArray wrapping, no registry). */
const ADD = 0;
function chainRaw(): void {
  let x = lib.mlxb_retain(x0.handle)!;
  const ch = c.handle;
  for (let i = 0; i < N; i++) {
    const y = lib.mlxb_binary(ADD, x, ch)!;
    lib.mlxb_free(x);
    x = y;
  }
  lib.mlxb_free(x);
}

/** The same chain built natively in the shim: MLX's own cost, paid by every binding. */
const nativeChain = (scalar: number) => () => void lib.mlxb_bench_chain(x0.handle, c.handle, N, scalar);

// Python runs the same chains in a persistent process, one chain per request, interleaved with
// the TS chains so that load changes on a shared machine hit both sides alike.
const PY = `
import sys, time, gc
import mlx.core as mx
N = ${N}
x0 = mx.ones((4,), mx.float32)
c = mx.full((4,), 1.0001, mx.float32)
def chain_arr():
    x = x0
    for i in range(N):
        x = x + c if i & 1 else x * c
def chain_scalar():
    x = x0
    for i in range(N):
        x = x + 0.5 if i & 1 else x * 1.0001
fns = {"array": chain_arr, "scalar": chain_scalar}
for line in sys.stdin:
    f = fns[line.strip()]
    gc.collect()
    c0 = time.process_time_ns()
    t0 = time.perf_counter_ns()
    f()
    t1 = time.perf_counter_ns()
    c1 = time.process_time_ns()
    print((t1 - t0) / N, (c1 - c0) / N, flush=True)
`;
const python = join(import.meta.dir, "..", ".venv", "bin", "python");
// cwd outside the repo: its mlx/ folder would shadow the mlx package
const proc = Bun.spawn([python, "-I", "-c", PY], { cwd: tmpdir(), stdin: "pipe", stdout: "pipe", stderr: "inherit" });
const reader = proc.stdout.getReader();
let pending = "";
/** [wall ns, CPU ns] per op of one Python chain. */
async function pyChain(kind: "array" | "scalar"): Promise<[number, number]> {
  proc.stdin.write(`${kind}\n`);
  await proc.stdin.flush();
  for (;;) {
    const nl = pending.indexOf("\n");
    if (nl >= 0) {
      const line = pending.slice(0, nl);
      pending = pending.slice(nl + 1);
      const [w, c] = line.split(" ").map(Number);
      return [w!, c!];
    }
    const { value, done } = await reader.read();
    if (done) throw new Error("python bench process exited");
    pending += new TextDecoder().decode(value);
  }
}

const variants: Record<string, () => void> = {
  disposed: chainDisposed,
  gc: chainGc,
  scalar: chainScalar,
  raw: chainRaw,
  native: nativeChain(0),
  nativeScalar: nativeChain(1),
};
const samples: Record<string, number[]> = Object.fromEntries([...Object.keys(variants), "pyArray", "pyScalar"].map((k) => [k, []]));
const cpuSamples: Record<string, number[]> = Object.fromEntries([...Object.keys(variants), "pyArray", "pyScalar"].map((k) => [k, []]));
for (let r = 0; r < REPS + 3; r++) {
  for (const [k, build] of Object.entries(variants)) {
    // flush pending finalizers (the GC-style variant leaves 10,000) before timing anything
    Bun.gc(true);
    await Bun.sleep(0);
    const c0 = process.cpuUsage();
    const t0 = Bun.nanoseconds();
    build();
    const dt = Bun.nanoseconds() - t0;
    const cu = process.cpuUsage(c0);
    if (r >= 3) {
      // first reps warm the JIT
      samples[k]!.push(dt / N);
      cpuSamples[k]!.push(((cu.user + cu.system) * 1000) / N);
    }
  }
  const pa = await pyChain("array");
  const ps = await pyChain("scalar");
  if (r >= 3) {
    samples.pyArray!.push(pa[0]);
    samples.pyScalar!.push(ps[0]);
    cpuSamples.pyArray!.push(pa[1]);
    cpuSamples.pyScalar!.push(ps[1]);
  }
}
proc.stdin.end();
await proc.exited;
// Per variant: the minimum over the repetitions of the CPU time (process CPU time is not charged
// while the process waits for a core, so it is the robust measure on a shared machine), and of
// the wall time; medians are printed too.
const best = (xs: number[]) => Math.min(...xs);
const cpu = Object.fromEntries(Object.entries(cpuSamples).map(([k, v]) => [k, best(v)]));
const wall = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, best(v)]));
const med = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, median(v)]));

const f = (ns: number) => `${(ns / 1000).toFixed(2)} µs`;
const row = (label: string, k: string, k2?: string) =>
  console.log(
    `  ${label.padEnd(31)} array ${f(cpu[k]!)} cpu, ${f(wall[k]!)} wall (median ${f(med[k]!)})` +
      (k2 ? ` | weak scalar ${f(cpu[k2]!)} cpu, ${f(wall[k2]!)} wall` : ""),
  );
console.log(`graph building: chains of ${N} ops, built and never evaluated; best of ${REPS} interleaved runs, per op call`);
row("C++ (MLX itself, in the shim)", "native", "nativeScalar");
row("Python mlx.core", "pyArray", "pyScalar");
row("TS, dispose()", "disposed", "scalar");
row("TS, left to GC (Python style)", "gc");
row("TS raw FFI (no MlxArray)", "raw");
const over = (t: Record<string, number>, k: string) => `${Math.max(0, t[k]! - t.native!).toFixed(0)} ns`;
console.log(`binding overhead above MLX's own C++ cost (cpu): TS ${over(cpu, "disposed")}, TS GC-style ${over(cpu, "gc")}, Python ${over(cpu, "pyArray")}`);
console.log(
  `FFI ratio TS / Python per op (array chain): ${(cpu.disposed! / cpu.pyArray!).toFixed(2)} cpu, ${(wall.disposed! / wall.pyArray!).toFixed(2)} wall ` +
    `(GC style ${(cpu.gc! / cpu.pyArray!).toFixed(2)}; weak scalars ${(cpu.scalar! / cpu.pyScalar!).toFixed(2)}); target <= 0.5. ` +
    `A binding with zero overhead would score C++/Python = ${(cpu.native! / cpu.pyArray!).toFixed(2)}`,
);
