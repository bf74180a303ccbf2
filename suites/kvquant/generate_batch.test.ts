// `npm run generate` with several prompts and --kv-bits (parity/kv_quant_batch_generate.ts), on
// c1_dense/f32, cheaply:
// - the CLI, run as a process, prints per prompt the same tokens as the port's mlx-vlm batch path
//   run directly on the same case (oracle/kv_quant_batch.ts portBatchGeneration, whose every call
//   suites/kvquant/batch.test.ts checks bit-exact against mlx-vlm's BatchGenerator): TurboQuant
//   3.5 bits from the first token and uniform 8 bits group 32, three prompts of 20/5/13 tokens in
//   prefill chunks of 8 (so the flags reach the path as given: scheme, bits, group, start, step);
//   the quantized tokens differ from the unquantized batch path's somewhere (not a no-op);
// - bad combinations are refused before the model loads with one UsageError each (generatePlan),
//   and one of them, run as a process, exits 2 with one stderr line;
// - `npm run bench --kv-bits` (bench/kv_rows.ts): its refusals before anything is built or run
//   (benchPlan, in process), and the plan of a valid run (scheme label, no MTP/train workloads).
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { UsageError } from "../../parity/args.ts";
import { generatePlan } from "../../parity/generate_cli.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { portBatchGeneration } from "../../oracle/kv_quant_batch.ts";
import { loadModel } from "../../model/gemma4/index.ts";
import { limit } from "../../tests/time_limit.ts";
import { benchPlan } from "../../bench/run.ts";
import * as mx from "@mlx-bun/mlx";

const C1 = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");
const P = (n: number, shift: number) => Array.from({ length: n }, (_, i) => (i * 37 + 11 + shift) % 256);
const PROMPTS = [P(20, 0), P(5, 3), P(13, 7)];
const MAX = 6;

function cli(flags: string[]) {
  const args = ["run", join(REPO_ROOT, "parity", "generate_cli.ts"), "--model", C1, ...PROMPTS.flatMap((p) => ["--tokens", p.join(",")]), "--max-tokens", String(MAX), "--prefill-step-size", "8", ...flags];
  return spawnSync(process.execPath, args, { cwd: REPO_ROOT, encoding: "utf8" });
}

/** The "[i] 1 2 3" lines of the CLI's output. */
function printedTokens(stdout: string): number[][] {
  return stdout
    .split("\n")
    .filter((l) => /^\[\d+\] /.test(l))
    .map((l) => l.replace(/^\[\d+\] /, "").split(" ").map(Number));
}

/**
 * The port's batch path on the same case: tokens per prompt (uid order), or MLX's own error where
 * the backend has no kernel for the case (CUDA's quantized_matmul at group size 32).
 */
function pathTokens(kv: { bits: number; scheme: "turboquant" | "uniform"; group: number; start: number } | null): number[][] | { mlxError: string } {
  const loaded = loadModel(C1);
  try {
    const rec = portBatchGeneration(loaded, {
      checkpoint: C1,
      prompts: PROMPTS,
      maxTokens: PROMPTS.map(() => MAX),
      kvBits: kv ? kv.bits : null,
      kvQuantScheme: kv ? kv.scheme : "uniform",
      kvGroupSize: kv?.group ?? 64,
      quantizedKvStart: kv?.start ?? 0,
      prefillStepSize: 8,
    });
    if (rec.error?.type === "MlxError") return { mlxError: rec.error.message };
    expect(rec.error).toBeNull();
    const out: number[][] = PROMPTS.map(() => []);
    for (const c of rec.calls) for (const r of c.responses) out[r.uid]!.push(r.token);
    return out;
  } finally {
    loaded.model.dispose();
  }
}

describe("npm run generate, several prompts with --kv-bits: mlx-vlm's batch path", () => {
  it("prints the batch path's tokens for TurboQuant 3.5 and uniform 8 (flags reach the path as given)", () => {
    const plain = pathTokens(null);
    if (!Array.isArray(plain)) throw new Error(`the unquantized batch path failed: ${plain.mlxError}`);
    const cases = [
      { flags: ["--kv-bits", "3.5", "--quantized-kv-start", "0"], kv: { bits: 3.5, scheme: "turboquant" as const, group: 64, start: 0 }, header: "KV cache: TurboQuant 3.5 bits, quantized_kv_start 0, 1 full-attention cache(s) quantized" },
      { flags: ["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "12"], kv: { bits: 8, scheme: "uniform" as const, group: 32, start: 12 }, header: "KV cache: uniform 8 bits, group 32, quantized_kv_start 12, 1 full-attention cache(s) quantized" },
    ];
    let ran = 0;
    let unsupported = 0;
    let differsFromPlain = 0;
    for (const k of cases) {
      const r = cli(k.flags);
      const want = pathTokens(k.kv);
      if (!Array.isArray(want)) {
        // unsupported on this backend: the path stops at MLX's own error, and the face prints that
        // error and fails; never on the CPU, where every kernel exists
        expect(mx.backend()).not.toBe("cpu");
        expect(r.stderr).toContain(want.mlxError);
        expect(r.status).not.toBe(0);
        unsupported++;
        continue;
      }
      expect(r.stderr).toBe("");
      expect(r.status).toBe(0);
      expect(r.stdout.startsWith(k.header)).toBe(true);
      const got = printedTokens(r.stdout);
      expect(want.map((t) => t.length)).toEqual([MAX, MAX, MAX]);
      expect(got).toEqual(want);
      if (JSON.stringify(want) !== JSON.stringify(plain)) differsFromPlain++;
      ran++;
    }
    if (unsupported) console.log(`[kvquant generate] ${unsupported} of ${cases.length} cases unsupported on ${mx.backend()} (MLX has no kernel for the shape)`);
    expect(ran + unsupported).toBe(cases.length);
    expect(ran).toBeGreaterThan(0);
    // TurboQuant 3.5 changes c1_dense's greedy tokens (the quantized cache is read, not bypassed)
    expect(differsFromPlain).toBeGreaterThan(0);
  }, limit(60_000));

  it("bad combinations: one UsageError each before the model loads, and exit 2 with one line", async () => {
    const bad: { flags: string[]; message: string }[] = [
      { flags: ["--kv-bits", "4", "--temp", "0.7"], message: "--kv-bits with several prompts runs mlx-vlm's batch path greedily (the port has no sampler there): --temp is not taken" },
      { flags: ["--kv-bits", "4", "--top-k", "5"], message: "--kv-bits with several prompts runs mlx-vlm's batch path greedily (the port has no sampler there): --top-k is not taken" },
      { flags: ["--kv-bits", "4", "--completion-batch-size", "2"], message: "--kv-bits with several prompts admits every prompt in one batch (mlx_vlm.batch_generate's path as ported): --completion-batch-size is not taken" },
      { flags: ["--kv-bits", "8"], message: "[quantize] The last dimension of the matrix needs to be divisible by the quantization group size 64. The head dim is 32." },
      { flags: ["--kv-bits", "3.5", "--kv-quant-scheme", "nope"], message: "argument --kv-quant-scheme: invalid choice: 'nope' (choose from 'uniform', 'turboquant')" },
      { flags: ["--kv-bits", "2.25"], message: "TurboQuant currently supports integer and .5 bit-widths, got 2.25." },
      { flags: ["--kv-bits", "4", "--quantized-kv-start", "-1"], message: "--quantized-kv-start must be a non-negative integer" },
    ];
    let n = 0;
    for (const b of bad) {
      const argv = ["--model", C1, ...PROMPTS.flatMap((p) => ["--tokens", p.join(",")]), ...b.flags];
      let err: unknown = null;
      try {
        await generatePlan(argv);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(UsageError);
      expect((err as Error).message).toBe(b.message);
      n++;
    }
    expect(n).toBe(bad.length);
    const r = cli(bad[0]!.flags);
    expect(r.status).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toBe(`error: ${bad[0]!.message}\n`);
  }, limit(30_000));
});

describe("npm run bench --kv-bits", () => {
  it("npm run bench --kv-bits: bad combinations refused before any run, a valid plan labelled with its scheme", () => {
    const bad: { argv: string[]; message: string }[] = [
      { argv: ["--only", "tiny-dense", "--kv-quant-scheme", "turboquant"], message: "--kv-quant-scheme needs --kv-bits" },
      { argv: ["--only", "tiny-dense", "--quantized-kv-start", "0"], message: "--quantized-kv-start needs --kv-bits" },
      { argv: ["--only", "mtp,tiny-dense", "--kv-bits", "4", "--kv-quant-scheme", "turboquant"], message: "--kv-bits applies to the prefill/decode workloads, not mtp" },
      { argv: ["--only", "tiny-dense,train-dense", "--kv-bits", "4", "--kv-quant-scheme", "turboquant"], message: "--kv-bits applies to the prefill/decode workloads, not train-dense" },
      { argv: ["--only", "tiny-dense", "--kv-bits", "3.5", "--kv-quant-scheme", "nope"], message: "argument --kv-quant-scheme: invalid choice: 'nope' (choose from 'uniform', 'turboquant')" },
      // default start 5000: no run of the workload (at most 1024 + 2 tokens) reaches it
      { argv: ["--only", "tiny-dense", "--kv-bits", "4", "--kv-quant-scheme", "turboquant"], message: "c1_dense/bf16: --quantized-kv-start 5000: the workload's runs (at most 1026 tokens) never reach it" },
      { argv: ["--only", "tiny-dense", "--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "0"], message: "c1_dense/bf16: --kv-quant-scheme uniform on a model with sliding-window layers: mlx-vlm 0.7.10 raises NotImplementedError: RotatingKVCache Quantization NYI" },
    ];
    let n = 0;
    for (const b of bad) {
      let err: unknown = null;
      try {
        benchPlan(b.argv);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(UsageError);
      expect((err as Error).message.startsWith(b.message)).toBe(true);
      n++;
    }
    expect(n).toBe(bad.length);
    const plan = benchPlan(["--only", "tiny-dense", "--kv-bits", "3.5", "--quantized-kv-start", "0"])!;
    expect(plan.kv?.label).toBe("KV turboquant 3.5 bits, start 0");
    expect(plan.wl.map((w) => w.name)).toEqual(["tiny-dense"]);
    expect(plan.twl).toEqual([]);
    expect(benchPlan(["--only", "tiny-dense"])!.kv).toBeNull();
  });
});
