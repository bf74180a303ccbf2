// The MLX-bug attribution of `npm run parity` at the first divergent tap (oracle/mlx_bugs.ts
// mlxBugAtTap), with the CUDA classification simulated (MLX_BUGS_ASSUME_CUDA_GPU=1) on
// c3_e2b/q8g64, a checkpoint whose layers have one quantization group per row (the recorded
// cuda-qmm-sm90 path):
//  - a port defect planted in the TS model (model/gemma4/mutations.ts) diverges first at a tap no
//    recorded bug produces: the run is a failure (the old per-checkpoint attribution excused it);
//  - a 1-ULP change at a one-group quantized matmul's output (one quantized weight of layers.0
//    q_proj moved by one step on the TS side, mlx-lm loading the original through
//    --oracle-model) diverges first at that tap: `PASS with known MLX bugs (1 runs, M of T taps
//    unverified)` in the terminal, parity.json, parity.md and parity.html, exit 0; with --strict
//    the same run fails, exit 1.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { OracleClient, REPO_ROOT } from "../../oracle/client.ts";
import { reachableMlxBug } from "../../oracle/mlx_bugs.ts";
import { withMutationAsync } from "../../model/gemma4/mutations.ts";
import { runParity } from "../../parity/engine.ts";
import { perturbCheckpoint } from "../../parity/perturb.ts";
import { reportVerdict, SCHEMA_ID } from "../../parity/schema.ts";
import { limit } from "../time_limit.ts";

const ID = "c3_e2b/q8g64";
const DIR = join(REPO_ROOT, ".cache", "checkpoints", ID);
const tmp = mkdtempSync(join(tmpdir(), "parity-attribution-"));
const SIMULATED = { MLX_BUGS_ASSUME_CUDA_GPU: "1" };

function cli(args: string[]): { code: number | null; out: string } {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", "cli.ts"), ...args], { cwd: REPO_ROOT, encoding: "utf8", env: { ...process.env, ...SIMULATED }, timeout: limit(180_000) });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

let oracle: OracleClient;
beforeAll(async () => {
  oracle = await OracleClient.start();
}, limit(120_000));
afterAll(async () => {
  await oracle?.close();
  rmSync(tmp, { recursive: true, force: true });
});

describe("MLX-bug attribution at the first divergent tap (CUDA classification simulated)", () => {
  it("a port defect on a checkpoint with recorded-bug layers fails: its first divergent tap is no bug's", async () => {
    // the checkpoint does have layers on the cuda-qmm-sm90 path
    expect(reachableMlxBug(DIR, 0, true)?.id).toBe("cuda-qmm-sm90");
    const before = process.env.MLX_BUGS_ASSUME_CUDA_GPU;
    process.env.MLX_BUGS_ASSUME_CUDA_GPU = "1";
    try {
      const spec = { tsDir: DIR, oracleCheckpoint: ID, model: "c3_e2b", variant: "q8g64", prompt: [2, 10, 20, 30], prefillStepSize: 2048, steps: 1, budget: { ulp: 0, atol: 0 } };
      // values taken from the normed keys instead of the raw projection: a real port bug
      const run = await withMutationAsync("v_norm_missing", () => runParity(oracle, spec));
      expect(run.firstDivergence?.tap).toBe("prefill0/layers.0/self_attn/v_norm");
      expect(run.mlxBug).toBeUndefined();
      expect(reportVerdict([run], null).text).toBe("FAIL");
      // and the same run without the defect is bit-exact (the divergence is the defect's)
      const clean = await runParity(oracle, spec);
      expect(clean.firstDivergence).toBeNull();
      expect(clean.tapsCompared).toBeGreaterThan(600);
      expect(reportVerdict([clean], null).text).toBe("PASS");
    } finally {
      if (before === undefined) delete process.env.MLX_BUGS_ASSUME_CUDA_GPU;
      else process.env.MLX_BUGS_ASSUME_CUDA_GPU = before;
    }
  }, limit(180_000));

  const bad = join(tmp, "q_proj_plus_one");
  const args = (out: string) => ["--model", bad, "--oracle-model", DIR, "--tokens", "2,10,20,30", "--steps", "1", "--out", join(tmp, out)];

  it("a first divergent tap at a one-group quantized matmul of 3 rows: PASS with known MLX bugs in every format, exit 0", () => {
    perturbCheckpoint(DIR, bad, "model.layers.0.self_attn.q_proj.weight", 3);
    const r = cli(args("known"));
    const m = /Verdict: PASS with known MLX bugs \(1 runs, (\d+) of (\d+) taps unverified\)/.exec(r.out);
    expect(m, r.out).not.toBeNull();
    expect(r.code, r.out).toBe(0);
    expect(r.out).toContain("the first divergent tap prefill0/layers.0/self_attn/q_proj is produced by a recorded MLX bug");
    const rep = JSON.parse(readFileSync(join(tmp, "known", "parity.json"), "utf8"));
    expect(rep.schema).toBe(SCHEMA_ID);
    expect(rep.verdict).toMatchObject({ status: "pass-with-known-mlx-bugs", mlxBugRuns: 1, unverifiedTaps: Number(m![1]), taps: Number(m![2]), strict: false });
    expect(rep.ok).toBe(true);
    expect(rep.runs[0].mlxBug).toMatchObject({ id: "cuda-qmm-sm90", tap: "prefill0/layers.0/self_attn/q_proj" });
    // the taps from the divergent one on are unverified: all but those before it
    expect(rep.runs[0].unverifiedTaps).toBe(rep.runs[0].taps.length - rep.runs[0].taps.findIndex((t: { name: string }) => t.name === "prefill0/layers.0/self_attn/q_proj"));
    expect(readFileSync(join(tmp, "known", "parity.md"), "utf8")).toContain(`Verdict: **${rep.verdict.text}**`);
    expect(readFileSync(join(tmp, "known", "parity.html"), "utf8")).toContain(`<span class="verdict known">${rep.verdict.text}</span>`);
  }, limit(180_000));

  it("op cases at a recorded MLX bug are known bugs too; any failure wins over them", () => {
    const op = { opsExposed: 2, opsTested: 2, cases: 5, bitExact: 3, unsupported: 0, mlxBug: 2, failed: 0, backend: "cuda", device: "gpu", workers: 2, vjp: { opsDifferentiable: 1, opsTested: 1, cases: 1, bitExact: 1, unsupported: 0, mlxBug: 0, failed: 0 }, nonExact: [] };
    expect(reportVerdict([], op).text).toBe("PASS with known MLX bugs (0 runs, 0 of 0 taps unverified, 2 op cases)");
    expect(reportVerdict([], op, null, true).text).toBe("FAIL (--strict: known MLX bugs, 0 runs, 0 of 0 taps unverified, 2 op cases)");
    expect(reportVerdict([], { ...op, bitExact: 2, failed: 1 }).text).toBe("FAIL");
    expect(reportVerdict([], { ...op, bitExact: 5, mlxBug: 0 }).text).toBe("PASS");
  });

  it("--strict turns it into a failure, exit 1", () => {
    const r = cli([...args("strict"), "--strict"]);
    expect(r.out).toMatch(/Verdict: FAIL \(--strict: known MLX bugs, 1 runs, \d+ of \d+ taps unverified\)/);
    expect(r.code, r.out).toBe(1);
    expect(JSON.parse(readFileSync(join(tmp, "strict", "parity.json"), "utf8")).verdict.status).toBe("fail");
  }, limit(180_000));
});
