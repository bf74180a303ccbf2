// Bad input to `npm run parity`: one clear message, a non-zero exit, no stack trace.
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";

const tmp = mkdtempSync(join(tmpdir(), "parity-cli-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function cli(args: string[], env: Record<string, string> = {}): { code: number | null; out: string } {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", "cli.ts"), ...args], { cwd: REPO_ROOT, encoding: "utf8", env: { ...process.env, ...env }, timeout: 120_000 });
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

describe("parity CLI bad input", { timeout: 120_000 }, () => {
  it("rejects a non-Gemma-4 checkpoint", () => {
    expectClean(cli(["--model", fakeCheckpoint("llama", { model_type: "llama" }), "--tokens", "1,2"]), 2, /not a Gemma 4 checkpoint: config.json has model_type 'llama'/);
  });

  it("rejects a missing directory and a file given as the directory", () => {
    expectClean(cli(["--model", join(tmp, "nope"), "--tokens", "1"]), 2, /checkpoint directory not found/);
    const f = join(tmp, "file");
    writeFileSync(f, "x");
    expectClean(cli(["--model", f, "--tokens", "1"]), 2, /not a directory/);
  });

  it("rejects a directory without config.json", () => {
    const d = join(tmp, "empty");
    mkdirSync(d, { recursive: true });
    expectClean(cli(["--model", d, "--tokens", "1"]), 2, /has no config.json/);
  });

  it("needs tokenizer.json for --prompt", () => {
    expectClean(cli(["--model", fakeCheckpoint("notok", gemma), "--prompt", "hello"]), 2, /--prompt needs .*tokenizer.json, which is missing/);
  });

  it("rejects a prompt longer than max_position_embeddings", () => {
    const tokens = Array.from({ length: 70 }, (_, i) => i % 200).join(",");
    expectClean(cli(["--model", fakeCheckpoint("short", gemma), "--tokens", tokens, "--steps", "1"]), 2, /exceeds the model's max_position_embeddings \(64\)/);
  });

  it("rejects unknown flags and bad values", () => {
    expectClean(cli(["--frobnicate"]), 2, /unknown flag --frobnicate/);
    expectClean(cli(["--steps", "x"]), 2, /--steps needs an integer/);
    expectClean(cli(["--tokens", "1,2"]), 2, /--tokens needs --model/);
  });

  it("reports an oracle that cannot start (missing venv)", () => {
    const d = fakeCheckpoint("ok", gemma);
    copyFileSync(join(d, "config.json"), join(d, "config.json"));
    expectClean(cli(["--model", d, "--tokens", "1,2"], { ORACLE_PYTHON: join(tmp, "no-venv", "bin", "python") }), 1, /python interpreter not found: .*no-venv.*\(run npm run setup\)/);
  });

  it("documents every flag in --help", () => {
    const r = cli(["--help"]);
    expect(r.code).toBe(0);
    for (const f of ["--model", "--prompt", "--chat", "--tokens", "--steps", "--prefill-step-size", "--ulp", "--atol", "--bisect"]) expect(r.out).toContain(f);
  });
});
