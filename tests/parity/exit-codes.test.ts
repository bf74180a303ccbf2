// Every exit code `npm run parity` documents (--help, README): 0 within budget, 1 divergence,
// 2 bad usage or input, 3 the oracle failed. Each is a real run of parity/cli.ts on a tiny
// fixture (4 prompt tokens, 1 decode step):
//  0: c1_dense/f32 as it is: Verdict: PASS;
//  1: c3_e2b/q8g64 with input_layernorm's weight moved by 1 ULP on the TS side (mlx-lm loads the
//     original through --oracle-model), the CUDA classification simulated
//     (MLX_BUGS_ASSUME_CUDA_GPU=1): the checkpoint has layers on the cuda-qmm-sm90 path, but the
//     first divergent tap is a norm, so the verdict is FAIL;
//  2: a bad flag value, refused before any oracle starts;
//  3: an oracle that raises (a stand-in speaking the oracle's protocol answers every command with
//     mlx-vlm's `[GatherMM::eval] Currently only supports float32` ValueError, as mlx-vlm does for
//     a bfloat16 MoE checkpoint on the CPU), and an oracle process that dies at start.
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { perturbCheckpoint } from "../../parity/perturb.ts";
import { limit } from "../time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "parity-exit-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const ck = (id: string) => join(REPO_ROOT, ".cache", "checkpoints", id);

function cli(args: string[], env: Record<string, string> = {}): { code: number | null; out: string } {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", "cli.ts"), ...args], { cwd: REPO_ROOT, encoding: "utf8", env: { ...process.env, ...env }, timeout: limit(180_000) });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

const RUN = ["--tokens", "2,10,20,30", "--steps", "1"];

// The oracle's wire protocol (oracle/python/server.py): a ready line, then one JSON reply per request.
const RAISING_ORACLE = `import json, os, sys
print(json.dumps({"event": "ready", "pid": os.getpid(), "versions": {"mlx": "stand-in"}, "tmpdir": ${JSON.stringify(tmp)}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["cmd"] == "shutdown":
        print(json.dumps({"id": req["id"], "ok": True}), flush=True)
        break
    err = {"type": "ValueError", "message": "[GatherMM::eval] Currently only supports float32.", "traceback": "Traceback (most recent call last): ..."}
    print(json.dumps({"id": req["id"], "ok": False, "error": err}), flush=True)
`;

describe("parity exit codes", () => {
  it("0: within budget (PASS)", () => {
    const r = cli(["--model", ck("c1_dense/f32"), ...RUN, "--out", join(tmp, "pass")]);
    expect(r.out).toMatch(/\nVerdict: PASS\n/);
    expect(r.code, r.out).toBe(0);
  }, limit(180_000));

  it("1: a divergence whose first divergent tap no recorded MLX bug produced (FAIL), even on a checkpoint with layers on a bug's path", () => {
    const bad = join(tmp, "norm_plus_one");
    perturbCheckpoint(ck("c3_e2b/q8g64"), bad, "model.layers.0.input_layernorm.weight", 0);
    const r = cli(["--model", bad, "--oracle-model", ck("c3_e2b/q8g64"), ...RUN, "--out", join(tmp, "fail")], { MLX_BUGS_ASSUME_CUDA_GPU: "1" });
    expect(r.out).toContain("prefill0/layers.0/input_layernorm");
    expect(r.out).toMatch(/\nVerdict: FAIL\n/);
    expect(r.code, r.out).toBe(1);
    const rep = JSON.parse(readFileSync(join(tmp, "fail", "parity.json"), "utf8"));
    expect(rep.runs[0].mlxBug).toBeUndefined();
    expect(rep.verdict.status).toBe("fail");
  }, limit(180_000));

  it("2: bad usage or input, before any oracle starts", () => {
    const r = cli(["--model", ck("c1_dense/f32"), "--tokens", "2,10", "--steps", "0"]);
    expect(r.out).toMatch(/error: --steps must be at least 1/);
    expect(r.code, r.out).toBe(2);
  }, limit(180_000));

  it("3: the oracle raises: its own code and message, not a divergence", () => {
    const fake = join(tmp, "raising-oracle");
    writeFileSync(fake, `#!${join(REPO_ROOT, ".venv", "bin", "python")}\n${RAISING_ORACLE}`);
    chmodSync(fake, 0o755);
    const r = cli(["--model", ck("c1_dense/f32"), ...RUN, "--out", join(tmp, "raise")], { ORACLE_PYTHON: fake });
    expect(r.out).toContain("error: the oracle failed, no verdict (exit 3): oracle capture failed: ValueError: [GatherMM::eval] Currently only supports float32.");
    expect(r.out).not.toContain("Verdict:");
    expect(r.code, r.out).toBe(3);
  }, limit(180_000));

  it("3: the oracle process dies", () => {
    const dead = join(tmp, "dying-oracle");
    writeFileSync(dead, "#!/bin/sh\nexit 7\n");
    chmodSync(dead, 0o755);
    const r = cli(["--model", ck("c1_dense/f32"), ...RUN], { ORACLE_PYTHON: dead });
    expect(r.out).toMatch(/error: the oracle failed, no verdict \(exit 3\): oracle process exited \(code 7\)/);
    expect(r.code, r.out).toBe(3);
  }, limit(180_000));

  it("--help documents every code", () => {
    const r = cli(["--help"]);
    expect(r.code).toBe(0);
    for (const line of [/ {2}0 {2}within budget/, / {2}1 {2}divergence/, / {2}2 {2}bad usage or input/, / {2}3 {2}the oracle failed/, /--strict/]) expect(r.out).toMatch(line);
  }, limit(60_000));
});
