// Conformance engine "gemma4-pt-claude": the third-party PyTorch port on PyPI (0.2.0) runs one
// forward over a prompt on a fixture checkpoint; engines/gemma4_pt_claude/pt_dump.py builds its
// TextConfig by hand, loads the weights with the port's own loader and reads level 1 (scaled
// embeddings, every block's output, the final norm, the logits) through hooks; this entry writes
// the conformance dump (oracle/conform/FORMAT.md) with the shared writer. The port lives in the
// on-demand .venv-reference (requirements-reference.txt; ensureVenv).
//
//   bun engines/gemma4_pt_claude/dump.ts --checkpoint c1_dense/f32 --out DIR [--dtype bfloat16]
//                                        [--prompt 2,17,33 | --seed N]
// Exit 0: dump written; 2: bad usage or input; 1: the engine failed (its message on stderr).
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadConfig } from "../../model/gemma4/index.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { checkpointHashes, type DumpManifest, writeDump } from "../../oracle/conform/dump.ts";
import { ensureVenv } from "../../oracle/reference_export.ts";
import { EngineUsageError, levelOf, resolveCheckpoint, seededPrompt, type TorchDtype } from "../transformers/dump.ts";

export const ENGINE = "gemma4-pt-claude";
const SCRIPT = join(REPO_ROOT, "engines", "gemma4_pt_claude", "pt_dump.py");

export interface PortDumpResult {
  manifest: DumpManifest;
  versions: Record<string, string>;
  /** load_weights(strict=True)'s error, when it refused the checkpoint (the dump then comes from strict=False). */
  strictRefusal: string | null;
  missingUnused: string[];
  /** Config fields the port has no place for, said in words. */
  notes: string[];
}

let seq = 0;

/** Runs the port on one forward and writes the dump to `out` (replacing a dump there). */
export function portDump(opts: { checkpoint: string; out: string; dtype: TorchDtype; prompt: number[] }): PortDumpResult {
  const dir = opts.checkpoint;
  const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  const { args } = loadConfig(dir);
  const bad = opts.prompt.find((t) => !Number.isInteger(t) || t < 0 || t >= args.vocab_size);
  if (opts.prompt.length === 0 || bad !== undefined) throw new EngineUsageError(`prompt: token ids must be integers in [0, ${args.vocab_size}); got ${bad ?? "none"}`);
  const py = ensureVenv();
  const tmp = join(REPO_ROOT, ".cache", `pt-claude-run-${process.pid}-${seq++}`);
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    writeFileSync(join(tmp, "job.json"), JSON.stringify({ dir, args, tokens: opts.prompt, dtype: opts.dtype }));
    const r = spawnSync(py, ["-W", "ignore::RuntimeWarning", SCRIPT, join(tmp, "job.json"), tmp], { cwd: REPO_ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 26 });
    if (r.error || r.status !== 0) throw new Error(`gemma4-pt-claude (pt_dump.py) failed: ${r.error?.message ?? `exit ${r.status}`}\n${(r.stderr ?? "").trim().split("\n").slice(-4).join("\n")}`);
    const out = JSON.parse(r.stdout.trim().split("\n").pop()!) as { versions: Record<string, string>; written: string[]; strict_refusal: string | null; missing_unused: string[]; notes: string[] };
    const st = mx.loadSafetensors(join(tmp, "tensors.safetensors"));
    try {
      const level = levelOf(config, opts.prompt.length, new Set(out.written));
      if (level === null) throw new Error("gemma4-pt-claude gave no logits");
      const notes = [
        `torch ${out.versions.torch}; TextConfig built from config.json by hand; explicit causal mask; level 1 through hooks on text_decoder.blocks[i]`,
        out.strict_refusal ? `load_weights(strict=True) refused: ${out.strict_refusal}; loaded with strict=False (left out: ${out.missing_unused.join(", ")})` : "load_weights(strict=True) accepted the checkpoint",
        ...out.notes,
      ];
      const manifest = writeDump(
        opts.out,
        {
          engine: { name: ENGINE, version: out.versions["gemma4-pt-claude"]!, device: "cpu", dtype: opts.dtype },
          checkpoint: { files: checkpointHashes(dir) },
          prompt: opts.prompt,
          schedule: { kind: "forward" },
          level,
          notes: notes.join("; "),
        },
        out.written.map((n) => [n, st.arrays.get(n)!] as [string, mx.MlxArray]),
      );
      return { manifest, versions: out.versions, strictRefusal: out.strict_refusal, missingUnused: out.missing_unused, notes: out.notes };
    } finally {
      for (const a of st.arrays.values()) a.dispose();
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

if (import.meta.main) {
  try {
    const argv = process.argv.slice(2);
    const v: Record<string, string> = {};
    for (let i = 0; i < argv.length; i += 2) {
      const flag = argv[i]!;
      if (!["--checkpoint", "--out", "--dtype", "--prompt", "--seed"].includes(flag)) throw new EngineUsageError(`unknown flag ${flag} (flags: --checkpoint --out --dtype --prompt --seed)`);
      if (argv[i + 1] === undefined) throw new EngineUsageError(`${flag} needs a value`);
      v[flag.slice(2)] = argv[i + 1]!;
    }
    if (!v.checkpoint || !v.out) throw new EngineUsageError("--checkpoint and --out are required");
    const dtype = (v.dtype ?? "float32") as TorchDtype;
    if (dtype !== "float32" && dtype !== "bfloat16") throw new EngineUsageError(`--dtype must be float32 or bfloat16, got ${v.dtype}`);
    const dir = resolveCheckpoint(v.checkpoint);
    const prompt = v.prompt ? v.prompt.split(",").map((s) => Number(s.trim())) : seededPrompt(dir, Number(v.seed ?? 1));
    const r = portDump({ checkpoint: dir, out: resolve(v.out), dtype, prompt });
    process.stderr.write(`[gemma4-pt-claude] ${v.checkpoint} ${dtype}: level ${r.manifest.level}, ${r.manifest.tensors.length} tensors${r.strictRefusal ? `; strict load refused: ${r.strictRefusal}` : ""}${r.notes.length ? `; ${r.notes.join("; ")}` : ""} -> ${v.out}\n`);
    process.exit(0);
  } catch (e) {
    const usage = e instanceof EngineUsageError || (e as Error).name === "DumpError" || (e as Error).name === "ConfigError";
    process.stderr.write(`error: ${(e as Error).message}\n`);
    process.exit(usage ? 2 : 1);
  }
}
