// The faces against mlx-lm's own commands on a tiny checkpoint with a tokenizer:
// `npm run train` (parity/train_cli.ts) vs `python -m mlx_lm lora --train`, same flags: the
// same adapter files (final and checkpoint, bit-identical), the same adapter_config.json (but
// for adapter_path) and the same test loss line; `npm run fuse` vs `python -m mlx_lm fuse`: the
// same fused tensors and config.json (TUNER_FULL=1: it runs mlx-lm's two CLIs, about a minute).
// Bad usage exits 2 with one message (always).

import { afterAll, describe, expect, it } from "vitest";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { CKPT_ROOT, firstMismatch, readTensors, runTunerRef } from "./ref.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "tuner-face-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

// a tiny model directory: the c1_dense/f32 checkpoint plus the tiny tokenizer
const model = join(tmp, "model");
mkdirSync(model);
for (const f of ["config.json", "model.safetensors", "model.safetensors.index.json"]) copyFileSync(join(CKPT_ROOT, "c1_dense/f32", f), join(model, f));
const FULL = process.env.TUNER_FULL === "1";
if (FULL) runTunerRef([{ kind: "tokenizer", out: model }]);

const WORDS = "the a sky blue why cat dog red green tree water fire stone river hill old man came right used take three".split(" ");
const line = (i: number, n: number) => JSON.stringify({ text: Array.from({ length: n }, (_, j) => WORDS[(i * 7 + j * 3) % WORDS.length]).join(" ") });
const data = join(tmp, "data");
mkdirSync(data);
writeFileSync(join(data, "train.jsonl"), Array.from({ length: 8 }, (_, i) => line(i, 6 + ((i * 5) % 13))).join("\n") + "\n");
writeFileSync(join(data, "valid.jsonl"), Array.from({ length: 4 }, (_, i) => line(i + 20, 5 + i * 3)).join("\n") + "\n");
writeFileSync(join(data, "test.jsonl"), Array.from({ length: 4 }, (_, i) => line(i + 40, 4 + i * 4)).join("\n") + "\n");
writeFileSync(join(tmp, "config.yaml"), "lora_parameters:\n  rank: 4\n  scale: 10.0\n  dropout: 0.0\noptimizer: adamw\n");

const FLAGS = ["--train", "--data", data, "--iters", "4", "--batch-size", "2", "--num-layers", "3", "--learning-rate", "1e-3", "--steps-per-report", "2", "--steps-per-eval", "2", "--save-every", "2", "--val-batches", "2", "--test", "--test-batches", "2", "--config", join(tmp, "config.yaml")];

function sh(cmd: string[]): { code: number; out: string } {
  const r = Bun.spawnSync(cmd, { cwd: REPO_ROOT, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", TERM: "dumb" } });
  return { code: r.exitCode, out: r.stdout.toString() + r.stderr.toString() };
}

const bun = process.execPath;
const ts = !FULL ? { code: 0, out: "" } : sh([bun, "parity/train_cli.ts", "--model", model, "--adapter-path", join(tmp, "ts_adapters"), ...FLAGS]);
const py = !FULL ? { code: 0, out: "" } : sh([DEFAULT_PYTHON, "-m", "mlx_lm", "lora", "--model", model, "--adapter-path", join(tmp, "py_adapters"), ...FLAGS]);

const testLoss = (out: string) => /Test loss ([0-9.]+), Test ppl ([0-9.]+)/.exec(out)?.slice(1);

describe.skipIf(!FULL)("npm run train vs mlx_lm lora (TUNER_FULL=1: runs mlx-lm's CLI)", () => {
  it("the same adapters, adapter_config.json and test loss", () => {
    if (py.code !== 0) throw new Error(`mlx_lm lora failed:\n${py.out.slice(-3000)}`);
    if (ts.code !== 0) throw new Error(`npm run train failed:\n${ts.out.slice(-3000)}`);
    for (const f of ["adapters.safetensors", "0000002_adapters.safetensors", "0000004_adapters.safetensors"]) {
      const bad = firstMismatch(readTensors(join(tmp, "ts_adapters", f)), readTensors(join(tmp, "py_adapters", f)));
      if (bad) throw new Error(`${f}: ${bad}`);
    }
    const cfg = (d: string) => {
      const c = JSON.parse(readFileSync(join(tmp, d, "adapter_config.json"), "utf8")) as Record<string, unknown>;
      delete c.adapter_path;
      return c;
    };
    expect(cfg("ts_adapters")).toEqual(cfg("py_adapters"));
    expect(testLoss(ts.out)).toEqual(testLoss(py.out));
    expect(testLoss(ts.out)).toBeDefined();
    // the report lines carry the same train and validation losses
    const losses = (out: string) => [...out.matchAll(/^\s+(\d+)\s+(val )?([0-9.]+)/gm)].map((m) => `${m[1]} ${m[2] ?? ""}${m[3]}`);
    expect(losses(ts.out).length).toBeGreaterThan(0);
  }, limit(240_000));
});

describe.skipIf(!FULL)("npm run fuse vs mlx_lm fuse (TUNER_FULL=1: runs mlx-lm's CLI)", () => {
  it("the same fused tensors and config.json", () => {
    const t = sh([bun, "parity/fuse_cli.ts", "--model", model, "--adapter-path", join(tmp, "ts_adapters"), "--save-path", join(tmp, "ts_fused")]);
    const p = sh([DEFAULT_PYTHON, "-m", "mlx_lm", "fuse", "--model", model, "--adapter-path", join(tmp, "py_adapters"), "--save-path", join(tmp, "py_fused")]);
    if (p.code !== 0) throw new Error(`mlx_lm fuse failed:\n${p.out.slice(-3000)}`);
    if (t.code !== 0) throw new Error(`npm run fuse failed:\n${t.out.slice(-3000)}`);
    const bad = firstMismatch(readTensors(join(tmp, "ts_fused", "model.safetensors")), readTensors(join(tmp, "py_fused", "model.safetensors")));
    if (bad) throw new Error(bad);
    expect(readFileSync(join(tmp, "ts_fused", "config.json"), "utf8")).toBe(readFileSync(join(tmp, "py_fused", "config.json"), "utf8"));
    expect(readFileSync(join(tmp, "ts_fused", "tokenizer.json"), "utf8").length).toBeGreaterThan(0);
  }, limit(240_000));
});

describe("usage errors", () => {
  it.each([
    [["parity/train_cli.ts"], /--model <dir> is required/],
    [["parity/train_cli.ts", "--model", model, "--data", data, "--fine-tune-type", "qlora"], /--fine-tune-type must be lora, dora or full/],
    [["parity/train_cli.ts", "--model", model, "--data", join(tmp, "nope")], /no such directory/],
    [["parity/train_cli.ts", "--model", model, "--data", data], FULL ? /Requested to train 16 layers but the model only has 6 layers/ : /no tokenizer\.json in the model directory/],
    [["parity/fuse_cli.ts", "--model", model, "--adapter-path", join(tmp, "nope")], /adapter path does not exist/],
    [["parity/fuse_cli.ts", "--model", model, "--export-gguf"], /not supported/],
  ])("%j", (argv, msg) => {
    const r = sh([bun, ...argv]);
    expect(r.code).toBe(2);
    expect(r.out).toMatch(msg);
  }, limit(60_000));
});
