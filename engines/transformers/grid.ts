// The opt-in results grid of the two PyTorch engines (issue 24): for each fixture checkpoint and
// dtype, the engine writes a forward dump (transformers float32 also a generate_step dump) (16 seeded tokens, the noise floor's prompts) and the
// conformance command (`npm run conform`, run as a child process: engines never import the face)
// judges it against mlx-lm with the measured noise floor. Results go to
// engines/transformers/results.json and engines/gemma4_pt_claude/results.json (checked in; the
// tables in engines/RESULTS.md are made from them). Needs .venv-reference (ensureVenv).
//
//   CONFORM_ENGINES=1 bun engines/transformers/grid.ts [--engine transformers|gemma4-pt-claude] [--only c1_dense] [--schedule forward|generate]
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../model/gemma4/index.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { tokensFor } from "../../oracle/reference_export.ts";
import { portDump } from "../gemma4_pt_claude/dump.ts";
import { type TorchDtype, transformersDump } from "./dump.ts";
import type { DumpSchedule } from "../../oracle/conform/dump.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints");
/** The generate case: mlx-lm's generate_step schedule on transformers' own cache (as the floor measures it). */
const GENERATE: DumpSchedule = { kind: "generate", prefill_step_size: 4, max_tokens: 6 };

/** One grid cell: engine, checkpoint, the dtype the engine computed in. */
export interface GridCase {
  engine: "transformers" | "gemma4-pt-claude";
  checkpoint: string;
  dtype: TorchDtype;
  /** The tokensFor seed: 1 + the index of the fixture's f32 checkpoint among c*\/f32 (as the floor). */
  seed: number;
  /** Absent: a forward. */
  schedule?: DumpSchedule;
}

export interface GridResult extends GridCase {
  level: number | null;
  status: string;
  headline: string;
  firstOutside: string | null;
  firstLayerOutside: number | null;
  compared: number;
  exact: number;
  /** Worst relative L2 over the level-1 tensors (embed_scaled, layers.*\/output, norm). */
  residualRelL2: number | null;
  /** Worst relative L2 over every other (level-2) float tensor. */
  l2RelL2: number | null;
  logitsRelL2: number | null;
  klMax: number | null;
  top1: number | null;
  /** generate: the first step whose greedy token differs from mlx-lm's (null: none). */
  firstTokenDiff?: number | null;
  /** Per layer: the worst relative L2 of that layer's tensors (the plot's values). */
  layers: { slot: string; maxRelL2: number; within: boolean }[];
  notes: string;
  /** The engine refused the checkpoint (its message): no comparison. */
  refused?: string;
}

function f32Ids(): string[] {
  const index = JSON.parse(readFileSync(join(CKPT, "index.json"), "utf8")) as { checkpoints: Record<string, unknown> };
  return Object.keys(index.checkpoints).filter((id) => /^c[^/]*\/f32$/.test(id)).sort();
}

/** The grid: transformers f32 and bf16 (bf16 checkpoints where they exist, else bf16 compute on the f32 one); the port f32. */
export function gridCases(only?: string): GridCase[] {
  const index = JSON.parse(readFileSync(join(CKPT, "index.json"), "utf8")) as { checkpoints: Record<string, unknown> };
  const out: GridCase[] = [];
  for (const [k, id] of f32Ids().entries()) {
    const fx = id.split("/")[0]!;
    if (only && fx !== only) continue;
    const seed = 1 + k;
    out.push({ engine: "transformers", checkpoint: id, dtype: "float32", seed });
    out.push({ engine: "transformers", checkpoint: id, dtype: "float32", seed, schedule: GENERATE });
    out.push({ engine: "transformers", checkpoint: `${fx}/bf16` in index.checkpoints ? `${fx}/bf16` : id, dtype: "bfloat16", seed });
    out.push({ engine: "gemma4-pt-claude", checkpoint: id, dtype: "float32", seed });
  }
  return out;
}

interface ReportRow {
  name: string;
  kind: string;
  layer: number | null;
  metrics?: { relL2: number };
  logits?: { klMax: number; top1: number };
}

function runCase(c: GridCase, work: string): GridResult {
  const dir = join(CKPT, c.checkpoint);
  const prompt = tokensFor(loadConfig(dir).args.vocab_size, c.seed);
  const dump = join(work, `${c.engine}-${c.checkpoint.replace("/", "-")}-${c.dtype}-${c.schedule?.kind ?? "forward"}`);
  const base = { ...c, level: null, compared: 0, exact: 0, residualRelL2: null, l2RelL2: null, logitsRelL2: null, klMax: null, top1: null, layers: [], firstOutside: null, firstLayerOutside: null };
  let notes: string;
  try {
    const r = c.engine === "transformers" ? transformersDump({ checkpoint: dir, out: dump, dtype: c.dtype, prompt, schedule: c.schedule }) : portDump({ checkpoint: dir, out: dump, dtype: c.dtype, prompt });
    notes = r.manifest.notes ?? "";
  } catch (e) {
    const msg = (e as Error).message;
    return { ...base, status: "REFUSED", headline: msg.split("\n")[0]!, notes: "", refused: msg };
  }
  const out = join(work, "report");
  const r = spawnSync(join(REPO_ROOT, "node_modules", ".bin", "bun"), [join(REPO_ROOT, "parity", "conform_cli.ts"), "--dump", dump, "--checkpoint", dir, "--out", out], { cwd: REPO_ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 28 });
  if (r.status !== 0 && r.status !== 1) throw new Error(`npm run conform on ${dump} exited ${r.status}: ${(r.stderr ?? "").trim().split("\n").slice(-3).join(" ")}`);
  // the report file, not --json on stdout (a large report piped to a process that exits came back cut short)
  const rep = JSON.parse(readFileSync(join(out, "conform.json"), "utf8")) as {
    dump: { level: number };
    verdict: { status: string; headline: string; firstOutside: string | null; firstLayerOutside: number | null; firstTokenDiff: number | null };
    compared: number;
    exact: number;
    logits: { klMax: number; top1: number } | null;
    layers: { slot: string; maxRelL2: number; within: boolean }[];
    tensors: ReportRow[];
  };
  const rel = (pred: (t: ReportRow) => boolean) => {
    const v = rep.tensors.filter((t) => pred(t) && t.metrics).map((t) => t.metrics!.relL2);
    return v.length ? Math.max(...v) : null;
  };
  const residual = (t: ReportRow) => t.kind === "embed_scaled" || t.kind === "norm" || (t.layer !== null && t.kind === "output");
  rmSync(dump, { recursive: true, force: true });
  return {
    ...base,
    level: rep.dump.level,
    status: rep.verdict.status,
    headline: rep.verdict.headline,
    firstOutside: rep.verdict.firstOutside,
    firstLayerOutside: rep.verdict.firstLayerOutside,
    ...(c.schedule ? { firstTokenDiff: rep.verdict.firstTokenDiff } : {}),
    compared: rep.compared,
    exact: rep.exact,
    residualRelL2: rel(residual),
    l2RelL2: rel((t) => !residual(t) && t.kind !== "logits"),
    logitsRelL2: rel((t) => t.kind === "logits"),
    klMax: rep.logits?.klMax ?? null,
    top1: rep.logits?.top1 ?? null,
    layers: rep.layers.map((l) => ({ slot: l.slot, maxRelL2: l.maxRelL2, within: l.within })),
    notes,
  };
}

function main(argv: string[]): number {
  if (process.env.CONFORM_ENGINES !== "1") {
    process.stderr.write("the engine grid installs torch (~5.6 GB, .venv-reference) and runs for minutes: set CONFORM_ENGINES=1 to run it\n");
    return 2;
  }
  const flag = (n: string) => (argv.includes(n) ? argv[argv.indexOf(n) + 1] : undefined);
  const engine = flag("--engine");
  const sched = flag("--schedule");
  const cases = gridCases(flag("--only")).filter((c) => (!engine || c.engine === engine) && (!sched || (c.schedule?.kind ?? "forward") === sched));
  const work = join(REPO_ROOT, ".cache", `engine-grid-${process.pid}`);
  mkdirSync(work, { recursive: true });
  const results: GridResult[] = [];
  try {
    for (const c of cases) {
      const t0 = performance.now();
      const res = runCase(c, work);
      results.push(res);
      process.stderr.write(`[grid] ${c.engine} ${c.checkpoint} ${c.dtype}${c.schedule ? ` ${c.schedule.kind}` : ""}: L${res.level ?? "-"} ${res.headline} (${((performance.now() - t0) / 1000).toFixed(0)} s)\n`);
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  const stamp = { when: new Date().toISOString(), machine: `${process.platform}-${process.arch}, CPU, torch one thread`, floor: "oracle/conform/noise_floor.json" };
  for (const [name, folder] of [["transformers", "transformers"], ["gemma4-pt-claude", "gemma4_pt_claude"]] as const) {
    const mine = results.filter((r) => r.engine === name);
    if (!mine.length) continue;
    const file = join(REPO_ROOT, "engines", folder, "results.json");
    // a partial run (--only) keeps the other cases of the file
    const old = existsSync(file) ? ((JSON.parse(readFileSync(file, "utf8")) as { results: GridResult[] }).results ?? []) : [];
    const key = (r: GridCase) => `${r.checkpoint}|${r.dtype}|${r.schedule?.kind ?? "forward"}`;
    const merged = [...old.filter((o) => !mine.some((m) => key(m) === key(o))), ...mine].sort((a, b) => key(a).localeCompare(key(b)));
    writeFileSync(file, `${JSON.stringify({ schema: "gemma4-engine-grid/1", engine: name, ...stamp, results: merged }, null, 2)}\n`);
    process.stderr.write(`[grid] wrote ${file}\n`);
  }
  return 0;
}

if (import.meta.main) {
  try {
    process.exit(main(process.argv.slice(2)));
  } catch (e) {
    process.stderr.write(`error: ${(e as Error).message}\n`);
    process.exit(1);
  }
}
