// The llama.cpp conformance grid (opt-in; minutes): for every fixture variant, a llama.cpp dump of
// a forward and of a greedy generation (engines/llama_cpp/dump.ts), validated against the
// checkpoint copy it names (oracle/conform/dump.ts), and compared with mlx-lm run by the oracle
// on that same copy: KL(mlx-lm ‖ llama.cpp) per row, top-1 agreement, top-10 overlap, |Δp| of
// mlx-lm's top token (oracle/conform/metrics.ts), the largest |Δ log-probability| over the whole
// vocabulary, and the first generation step whose greedy token differs. It also checks that mlx-lm
// gives the same logits, bit for bit, on the prepared copy and on the original checkpoint (the copy
// holds the same weights). Where the converter refuses a variant its message is recorded.
// Writes engines/llama_cpp/results.json (checked in; suites/conform/llama_cpp.test.ts reads it).
//
//   CONFORM_ENGINES=llama_cpp bun engines/llama_cpp/measure.ts [--only c1_dense/f32,...]
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { OracleClient } from "../../oracle/client.ts";
import { readDump, validateDump } from "../../oracle/conform/dump.ts";
import { firstDifferingStep, logitMetrics, type LogitMetrics, logSoftmax, tensorMetrics, toFloat64 } from "../../oracle/conform/metrics.ts";
import { compareTensor } from "../../oracle/conform/tensor_compare.ts";
import { judge, loadNoiseFloor } from "../../oracle/conform/verdict.ts";
import type { RawTensor } from "../../oracle/tensor_diff.ts";
import { ensureVenv } from "../../oracle/reference_export.ts";
import { llamaDump, resolveCheckpoint } from "./dump.ts";
import { ConversionRefused, EngineAborted, HERE, optedIn, REPO, WORK } from "./engine.ts";

/** Every text fixture variant stored unquantized, then the quantized ones (refused: recorded). */
export const VARIANTS = [
  "c1_dense/f32",
  "c2_keqv/f32",
  "c3_e2b/f32",
  "c4_e4b/f32",
  "c5_moe/hf_f32",
  "c5_moe/f32",
  "c6_sink/f32",
  "c6_sink/wrap_f32",
  "c7_defaults/f32",
  "c7_plainrope/f32",
  "c1_dense/bf16",
  "c2_keqv/bf16",
  "c3_e2b/bf16",
  "c4_e4b/bf16",
  "c3_e2b/hf_bf16",
  "c7_defaults/bf16",
  "c1_dense/f16",
  "c3_e2b/f16",
  "c1_dense/q4g32_f32",
  "c5_moe/mxfp4",
];

export const PREFILL_STEP_SIZE = 4;
export const MAX_TOKENS = 8;
export const SEED = 1;

export interface Distances extends LogitMetrics {
  /** max over rows and tokens of |log p_llama.cpp − log p_mlx-lm| (natural log). */
  maxAbsDLogprob: number;
}

export interface VariantResult {
  checkpoint: string;
  /** refused: by the converter; load_refused: llama.cpp would not load the GGUF; aborted: llama.cpp ended its process (GGML_ASSERT). */
  status: "measured" | "refused" | "load_refused" | "aborted";
  refusal?: string;
  level?: number;
  /** sha256 of the prepared copy's files (what the dumps name). */
  files?: Record<string, string>;
  rewrittenMoeLayout?: string[];
  /** mlx-lm's logits on the prepared copy equal its logits on the original checkpoint, bit for bit. */
  oracleSameOnPrepared?: boolean;
  samplerAgreesWithArgmax?: boolean;
  prompt?: number[];
  forward?: Distances;
  generate?: Distances & {
    /** Steps compared: up to and including the first differing token (later steps see other inputs). */
    stepsCompared: number;
    firstDifferingStep: number | null;
    llamaTokens: number[];
    mlxTokens: number[];
  };
  /** mlx-lm's dtype on this checkpoint (bf16 checkpoints run in bf16 in mlx-lm, in f32 in the GGUF). */
  oracleDtype?: string;
  /**
   * bfloat16/float16 checkpoints: the level-0 forward against mlx-lm in float32 on a float32 copy of
   * the same values (prepare_checkpoint.py --upcast), the weights the float32 GGUF holds: what
   * separates llama.cpp from mlx-lm once mlx-lm's own bfloat16/float16 arithmetic is taken out.
   */
  f32Reference?: Distances;
  /** Level 1 (llama_taps, raw logits): relative L2 error ‖llama.cpp − mlx-lm‖/‖mlx-lm‖ of each residual tap, forward. */
  level1?: { relL2: Record<string, number>; maxAbs: Record<string, number>; logits: Distances };
  /** The level-1 forward judged against the measured noise floor (oracle/conform/noise_floor.json), as npm run conform judges it. */
  verdict?: { status: string; headline: string; firstLayerOutside: number | null; floorStatus: string; layer0Ratio: number };
  /** The control experiment (gelu_table_check.py): llama.cpp's forward log-probabilities against mlx-lm as it is, and against mlx-lm with ggml's float16 GELU lookup. */
  geluControl?: {
    stock_gelu: GeluDistance;
    ggml_table_gelu: GeluDistance;
    /** Per position: layer 0's output, llama.cpp against mlx-lm with the lookup (relative L2). */
    layer0_rel_l2_per_position: number[];
    /** Per position: the smallest |x − nearest float16 rounding midpoint| / |x| over layer 0's GELU inputs (mlx-lm's). */
    layer0_gelu_input_midpoint_margin_per_position: number[];
  };
}

interface GeluDistance {
  max_abs_dlogprob: number;
  kl_mean: number;
  kl_max: number;
  row_max_abs_dlogprob: number[];
  "rows_within_1e-5": number;
}

function distances(engine: RawTensor, oracle: RawTensor): Distances {
  const V = oracle.shape.at(-1)!;
  const m = logitMetrics(engine, oracle);
  const a = toFloat64(engine);
  const b = toFloat64(oracle);
  let maxAbs = 0;
  for (let r = 0; r < a.length / V; r++) {
    const la = logSoftmax(a.subarray(r * V, (r + 1) * V));
    const lb = logSoftmax(b.subarray(r * V, (r + 1) * V));
    for (let i = 0; i < V; i++) maxAbs = Math.max(maxAbs, Math.abs(la[i]! - lb[i]!));
  }
  return { ...m, maxAbsDLogprob: maxAbs };
}

function concatRows(rows: RawTensor[], V: number): RawTensor {
  const parts = rows.map((r) => toFloat64(r));
  const out = new Float64Array(parts.length * V);
  parts.forEach((p, i) => out.set(p, i * V));
  return { dtype: "float64", shape: [1, parts.length, V], data: new Uint8Array(out.buffer) };
}

const sameBytes = (a: RawTensor, b: RawTensor) => a.dtype === b.dtype && a.data.length === b.data.length && a.data.every((x, i) => x === b.data[i]);

export async function measureVariant(oracle: OracleClient, id: string, install: boolean): Promise<VariantResult> {
  const { dir: source } = resolveCheckpoint(id);
  const base = join(WORK, "dumps", id.replace("/", "_"));
  let fwd;
  try {
    fwd = await llamaDump({ checkpoint: id, out: join(base, "forward"), seed: SEED, schedule: { kind: "forward" }, install, level: 0 });
  } catch (e) {
    if (e instanceof ConversionRefused) return { checkpoint: id, status: "refused", refusal: e.refusal };
    if (e instanceof EngineAborted) return { checkpoint: id, status: e.isAbort ? "aborted" : "load_refused", refusal: e.engineMessage };
    throw e;
  }
  const gen = await llamaDump({ checkpoint: id, out: join(base, "generate"), seed: SEED, schedule: { kind: "generate", prefill_step_size: PREFILL_STEP_SIZE, max_tokens: MAX_TOKENS }, install, level: 0 });
  const prompt = fwd.manifest.prompt;
  // both dumps must pass the validator against the copy they name
  validateDump(join(base, "forward"), fwd.checkpoint);
  validateDump(join(base, "generate"), gen.checkpoint);

  const onCopy = await oracle.forward(fwd.checkpoint, [prompt]);
  const onSource = await oracle.forward(source, [prompt]);
  const fd = readDump(join(base, "forward"));
  const forward = distances(fd.tensors.read("logprobs"), onCopy);

  const V = onCopy.shape.at(-1)!;
  const og = await oracle.generate(gen.checkpoint, prompt, { prefillStepSize: PREFILL_STEP_SIZE, maxTokens: MAX_TOKENS });
  const gd = readDump(join(base, "generate"));
  const llamaTokens = gen.manifest.generated ?? [];
  const first = firstDifferingStep(llamaTokens, og.tokens);
  const steps = first === null ? MAX_TOKENS : first + 1;
  const eng = concatRows(Array.from({ length: steps }, (_, n) => gd.tensors.read(`step${n}/logprobs`)), V);
  const orc = concatRows(og.logprobs.slice(0, steps), V);
  // level 1: the residual stream through llama.cpp's C API, compared tap by tap with mlx-lm's capture
  const l1 = await llamaDump({ checkpoint: id, out: join(base, "forward_l1"), seed: SEED, schedule: { kind: "forward" }, install, level: 1 });
  validateDump(join(base, "forward_l1"), l1.checkpoint);
  const l1d = readDump(join(base, "forward_l1"));
  const names = l1d.tensors.names.filter((n) => n !== "logits");
  const cap = await oracle.capture(l1.checkpoint, { id: "llama_cpp_l1", kind: "forward", tokens: [prompt] }, { mode: "full", only: names });
  const relL2: Record<string, number> = {};
  const maxAbs: Record<string, number> = {};
  const comparisons = [];
  for (const n of names) {
    const tap = cap.taps.find((t) => t.name === n);
    if (!tap?.array) throw new Error(`mlx-lm's capture has no ${n}`);
    const m = tensorMetrics(l1d.tensors.read(n), tap.array);
    relL2[n] = m.relL2;
    maxAbs[n] = m.maxAbs;
    const layer = /^layers\.(\d+)\//.exec(n);
    comparisons.push(compareTensor(n, { call: "forward", layer: layer ? Number(layer[1]) : null, kind: layer ? "output" : n }, l1d.tensors.read(n), n, tap.array));
  }
  comparisons.push(compareTensor("logits", { call: "forward", layer: null, kind: "logits" }, l1d.tensors.read("logits"), "logits", onCopy));
  const level1 = { relL2, maxAbs, logits: distances(l1d.tensors.read("logits"), onCopy) };
  const floor = loadNoiseFloor();
  const v = judge(comparisons, floor);
  const l0 = v.tensors.find((t) => t.name === "layers.0/output");
  const verdict = { status: v.status, headline: v.headline, firstLayerOutside: v.firstLayerOutside, floorStatus: floor.status, layer0Ratio: l0?.ratio ?? Number.NaN };
  let f32Reference: Distances | undefined;
  if (onCopy.dtype !== "float32") {
    const up = join(WORK, "upcast", id.replace("/", "_"));
    const r = spawnSync(ensureVenv(), [join(HERE, "prepare_checkpoint.py"), "--upcast", fwd.checkpoint, up], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    if (r.status !== 0) throw new Error(`prepare_checkpoint.py --upcast failed: ${r.stderr}`);
    const ref = await oracle.forward(up, [prompt]);
    if (ref.dtype !== "float32") throw new Error(`mlx-lm ran the float32 copy of ${id} in ${ref.dtype}`);
    f32Reference = distances(fd.tensors.read("logprobs"), ref);
  }
  const control = spawnSync(join(REPO, ".venv", "bin", "python"), [join(HERE, "gelu_table_check.py"), fwd.checkpoint, join(base, "forward"), join(base, "forward_l1")], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  if (control.status !== 0) throw new Error(`gelu_table_check.py failed: ${control.stderr}`);
  const geluControl = JSON.parse(control.stdout.trim().split("\n").pop()!) as VariantResult["geluControl"];
  return {
    checkpoint: id,
    status: "measured",
    level: l1.manifest.level,
    level1,
    verdict,
    geluControl,
    files: fwd.prepared.files,
    rewrittenMoeLayout: fwd.prepared.rewrittenMoeLayout,
    oracleSameOnPrepared: sameBytes(onCopy, onSource),
    samplerAgreesWithArgmax: fwd.samplerAgreesWithArgmax && gen.samplerAgreesWithArgmax,
    prompt,
    oracleDtype: onCopy.dtype,
    ...(f32Reference ? { f32Reference } : {}),
    forward,
    generate: { ...distances(eng, orc), stepsCompared: steps, firstDifferingStep: first, llamaTokens, mlxTokens: og.tokens },
  };
}

async function main(): Promise<number> {
  const argv = process.argv.slice(2);
  const only = argv[0] === "--only" && argv[1] ? argv[1].split(",") : null;
  const ids = only ?? VARIANTS;
  const install = optedIn() || argv.includes("--install");
  const oracle = await OracleClient.start();
  const results: VariantResult[] = [];
  try {
    for (const id of ids) {
      const t0 = performance.now();
      const r = await measureVariant(oracle, id, install);
      results.push(r);
      const f = r.forward;
      process.stderr.write(
        `${id}: ${r.status !== "measured" ? `${r.status}: ${r.refusal}` : `KL mean ${f!.klMean.toExponential(2)} max ${f!.klMax.toExponential(2)} top-1 ${f!.top1} max|Δlogp| ${f!.maxAbsDLogprob.toExponential(2)} gen first diff ${r.generate!.firstDifferingStep} same-on-copy ${r.oracleSameOnPrepared} L1 norm relL2 ${r.level1!.relL2.norm?.toExponential(2)} table-GELU max|Δlogp| ${r.geluControl!.ggml_table_gelu.max_abs_dlogprob.toExponential(2)}`} (${((performance.now() - t0) / 1000).toFixed(1)} s)\n`,
      );
    }
  } finally {
    await oracle.close();
  }
  if (!only) {
    const out = {
      note: "written by CONFORM_ENGINES=llama_cpp bun engines/llama_cpp/measure.ts; llama.cpp through node-llama-cpp (CPU, float32 GGUF, F32 KV cache, 1 thread) against mlx-lm 0.32.2 on the same prepared checkpoint copy; prompt = 16 seeded ids (tokensFor(vocab, 1)); forward over the prompt, and greedy generation with prefill_step_size 4, max_tokens 8",
      prefill_step_size: PREFILL_STEP_SIZE,
      max_tokens: MAX_TOKENS,
      noise_floor: { status: loadNoiseFloor().status, measured_when: loadNoiseFloor().measured?.when ?? null },
      results,
    };
    writeFileSync(join(HERE, "results.json"), `${JSON.stringify(out, null, 1)}\n`);
  } else {
    process.stdout.write(`${JSON.stringify(results, null, 1)}\n`);
  }
  return 0;
}

if (import.meta.main) process.exit(await main());
