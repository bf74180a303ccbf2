// The KV-quantization flags on the faces (--kv-bits, --kv-quant-scheme, --kv-group-size,
// --quantized-kv-start, mlx-vlm's names), checked cheaply:
// - bad input gets one clear error on both `npm run generate` (generatePlan) and `npm run parity`
//   (parityPlan), before any model loads: fractional bits mlx-vlm refuses (2.25; 0.5), a scheme
//   it does not know, a group size that does not divide the full-attention head dim, and uniform
//   --kv-bits on a model whose caches cannot be quantized (sliding layers reaching the start:
//   mlx-vlm's RotatingKVCache NYI); the messages are mlx-vlm's / MLX's where they exist;
// - the same errors exit 2 with one stderr line when the faces run as processes (one run each);
// - `npm run parity --kv-bits 3.5`: a passing KV-quantized run (the port vs mlx-vlm's
//   generate_step per step) on c1_dense, in process;
// - `npm run parity --kv-batch-tokens`: its bad input, and a passing uniform batch run (the port's
//   mlx-vlm batch path vs mlx-vlm's BatchGenerator, per next() call), in process.
import * as mx from "@mlx-bun/mlx";
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { UsageError } from "../../parity/args.ts";
import { parityPlan } from "../../parity/cli.ts";
import { generatePlan } from "../../parity/generate_cli.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";

const C1 = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");

const BAD: { flags: string[]; message: string }[] = [
  { flags: ["--kv-bits", "2.25"], message: "TurboQuant currently supports integer and .5 bit-widths, got 2.25." },
  { flags: ["--kv-bits", "0.5", "--kv-quant-scheme", "turboquant"], message: "TurboQuant requires kv_bits >= 1." },
  { flags: ["--kv-bits", "4", "--kv-quant-scheme", "foo"], message: "argument --kv-quant-scheme: invalid choice: 'foo' (choose from 'uniform', 'turboquant')" },
  // the start is beyond the run, so no sliding cache reaches it; mx.quantize's check on the head dim (32)
  { flags: ["--kv-bits", "4", "--kv-group-size", "48", "--quantized-kv-start", "100000"], message: "[quantize] The last dimension of the matrix needs to be divisible by the quantization group size 48. The head dim is 32." },
  { flags: ["--kv-bits", "8", "--quantized-kv-start", "0"], message: "--kv-quant-scheme uniform on a model with sliding-window layers: mlx-vlm 0.7.10 raises NotImplementedError: RotatingKVCache Quantization NYI" },
];

async function rejection(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (e) {
    return e as Error;
  }
  throw new Error("expected a rejection");
}

describe("bad KV-quantization input: one clear error before the model loads", () => {
  it("npm run generate and npm run parity refuse each case with the same message", async () => {
    let n = 0;
    for (const b of BAD) {
      const g = await rejection(generatePlan(["--model", C1, "--tokens", "1,2,3", "--max-tokens", "2", ...b.flags]));
      const p = await rejection(parityPlan(["--model", C1, "--tokens", "1,2,3", "--steps", "2", ...b.flags]));
      for (const e of [g, p]) {
        expect(e).toBeInstanceOf(UsageError);
        expect(e.message.startsWith(b.message)).toBe(true);
      }
      n++;
    }
    expect(n).toBe(BAD.length);
  });

  it("--kv-quant-scheme without --kv-bits is refused by npm run parity", async () => {
    const e = await rejection(parityPlan(["--model", C1, "--tokens", "1,2,3", "--kv-quant-scheme", "turboquant"]));
    expect(e.message).toBe("--kv-quant-scheme needs --kv-bits");
  });

  it("as processes: exit 2 and one stderr line", () => {
    const runs = [
      spawnSync("bun", [join(REPO_ROOT, "parity", "generate_cli.ts"), "--model", C1, "--tokens", "1,2,3", "--max-tokens", "2", "--kv-bits", "2.25"], { encoding: "utf8" }),
      spawnSync("bun", [join(REPO_ROOT, "parity", "cli.ts"), "--model", C1, "--tokens", "1,2,3", "--kv-bits", "4", "--kv-quant-scheme", "foo"], { encoding: "utf8" }),
    ];
    for (const r of runs) {
      expect(r.status).toBe(2);
      expect(r.stderr.trim().split("\n").length).toBe(1);
      expect(r.stderr).toMatch(/^\s*error: /);
    }
  }, limit(60_000));
});

describe("npm run parity --kv-bits", () => {
  it("TurboQuant 3.5 on c1_dense: the port and mlx-vlm's generate_step agree at every step", async () => {
    const plan = await parityPlan(["--model", C1, "--tokens", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15", "--steps", "4", "--prefill-step-size", "8", "--kv-bits", "3.5", "--quantized-kv-start", "12"]);
    expect(plan?.mode).not.toBeNull();
    const lines: string[] = [];
    const write = process.stdout.write.bind(process.stdout);
    process.stdout.write = ((s: string) => {
      lines.push(String(s));
      return true;
    }) as typeof process.stdout.write;
    let ok: boolean;
    try {
      ok = await plan!.mode!(null as never, plan!.a);
    } finally {
      process.stdout.write = write;
    }
    expect(ok).toBe(true);
    const out = lines.join("");
    expect(out.match(/^step \d+: token \d+ =, logprobs =, caches = \(.*TurboQuantKVCache@\d+/gm)?.length).toBe(4);
    expect(out).toContain("PASS: 4 steps bit-exact");
  }, limit(60_000));
});

describe("npm run parity --kv-batch-tokens (mlx-vlm's batch path)", () => {
  const BATCH = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20;5,6,7,8,9;3,4,5,6,7,8,9,10,11,12,13,14,15";
  it("bad input: one UsageError each, before any oracle starts", async () => {
    const cases: { flags: string[]; message: string }[] = [
      { flags: ["--kv-batch-tokens", BATCH], message: "--kv-batch-tokens needs --kv-bits (the batch path compared is the quantized one)" },
      { flags: ["--kv-batch-tokens", "1,2;x", "--kv-bits", "4"], message: "--kv-batch-tokens: prompt 2 must be comma-separated token ids, got 'x'" },
      // the batch path quantizes from the first token: mx.quantize's check on the head dim (32) at once
      { flags: ["--kv-batch-tokens", BATCH, "--kv-bits", "4"], message: "[quantize] The last dimension of the matrix needs to be divisible by the quantization group size 64. The head dim is 32." },
      { flags: ["--kv-batch-tokens", BATCH, "--kv-bits", "2.25"], message: "TurboQuant currently supports integer and .5 bit-widths, got 2.25." },
      { flags: ["--kv-batch-tokens", BATCH, "--kv-bits", "4", "--tokens", "1,2"], message: "--kv-batch-tokens does not take --tokens" },
    ];
    for (const c of cases) {
      const e = await rejection(parityPlan(["--model", C1, ...c.flags]));
      expect(e).toBeInstanceOf(UsageError);
      expect(e.message).toBe(c.message);
    }
  });

  it("uniform 4 (group 32): equal at every call", async () => {
    const plan = await parityPlan(["--model", C1, "--kv-batch-tokens", BATCH, "--steps", "3", "--prefill-step-size", "8", "--kv-bits", "4", "--kv-group-size", "32"]);
    const lines: string[] = [];
    const write = process.stdout.write.bind(process.stdout);
    process.stdout.write = ((s: string) => {
      lines.push(String(s));
      return true;
    }) as typeof process.stdout.write;
    let ok: boolean;
    try {
      ok = await plan!.mode!(null as never, plan!.a);
    } finally {
      process.stdout.write = write;
    }
    expect(ok).toBe(true);
    const out = lines.join("");
    if (out.includes("UNSUPPORTED on")) {
      // CUDA has no quantized_matmul at group 32 for these shapes: both sides stop at MLX's error
      expect(mx.defaultDevice()).toBe("gpu");
      expect(out).toMatch(/^UNSUPPORTED on \w+: both sides stop at the same MLX error after \d+ equal calls: \[quantized_matmul\]/m);
      return;
    }
    expect(out.match(/^call \d+: .*, equal$/gm)?.length).toBe(7);
    expect(out).toContain("PASS: 7 calls, 9 tokens bit-exact");
  }, limit(60_000));
});
