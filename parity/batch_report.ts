// `npm run parity -- --mode batch`: batched generation, TS against mlx-lm's BatchGenerator, on the
// batch scenarios of fixtures/batch_scenarios.json, per next() call (parity/batch_engine.ts),
// on every fixture checkpoint (or --only, or --model DIR). Prints a table, writes
// <out>/batch.json and <out>/batch.md; exit 1 on any divergence (the bar is bit-exact).
import { mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { batchModel } from "../model/generate_batch.ts";
import { checkCheckpoint, loadModel } from "../model/gemma4/index.ts";
import { type OracleClient, REPO_ROOT } from "../oracle/client.ts";
import { type Parsed, UsageError } from "./args.ts";
import { type BatchComparison, type BatchScenario, batchParity, runFeatures } from "./batch_engine.ts";
import { pct, textTable } from "./format.ts";
import { inspectCheckpoint } from "./inputs.ts";
import { ProgressBar } from "./progress.ts";

export const BATCH_SCHEMA_ID = "gemma4-parity/batch-report@1";

export interface BatchRunResult extends BatchComparison {
  checkpoint: string;
  about: string;
  features: string[];
  ms: { oracle: number; ts: number };
}

export interface BatchReport {
  schema: typeof BATCH_SCHEMA_ID;
  createdAt: string;
  versions: Record<string, string>;
  runs: BatchRunResult[];
  ok: boolean;
}

export function loadBatchScenarios(ids: readonly string[]): BatchScenario[] {
  const all = (JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "batch_scenarios.json"), "utf8")) as { scenarios: BatchScenario[] }).scenarios;
  const unknown = ids.filter((id) => !all.some((s) => s.id === id));
  if (unknown.length) throw new UsageError(`unknown batch scenario ${unknown.join(", ")} (known: ${all.map((s) => s.id).join(", ")})`);
  return ids.length ? all.filter((s) => ids.includes(s.id)) : all;
}

/** Runs every (checkpoint, scenario) pair; `checkpoints` are [TS dir, oracle checkpoint id or dir, label]. */
export async function runBatchParity(oracle: OracleClient, checkpoints: [string, string, string][], scenarios: BatchScenario[]): Promise<BatchReport> {
  const runs: BatchRunResult[] = [];
  for (const [dir, oracleCkpt, label] of checkpoints) {
    const loaded = loadModel(dir);
    try {
      const m = batchModel(loaded);
      const bar = new ProgressBar(`[batch ${label}]`);
      for (const [i, sc] of scenarios.entries()) {
        bar.update(i / scenarios.length, `${sc.id} (${i + 1}/${scenarios.length})`);
        const r = await batchParity(oracle, oracleCkpt, m, sc);
        const { oracleRun, ...rest } = r;
        runs.push({ ...rest, checkpoint: label, about: sc.about ?? "", features: [...runFeatures(oracleRun)].sort() });
      }
      const mine = runs.filter((r) => r.checkpoint === label);
      const bad = mine.filter((r) => r.first);
      bar.done(bad.length ? `${bad.length}/${mine.length} scenarios diverge` : `${mine.length} scenarios, ${mine.reduce((a, r) => a + r.steps, 0)} steps bit-exact`);
    } finally {
      loaded.model.dispose();
      mx.clearCache();
    }
  }
  return { schema: BATCH_SCHEMA_ID, createdAt: new Date().toISOString(), versions: { libmlx: mx.version(), ...(oracle.versions ?? {}), bun: Bun.version, platform: `${process.platform}-${process.arch}` }, runs, ok: runs.every((r) => !r.first) };
}

const HEADER = ["checkpoint", "scenario", "next() calls", "steps", "bit-exact", "cache states", "first divergence"];

function row(r: BatchRunResult): string[] {
  const d = r.first ? `call ${r.first.call}: ${r.first.what}` : "none";
  return [r.checkpoint, r.scenario, String(r.calls), String(r.steps), `${r.bitExact} (${pct(r.bitExact, r.steps)})`, String(r.cacheStates), d];
}

export function batchSummary(rep: BatchReport): string {
  const steps = rep.runs.reduce((a, r) => a + r.steps, 0);
  const exact = rep.runs.reduce((a, r) => a + r.bitExact, 0);
  const states = rep.runs.reduce((a, r) => a + r.cacheStates, 0);
  const lines = ["", "Batched generation (TS vs mlx-lm's BatchGenerator, every next() call: tokens, logprobs bytes, batch-cache state)", textTable(HEADER, rep.runs.map(row)), ""];
  for (const r of rep.runs.filter((x) => x.first)) lines.push(`First divergence in ${r.checkpoint} · ${r.scenario}, next() call ${r.first!.call}, ${r.first!.what}: ${r.first!.detail}`);
  lines.push(`${rep.runs.length} runs · ${steps} generation steps · ${exact} bit-exact (${pct(exact, steps)}) · ${states} cache states compared`, `Verdict: ${rep.ok ? "PASS" : "FAIL"}`);
  return lines.join("\n");
}

function renderMarkdown(rep: BatchReport): string {
  const esc = (s: string) => s.replaceAll("|", "\\|").replaceAll("\n", " ");
  const out = ["# Batched generation parity: TypeScript vs mlx-lm's BatchGenerator", "", `Generated ${rep.createdAt}. Verdict: **${rep.ok ? "PASS" : "FAIL"}** (bit-exact).`, ""];
  out.push("| " + Object.keys(rep.versions).join(" | ") + " |", "|" + Object.keys(rep.versions).map(() => "---").join("|") + "|", "| " + Object.values(rep.versions).map(esc).join(" | ") + " |", "");
  out.push("Per `next()` call: the prompt responses, every generation response (token, finish reason, logprobs bytes; extracted caches on finish) and every batch cache of the generation and prompt batches (per-sequence offsets and left padding, `_idx`, `_offset`, rotation, buffer shapes and key/value bytes).", "");
  out.push("| " + [...HEADER, "features"].join(" | ") + " |", "|" + [...HEADER, "features"].map(() => "---").join("|") + "|");
  for (const r of rep.runs) out.push("| " + [...row(r), r.features.join(", ")].map(esc).join(" | ") + " |");
  out.push("");
  const bad = rep.runs.filter((r) => r.first);
  if (bad.length) {
    out.push("## First divergences", "");
    for (const r of bad) out.push(`- **${esc(r.checkpoint)} · ${esc(r.scenario)}**, next() call ${r.first!.call}, ${esc(r.first!.what)}: ${esc(r.first!.detail)}`);
    out.push("");
  }
  out.push("## Scenarios", "");
  for (const s of [...new Map(rep.runs.map((r) => [r.scenario, r.about])).entries()]) out.push(`- \`${s[0]}\`: ${esc(s[1])}`);
  return `${out.join("\n")}\n`;
}

/** Writes <out>/batch.json and <out>/batch.md (each to a temp name, then renamed). */
export function writeBatchReports(rep: BatchReport, out: string): string[] {
  mkdirSync(out, { recursive: true });
  const files: [string, string][] = [
    [join(out, "batch.json"), `${JSON.stringify(rep)}\n`],
    [join(out, "batch.md"), renderMarkdown(rep)],
  ];
  for (const [f, text] of files) {
    const tmp = `${f}.${process.pid}.tmp`;
    writeFileSync(tmp, text);
    renameSync(tmp, f);
  }
  return files.map(([f]) => f);
}

/** The checkpoints of a batch run: --model DIR, or the fixture checkpoints (matching --only). */
function batchCheckpoints(model: string | undefined, fixtureIds: string[]): [string, string, string][] {
  if (model !== undefined) {
    const dir = resolve(model);
    return [[dir, dir, basename(dir)]];
  }
  return fixtureIds.map((id) => [join(REPO_ROOT, ".cache", "checkpoints", id), id, id]);
}

/** --mode batch's checks before any oracle starts (parityPlan calls it). */
export function batchModeCheck(a: Parsed): void {
  for (const k of ["prompt", "tokens", "chat", "bisect", "oracle-model", "skip-ops", "image", "audio"]) if (a[k] !== undefined) throw new UsageError(`--${k} does not apply to --mode batch`);
  if (Number(a.ulp) !== 0 || Number(a.atol) !== 0) throw new UsageError("--mode batch compares bit for bit: --ulp and --atol do not apply");
  if (a.model !== undefined && a.only !== undefined) throw new UsageError("--only applies to the fixture run, not to --model");
  const scenarios = loadBatchScenarios((a.scenario as string[] | undefined) ?? []);
  if (a.model !== undefined) {
    const dir = resolve(String(a.model));
    const info = inspectCheckpoint(dir);
    checkCheckpoint(dir);
    checkScenarioVocab(scenarios, Number(info.text.vocab_size ?? 262144));
  }
}

/** Every token id of the scenarios (prompts, joined prompts, stop sequences) is inside the checkpoint's vocabulary. */
export function checkScenarioVocab(scenarios: readonly BatchScenario[], vocab: number): void {
  for (const s of scenarios) {
    const ids = [...s.prompts.flat(), ...(s.join ?? []).flatMap((j) => j.prompts.flat()), ...(s.stop_tokens ?? []).flat()];
    const bad = ids.find((t) => t >= vocab);
    if (bad !== undefined) {
      throw new UsageError(`batch scenario ${s.id} has token id ${bad}, outside the vocabulary of this checkpoint (vocab_size ${vocab}); the scenarios of fixtures/batch_scenarios.json use ids up to 255: choose ones that fit with --scenario, or a checkpoint with a larger vocabulary`);
    }
  }
}

const globRe = (glob: string) => new RegExp(`^${glob.split("*").map((x) => x.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`);

/** --mode batch: the batch scenarios on the fixtures (or --model DIR) against mlx-lm's BatchGenerator. */
async function batchMode(oracle: OracleClient, a: Parsed): Promise<boolean> {
  const scenarios = loadBatchScenarios((a.scenario as string[] | undefined) ?? []);
  let ids: string[] = [];
  if (a.model === undefined) {
    const plan = await oracle.request<{ checkpoints: { id: string }[] }>("plan");
    const re = typeof a.only === "string" ? globRe(a.only) : null;
    ids = plan.checkpoints.map((c) => c.id).filter((id) => !re || re.test(id));
    if (ids.length === 0) throw new UsageError(`--only '${String(a.only)}' matches no fixture checkpoint (ids look like c3_e2b/bf16)`);
    await oracle.request("make_checkpoints", {}, 1_800_000);
  }
  const rep = await runBatchParity(oracle, batchCheckpoints(a.model as string | undefined, ids), scenarios);
  process.stdout.write(`${batchSummary(rep)}\n`);
  const files = writeBatchReports(rep, resolve(String(a.out ?? "report")));
  process.stdout.write(`Reports: ${files.join(", ")}\n`);
  return rep.ok;
}

export const BATCH_MODES = { batch: batchMode };
