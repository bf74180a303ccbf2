// `npm run parity`: the TS Gemma 4 model side by side with mlx-lm, tap by tap.
//   npm run parity                          every embedded fixture checkpoint + the op-level report
//   npm run parity -- --model <dir> ...     any local gemma4 / gemma4_text / gemma4_unified checkpoint
// Writes report/parity.json, report/parity.md and report/parity.html. Exit status: 0 within
// budget (PASS, or PASS with known MLX bugs without --strict), 1 on divergence beyond the --ulp /
// --atol budget (default: bit-exact), 2 on bad usage or input, 3 when the oracle itself fails.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { OracleClient, OracleError, REPO_ROOT } from "../oracle/client.ts";
import { CASES, exposedOps, NOT_OPS } from "../oracle/ops/cases.ts";
import { type IsolatedRun, runCasesIsolated } from "../oracle/ops/isolated.ts";
import { type CaseResult, type Coverage, coverage, groupUnsupported } from "../oracle/ops/runner.ts";
import { runVjpCasesIsolated, vjpCases, vjpCoverage } from "../oracle/ops/vjp_runner.ts";
import { checkCheckpoint, loadModel } from "../model/gemma4/index.ts";
import { type FlagSpec, helpText, isInputError, type Parsed, parseArgs, runMain, UsageError } from "./args.ts";
import { applyDeviceFlag, DEVICE_FLAG, type DeviceInfo } from "./device.ts";
import { type Budget, type Capture, captureOracle, runParity, type RunSpec } from "./engine.ts";
import { checkMediaCheckpoint, checkpointTowers, MEDIA_FLAGS, type MediaRequest, mediaRequest, prepareMedia, VIDEO_FLAGS, wantsMedia } from "./media.ts";
import { videoParity, videoParityPreflight } from "./video_parity.ts";
import { checkUnifiedCheckpoint, isUnifiedCheckpoint, type UnifiedMediaPlan, unifiedMediaPlan, unifiedScenarioOf, useOpenCvFrames } from "./unified_face.ts";
import { disposeMediaInputs } from "../model/gemma4/gemma4.ts";
import { modelConfigFromDict } from "../model/gemma4_unified/index.ts";
import { inlineScenario, unifiedInputs, unifiedScenario } from "../oracle/unified_fixtures.ts";
import { fmtDivergence, fmtNum, pct, REFERENCE_HEADER, referenceRow, SUMMARY_HEADER, summaryRow, textTable } from "./format.ts";
import { compareWithReference, readReferenceManifest, REFERENCE_BOUND, referenceBoundApplies, relDiff } from "../oracle/reference.ts";
import { renderHtml } from "./html.ts";
import { checkPromptLength, inspectCheckpoint, resolvePrompt } from "./inputs.ts";
import { renderMarkdown } from "./markdown.ts";
import { ProgressBar } from "./progress.ts";
import { type OpLevelSummary, type ParityReport, type ReferenceRow, type ReferenceSummary, reportVerdict, type RunResult, SCHEMA_ID } from "./schema.ts";
import { SPECULATIVE_MODES } from "./speculative_modes.ts";
import { BATCH_MODES, batchModeCheck } from "./batch_report.ts";
import { KV_QUANT_FLAGS, kvQuantParityRun } from "./kv_quant_flags.ts";
import { KV_BATCH_FLAG, kvQuantBatchParityRun } from "./kv_quant_batch_face.ts";

// --mode NAME: one decoding mode against its oracle (each feature adds its runners here).
const MODES: Record<string, (oracle: OracleClient, a: Parsed) => Promise<boolean>> = { ...SPECULATIVE_MODES, ...BATCH_MODES };

export const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "a local Gemma 4 checkpoint (gemma4, gemma4_text or gemma4_unified; flat, wrapper or raw HF layout; quantized or not)" },
  { name: "prompt", kind: "string", valueName: "text", help: "with --model: prompt text, tokenized with the checkpoint's tokenizer.json" },
  { name: "chat", kind: "bool", help: "with --prompt: apply the checkpoint's chat template first" },
  { name: "tokens", kind: "string", valueName: "1,2,3", help: "with --model: prompt token ids instead of --prompt" },
  { name: "steps", kind: "int", valueName: "N", help: "with --model: greedy decode steps", default: 8 },
  { name: "prefill-step-size", kind: "int", valueName: "N", help: "with --model: prefill chunk size (generate_step's prefill_step_size)", default: 2048 },
  { name: "oracle-model", kind: "string", valueName: "dir", help: "with --model: let mlx-lm load this copy instead (e.g. the original of a modified checkpoint)" },
  ...MEDIA_FLAGS,
  ...VIDEO_FLAGS,
  ...KV_QUANT_FLAGS,
  KV_BATCH_FLAG,
  { name: "bisect", kind: "bool", help: "on a divergence, re-run the block of the first divergent tap op by op and name the first MLX op that differs" },
  { name: "only", kind: "string", valueName: "glob", help: "fixtures: only checkpoints whose id (e.g. c3_e2b/bf16) matches; '*' wildcards, several globs comma-separated" },
  { name: "skip-ops", kind: "bool", help: "fixtures: skip the op-level section" },
  { name: "strict", kind: "bool", help: "fail (exit 1) on runs or op cases counted apart at a recorded MLX bug, instead of PASS with known MLX bugs" },
  { name: "ulp", kind: "int", valueName: "N", help: "budget: a tap passes if its max ULP distance is at most N", default: 0 },
  { name: "atol", kind: "number", valueName: "X", help: "budget: a tap passes if its max abs difference is at most X", default: 0 },
  DEVICE_FLAG,
  { name: "out", kind: "string", valueName: "dir", help: "where the reports go", default: "report" },
  { name: "mode", kind: "string", valueName: "name", help: `run one decoding mode against its oracle on the fixtures instead (${Object.keys(MODES).join(", ")}); --only filters fixtures` },
  { name: "scenario", kind: "string", valueName: "id", help: "--mode batch: only this batch scenario of fixtures/batch_scenarios.json (repeatable)", multiple: true },
  { name: "verbose", kind: "bool", help: "stack traces on errors, oracle stderr" },
  { name: "help", kind: "bool", help: "show this help" },
];

const FOOTER = `
Budget: with the defaults (--ulp 0 --atol 0) every tap must be bit-identical; that is the bar on
one machine, where both sides run the same libmlx. Raise it only to compare across backends.

Verdict: PASS when everything compared is within budget; PASS with known MLX bugs (N runs, M of
T taps unverified) when some runs' FIRST divergent tap is produced by an op on the path of a
recorded MLX bug of this backend (oracle/mlx_bugs.ts; the taps from there on are unverified);
FAIL otherwise. --strict turns known MLX bugs into a failure.

Reports: <out>/parity.json (schema: parity/SCHEMA.md), <out>/parity.md, <out>/parity.html.
Exit status:
  0  within budget (PASS; PASS with known MLX bugs unless --strict)
  1  divergence (FAIL)
  2  bad usage or input (flags, checkpoint, prompt, media), found before any comparison
  3  the oracle failed (mlx-lm / mlx-vlm raised, e.g. an op its backend does not support, or its
     process died): no verdict; the Python error is shown (--verbose: its traceback)

Examples:
  npm run parity
  npm run parity -- --only 'c5_moe/*'
  npm run parity -- --model ~/models/gemma-4-e4b-it-4bit --prompt "Why is the sky blue?" --chat --steps 16
  npm run parity -- --model ~/models/gemma-4-e2b-it --image cat.png --audio note.wav --prompt "Describe both." --chat
  npm run parity -- --model ./ckpt --tokens 2,105,2364 --prefill-step-size 512
  npm run parity -- --mode batch --only 'c5_moe/*' --scenario join_mid_run
  npm run parity -- --mode batch --model ./ckpt
`;

// The fixture scenarios the report runs: a ring-buffer-wrapping generation for every
// checkpoint (prompt 9 > window 8, chunks of 5, 20 decode steps), plus, for MoE checkpoints,
// a prefill chunk of 36 tokens so SwitchGLU's sorted gather path runs.
const FIXTURE_SCENARIOS = { all: "gen_P9_S5", moe: "gen_P40_S36" };

// The multimodal fixtures (mlx-vlm) run 20 decode steps after an image prompt; those with an
// audio tower also a chunked image + audio prefill.
const MM_FIXTURE_SCENARIOS = { all: "mm_gen_image", audio: "mm_gen_chunked_av" };

// The gemma4_unified fixtures run 20 decode steps after an image prompt (fixtures/
// unified_scenarios.json), their inputs made by the TS processor (oracle/unified_fixtures.ts).
const UNIFIED_FIXTURE_SCENARIO = "u_gen_image";

/** Comma-separated globs ('*' wildcards): an id matches if it matches any of them. */
function globRe(globs: string): RegExp {
  const one = (g: string) => g.split("*").map((s) => s.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*");
  return new RegExp(`^(?:${globs.split(",").map(one).join("|")})$`);
}

// The op table runs in worker processes of its own (oracle/ops/isolated.ts): a case that leaves a
// sticky GPU error behind poisons only its worker, never the oracle of the model runs.
/** Runs one case table in its worker processes, with a progress bar and every non-exact case printed. */
async function runTable<C extends { id: string; op: string }>(
  label: string,
  prefix: string,
  cases: readonly C[],
  run: (cs: readonly C[], onResult: (r: CaseResult, done: number) => void) => Promise<IsolatedRun>,
  cover: (rs: CaseResult[]) => Coverage,
  dev: DeviceInfo,
): Promise<{ cov: Coverage; run: IsolatedRun }> {
  const bar = new ProgressBar(`[${label}]`);
  bar.update(0, `${cases.length} cases`);
  const r = await run(cases, (_r, done) => bar.update(done / cases.length, `${done}/${cases.length} cases`));
  const cov = cover(r.results);
  const unsup = cov.unsupported.length ? `, ${cov.unsupported.length} unsupported on ${dev.backend}` : "";
  const bugs = cov.mlxBugs.length ? `, ${cov.mlxBugs.length} at MLX bugs` : "";
  bar.done(`${cov.bitExact}/${cov.cases} cases bit-exact${unsup}${bugs}, ${cov.failures.length} failed, ${cov.tested.length}/${cov.exposed.length} ops tested`);
  for (const [msg, ids] of groupUnsupported(cov.unsupported)) process.stderr.write(`  unsupported on ${dev.backend} (${ids.length}): ${msg}\n    ${ids.join(", ")}\n`);
  for (const b of cov.mlxBugs) process.stderr.write(`  ${prefix}${b.id} diverges at MLX bug ${b.mlxBug!.id} (${b.mlxBug!.reproducer}): ${b.detail}\n`);
  for (const f of cov.failures) process.stderr.write(`  FAIL ${prefix}${f.id}: ${f.detail}\n`);
  for (const p of r.poisoners) process.stderr.write(`  ${prefix}${p.id} left a sticky error behind (binding: ${p.ts ?? "ok"}; oracle: ${p.py ?? "ok"}); the rest ran in fresh processes\n`);
  return { cov, run: r };
}

async function opLevel(dev: DeviceInfo): Promise<OpLevelSummary> {
  const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
  const grads = vjpCases();
  const fwd = await runTable("ops", "", CASES, (cs, on) => runCasesIsolated(cs, on), (rs) => coverage(exposed, CASES, rs), dev);
  const grad = await runTable("vjp", "vjp:", grads, (cs, on) => runVjpCasesIsolated(cs, on), (rs) => vjpCoverage(exposed, grads, rs), dev);
  const nonExact = ([[fwd, ""], [grad, "vjp:"]] as const).flatMap(([{ run }, prefix]) =>
    run.results
      .filter((r) => r.status !== "exact")
      .map((r) => ({ id: `${prefix}${r.id}`, op: r.op, status: r.status as "unsupported" | "mlx-bug" | "fail", detail: r.mlxBug ? `MLX bug ${r.mlxBug.id} (${r.mlxBug.reproducer}): ${r.detail}` : (r.detail ?? ""), sticky: r.sticky === true })),
  );
  return {
    opsExposed: fwd.cov.exposed.length,
    opsTested: fwd.cov.tested.length,
    cases: fwd.cov.cases,
    bitExact: fwd.cov.bitExact,
    unsupported: fwd.cov.unsupported.length,
    mlxBug: fwd.cov.mlxBugs.length,
    failed: fwd.cov.failures.length,
    backend: dev.backend,
    device: dev.device,
    workers: fwd.run.workers + grad.run.workers,
    vjp: {
      opsDifferentiable: grad.cov.exposed.length,
      opsTested: grad.cov.tested.length,
      cases: grad.cov.cases,
      bitExact: grad.cov.bitExact,
      unsupported: grad.cov.unsupported.length,
      mlxBug: grad.cov.mlxBugs.length,
      failed: grad.cov.failures.length,
    },
    nonExact,
  };
}

interface ScenarioEntry {
  id: string;
  prompt?: number[];
  prefill_step_size?: number;
  max_tokens?: number;
}

async function fixtureRuns(oracle: OracleClient, budget: Budget, only: string | undefined, bisectOn: boolean): Promise<RunResult[]> {
  const plan = await oracle.request<{
    checkpoints: { id: string; moe: boolean }[];
    mm_checkpoints: { id: string; towers: string[] }[];
    mm_scenarios: { id: string; kind: string }[];
    unified_checkpoints?: { id: string }[];
  }>("plan");
  const scenarios = new Map(
    (JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "scenarios.json"), "utf8")) as { scenarios: ScenarioEntry[] }).scenarios.map((s) => [s.id, s]),
  );
  const re = only ? globRe(only) : null;
  const ckpts = plan.checkpoints.filter((c) => !re || re.test(c.id));
  const mmCkpts = plan.mm_checkpoints.filter((c) => !re || re.test(c.id));
  const unifiedCkpts = (plan.unified_checkpoints ?? []).filter((c) => !re || re.test(c.id));
  if (ckpts.length + mmCkpts.length + unifiedCkpts.length === 0) throw new UsageError(`--only '${only}' matches no fixture checkpoint (ids look like c3_e2b/bf16, m2_e2b/f32 or u1_dense/f32)`);
  const build = new ProgressBar("[checkpoints]");
  build.update(0, "building the fixture checkpoints with mlx-lm (cached after the first run)");
  await oracle.request("make_checkpoints", {}, 1_800_000);
  build.done(`${plan.checkpoints.length + plan.mm_checkpoints.length + (plan.unified_checkpoints ?? []).length} fixture checkpoints ready`);
  const specs: RunSpec[] = [];
  for (const c of ckpts) {
    for (const sid of c.moe ? [FIXTURE_SCENARIOS.all, FIXTURE_SCENARIOS.moe] : [FIXTURE_SCENARIOS.all]) {
      const s = scenarios.get(sid)!;
      specs.push(fixtureSpec(c.id, s, budget, { prompt: s.prompt!, bisect: bisectOn }));
    }
  }
  const mmScenarios = JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "mm_scenarios.json"), "utf8")) as { scenarios: ScenarioEntry[] };
  for (const c of mmCkpts) {
    for (const sid of c.towers.includes("audio") ? [MM_FIXTURE_SCENARIOS.all, MM_FIXTURE_SCENARIOS.audio] : [MM_FIXTURE_SCENARIOS.all]) {
      const s = mmScenarios.scenarios.find((x) => x.id === sid)!;
      specs.push(fixtureSpec(c.id, s, budget, { prompt: [], media: { scenario: sid } }));
    }
  }
  for (const c of unifiedCkpts) {
    const s = unifiedScenario(UNIFIED_FIXTURE_SCENARIO);
    const dir = join(REPO_ROOT, ".cache", "checkpoints", c.id);
    const unified = () => unifiedInputs(s, modelConfigFromDict(JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>, join(dir, "config.json")));
    specs.push(fixtureSpec(c.id, { id: s.id, prefill_step_size: s.prefill_step_size, max_tokens: s.max_tokens }, budget, { prompt: [], media: { scenario: inlineScenario(s), unified } }));
  }
  // The oracle captures run k+1 while TS compares run k (two processes, two cores).
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

/** The run of fixture checkpoint `id` on scenario `s` (its prefill step size and decode steps). */
function fixtureSpec(id: string, s: ScenarioEntry, budget: Budget, rest: Pick<RunSpec, "prompt" | "bisect" | "media">): RunSpec {
  const [fixture, variant] = id.split("/") as [string, string];
  const tsDir = join(REPO_ROOT, ".cache", "checkpoints", id);
  return { tsDir, oracleCheckpoint: id, model: fixture, variant, prefillStepSize: s.prefill_step_size!, steps: s.max_tokens!, budget, ...rest };
}

/**
 * The three-way check on the float32 fixtures: the TS model and mlx-lm on the exported
 * reference's tokens, TS = mlx-lm byte for byte, and both within the recorded bound of
 * transformers (oracle/reference.ts).
 */
async function referenceSection(oracle: OracleClient, only: string | undefined): Promise<ReferenceSummary | null> {
  const manifest = readReferenceManifest();
  if (manifest === null) return null;
  const re = only ? globRe(only) : null;
  const fixtures = Object.values(manifest.fixtures).filter((e) => !re || re.test(e.checkpoint));
  if (fixtures.length === 0) return null;
  const bar = new ProgressBar("[reference]");
  const rows: ReferenceRow[] = [];
  const judged = referenceBoundApplies();
  for (const [k, e] of fixtures.entries()) {
    bar.update(k / fixtures.length, `${e.checkpoint} against transformers`);
    const { model, text } = loadModel(join(REPO_ROOT, ".cache", "checkpoints", e.checkpoint));
    let d;
    try {
      d = compareWithReference(e.checkpoint, e, model, text.args.num_hidden_layers);
    } finally {
      model.dispose();
    }
    const theirs = await oracle.forward(e.checkpoint, [d.tokens]);
    const mlxLogits = new Float32Array(theirs.data.slice().buffer);
    const same = theirs.dtype === "float32" && Buffer.compare(Buffer.from(theirs.data), Buffer.from(new Uint8Array(d.logits.buffer))) === 0;
    const mlx = relDiff(mlxLogits, d.referenceLogits).rel;
    rows.push({
      checkpoint: e.checkpoint,
      tsEqualsMlxLm: same,
      tsVsTransformers: { logits: d.logitsRel, hidden: d.hiddenRel },
      mlxLmVsTransformers: { logits: mlx },
      judged: judged,
      ok: same && (!judged || (d.ok && mlx <= REFERENCE_BOUND.relative)),
    });
  }
  bar.done(`${rows.filter((r) => r.ok).length}/${rows.length} float32 fixtures: TS = mlx-lm bit for bit${judged ? `, both within ${REFERENCE_BOUND.relative} of transformers` : ` (the bound was measured on the CPU device: on ${mx.backend()} float32 matmuls run in TF32, distances shown, not judged)`}`);
  return { bound: REFERENCE_BOUND.relative, versions: manifest.versions, rows };
}

/**
 * --prompt: the prompt's token ids from mlx-lm's tokenizer (and chat template, with --chat) must
 * equal the TS tokenizer's before the models are compared on them.
 */
async function compareTokenization(oracle: OracleClient, dir: string, prompt: string, chat: boolean, ours: readonly number[], content: unknown = prompt): Promise<void> {
  const r = await oracle.request<{ with_special: number[][]; chats: number[][] }>(
    "tokenize",
    chat ? { dir, chats: [{ messages: [{ role: "user", content }], add_generation_prompt: true }] } : { dir, strings: [prompt] },
  );
  const theirs = chat ? r.chats[0] : r.with_special[0];
  if (!theirs || theirs.length !== ours.length || theirs.some((t, i) => t !== ours[i])) {
    throw new Error(`the prompt tokenizes differently: TS [${ours.join(",")}] vs mlx-lm [${(theirs ?? []).join(",")}]`);
  }
  process.stderr.write(`[tokenizer] ${ours.length} prompt tokens${chat ? " (chat template)" : ""}: TS = mlx-lm\n`);
}

/** A --model run's spec: a gemma4 media run keeps its request; a gemma4_unified one its prompt's ids before expansion. */
type ModelSpec = RunSpec & { mediaRequest?: MediaRequest; unifiedTokenized?: UnifiedMediaPlan["tokenized"]; unifiedPlan?: UnifiedMediaPlan };

/** A --model run after its pre-flight: the prompt's tokenization against mlx-lm's, then the tap-by-tap run. */
export async function modelRun(oracle: OracleClient, plan: { a: Parsed; spec: ModelSpec | null }): Promise<RunResult> {
  const { a, spec } = plan;
  if (!spec) throw new UsageError("modelRun needs a --model plan");
  // a media prompt: its text tokens (before the placeholders are expanded), the media's
  // typed parts in the user message when --chat placed them
  const tok = spec.mediaRequest?.tokenized ?? spec.unifiedTokenized;
  // a gemma4_unified video: both sides from OpenCV's frames (the decoders differ by a few levels)
  if (spec.unifiedPlan) await useOpenCvFrames(oracle, spec.unifiedPlan);
  // (a unified --video prompt: the expanded text, as Gemma4Processor hands it to the tokenizer)
  const text = spec.unifiedTokenized?.text ?? a.prompt;
  if (typeof text === "string") await compareTokenization(oracle, spec.oracleCheckpoint, text, a.chat === true, tok?.ids ?? spec.prompt, tok?.content);
  return runOne(oracle, spec);
}

async function runOne(oracle: OracleClient, spec: RunSpec, capture?: Promise<Capture>): Promise<RunResult> {
  const bar = new ProgressBar(`[${spec.model} ${spec.variant}${spec.media ? " media" : ""}]`);
  bar.update(0, `${spec.media ? "mlx-vlm" : "mlx-lm"} capturing`);
  const r = await runParity(oracle, spec, (p) => {
    const frac = (p.callIndex + ((p.layer ?? 0) + 1) / Math.max(1, p.layers)) / Math.max(1, p.calls);
    bar.update(frac, `${p.call} (${p.callIndex + 1}/${p.calls}) · layer ${(p.layer ?? 0) + 1}/${p.layers}`);
  }, capture);
  bar.done(r.firstDivergence ? `diverges: ${fmtDivergence(r.firstDivergence)}` : `${r.bitExact}/${r.tapsCompared} taps bit-exact`);
  return r;
}

/** Everything about a --model run that can be checked before the oracle starts. */
async function modelSpec(a: Record<string, unknown>, budget: Budget): Promise<ModelSpec> {
  const dir = resolve(String(a.model));
  const info = inspectCheckpoint(dir);
  if (wantsMedia(a as Parsed)) {
    if (a.bisect) throw new UsageError("--bisect replays text-model blocks; it does not apply to --image / --audio runs");
    if (a["oracle-model"] !== undefined) throw new UsageError("--oracle-model does not apply to --image / --audio runs");
    if (isUnifiedCheckpoint(dir)) return unifiedSpec(dir, a as Parsed, info.modelType, budget);
    const req = await mediaRequest(dir, a as Parsed);
    const steps = Number(a.steps);
    const prefill = Number(a["prefill-step-size"]);
    if (steps < 1) throw new UsageError("--steps must be at least 1");
    if (prefill < 1) throw new UsageError("--prefill-step-size must be at least 1");
    checkMediaCheckpoint(dir);
    const scenario = { id: "parity-cli-media", kind: "generate", prompt: req.prompt, media: req.media, prefill_step_size: prefill, max_tokens: steps };
    return { tsDir: dir, oracleCheckpoint: dir, model: basename(dir), variant: info.modelType, prompt: [], prefillStepSize: prefill, steps, budget, media: { scenario }, mediaRequest: req };
  }
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
  // Everything the TS loader would refuse (config, shapes, files), without reading the weights:
  // a bad checkpoint gets our error naming file and key, and no oracle process is started for it.
  checkCheckpoint(dir);
  if (oracleDir !== dir) {
    inspectCheckpoint(oracleDir);
    checkCheckpoint(oracleDir);
  }
  return { tsDir: dir, oracleCheckpoint: oracleDir, model: basename(dir), variant: info.modelType, prompt, prefillStepSize: prefill, steps, budget, bisect: a.bisect === true };
}

/** A gemma4_unified --image run (parity/unified_face.ts): the TS processor's inputs, mlx-vlm's generate_step on the same files. */
async function unifiedSpec(dir: string, a: Parsed, variant: string, budget: Budget): Promise<ModelSpec> {
  const steps = Number(a.steps);
  const prefill = Number(a["prefill-step-size"]);
  if (steps < 1) throw new UsageError("--steps must be at least 1");
  if (prefill < 1) throw new UsageError("--prefill-step-size must be at least 1");
  // the tap scheme covers one vision pass per embed call (oracle/TAPS.md): images or videos
  if (a.image !== undefined && a.video !== undefined) throw new UsageError("npm run parity takes --video with --audio, not with --image (the tap scheme covers an embed call with images or videos, not both; npm run generate takes both)");
  checkUnifiedCheckpoint(dir);
  const plan = await unifiedMediaPlan(dir, a);
  const scenario = unifiedScenarioOf(plan, prefill, steps);
  return { tsDir: dir, oracleCheckpoint: dir, model: basename(dir), variant, prompt: [], prefillStepSize: prefill, steps, budget, media: { scenario, unified: () => plan }, unifiedTokenized: plan.tokenized, ...(plan.videos ? { unifiedPlan: plan } : {}) };
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
    lines.push(`Op-level parity (@mlx-bun/mlx vs Python MLX, ${o.backend} backend, device ${o.device})`);
    lines.push(
      textTable(
        ["table", "ops exposed", "ops parity-tested", "cases", "bit-exact cases", `unsupported on ${o.backend}`, "at MLX bugs", "failed"],
        [
          ["forward", String(o.opsExposed), `${o.opsTested} (${pct(o.opsTested, o.opsExposed)})`, String(o.cases), `${o.bitExact} (${pct(o.bitExact, o.cases)})`, String(o.unsupported), String(o.mlxBug), String(o.failed)],
          ["vjp", `${o.vjp.opsDifferentiable} differentiable`, `${o.vjp.opsTested} (${pct(o.vjp.opsTested, o.vjp.opsDifferentiable)})`, String(o.vjp.cases), `${o.vjp.bitExact} (${pct(o.vjp.bitExact, o.vjp.cases)})`, String(o.vjp.unsupported), String(o.vjp.mlxBug), String(o.vjp.failed)],
        ],
      ),
      "",
    );
  }
  if (rep.runs.length) {
    lines.push("Model parity (TS vs mlx-lm; media runs vs mlx-vlm: every tap of every generate_step call)");
    lines.push(textTable(SUMMARY_HEADER, rep.runs.map(summaryRow)), "");
    const taps = rep.runs.reduce((s, r) => s + r.tapsCompared, 0);
    const exact = rep.runs.reduce((s, r) => s + r.bitExact, 0);
    for (const r of rep.runs) {
      const b = r.firstDivergence?.bisect;
      if (!r.firstDivergence) continue;
      lines.push(`First divergence in ${r.model} · ${r.variant}: ${fmtDivergence(r.firstDivergence)}, first differing index ${r.firstDivergence.firstIndex}`);
      if (r.mlxBug) lines.push(`  the first divergent tap ${r.mlxBug.tap} is produced by a recorded MLX bug on ${process.env.MLX_BUGS_ASSUME_CUDA_GPU === "1" ? "CUDA (simulated: MLX_BUGS_ASSUME_CUDA_GPU=1)" : mx.backend()} (${r.mlxBug.id}): ${r.mlxBug.what}; reproducer ${r.mlxBug.reproducer}; counted apart, ${r.unverifiedTaps} of its ${r.tapsCompared} taps unverified`);
      if (b) lines.push(`  bisect: first differing MLX op ${b.op}(${b.inputs.map((i) => `${i.dtype}[${i.shape.join(",")}]`).join(", ")}), max abs ${fmtNum(b.maxAbs)}, max ULP ${fmtNum(b.maxUlp)}`);
      const params = b?.differingParameters;
      if (params?.length) lines.push(`  parameters whose bytes differ from mlx-lm's checkpoint: ${params.join(", ")}`);
      else if (b === null) lines.push("  bisect: every op of the block matches when replayed with mlx-lm's parameters; the TS block computes something else than mlx-lm (a port difference, not a data one)");
    }
    const atBug = rep.runs.filter((r) => r.mlxBug).length;
    lines.push(`${rep.runs.length} runs · ${taps} taps compared · ${exact} bit-exact (${pct(exact, taps)}) · budget ${rep.budget.ulp} ULP / atol ${fmtNum(rep.budget.atol)}${atBug ? ` · ${atBug} runs diverge first at a tap of a recorded MLX bug` : ""}`);
  }
  if (rep.reference) {
    const rf = rep.reference;
    lines.push("", `Independent reference (transformers ${rf.versions.transformers}, torch ${rf.versions.torch}; float32; bound ${rf.bound} relative)`);
    lines.push(textTable(REFERENCE_HEADER, rf.rows.map(referenceRow)), "");
  }
  lines.push(`Verdict: ${rep.verdict.text}`);
  process.stdout.write(`${lines.join("\n")}\n`);
}

type Mode = (oracle: OracleClient, a: Parsed) => Promise<boolean>;

export interface ParityPlan {
  a: Parsed;
  dev: DeviceInfo;
  /** --mode NAME: that decoding mode's runner (no tap-by-tap run then). */
  mode: Mode | null;
  budget: Budget;
  spec: ModelSpec | null;
}

/**
 * Everything checked before the oracle starts (flags, device, checkpoint, prompt): bad input
 * fails fast with a UsageError, ConfigError or WeightsError, and no Python process is started
 * for it. Null for --help.
 */
export async function parityPlan(argv: readonly string[]): Promise<ParityPlan | null> {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  if (a.mode === "batch") batchModeCheck(a);
  else if (a.scenario !== undefined) throw new UsageError("--scenario applies to --mode batch");
  for (const k of ["prompt", "chat", "tokens", "oracle-model", "image", "audio", "video"]) if (a[k] !== undefined && a.model === undefined) throw new UsageError(`--${k} needs --model`);
  if (a.model !== undefined && (a.only !== undefined || a["skip-ops"])) throw new UsageError("--only and --skip-ops apply to the fixture run, not to --model");
  // The device first: it applies to every mode, and a missing GPU fails before any oracle starts.
  const dev = applyDeviceFlag(a.device);
  let mode: Mode | null = null;
  if (a.mode !== undefined) {
    mode = MODES[String(a.mode)] ?? null;
    if (!mode) throw new UsageError(`unknown --mode ${a.mode} (modes: ${Object.keys(MODES).join(", ")})`);
    if (a.model !== undefined && a.mode !== "batch") throw new UsageError("--mode runs on the fixtures; it does not take --model");
  }
  const budget: Budget = { ulp: Number(a.ulp), atol: Number(a.atol) };
  if (budget.ulp < 0 || budget.atol < 0) throw new UsageError("--ulp and --atol must be >= 0");
  // --kv-batch-tokens: a batch through mlx-vlm's batch path with quantized caches (parity/kv_quant_batch_face.ts)
  const kvBatch = kvQuantBatchParityRun(a);
  if (kvBatch) return { a, dev, mode: () => kvBatch(), budget, spec: null };
  // --kv-bits: a KV-quantized --model run against mlx-vlm's generate_step (parity/kv_quant_flags.ts)
  if (a.video !== undefined || mode) kvQuantParityRun(a, null, null);
  if (a.video !== undefined && !(a.model !== undefined && existsSync(String(a.model)) && isUnifiedCheckpoint(resolve(String(a.model))))) {
    // video: block by block, then tap by tap against mlx-vlm (parity/video_parity.ts), files checked before the oracle starts
    // (a gemma4_unified checkpoint's video is a --model media run: unifiedSpec)
    if (mode) throw new UsageError("--video does not take --mode");
    await videoParityPreflight(a);
    return { a, dev, mode: videoParity, budget, spec: null };
  }
  const spec = a.model === undefined || mode ? null : await modelSpec(a, budget);
  const textSpec = spec && !spec.mediaRequest ? spec : null;
  const kvRun = kvQuantParityRun(a, textSpec, textSpec ? inspectCheckpoint(textSpec.tsDir).text : null);
  if (kvRun) return { a, dev, mode: () => kvRun(), budget, spec: null };
  if (spec?.mediaRequest) {
    // the TS processor's output, checked before the capture (mlx-vlm would silently wrap a
    // placeholder count that does not match the media); the oracle runs mlx-vlm's own processor
    // on the same files, and the embed/inputs taps compare the two
    spec.media!.prepared = await prepareMedia(spec.tsDir, spec.mediaRequest, checkpointTowers(spec.tsDir));
  }
  return { a, dev, mode, budget, spec };
}

async function main(argv: string[]): Promise<number> {
  const plan = await parityPlan(argv);
  if (plan === null) {
    process.stdout.write(helpText("npm run parity -- [options]", "Compares the TypeScript Gemma 4 model with mlx-lm tap by tap, on the embedded fixtures or on a local checkpoint.", FLAGS, FOOTER));
    return 0;
  }
  const { a, dev, mode, budget } = plan;

  // ORACLE_PYTHON: another interpreter for the oracle (default: the repo's .venv).
  const oracle = await OracleClient.start({ python: process.env.ORACLE_PYTHON || undefined, onStderr: a.verbose ? (l) => process.stderr.write(`[oracle] ${l}\n`) : undefined });
  if (mode) {
    try {
      return (await mode(oracle, a)) ? 0 : 1;
    } finally {
      await oracle.close();
    }
  }
  let rep: ParityReport;
  try {
    const opLevelSummary = a.model === undefined && !a["skip-ops"] ? await opLevel(dev) : null;
    let runs: RunResult[];
    try {
      runs = a.model === undefined ? await fixtureRuns(oracle, budget, a.only as string | undefined, a.bisect === true) : [await modelRun(oracle, plan)];
    } finally {
      if (plan.spec?.media?.prepared) disposeMediaInputs(plan.spec.media.prepared.media);
    }
    const reference = a.model === undefined ? await referenceSection(oracle, a.only as string | undefined) : null;
    const verdict = reportVerdict(runs, opLevelSummary, reference, a.strict === true);
    rep = {
      schema: SCHEMA_ID,
      createdAt: new Date().toISOString(),
      versions: { libmlx: mx.version(), ...(oracle.versions ?? {}), bun: Bun.version, platform: `${process.platform}-${process.arch}`, backend: dev.backend, device: dev.device, ...(dev.gpu ? { gpu: dev.gpu } : {}), ...(process.env.MLX_BUGS_ASSUME_CUDA_GPU === "1" ? { mlxBugsAttribution: "simulated CUDA GPU (MLX_BUGS_ASSUME_CUDA_GPU=1, tests only)" } : {}) },
      budget,
      opLevel: opLevelSummary,
      runs,
      reference,
      verdict,
      ok: verdict.status !== "fail",
    };
  } finally {
    await oracle.close();
  }
  printSummary(rep);
  const files = writeReports(rep, resolve(String(a.out)));
  process.stdout.write(`Reports: ${files.join(", ")}\n`);
  return rep.ok ? 0 : 1;
}

/** Exit 3 (documented in --help and the README): the oracle failed, so there is no verdict. */
export const ORACLE_FAILED = 3;

/** The one message of a failed run: an oracle failure is named as such, never as a divergence. */
export function errorMessage(err: Error): string {
  const msg = err.message.split("\n--- python traceback ---")[0];
  if (err instanceof OracleError) return `\nerror: the oracle failed, no verdict (exit ${ORACLE_FAILED}): ${msg}\n(run with --verbose for the Python traceback)\n`;
  return `\nerror: ${msg}\n${isInputError(err) ? "" : "(run with --verbose for details)\n"}`;
}

if (import.meta.main) runMain(main, errorMessage, (err) => (err instanceof OracleError ? ORACLE_FAILED : undefined));
