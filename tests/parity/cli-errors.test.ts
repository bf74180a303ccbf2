// Bad input to `npm run parity`: one clear message, a non-zero exit, no stack trace.
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import * as mx from "@mlx-bun/mlx";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { limit } from "../time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "parity-cli-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function cli(args: string[], env: Record<string, string> = {}): { code: number | null; out: string } {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", "cli.ts"), ...args], { cwd: REPO_ROOT, encoding: "utf8", env: { ...process.env, ...env }, timeout: limit(120_000) });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

function expectClean(r: { code: number | null; out: string }, code: number, message: RegExp): void {
  expect(r.out).toMatch(message);
  expect(r.code).toBe(code);
  expect(r.out).not.toMatch(/\n\s+at .+:\d+:\d+/); // no stack frames
}

// A minimal checkpoint directory: config + an (empty-tensor) safetensors file.
function fakeCheckpoint(name: string, config: Record<string, unknown>): string {
  const d = join(tmp, name);
  mkdirSync(d, { recursive: true });
  writeFileSync(join(d, "config.json"), JSON.stringify(config));
  const header = Buffer.from(JSON.stringify({ __metadata__: {} }));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(header.length));
  writeFileSync(join(d, "model.safetensors"), Buffer.concat([len, header]));
  return d;
}

const gemma = { model_type: "gemma4_text", vocab_size: 256, max_position_embeddings: 64 };

const FIXTURE = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");

/** A copy of the c1_dense/f32 fixture with one defect made by `edit` (on the copy's directory). */
function fixtureCopy(name: string, edit: (dir: string, config: Record<string, unknown>) => void): string {
  const d = join(tmp, name);
  mkdirSync(d, { recursive: true });
  copyFileSync(join(FIXTURE, "model.safetensors"), join(d, "model.safetensors"));
  const config = JSON.parse(readFileSync(join(FIXTURE, "config.json"), "utf8")) as Record<string, unknown>;
  edit(d, config);
  writeFileSync(join(d, "config.json"), JSON.stringify(config));
  return d;
}

/** Rewrites the copy's safetensors header. */
function editHeader(dir: string, f: (h: Record<string, { dtype: string; shape: number[]; data_offsets: number[] }>) => void): void {
  const p = join(dir, "model.safetensors");
  const b = readFileSync(p);
  const n = Number(b.readBigUInt64LE(0));
  const h = JSON.parse(b.subarray(8, 8 + n).toString("utf8"));
  f(h);
  const text = Buffer.from(JSON.stringify(h).padEnd(n, " "));
  if (text.length !== n) throw new Error("edited header must keep its length");
  writeFileSync(p, Buffer.concat([b.subarray(0, 8), text, b.subarray(8 + n)]));
}

// each test has its own limit: bun takes no timeout from a describe
describe("parity CLI bad input", () => {
  it("rejects a non-Gemma-4 checkpoint", () => {
    expectClean(cli(["--model", fakeCheckpoint("llama", { model_type: "llama" }), "--tokens", "1,2"]), 2, /not a Gemma 4 checkpoint: config.json has model_type 'llama'/);
  }, limit(120_000));

  it("rejects a missing directory and a file given as the directory", () => {
    expectClean(cli(["--model", join(tmp, "nope"), "--tokens", "1"]), 2, /checkpoint directory not found/);
    const f = join(tmp, "file");
    writeFileSync(f, "x");
    expectClean(cli(["--model", f, "--tokens", "1"]), 2, /not a directory/);
  }, limit(120_000));

  it("rejects a directory without config.json", () => {
    const d = join(tmp, "empty");
    mkdirSync(d, { recursive: true });
    expectClean(cli(["--model", d, "--tokens", "1"]), 2, /has no config.json/);
  }, limit(120_000));

  it("needs tokenizer.json for --prompt", () => {
    expectClean(cli(["--model", fakeCheckpoint("notok", gemma), "--prompt", "hello"]), 2, /--prompt needs .*tokenizer.json, which is missing/);
  }, limit(120_000));

  it("rejects a prompt longer than max_position_embeddings", () => {
    const tokens = Array.from({ length: 70 }, (_, i) => i % 200).join(",");
    expectClean(cli(["--model", fakeCheckpoint("short", gemma), "--tokens", tokens, "--steps", "1"]), 2, /exceeds the model's max_position_embeddings \(64\)/);
  }, limit(120_000));

  it("rejects unknown flags and bad values", () => {
    expectClean(cli(["--frobnicate"]), 2, /unknown flag --frobnicate/);
    expectClean(cli(["--steps", "x"]), 2, /--steps needs an integer/);
    expectClean(cli(["--tokens", "1,2"]), 2, /--tokens needs --model/);
  }, limit(120_000));

  it("reports an oracle that cannot start (missing venv): exit 3, the oracle's own code", () => {
    const d = fixtureCopy("ok", () => {});
    expectClean(cli(["--model", d, "--tokens", "1,2"], { ORACLE_PYTHON: join(tmp, "no-venv", "bin", "python") }), 3, /the oracle failed, no verdict \(exit 3\): python interpreter not found: .*no-venv.*\(run npm run setup\)/);
  }, limit(120_000));

  // Issue 15: a checkpoint the TS loader refuses is refused by our pre-flight check (config,
  // shapes, files; no weights read), with our message naming file and key, and no Python
  // process is started for it (ORACLE_PYTHON records any start).
  it("refuses bad checkpoints before an oracle process starts", () => {
    const marker = join(tmp, "oracle-started");
    const recorder = join(tmp, "recording-python");
    writeFileSync(recorder, `#!/bin/sh\ntouch '${marker}'\nexit 1\n`, { mode: 0o755 });
    const cases: [string, (d: string, c: Record<string, unknown>) => void, (d: string) => RegExp][] = [
      ["truncated", (d) => truncateSync(join(d, "model.safetensors"), 500_000), (d) => new RegExp(`${join(d, "model.safetensors")} \\[model\\.[\\w.]+\\]: truncated safetensors file`)],
      ["negative_heads", (_d, c) => void (c.num_attention_heads = -4), (d) => new RegExp(`${join(d, "config.json")}: num_attention_heads: must be a positive integer, got -4`)],
      ["shape_mismatch", (_d, c) => void (c.intermediate_size = 96), () => /model\.layers\.0\.mlp\.gate_proj\.weight .*expected shape \(96, 64\) but received shape \(128, 64\)/],
      ["bad_layer_type", (_d, c) => void ((c.layer_types as string[])[2] = "chunked_attention"), () => /config\.json: layer_types\[2\]: unknown layer type "chunked_attention"/],
      ["bad_dtype", (d) => editHeader(d, (h) => void (h["model.norm.weight"]!.dtype = "F8")), () => /\[model\.norm\.weight\]: unsupported or missing dtype "F8"/],
      ["overlap", (d) => editHeader(d, (h) => {
        const b = h["model.layers.0.layer_scalar"]!.data_offsets[0]!;
        h["model.norm.weight"]!.data_offsets = [b, b + 256];
      }), () => /\[model\.[\w.]+, model\.[\w.]+\]: corrupt safetensors header: the data of .+ and .+ overlap/],
    ];
    for (const [name, edit, message] of cases) {
      const d = fixtureCopy(name, edit);
      expectClean(cli(["--model", d, "--tokens", "2,7,1"], { ORACLE_PYTHON: recorder }), 2, message(d));
      expect(existsSync(marker), `${name}: an oracle process was started`).toBe(false);
    }
    // a good checkpoint does start it (the recorder then dies: an oracle failure, exit 3)
    const ok = cli(["--model", fixtureCopy("good", () => {}), "--tokens", "2,7,1"], { ORACLE_PYTHON: recorder });
    expect(ok.code).toBe(3);
    expect(existsSync(marker)).toBe(true);
  }, limit(300_000));

  it("documents every flag in --help", () => {
    const r = cli(["--help"]);
    expect(r.code).toBe(0);
    for (const f of ["--model", "--prompt", "--chat", "--tokens", "--steps", "--prefill-step-size", "--ulp", "--atol", "--bisect", "--device"]) expect(r.out).toContain(f);
  }, limit(120_000));

  it("rejects an unknown device, and a GPU where libmlx has none, before the oracle starts", () => {
    expectClean(cli(["--device", "tpu"]), 2, /--device must be cpu or gpu, got 'tpu'/);
    // the oracle would fail to start (no venv): the device check comes first
    const noVenv = { ORACLE_PYTHON: join(tmp, "no-venv", "bin", "python") };
    if (!mx.isAvailable("gpu")) expectClean(cli(["--device", "gpu", "--skip-ops"], noVenv), 2, /--device gpu: no GPU is available to MLX here: this libmlx has the CPU backend only/);
    expectClean(cli(["--device", "cpu", "--skip-ops", "--only", "c1_dense/f32"], noVenv), 3, /python interpreter not found/);
  }, limit(120_000));
});

describe("setup bad input", () => {
  // Setup runs under node (npm run setup); where there is no node (the offline GPU machine), under
  // bun, which has the Node APIs it uses.
  const runtime = Bun.which("node") ?? process.execPath;
  const setup = (env: Record<string, string>) => {
    const r = spawnSync(runtime, [join(REPO_ROOT, "scripts", "setup.mjs"), "--quiet"], { cwd: REPO_ROOT, encoding: "utf8", env: { ...process.env, ...env }, timeout: limit(120_000) });
    return { code: r.status, out: `${r.stdout}${r.stderr}` };
  };
  it.skipIf(existsSync("/proc/driver/nvidia/version"))("refuses MLX_BACKEND=cuda on a machine without an NVIDIA driver, with one message", () => {
    expectClean(setup({ MLX_BACKEND: "cuda" }), 1, /MLX_BACKEND=cuda, but this machine has no NVIDIA GPU driver/);
  }, limit(120_000));
  it("refuses an unknown backend and an unknown device", () => {
    // both are refused before setup's first step, so nothing installs
    expectClean(setup({ MLX_BACKEND: "rocm" }), 1, /MLX_BACKEND=rocm is not a backend for/);
    expectClean(setup({ MLX_DEVICE: "tpu" }), 1, /MLX_DEVICE=tpu is not a device/);
  }, limit(120_000));
  it("has one requirements file per backend, each pinning its wheel to mlx's version", () => {
    const common = readFileSync(join(REPO_ROOT, "requirements.txt"), "utf8");
    const mlxPin = common.match(/^mlx==(\S+)$/m)?.[1];
    expect(mlxPin).toBeDefined();
    for (const [backend, wheel] of [["cpu", "mlx-cpu"], ["cuda", "mlx-cuda-13"], ["metal", "mlx-metal"]]) {
      const req = readFileSync(join(REPO_ROOT, "requirements", `${backend}.txt`), "utf8");
      expect(req).toContain("-r ../requirements.txt");
      expect(req.match(new RegExp(`^${wheel}==(\\S+)$`, "m"))?.[1]).toBe(mlxPin);
    }
  }, limit(120_000));
  it.skipIf(mx.isAvailable("gpu"))("refuses MLX_DEVICE=gpu where libmlx has no GPU", () => {
    expectClean(setup({ MLX_DEVICE: "gpu" }), 1, /MLX_DEVICE=gpu, but this libmlx has no GPU here/);
  }, limit(120_000));
});
