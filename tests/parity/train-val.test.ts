// `npm run train`: the validation lines carry the iteration numbers mlx_lm.lora prints. mlx-lm's
// trainer (mlx_lm/tuner/trainer.py, 0.32.2) validates before iteration `it` (1-based) when
// it == 1, it % steps_per_eval == 0 or it == iters, and prints `ui.report_val(it, ...)`; only its
// training callback gets it - 1. The face once printed the callback's number: "0 val" where
// mlx_lm.lora prints "1 val". Run on c1_dense/f32 with a tiny tokenizer (oracle/python/tuner_ref.py),
// 4 iterations, a validation every 2: mlx-lm's lines are 1, 2 and 4. With TUNER_FULL=1 the same
// flags also run `python -m mlx_lm lora` and its printed numbers are compared.
import { afterAll, describe, expect, it } from "vitest";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { limit } from "../time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "train-val-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function sh(cmd: string[], stdin?: string): { code: number; out: string } {
  const r = Bun.spawnSync(cmd, { cwd: REPO_ROOT, stdin: stdin === undefined ? undefined : new TextEncoder().encode(stdin), stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1", TERM: "dumb" } });
  return { code: r.exitCode, out: r.stdout.toString() + r.stderr.toString() };
}

/** The iteration numbers of the "N    val L" lines (mlx-lm's rich console colours them even with NO_COLOR). */
const valIterations = (out: string) => [...out.replace(/\x1b\[[0-9;]*m/g, "").matchAll(/^\s+(\d+)\s+val\s+[0-9.]+/gm)].map((m) => Number(m[1]));

describe("npm run train: validation line numbers", () => {
  it("are mlx_lm.lora's: 1, 2 and 4 for 4 iterations with --steps-per-eval 2", () => {
    const model = join(tmp, "model");
    const data = join(tmp, "data");
    mkdirSync(model);
    mkdirSync(data);
    for (const f of ["config.json", "model.safetensors", "model.safetensors.index.json"]) copyFileSync(join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32", f), join(model, f));
    const tok = sh([DEFAULT_PYTHON, "-I", join(REPO_ROOT, "oracle", "python", "tuner_ref.py")], JSON.stringify([{ kind: "tokenizer", out: model }]));
    expect(tok.code, tok.out).toBe(0);
    const words = "the a sky blue why cat dog red green tree water fire stone river hill old man came right used take three".split(" ");
    const line = (i: number, n: number) => JSON.stringify({ text: Array.from({ length: n }, (_, j) => words[(i * 7 + j * 3) % words.length]).join(" ") });
    writeFileSync(join(data, "train.jsonl"), `${Array.from({ length: 8 }, (_, i) => line(i, 6 + ((i * 5) % 13))).join("\n")}\n`);
    writeFileSync(join(data, "valid.jsonl"), `${Array.from({ length: 4 }, (_, i) => line(i + 20, 5 + i * 3)).join("\n")}\n`);
    const flags = ["--train", "--data", data, "--iters", "4", "--batch-size", "2", "--num-layers", "3", "--steps-per-report", "2", "--steps-per-eval", "2", "--val-batches", "2"];
    const ts = sh([process.execPath, join(REPO_ROOT, "parity", "train_cli.ts"), "--model", model, "--adapter-path", join(tmp, "ts"), ...flags]);
    expect(ts.code, ts.out).toBe(0);
    expect(valIterations(ts.out)).toEqual([1, 2, 4]);
    if (process.env.TUNER_FULL === "1") {
      const py = sh([DEFAULT_PYTHON, "-m", "mlx_lm", "lora", "--model", model, "--adapter-path", join(tmp, "py"), ...flags]);
      expect(py.code, py.out.slice(-2000)).toBe(0);
      expect(valIterations(ts.out)).toEqual(valIterations(py.out));
    }
  }, limit(180_000));
});
