// The transformers reference export (the work of `npm run reference:export`; its command face is
// parity/reference_export_cli.ts): transformers' float32 logits and hidden states for every float32
// fixture checkpoint, into fixtures/reference/ (small committed files; versions in manifest.json).
// Also what engines/ reuse: the reference venv (ensureVenv) and the seeded prompts (tokensFor).
//
// torch and transformers are installed on demand into a separate git-ignored venv,
// .venv-reference (requirements-reference.txt; about 5.6 GB with torch's CUDA wheels, which
// PyPI serves for Linux x86_64; nothing uses a GPU). The default setup never installs them, and
// the comparison test (suites/reference) needs only the exported files.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig, loadModel } from "../model/gemma4/index.ts";
import { REPO_ROOT } from "./client.ts";
import { compareWithReference, REFERENCE_BOUND, REFERENCE_DIR, type ReferenceFixture, type ReferenceManifest, sha256File } from "./reference.ts";

const VENV = join(REPO_ROOT, ".venv-reference");
const REQUIREMENTS = join(REPO_ROOT, "requirements-reference.txt");
const CKPT = join(REPO_ROOT, ".cache", "checkpoints");
/** Tokens per reference forward: twice the fixtures' sliding window (8), so the window masks. */
export const TOKENS = 16;

const log = (m: string) => process.stderr.write(`[reference] ${m}\n`);

function run(cmd: string, args: string[], what: string): string {
  const r = spawnSync(cmd, args, { cwd: REPO_ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"], maxBuffer: 1 << 26 });
  if (r.error || r.status !== 0) throw new Error(`${what} failed (${r.error?.message ?? `exit ${r.status}`})`);
  return r.stdout;
}

/** The reference venv, made from the oracle venv's base interpreter; re-installed when the pins change (also used by the conformance engines in engines/). */
export function ensureVenv(): string {
  const py = join(VENV, "bin", "python");
  const stamp = join(VENV, ".requirements.sha256");
  const want = createHash("sha256").update(readFileSync(REQUIREMENTS)).update(process.platform + process.arch).digest("hex");
  if (existsSync(py) && existsSync(stamp) && readFileSync(stamp, "utf8") === want) return py;
  const base = run(join(REPO_ROOT, ".venv", "bin", "python"), ["-c", "import sys; print(sys._base_executable)"], "finding the base Python (run npm run setup first)").trim();
  if (!existsSync(py)) {
    log(`creating ${VENV} with ${base}`);
    run(base, ["-m", "venv", VENV], "creating the reference venv");
  }
  log("installing torch and transformers (requirements-reference.txt; a few GB, once)");
  run(py, ["-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", REQUIREMENTS], "pip install -r requirements-reference.txt");
  writeFileSync(stamp, want);
  return py;
}

/** Seeded token ids: BOS, then ids in [3, vocab) (the reference's prompts; engines/ reuse them). */
export function tokensFor(vocab: number, seed: number): number[] {
  let s = seed >>> 0;
  const next = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0), s);
  return [2, ...Array.from({ length: TOKENS - 1 }, () => 3 + (next() % (vocab - 3)))];
}

/** The float32 fixture checkpoints (ids like "c1_dense/f32"), sorted: what the export covers. */
export function float32Checkpoints(): string[] {
  const index = JSON.parse(readFileSync(join(CKPT, "index.json"), "utf8")) as { checkpoints: Record<string, { fixture: string }> };
  return Object.keys(index.checkpoints).filter((id) => id.endsWith("/f32")).sort();
}

/**
 * Runs transformers on `ids` (float32 fixture checkpoints), measures the TS model against it in
 * float32 and float64, and swaps the new fixtures/reference/ into place; the fixtures not in
 * `ids` keep their files. Installs the reference venv on first use.
 */
export async function exportReference(ids: readonly string[]): Promise<void> {
  const py = ensureVenv();
  const tmp = join(REPO_ROOT, ".cache", `reference-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    // a fixture's prompt seed is 1 + its index among all float32 checkpoints, whatever `ids`
    // selects (--only once seeded by the index in the selection: another prompt than the full run's)
    const all = float32Checkpoints();
    const jobs = ids.map((id) => {
      const dir = join(CKPT, id);
      const { args } = loadConfig(dir);
      const k = all.indexOf(id);
      if (k < 0) throw new Error(`${id}: not a float32 fixture checkpoint`);
      return { id, fixture: id.split("/")[0]!, dir, args, tokens: tokensFor(args.vocab_size, 1 + k) };
    });
    writeFileSync(join(tmp, "jobs.json"), JSON.stringify(jobs));
    log(`transformers forward on ${ids.length} checkpoints`);
    const out = JSON.parse(run(py, [join(REPO_ROOT, "oracle", "python", "reference_export.py"), join(tmp, "jobs.json"), tmp], "the transformers export").trim().split("\n").pop()!) as {
      versions: Record<string, string>;
      fixtures: Record<string, { missing_unused: string[]; hf32_vs_hf64: { logits_rel: number; hidden_rel: number } }>;
    };
    rmSync(join(tmp, "jobs.json"));
    const old = existsSync(join(REFERENCE_DIR, "manifest.json")) ? (JSON.parse(readFileSync(join(REFERENCE_DIR, "manifest.json"), "utf8")) as ReferenceManifest) : null;
    const fixtures: Record<string, ReferenceFixture> = {};
    // the files --only leaves alone
    for (const [fx, e] of Object.entries(old?.fixtures ?? {})) {
      if (jobs.some((j) => j.fixture === fx)) continue;
      renameSync(join(REFERENCE_DIR, e.file), join(tmp, e.file));
      fixtures[fx] = e;
    }
    for (const j of jobs) {
      const file = `${j.fixture}.safetensors`;
      const entry: ReferenceFixture = {
        checkpoint: j.id,
        file,
        sha256: sha256File(join(tmp, file)),
        checkpointSha256: sha256File(join(j.dir, "model.safetensors")),
        tokens: j.tokens.length,
        missingUnused: out.fixtures[j.fixture]!.missing_unused,
        measured: { tsVsHf32: { logits: 0, hidden: 0 }, tsVsHf64: { logits: 0, hidden: 0 }, hf32VsHf64: { logits: 0, hidden: 0 }, logitsAbs: 0 },
      };
      // measure TS (= mlx-lm, bit for bit) against transformers in float32 and in float64
      const { model, text } = loadModel(j.dir);
      try {
        const n = text.args.num_hidden_layers;
        const d32 = compareWithReference(j.id, entry, model, n, tmp);
        const d64 = compareWithReference(j.id, entry, model, n, tmp, `${j.fixture}.f64.safetensors`);
        const noise = out.fixtures[j.fixture]!.hf32_vs_hf64;
        entry.measured = {
          tsVsHf32: { logits: d32.logitsRel, hidden: d32.hiddenRel },
          tsVsHf64: { logits: d64.logitsRel, hidden: d64.hiddenRel },
          hf32VsHf64: { logits: noise.logits_rel, hidden: noise.hidden_rel },
          logitsAbs: d32.logitsAbs,
        };
        const e = (x: number) => x.toExponential(2);
        log(`${j.id}: TS vs transformers f32 ${e(d32.logitsRel)} logits / ${e(d32.hiddenRel)} hidden; vs f64: TS ${e(d64.logitsRel)} / ${e(d64.hiddenRel)}, transformers f32 ${e(noise.logits_rel)} / ${e(noise.hidden_rel)}`);
      } finally {
        model.dispose();
        rmSync(join(tmp, `${j.fixture}.f64.safetensors`));
      }
      fixtures[j.fixture] = entry;
    }
    const manifest: ReferenceManifest = {
      note: "Hugging Face transformers' Gemma 4 (Gemma4ForCausalLM, eager attention, float32, CPU) on the float32 fixture checkpoints; written by npm run reference:export. hidden_states.i: 0 = embeddings * sqrt(H), i = output of layer i-1, last = after the final norm.",
      versions: out.versions,
      bound: { ...REFERENCE_BOUND },
      fixtures: Object.fromEntries(Object.entries(fixtures).sort()),
    };
    writeFileSync(join(tmp, "manifest.json"), `${JSON.stringify(manifest, null, 2)}\n`);
    // swap the new directory into place (an interrupted run leaves the old files)
    const bak = `${REFERENCE_DIR}.old-${process.pid}`;
    if (existsSync(REFERENCE_DIR)) renameSync(REFERENCE_DIR, bak);
    renameSync(tmp, REFERENCE_DIR);
    rmSync(bak, { recursive: true, force: true });
    log(`wrote ${REFERENCE_DIR} (${Object.keys(fixtures).length} fixtures)`);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

