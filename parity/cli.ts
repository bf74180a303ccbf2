// `npm run parity`: the TS Gemma 4 model side by side with mlx-lm, tap by tap.
//   npm run parity                          every embedded fixture checkpoint + the op-level report
//   npm run parity -- --model <dir> ...     any local gemma4 / gemma4_text / gemma4_unified checkpoint
// Writes report/parity.json, report/parity.md and report/parity.html; exits 1 on any divergence
// beyond the --ulp / --atol budget (default: bit-exact).
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { OracleClient, REPO_ROOT } from "../oracle/client.ts";
import { CASES, exposedOps, NOT_OPS } from "../oracle/ops/cases.ts";
import { coverage, runCases } from "../oracle/ops/runner.ts";
import { type FlagSpec, helpText, parseArgs, UsageError } from "./args.ts";
import { type Budget, type Capture, captureOracle, runParity, type RunSpec } from "./engine.ts";
import { fmtDivergence, fmtNum, pct, SUMMARY_HEADER, summaryRow, textTable } from "./format.ts";
import { renderHtml } from "./html.ts";
import { checkPromptLength, inspectCheckpoint, resolvePrompt } from "./inputs.ts";
import { renderMarkdown } from "./markdown.ts";
import { ProgressBar } from "./progress.ts";
import { type OpLevelSummary, type ParityReport, reportOk, type RunResult, SCHEMA_ID } from "./schema.ts";
import { batchCheckpoints, batchSummary, loadBatchScenarios, runBatchParity, writeBatchReports } from "./batch_report.ts";

const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "a local Gemma 4 checkpoint (gemma4, gemma4_text or gemma4_unified; flat, wrapper or raw HF layout; quantized or not)" },
  { name: "prompt", kind: "string", valueName: "text", help: "with --model: prompt text, tokenized with the checkpoint's tokenizer.json" },
  { name: "chat", kind: "bool", help: "with --prompt: apply the checkpoint's chat template first" },
  { name: "tokens", kind: "string", valueName: "1,2,3", help: "with --model: prompt token ids instead of --prompt" },
  { name: "steps", kind: "int", valueName: "N", help: "with --model: greedy decode steps", default: 8 },
  { name: "prefill-step-size", kind: "int", valueName: "N", help: "with --model: prefill chunk size (generate_step's prefill_step_size)", default: 2048 },
  { name: "oracle-model", kind: "string", valueName: "dir", help: "with --model: let mlx-lm load this copy instead (e.g. the original of a modified checkpoint)" },
  { name: "bisect", kind: "bool", help: "on a divergence, re-run the block of the first divergent tap op by op and name the first MLX op that differs" },
  { name: "only", kind: "string", valueName: "glob", help: "fixtures: only checkpoints whose id (e.g. c3_e2b/bf16) matches; '*' wildcards" },
  { name: "skip-ops", kind: "bool", help: "fixtures: skip the op-level section" },
  { name: "ulp", kind: "int", valueName: "N", help: "budget: a tap passes if its max ULP distance is at most N", default: 0 },
  { name: "atol", kind: "number", valueName: "X", help: "budget: a tap passes if its max abs difference is at most X", default: 0 },
  { name: "out", kind: "string", valueName: "dir", help: "where the reports go", default: "report" },
  { name: "mode", kind: "string", valueName: "generate|batch", help: "generate: generate_step tap by tap; batch: batched generation against mlx-lm's BatchGenerator, per next() call", default: "generate" },
  { name: "scenario", kind: "string", valueName: "id", help: "--mode batch: only this batch scenario of fixtures/batch_scenarios.json", repeat: true },
  { name: "verbose", kind: "bool", help: "stack traces on errors, oracle stderr" },
  { name: "help", kind: "bool", help: "show this help" },
];

const FOOTER = `
Budget: with the defaults (--ulp 0 --atol 0) every tap must be bit-identical; that is the bar on
one machine, where both sides run the same libmlx. Raise it only to compare across backends.

Reports: <out>/parity.json (schema: parity/SCHEMA.md), <out>/parity.md, <out>/parity.html.
Exit status: 0 when everything is within budget, 1 on divergence, 2 on bad usage or input.

Examples:
  npm run parity
  npm run parity -- --only 'c5_moe/*'
  npm run parity -- --model ~/models/gemma-4-e4b-it-4bit --prompt "Why is the sky blue?" --chat --steps 16
  npm run parity -- --model ./ckpt --tokens 2,105,2364 --prefill-step-size 512
  npm run parity -- --mode batch --only 'c5_moe/*' --scenario join_mid_run
`;

// The fixture scenarios the report runs: a ring-buffer-wrapping generation for every
// checkpoint (prompt 9 > window 8, chunks of 5, 20 decode steps), plus, for MoE checkpoints,
// a prefill chunk of 36 tokens so SwitchGLU's sorted gather path runs.
const FIXTURE_SCENARIOS = { all: "gen_P9_S5", moe: "gen_P40_S36" };

function globRe(glob: string): RegExp {
  return new RegExp(`^${glob.split("*").map((s) => s.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`);
}

async function opLevel(oracle: OracleClient): Promise<OpLevelSummary> {
  const bar = new ProgressBar("[ops]");
  bar.update(0, `${CASES.length} cases`);
  const results = await runCases(CASES, oracle);
  const cov = coverage(exposedOps().filter((o) => !(o in NOT_OPS)), CASES, results);
  bar.done(`${cov.bitExact}/${cov.cases} cases bit-exact, ${cov.tested.length}/${cov.exposed.length} ops tested`);
  for (const f of cov.failures.slice(0, 10)) process.stderr.write(`  FAIL ${f.id}: ${f.detail}\n`);
  return { opsExposed: cov.exposed.length, opsTested: cov.tested.length, cases: cov.cases, bitExact: cov.bitExact };
}

interface ScenarioEntry {
  id: string;
  prompt?: number[];
  prefill_step_size?: number;
  max_tokens?: number;
}

async function fixtureRuns(oracle: OracleClient, budget: Budget, only: string | undefined, bisectOn: boolean): Promise<RunResult[]> {
  const plan = await oracle.request<{ checkpoints: { id: string; moe: boolean }[] }>("plan");
  const scenarios = new Map(
    (JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "scenarios.json"), "utf8")) as { scenarios: ScenarioEntry[] }).scenarios.map((s) => [s.id, s]),
  );
  const re = only ? globRe(only) : null;
  const ckpts = plan.checkpoints.filter((c) => !re || re.test(c.id));
  if (ckpts.length === 0) throw new UsageError(`--only '${only}' matches no fixture checkpoint (ids look like c3_e2b/bf16)`);
  const build = new ProgressBar("[checkpoints]");
  build.update(0, "building the fixture checkpoints with mlx-lm (cached after the first run)");
  await oracle.request("make_checkpoints", {}, 1_800_000);
  build.done(`${plan.checkpoints.length} fixture checkpoints ready`);
  const specs: RunSpec[] = [];
  for (const c of ckpts) {
    for (const sid of c.moe ? [FIXTURE_SCENARIOS.all, FIXTURE_SCENARIOS.moe] : [FIXTURE_SCENARIOS.all]) {
      const s = scenarios.get(sid)!;
      const [fixture, variant] = c.id.split("/") as [string, string];
      specs.push({
        tsDir: join(REPO_ROOT, ".cache", "checkpoints", c.id),
        oracleCheckpoint: c.id,
        model: fixture,
        variant,
        prompt: s.prompt!,
        prefillStepSize: s.prefill_step_size!,
        steps: s.max_tokens!,
        budget,
        bisect: bisectOn,
      });
    }
  }
  // mlx-lm captures run k+1 while TS compares run k (two processes, two cores).
  const runs: RunResult[] = [];
  // A prefetched capture's failure surfaces when its run awaits it, not as an unhandled rejection.
  const prefetch = (k: number) => {
    const p = captureOracle(oracle, specs[k]!);
    p.catch(() => {});
    return p;
  };
  let next = specs.length ? prefetch(0) : null;
  for (let k = 0; k < specs.length; k++) {
    const current = next!;
    next = k + 1 < specs.length ? prefetch(k + 1) : null;
    runs.push(await runOne(oracle, specs[k]!, current));
  }
  return runs;
}

async function runOne(oracle: OracleClient, spec: RunSpec, capture?: Promise<Capture>): Promise<RunResult> {
  const bar = new ProgressBar(`[${spec.model} ${spec.variant}]`);
  bar.update(0, "mlx-lm capturing");
  const r = await runParity(oracle, spec, (p) => {
    const frac = (p.callIndex + ((p.layer ?? 0) + 1) / Math.max(1, p.layers)) / Math.max(1, p.calls);
    bar.update(frac, `${p.call} (${p.callIndex + 1}/${p.calls}) · layer ${(p.layer ?? 0) + 1}/${p.layers}`);
  }, capture);
  bar.done(r.firstDivergence ? `diverges: ${fmtDivergence(r.firstDivergence)}` : `${r.bitExact}/${r.tapsCompared} taps bit-exact`);
  return r;
}

/** Everything about a --model run that can be checked before the oracle starts. */
async function modelSpec(a: Record<string, unknown>, budget: Budget): Promise<RunSpec> {
  const dir = resolve(String(a.model));
  const info = inspectCheckpoint(dir);
  const prompt = await resolvePrompt(dir, a);
  const steps = Number(a.steps);
  const prefill = Number(a["prefill-step-size"]);
  if (steps < 1) throw new UsageError("--steps must be at least 1");
  if (prefill < 1) throw new UsageError("--prefill-step-size must be at least 1");
  const vocab = Number(info.text.vocab_size ?? 262144);
  const bad = prompt.find((t) => t >= vocab);
  if (bad !== undefined) throw new UsageError(`token id ${bad} is outside the vocabulary (vocab_size ${vocab})`);
  checkPromptLength(prompt, steps, info);
  const oracleDir = a["oracle-model"] === undefined ? dir : resolve(String(a["oracle-model"]));
  if (oracleDir !== dir) inspectCheckpoint(oracleDir);
  return { tsDir: dir, oracleCheckpoint: oracleDir, model: basename(dir), variant: info.modelType, prompt, prefillStepSize: prefill, steps, budget, bisect: a.bisect === true };
}

function writeReports(rep: ParityReport, out: string): string[] {
  mkdirSync(out, { recursive: true });
  const files = [join(out, "parity.json"), join(out, "parity.md"), join(out, "parity.html")];
  writeFileSync(files[0]!, `${JSON.stringify(rep)}\n`);
  writeFileSync(files[1]!, renderMarkdown(rep));
  writeFileSync(files[2]!, renderHtml(rep));
  return files;
}

function printSummary(rep: ParityReport): void {
  const lines: string[] = [""];
  if (rep.opLevel) {
    const o = rep.opLevel;
    lines.push("Op-level parity (@mlx-bun/mlx vs Python MLX)");
    lines.push(textTable(["ops exposed", "ops parity-tested", "cases", "bit-exact cases"], [[String(o.opsExposed), `${o.opsTested} (${pct(o.opsTested, o.opsExposed)})`, String(o.cases), `${o.bitExact} (${pct(o.bitExact, o.cases)})`]]), "");
  }
  if (rep.runs.length) {
    lines.push("Model parity (TS vs mlx-lm, every tap of every generate_step call)");
    lines.push(textTable(SUMMARY_HEADER, rep.runs.map(summaryRow)), "");
    const taps = rep.runs.reduce((s, r) => s + r.tapsCompared, 0);
    const exact = rep.runs.reduce((s, r) => s + r.bitExact, 0);
    for (const r of rep.runs) {
      const b = r.firstDivergence?.bisect;
      if (!r.firstDivergence) continue;
      lines.push(`First divergence in ${r.model} · ${r.variant}: ${fmtDivergence(r.firstDivergence)}, first differing index ${r.firstDivergence.firstIndex}`);
      if (b) lines.push(`  bisect: first differing MLX op ${b.op}(${b.inputs.map((i) => `${i.dtype}[${i.shape.join(",")}]`).join(", ")}), max abs ${fmtNum(b.maxAbs)}, max ULP ${fmtNum(b.maxUlp)}`);
      const params = b?.differingParameters;
      if (params?.length) lines.push(`  parameters whose bytes differ from mlx-lm's checkpoint: ${params.join(", ")}`);
      else if (b === null) lines.push("  bisect: every op of the block matches when replayed with mlx-lm's parameters; the TS block computes something else than mlx-lm (a port difference, not a data one)");
    }
    lines.push(`${rep.runs.length} runs · ${taps} taps compared · ${exact} bit-exact (${pct(exact, taps)}) · budget ${rep.budget.ulp} ULP / atol ${fmtNum(rep.budget.atol)}`);
  }
  lines.push(`Verdict: ${rep.ok ? "PASS" : "FAIL"}`);
  process.stdout.write(`${lines.join("\n")}\n`);
}

async function main(argv: string[]): Promise<number> {
  const a = parseArgs(argv, FLAGS);
  if (a.help) {
    process.stdout.write(helpText("npm run parity -- [options]", "Compares the TypeScript Gemma 4 model with mlx-lm tap by tap, on the embedded fixtures or on a local checkpoint.", FLAGS, FOOTER));
    return 0;
  }
  if (a.mode !== "generate" && a.mode !== "batch") throw new UsageError(`--mode must be generate or batch, got '${String(a.mode)}'`);
  if (a.mode === "batch") return batchMode(a);
  if (a.scenario !== undefined) throw new UsageError("--scenario applies to --mode batch");
  for (const k of ["prompt", "chat", "tokens", "oracle-model"]) if (a[k] !== undefined && a.model === undefined) throw new UsageError(`--${k} needs --model`);
  if (a.model !== undefined && (a.only !== undefined || a["skip-ops"])) throw new UsageError("--only and --skip-ops apply to the fixture run, not to --model");
  const budget: Budget = { ulp: Number(a.ulp), atol: Number(a.atol) };
  if (budget.ulp < 0 || budget.atol < 0) throw new UsageError("--ulp and --atol must be >= 0");
  // Validate the checkpoint and prompt before starting the oracle, so bad input fails fast.
  const spec = a.model === undefined ? null : await modelSpec(a, budget);

  // ORACLE_PYTHON: another interpreter for the oracle (default: the repo's .venv).
  const oracle = await OracleClient.start({ python: process.env.ORACLE_PYTHON || undefined, onStderr: a.verbose ? (l) => process.stderr.write(`[oracle] ${l}\n`) : undefined });
  let rep: ParityReport;
  try {
    const opLevelSummary = a.model === undefined && !a["skip-ops"] ? await opLevel(oracle) : null;
    const runs = a.model === undefined ? await fixtureRuns(oracle, budget, a.only as string | undefined, a.bisect === true) : [await runOne(oracle, spec!)];
    rep = {
      schema: SCHEMA_ID,
      createdAt: new Date().toISOString(),
      versions: { libmlx: mx.version(), ...(oracle.versions ?? {}), bun: Bun.version, platform: `${process.platform}-${process.arch}` },
      budget,
      opLevel: opLevelSummary,
      runs,
      ok: reportOk(runs, opLevelSummary),
    };
  } finally {
    await oracle.close();
  }
  printSummary(rep);
  const files = writeReports(rep, resolve(String(a.out)));
  process.stdout.write(`Reports: ${files.join(", ")}\n`);
  return rep.ok ? 0 : 1;
}

/** --mode batch: the batch scenarios on the fixtures (or --model DIR) against mlx-lm's BatchGenerator. */
async function batchMode(a: Record<string, unknown>): Promise<number> {
  for (const k of ["prompt", "tokens", "chat", "bisect", "oracle-model", "skip-ops"]) if (a[k] !== undefined) throw new UsageError(`--${k} does not apply to --mode batch`);
  if (Number(a.ulp) !== 0 || Number(a.atol) !== 0) throw new UsageError("--mode batch compares bit for bit: --ulp and --atol do not apply");
  if (a.model !== undefined && a.only !== undefined) throw new UsageError("--only applies to the fixture run, not to --model");
  const scenarios = loadBatchScenarios((a.scenario as string[] | undefined) ?? []);
  if (a.model !== undefined) inspectCheckpoint(resolve(String(a.model)));
  const oracle = await OracleClient.start({ python: process.env.ORACLE_PYTHON || undefined, onStderr: a.verbose ? (l) => process.stderr.write(`[oracle] ${l}\n`) : undefined });
  let rep;
  try {
    let ids: string[] = [];
    if (a.model === undefined) {
      const plan = await oracle.request<{ checkpoints: { id: string }[] }>("plan");
      const re = a.only ? globRe(String(a.only)) : null;
      ids = plan.checkpoints.map((c) => c.id).filter((id) => !re || re.test(id));
      if (ids.length === 0) throw new UsageError(`--only '${String(a.only)}' matches no fixture checkpoint (ids look like c3_e2b/bf16)`);
      await oracle.request("make_checkpoints", {}, 1_800_000);
    }
    rep = await runBatchParity(oracle, batchCheckpoints(a.model as string | undefined, ids), scenarios);
  } finally {
    await oracle.close();
  }
  process.stdout.write(`${batchSummary(rep)}\n`);
  const files = writeBatchReports(rep, resolve(String(a.out)));
  process.stdout.write(`Reports: ${files.join(", ")}\n`);
  return rep.ok ? 0 : 1;
}

const verbose = process.argv.includes("--verbose");
main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (e: unknown) => {
    const err = e as Error;
    if (verbose) console.error(err);
    else process.stderr.write(`\nerror: ${err.message.split("\n--- python traceback ---")[0]}\n${err instanceof UsageError ? "" : "(run with --verbose for details)\n"}`);
    process.exit(err instanceof UsageError ? 2 : 1);
  },
);
