// `npm run bench`: the TS model against mlx-lm on the same libmlx, side by side in one run.
//
// Every measurement alternates the two sides (TS, mlx-lm, TS, mlx-lm, ...) after one warm-up
// each, reports median and min–max per side and the TS/mlx-lm ratio of every pair. Both sides
// load the same checkpoint from disk. Timing follows mlx-lm's stream_generate: the prompt clock
// stops at the first token; decode tok/s = (n + 1) / (time since the first token).
// Results: bench/RESULTS.md and bench/results.json.
import * as mx from "@mlx-bun/mlx";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { cpus, loadavg, totalmem } from "node:os";
import { join, relative } from "node:path";
import { helpText, parseArgs, UsageError, type FlagSpec } from "../parity/args.ts";
import { applyDeviceFlag, DEVICE_FLAG, type DeviceInfo } from "../parity/device.ts";
import { decodeBytesPerToken } from "./weights_read.ts";
import { generate } from "../model/generate.ts";
import { loadGenerationModel } from "../model/runtime.ts";
import type { KVCacheLike } from "../model/cache/index.ts";
import { type TrainWorkload, trainBatch, trainWorkloads, tsTrainer } from "./train.ts";
import { measureMtp } from "./mtp.ts";
import { PY, PyWorker } from "./py_worker.ts";
import { baseWorkload, benchKv, type BenchKv, checkKvWorkload, KV_QUANT_FLAGS, kvRequest, kvWorkloadName } from "./kv_rows.ts";
import { makeKvQuantizer } from "../model/cache/kv_quantize.ts";

const ROOT = join(import.meta.dir, "..");

export const FLAGS: FlagSpec[] = [
  { name: "quick", kind: "bool", help: "smoke mode: tiny fixtures only, 2 pairs, short prompts (< 3 minutes)" },
  { name: "pairs", kind: "int", help: "measured TS/mlx-lm pairs per row (after one warm-up each)", default: 5 },
  { name: "only", kind: "string", valueName: "names", help: "comma-separated workload names (tiny-dense,tiny-e2b,tiny-moe,mtp,e2b,moe,train-dense,train-e2b; e4b and 31b run when named, or on a GPU)" },
  { name: "e2b-layers", kind: "int", help: "layers of the E2B-shaped checkpoint (35 = the real model)", default: 35 },
  { name: "e4b-layers", kind: "int", help: "layers of the E4B-shaped checkpoint (42 = the real model)", default: 42 },
  { name: "moe-layers", kind: "int", help: "layers of the 26B-A4B-shaped MoE slice (30 = the real model)", default: 4 },
  { name: "31b-layers", kind: "int", help: "layers of the 31B-shaped dense checkpoint (60 = the real model)", default: 60 },
  { name: "big-prompts", kind: "string", valueName: "list", help: "prompt lengths for the full-width workloads (a 1024-token prefill of a 262144-vocab model takes minutes per run on a small CPU)", default: "128,1024" },
  { name: "big-decode", kind: "int", valueName: "N", help: "decode tokens of the full-width workloads (after the first prompt)", default: 64 },
  { name: "hbm-gbps", kind: "number", valueName: "GB/s", help: "the GPU's memory bandwidth for the roofline fraction (default: the H200's datasheet 4800; a device-to-device copy measured about 4300)", default: 4800 },
  DEVICE_FLAG,
  { name: "big-dtype", kind: "string", valueName: "dtype", help: "dtype of the full-width checkpoints' unquantized parameters and activations: bfloat16 (as released) or float32 (libmlx's CPU quantized matmul runs ~10x faster in float32)", default: "bfloat16" },
  { name: "suite-cost", kind: "bool", help: "also time `npm test` and `npm run golden:regen` (minutes)" },
  { name: "no-workloads", kind: "bool", help: "run no workload (with --suite-cost: only the suite cost)" },
  // the prefill/decode rows with a quantized KV cache on both sides (bench/kv_rows.ts)
  ...KV_QUANT_FLAGS,
  { name: "help", kind: "bool", help: "show this help" },
];

interface Workload {
  name: string;
  what: string;
  dir: string;
  build: string[];
  prompts: number[];
  decode: number;
  /** The warm-up run's [prompt length, tokens]; default: the measured run itself. */
  warmup?: [number, number];
  /** An MTP workload: the gemma4_assistant drafter (bench/mtp.ts) instead of the prefill/decode rows. */
  mtpDrafter?: string;
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? "" : "s"}`;

// The full-width workloads warm up on a 16-token prompt and 2 tokens: that loads the weights
// and JIT-builds the kernels the measured runs use (a full-size warm-up costs minutes there).
const WARMUP_BIG: [number, number] = [16, 2];

interface Shapes {
  quick: boolean;
  e2bLayers: number;
  e4bLayers: number;
  moeLayers: number;
  denseLayers: number;
  bigPrompts: number[];
  bigDecode: number;
  bigDtype: string;
}

function workloads(o: Shapes): Workload[] {
  const fx = (f: string, v: string) => join(ROOT, ".cache", "checkpoints", f, v);
  const prompts = o.quick ? [32] : [128, 1024];
  const decode = o.quick ? 16 : 64;
  const tiny = (name: string, f: string, v: string, what: string): Workload => ({
    name, what, dir: fx(f, v), build: ["oracle/python/make_checkpoints.py", "--only", `${f}/${v}`], prompts, decode,
  });
  const list = [
    tiny("tiny-dense", "c1_dense", "bf16", "fixture C1 (dense, 6 layers, H=64), bfloat16"),
    tiny("tiny-e2b", "c3_e2b", "q4g32", "fixture C3 (E2B-like, PLE + KV sharing), 4-bit g32"),
    tiny("tiny-moe", "c5_moe", "q4g32", "fixture C5 (MoE, k_eq_v), 4-bit g32"),
  ];
  list.push({
    name: "mtp", what: "fixture C1 (dense), float32, with its gemma4_assistant MTP drafter (random weights) vs plain decode",
    dir: fx("c1_dense", "f32"), build: ["oracle/python/make_checkpoints.py", "--only", "c1_dense/f32"], prompts: [o.quick ? 8 : 32], decode: o.quick ? 16 : 64,
    mtpDrafter: join(ROOT, ".cache", "checkpoints", "speculative", "c1_dense_assistant"),
  });
  if (o.quick) return list;
  const tag = o.bigDtype === "bfloat16" ? "" : `-${o.bigDtype}`;
  const big = (name: string, shapeName: string, layers: number, what: string): Workload => {
    const dir = join(ROOT, ".cache", "bench", `${shapeName}-${layers}l${tag}`);
    const build = ["oracle/python/make_checkpoints.py", "--shape", shapeName, "--layers", String(layers), "--dtype", o.bigDtype, "--out", dir];
    return { name, what: `${what}, ${plural(layers, "layer")}, 4-bit g64, ${o.bigDtype} (random weights)`, dir, build, prompts: o.bigPrompts, decode: o.bigDecode, warmup: WARMUP_BIG };
  };
  list.push(
    big("e2b", "e2b", o.e2bLayers, "E2B-shaped, full width"),
    big("e4b", "e4b", o.e4bLayers, "E4B-shaped, full width"),
    big("moe", "26b-a4b", o.moeLayers, "26B-A4B-shaped MoE, 128 experts top-8"),
    big("31b", "31b", o.denseLayers, "31B-shaped dense, k_eq_v"),
  );
  return list;
}

/** Workloads a plain run takes: the big E4B and 31B shapes only on a GPU (or when named). */
const DEFAULT_ON_CPU = new Set(["tiny-dense", "tiny-e2b", "tiny-moe", "e2b", "moe"]);

// ------------------------------------------------------------------ the mlx-lm side (bench/py_worker.ts)

interface GenSample {
  prompt_tps: number;
  generation_tps: number | null;
  peak_memory: number;
  tokens: number[];
  /** --kv-bits runs: the cache types after the run. */
  caches?: string[];
}

// ------------------------------------------------------------------ the TS side

async function tsGenerate(model: ReturnType<typeof loadGenerationModel>["model"], prompt: number[], maxTokens: number, kv: BenchKv | null = null): Promise<GenSample> {
  // --kv-bits: a fresh quantizer per run (mlx-vlm's generate_step with kv_bits, as the worker runs it)
  const quantizeCache = kv ? (makeKvQuantizer(kv.cfg) ?? undefined) : undefined;
  let caches: string[] | undefined;
  const onStep = kv ? (i: { cache: readonly KVCacheLike[] }) => (caches = i.cache.map((c) => c.constructor.name)) : undefined;
  mx.clearCache();
  mx.resetPeakMemory();
  const tokens: number[] = [];
  let tic = performance.now();
  let promptSeconds = 0;
  let n = 0;
  for await (const t of generate(model, prompt, { maxTokens, quantizeCache, onStep })) {
    if (t.n === 0) {
      promptSeconds = (performance.now() - tic) / 1000;
      tic = performance.now();
    }
    n = t.n;
    tokens.push(t.token);
  }
  const genSeconds = (performance.now() - tic) / 1000;
  return { prompt_tps: prompt.length / promptSeconds, generation_tps: genSeconds > 0 ? (n + 1) / genSeconds : null, peak_memory: mx.getPeakMemory(), tokens, caches };
}

/**
 * One decode step's host cost, repeated: building the graph (the model call, no eval), then
 * evaluating it synchronously (mx.eval of the next token and the caches, as the bench worker does).
 */
function tsStepTimes(model: ReturnType<typeof loadGenerationModel>["model"], prompt: number[], reps: number): { build: number[]; eval: number[] } {
  const cache: KVCacheLike[] = model.makeCache();
  const build: number[] = [];
  const evalT: number[] = [];
  try {
    let y = mx.array(Int32Array.from(prompt), [1, prompt.length], "int32");
    for (let i = 0; i <= reps; i++) {
      const t0 = performance.now();
      const logits = model.forward(y, cache, { kind: "step", index: i });
      const t1 = performance.now();
      const L = logits.shape[1]!;
      const last = mx.slice(logits, [0, L - 1, 0], [1, L, logits.shape[2]!]);
      const next = mx.argmax(last, -1);
      // (the state handles are aliases: held past the eval, they would keep every cache buffer
      // shared, and the next step's slice_update would copy it instead of updating it in place)
      const states = cache.flatMap((c) => c.state);
      mx.evaluate(next, states);
      const t2 = performance.now();
      for (const s of states) s.dispose();
      if (i > 0) {
        build.push((t1 - t0) / 1000);
        evalT.push((t2 - t1) / 1000);
      }
      y.dispose();
      logits.dispose();
      last.dispose();
      y = next;
    }
    y.dispose();
  } finally {
    for (const c of cache) c.dispose();
  }
  return { build, eval: evalT };
}

// ------------------------------------------------------------------ statistics and report

interface Stat {
  median: number;
  min: number;
  max: number;
  samples: number[];
}

function stat(xs: number[]): Stat {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
  return { median: m, min: s[0]!, max: s[s.length - 1]!, samples: xs };
}

interface Row {
  workload: string;
  metric: string;
  unit: string;
  better: "higher" | "lower";
  ts: Stat;
  mlxLm: Stat;
  /** TS / mlx-lm, one per pair. */
  ratios: number[];
  ratio: Stat;
  target?: string;
}

function row(workload: string, metric: string, unit: string, better: Row["better"], ts: number[], py: number[], target?: string): Row {
  const ratios = ts.map((t, i) => t / py[i]!);
  return { workload, metric, unit, better, ts: stat(ts), mlxLm: stat(py), ratios, ratio: stat(ratios), target };
}

const f = (x: number, unit: string) => (unit === "GB" ? (x / 1e9).toFixed(3) : unit === "ms" ? (x * 1e3).toFixed(3) : x >= 100 ? x.toFixed(0) : x.toFixed(2));

export function markdown(meta: Record<string, string>, wl: MeasuredWorkload[], rows: Row[], notes: Note[], suite: SuiteCost | null): string {
  const out = ["# Benchmarks: TypeScript (Bun) vs mlx-lm on the same libmlx", ""];
  for (const [k, v] of Object.entries(meta)) out.push(`- **${k}**: ${v}`);
  out.push("", "Each row: one warm-up per side, then pairs run alternately (TS, mlx-lm, TS, mlx-lm, …). Ratio = TS / mlx-lm per pair (median, min–max); for tok/s higher is better, for time and memory lower is better. A run of some workloads (`--only`) keeps the other workloads' rows from the previous results, with their own date.", "");
  out.push("KV-cache quantization (issue 27: cache bytes at 4k/32k on the E2B and 31B layouts, decode tok/s against mlx-vlm with a quantized cache, quality against the unquantized cache): `npm run bench:kvquant`, results in [KVQUANT.md](KVQUANT.md).", "");
  if (wl.some((w) => w.name !== baseWorkload(w.name))) {
    out.push("A workload named `NAME (KV <scheme> <bits> bits, start N)` is a `npm run bench -- --kv-bits` run (bench/kv_rows.ts): NAME's prefill/decode/peak-memory rows with a quantized KV cache on both sides; the reference side (the \"mlx-lm\" columns) is then mlx-vlm 0.7.10's generate_step with kv_bits / kv_quant_scheme / kv_group_size / quantized_kv_start (mlx-lm's own --kv-bits breaks on Gemma 4 once a sliding cache reaches quantized_kv_start), and the generated tokens are compared in every pair (notes). Their peak-memory rows set the port against mlx-vlm's generate_step over its gemma4 Model, not against mlx-lm's.", "");
  }
  out.push("## Workloads", "");
  for (const w of wl) {
    const warm = w.warmup ? `; warm-up ${w.warmup[0]}-token prompt, ${w.warmup[1]} tokens` : "";
    if (w.name.startsWith("train-")) out.push(`- **${w.name}**: ${w.what} (batch 4 × ${w.prompts[0]} tokens; a sample is the median of 10 steps; measured ${w.measured}, ${w.mode})`);
    else out.push(`- **${w.name}**: ${w.what} (prompts ${w.prompts.join(" and ")} tokens, ${w.decode} decode tokens${warm}; measured ${w.measured}, ${w.mode})`);
  }
  out.push("", "## Results", "", "| workload | metric | TS median (min–max) | mlx-lm median (min–max) | ratio TS/mlx-lm median (min–max) | per-pair ratios | target |", "|---|---|---|---|---|---|---|");
  for (const r of rows) {
    const s = (x: Stat) => `${f(x.median, r.unit)} (${f(x.min, r.unit)}–${f(x.max, r.unit)}) ${r.unit}`;
    out.push(`| ${r.workload} | ${r.metric} | ${s(r.ts)} | ${s(r.mlxLm)} | **${r.ratio.median.toFixed(3)}** (${r.ratio.min.toFixed(3)}–${r.ratio.max.toFixed(3)}) | ${r.ratios.map((x) => x.toFixed(2)).join(" ")} | ${r.target ?? ""} |`);
  }
  if (notes.length || suite) out.push("", "## Notes", "");
  for (const n of notes) out.push(`- ${n.text}`);
  if (suite) out.push(`- Suite cost (${suite.measured}, wall time, this machine): \`npm test\` ${suite.npmTestSeconds.toFixed(0)} s, \`npm run golden:regen\` ${suite.goldenRegenSeconds.toFixed(0)} s.`);
  return out.join("\n") + "\n";
}

interface MeasuredWorkload extends Workload {
  measured: string;
  mode: string;
}
interface Note {
  workload: string;
  text: string;
}
interface SuiteCost {
  measured: string;
  npmTestSeconds: number;
  goldenRegenSeconds: number;
}

// ------------------------------------------------------------------ main

const fmtMs = (sec: number) => `${(sec * 1e3).toFixed(3)} ms`;

/** The decode target of issue 7 (CPU) and issue 11 (GPU: E2B/E4B ≥ 2.0, 26B-A4B/31B ≥ 1.5). */
function decodeTarget(name: string, dev: DeviceInfo): string {
  if (dev.device === "gpu") return name === "e2b" || name === "e4b" ? "≥ 2.0" : name === "moe" || name === "31b" ? "≥ 1.5" : "";
  return name.startsWith("tiny") ? "≥ 1.5" : "≥ 1.0";
}

function ensureCheckpoint(w: Workload): void {
  if (existsSync(join(w.dir, "config.json"))) return;
  console.error(`[bench] building ${w.name}: python ${w.build.join(" ")}`);
  const r = spawnSync(PY, w.build, { cwd: ROOT, stdio: ["ignore", "inherit", "inherit"] });
  if (r.status !== 0) throw new Error(`building the ${w.name} checkpoint failed`);
}

function promptOf(n: number, vocab: number): number[] {
  // Fixed pseudo-random ids (LCG), identical on both sides.
  const out: number[] = [];
  let s = 12345;
  for (let i = 0; i < n; i++) {
    s = (s * 1103515245 + 12345) % 2147483648;
    out.push(2 + (s % (vocab - 2)));
  }
  return out;
}

function timeCommand(cmd: string, args: string[]): number {
  const t0 = performance.now();
  const r = spawnSync(cmd, args, { cwd: ROOT, stdio: ["ignore", "ignore", "inherit"] });
  if (r.status !== 0) console.error(`[bench] ${cmd} ${args.join(" ")} exited ${r.status}`);
  return (performance.now() - t0) / 1000;
}

/** Train-step rows of one workload: compiled (the trainer's step) and eager, alternating sides. */
async function benchTrain(w: TrainWorkload, py: PyWorker, pairs: number, quick: boolean, rows: Row[], notes: Note[]): Promise<void> {
  const load0 = loadavg()[0]!;
  const vocab = Number((JSON.parse(readFileSync(join(w.ckpt, "config.json"), "utf8")) as { vocab_size?: number }).vocab_size ?? 256);
  const { tokens, lengths } = trainBatch(w, vocab);
  const steps = quick ? 5 : 10;
  for (const compiled of [true, false]) {
    console.error(`[bench] ${w.name}: ${compiled ? "compiled" : "eager"} step, setting up both sides`);
    const ts = tsTrainer(w, vocab, compiled);
    try {
      await py.call({ cmd: "train_setup", path: w.ckpt, tokens, lengths, compiled, grad_checkpoint: w.grad_checkpoint });
      const tsS: { seconds: number; peak_memory: number }[] = [];
      const pyS: { seconds: number; peak_memory: number }[] = [];
      for (let i = 0; i < pairs; i++) {
        console.error(`[bench] ${w.name}: ${compiled ? "compiled" : "eager"}, pair ${i + 1}/${pairs}`);
        tsS.push(ts.run(steps));
        pyS.push(await py.call<{ seconds: number; peak_memory: number }>({ cmd: "train_steps", steps }));
      }
      const tag = compiled ? "compiled (the trainer's)" : "eager";
      rows.push(row(w.name, `train step, ${tag}`, "ms", "lower", tsS.map((x) => x.seconds), pyS.map((x) => x.seconds), "≤ 1.0"));
      if (compiled) rows.push(row(w.name, "train peak memory", "GB", "lower", tsS.map((x) => x.peak_memory), pyS.map((x) => x.peak_memory), "≤ 1.05"));
    } finally {
      ts.dispose();
    }
  }
  notes.push({ workload: w.name, text: `${w.name}: 1-minute load average ${load0.toFixed(1)} at the start, ${loadavg()[0]!.toFixed(1)} at the end (${cpus().length} cores; the step times scale with it, the per-pair ratios less so).` });
}

/** Every flag check, before any checkpoint is built or process started (null for --help). */
export function benchPlan(argv: readonly string[]) {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  const quick = a.quick === true;
  const pairs = quick ? 2 : Number(a.pairs);
  if (!quick && pairs < 5) throw new UsageError("--pairs must be at least 5 (use --quick for a smoke run)");
  const bigPrompts = String(a["big-prompts"]).split(",").map(Number);
  if (bigPrompts.some((n) => !Number.isInteger(n) || n < 2)) throw new UsageError("--big-prompts needs comma-separated prompt lengths >= 2");
  const bigDtype = String(a["big-dtype"]);
  if (bigDtype !== "bfloat16" && bigDtype !== "float32") throw new UsageError("--big-dtype must be bfloat16 or float32");
  const bigDecode = Number(a["big-decode"]);
  if (bigDecode < 2) throw new UsageError("--big-decode must be at least 2");
  const dev = applyDeviceFlag(a.device);
  const hbm = Number(a["hbm-gbps"]) * 1e9;
  const layers = (k: string) => {
    const n = Number(a[k]);
    if (!Number.isInteger(n) || n < 1) throw new UsageError(`--${k} must be a positive integer`);
    return n;
  };
  let wl = workloads({ quick, e2bLayers: layers("e2b-layers"), e4bLayers: layers("e4b-layers"), moeLayers: layers("moe-layers"), denseLayers: layers("31b-layers"), bigPrompts, bigDecode, bigDtype });
  if (a["no-workloads"]) {
    if (!a["suite-cost"]) throw new UsageError("--no-workloads needs --suite-cost");
    wl = [];
  }
  let twl: TrainWorkload[] = a["no-workloads"] ? [] : trainWorkloads(ROOT);
  if (typeof a.only === "string") {
    const names = new Set(a.only.split(","));
    wl = wl.filter((w) => names.has(w.name));
    twl = twl.filter((w) => names.has(w.name));
    if (wl.length === 0 && twl.length === 0) throw new UsageError(`--only matched no workload`);
  } else if (dev.device === "cpu") wl = wl.filter((w) => DEFAULT_ON_CPU.has(w.name));
  const kv = benchKv(a);
  if (kv) {
    // the quantized cache changes the prefill/decode rows only: no MTP or train workload
    const other = [...wl.filter((w) => w.mtpDrafter).map((w) => w.name), ...twl.map((w) => w.name)];
    if (typeof a.only === "string" && other.length) throw new UsageError(`--kv-bits applies to the prefill/decode workloads, not ${other.join(", ")}`);
    wl = wl.filter((w) => !w.mtpDrafter);
    twl = [];
    for (const w of wl) checkKvWorkload(kv, w.dir, w.prompts, w.decode);
  }
  return { a, quick, pairs, wl, twl, dev, hbm, kv };
}

async function main(): Promise<void> {
  const plan = benchPlan(process.argv.slice(2));
  if (plan === null) {
    process.stdout.write(helpText("npm run bench -- [options]", "Benchmarks the TS Gemma 4 model against mlx-lm, alternating the two sides in one run.", FLAGS));
    return;
  }
  const { a, quick, pairs, wl, twl, dev, hbm, kv } = plan;
  const rows: Row[] = [];
  const notes: Note[] = [];
  const done: MeasuredWorkload[] = [];
  const started = new Date().toISOString();
  const mode = quick ? "--quick" : `${pairs} pairs`;
  // --kv-bits: the reference side is mlx-vlm's generate_step with the quantized cache (bench/kv_rows.ts)
  const py = kv ? new PyWorker("kvquant_worker.py", "mlx-vlm kvquant worker") : new PyWorker("bench_worker.py", "mlx-lm bench worker");
  let kvTokensDiffer = false;
  try {
    for (const w of wl) {
      ensureCheckpoint(w);
      if (kv) checkKvWorkload(kv, w.dir, w.prompts, w.decode);
      const load0 = loadavg()[0]!;
      const vocab = Number((JSON.parse(readFileSync(join(w.dir, "config.json"), "utf8")) as { vocab_size?: number }).vocab_size ?? 256);
      const bytes = decodeBytesPerToken(w.dir);
      console.error(`[bench] ${w.name}: loading on both sides`);
      await py.call({ cmd: "load", path: w.dir });
      const { loaded, model } = loadGenerationModel(w.dir);
      if (w.mtpDrafter) {
        const m = await measureMtp(w.dir, w.mtpDrafter, loaded, model, py, promptOf(w.prompts[0]!, vocab), w.decode, pairs);
        rows.push(row(w.name, `MTP decode ${w.decode} tok (vs mlx-vlm)`, "tok/s", "higher", m.mtp[0], m.mtp[1], "≥ 1.0"));
        rows.push(row(w.name, `plain decode ${w.decode} tok (vs mlx-lm)`, "tok/s", "higher", m.plain[0], m.plain[1], "≥ 1.0"));
        for (const text of m.notes) notes.push({ workload: w.name, text });
        done.push({ ...w, measured: started, mode });
        writeResults(quick, dev, done, rows, notes, null);
        loaded.model.dispose();
        continue;
      }
      for (const [k, plen] of w.prompts.entries()) {
        const prompt = promptOf(plen, vocab);
        const maxTokens = k === 0 ? w.decode : 2;
        const run = async (side: "ts" | "py", p = prompt, n = maxTokens) =>
          side === "ts" ? tsGenerate(model, p, n, kv) : py.call<GenSample>({ cmd: "generate", prompt: p, max_tokens: n, prefill_step_size: 2048, ...(kv ? kvRequest(kv) : {}) });
        const [wp, wn] = w.warmup ? [promptOf(w.warmup[0], vocab), w.warmup[1]] : [prompt, maxTokens];
        await run("ts", wp, wn);
        await run("py", wp, wn);
        const ts: GenSample[] = [];
        const pys: GenSample[] = [];
        for (let i = 0; i < pairs; i++) {
          console.error(`[bench] ${w.name}: prompt ${plen}, pair ${i + 1}/${pairs}`);
          ts.push(await run("ts"));
          pys.push(await run("py"));
        }
        const rn = kv ? kvWorkloadName(w.name, kv) : w.name;
        if (kv) {
          // every pair's tokens, and the caches after the run (the quantized ones named)
          const bad = ts.map((t, i) => t.tokens.join() !== pys[i]!.tokens.join()).filter(Boolean).length;
          kvTokensDiffer ||= bad > 0;
          const tc = ts[0]!.caches ?? [];
          const pc = pys[0]!.caches ?? [];
          const quantized = tc.filter((c) => c !== "KVCache" && c !== "RotatingKVCache").length;
          notes.push({
            workload: rn,
            text: `${rn}, prompt ${plen}: ${bad === 0 ? `generated tokens equal on both sides in all ${pairs} pairs (${ts[0]!.tokens.length} tokens each)` : `**generated tokens differ** in ${bad} of ${pairs} pairs (TS ${ts[0]!.tokens.slice(0, 8)} … vs mlx-vlm ${pys[0]!.tokens.slice(0, 8)} …)`}; caches after the run: ${tc.join() === pc.join() ? "both sides" : `TS ${tc.join(" ")}, mlx-vlm`} ${pc.join(" ")} (${quantized ? `${quantized} quantized` : "**nothing quantized**: the run never reaches --quantized-kv-start or the layout has no convertible cache"}).`,
          });
        } else if (ts[0]!.tokens.join() !== pys[0]!.tokens.join()) notes.push({ workload: w.name, text: `${w.name}, prompt ${plen}: **generated tokens differ** between the sides (TS ${ts[0]!.tokens.slice(0, 8)} … vs mlx-lm ${pys[0]!.tokens.slice(0, 8)} …)` });
        rows.push(row(rn, `prefill ${plen} tok`, "tok/s", "higher", ts.map((s) => s.prompt_tps), pys.map((s) => s.prompt_tps), "≥ 1.0"));
        if (k === 0) {
          const tsTps = ts.map((s) => s.generation_tps ?? 0);
          const pyTps = pys.map((s) => s.generation_tps ?? 0);
          rows.push(row(rn, `decode ${w.decode} tok`, "tok/s", "higher", tsTps, pyTps, decodeTarget(w.name, dev)));
          if (dev.device === "gpu" && !kv) {
            // the fraction of the memory roofline: weight bytes read per token × tok/s over the bandwidth
            const frac = (tps: number[]) => tps.map((t) => (t * bytes.perToken) / hbm);
            rows.push(row(w.name, `decode HBM roofline fraction (${(bytes.perToken / 1e9).toFixed(2)} GB read per token)`, "×", "higher", frac(tsTps), frac(pyTps)));
          }
        }
        rows.push(row(rn, `peak memory (prompt ${plen})`, "GB", "lower", ts.map((s) => s.peak_memory), pys.map((s) => s.peak_memory), "≤ 1.05"));
      }
      if (kv) {
        // the host-overhead rows measure the unquantized step against mlx-lm: not part of a --kv-bits run
        const rn = kvWorkloadName(w.name, kv);
        notes.push({ workload: rn, text: `${rn}: 1-minute load average ${load0.toFixed(1)} at the start, ${loadavg()[0]!.toFixed(1)} at the end (${cpus().length} cores, shared; the per-pair ratios come from back-to-back runs under the same load).` });
        done.push({ ...w, name: rn, what: `${w.what}; ${kv.label}`, measured: started, mode });
        writeResults(quick, dev, done, rows, notes, null);
        loaded.model.dispose();
        mx.clearCache();
        continue;
      }
      // Host overhead: building one decode step's graph (no eval), then its synchronous eval,
      // median over reps.
      const reps = quick || (w.warmup && dev.device === "cpu") ? 10 : 30; // a full-width CPU step evaluates for ~1 s
      const prompt = promptOf(8, vocab);
      const tsB: number[] = [];
      const pyB: number[] = [];
      const tsE: number[] = [];
      const pyE: number[] = [];
      for (let i = 0; i < pairs; i++) {
        const t = tsStepTimes(model, prompt, reps);
        tsB.push(stat(t.build).median);
        tsE.push(stat(t.eval).median);
        const p = await py.call<{ seconds: number[]; eval_seconds: number[] }>({ cmd: "graph_build", prompt, reps });
        pyB.push(stat(p.seconds).median);
        pyE.push(stat(p.eval_seconds).median);
      }
      rows.push(row(w.name, "decode-step graph build", "ms", "lower", tsB, pyB, "≤ 0.5"));
      rows.push(row(w.name, "decode-step eval (synchronous)", "ms", "lower", tsE, pyE));
      const calls = spawnSync(process.execPath, [join(ROOT, "bench", "native_calls.ts"), w.dir], { cwd: ROOT, env: { ...process.env, MLX_BUN_COUNT_CALLS: "1" }, encoding: "utf8" });
      if (calls.status === 0) {
        const c = JSON.parse(calls.stdout.trim().split("\n").pop()!) as { median: number; nodes: { total: number; kernels: number; opByOpKernels: number } };
        notes.push({
          workload: w.name,
          text: `${w.name}: **${c.median} native calls** per decode step on the TS side (graph building, MLX_BUN_COUNT_CALLS=1); the step graph has ${c.nodes.total} nodes, ${c.nodes.kernels} of them kernel-launching primitives (views excluded), against ${c.nodes.opByOpKernels} for the op-by-op route, which builds mlx-lm's primitives one for one (suites/gemma4/graph_parity.test.ts); eval ${fmtMs(stat(tsE).median)} per step on the TS side = ${((stat(tsE).median * 1e6) / c.nodes.kernels).toFixed(1)} µs per kernel.`,
        });
      }
      done.push({ ...w, measured: started, mode });
      writeResults(quick, dev, done, rows, notes, null);
      // Free this workload's weights, as the Python worker does when it loads the next model
      // (otherwise they would count in the next workload's TS peak memory).
      loaded.model.dispose();
      mx.clearCache();
    }
    for (const w of twl) {
      await benchTrain(w, py, pairs, quick, rows, notes);
      done.push({ name: w.name, what: w.what, dir: relative(ROOT, w.ckpt), build: [], prompts: [w.length], decode: 0, measured: started, mode });
      writeResults(quick, dev, done, rows, notes, null);
    }
  } finally {
    py.close();
  }
  let suite: SuiteCost | null = null;
  if (a["suite-cost"]) {
    console.error("[bench] suite cost: npm test, then npm run golden:regen");
    const npmTestSeconds = timeCommand("npm", ["test"]);
    suite = { measured: new Date().toISOString(), npmTestSeconds, goldenRegenSeconds: timeCommand("npm", ["run", "golden:regen"]) };
  }
  process.stdout.write(writeResults(quick, dev, done, rows, notes, suite));
  // a --kv-bits run whose sides generated different tokens is a divergence (exit 1)
  if (kvTokensDiffer) {
    console.error("[bench] --kv-bits: the generated tokens differ between the port and mlx-vlm (see the notes)");
    process.exitCode = 1;
  }
}

/** Paths in the results as the repository sees them (.cache/…), never this machine's. */
function repoRelative(w: MeasuredWorkload): MeasuredWorkload {
  const rel = (p: string) => p.replace(/^\/.*?\/(\.cache\/)/, "$1");
  const out = { ...w, dir: rel(w.dir), build: w.build.map(rel) };
  if (typeof (w as { mtpDrafter?: string }).mtpDrafter === "string") Object.assign(out, { mtpDrafter: rel((w as { mtpDrafter: string }).mtpDrafter) });
  return out;
}

interface ResultsFile {
  meta: Record<string, string>;
  workloads: MeasuredWorkload[];
  rows: Row[];
  notes: Note[];
  suite: SuiteCost | null;
}

/**
 * Writes bench/RESULTS.md and bench/results.json (after every workload, so a long run keeps what
 * it measured). Workloads (and the suite cost) not measured in this run keep their previous rows.
 */
function writeResults(quick: boolean, dev: DeviceInfo, done: MeasuredWorkload[], rows: Row[], notes: Note[], suite: SuiteCost | null): string {
  // GPU runs have files of their own (RESULTS-cuda.md, results-cuda.json); CPU runs keep RESULTS.md
  const suffix = `${dev.device === "gpu" ? `-${dev.backend}` : ""}${quick ? "-quick" : ""}`;
  const file = join(ROOT, "bench", `results${suffix}.json`);
  let prev: ResultsFile | null = null;
  try {
    prev = JSON.parse(readFileSync(file, "utf8")) as ResultsFile;
    if (!Array.isArray(prev.workloads) || !Array.isArray(prev.rows) || !Array.isArray(prev.notes) || !prev.workloads.every((w) => w.measured)) prev = null;
  } catch {
    prev = null;
  }
  const now = new Set(done.map((w) => w.name));
  const keep = (name: string) => !now.has(name);
  const order = ["tiny-dense", "tiny-e2b", "tiny-moe", "mtp", "e2b", "e4b", "moe", "31b", "train-dense", "train-e2b"];
  // a --kv-bits workload ("tiny-dense (KV …)") right after its base workload
  const rank = (name: string) => order.indexOf(baseWorkload(name)) + (name === baseWorkload(name) ? 0 : 0.5);
  const workloads = [...(prev?.workloads.filter((w) => keep(w.name)) ?? []), ...done].map(repoRelative).sort((x, y) => rank(x.name) - rank(y.name));
  const byWorkload = <T extends { workload: string }>(xs: T[]) => [...xs].sort((x, y) => rank(x.workload) - rank(y.workload));
  const allRows = byWorkload([...(prev?.rows.filter((r) => keep(r.workload)) ?? []), ...rows]);
  const allNotes = byWorkload([...(prev?.notes.filter((n) => keep(n.workload)) ?? []), ...notes]);
  const allSuite = suite ?? prev?.suite ?? null;
  const meta: Record<string, string> = {
    date: new Date().toISOString(),
    machine: `${cpus()[0]?.model ?? "unknown CPU"}, ${cpus().length} cores, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, ${process.platform}-${process.arch}`,
    device: `${dev.device} (${dev.backend} backend${dev.gpu ? `, ${dev.gpu}` : ""})`,
    versions: `libmlx ${mx.version()}, mlx-lm ${spawnSync(PY, ["-I", "-c", "import mlx_lm; print(mlx_lm.__version__)"], { encoding: "utf8" }).stdout.trim()}, mlx-vlm ${spawnSync(PY, ["-I", "-c", "import mlx_vlm; print(mlx_vlm.__version__)"], { encoding: "utf8" }).stdout.trim()}, bun ${Bun.version}`,
  };
  const out: ResultsFile = { meta, workloads, rows: allRows, notes: allNotes, suite: allSuite };
  writeFileSync(file + ".tmp", JSON.stringify(out, null, 2) + "\n");
  const md = markdown(meta, workloads, allRows, allNotes, allSuite);
  writeFileSync(join(ROOT, "bench", `RESULTS${suffix}.md.tmp`), md);
  renameSync(file + ".tmp", file);
  renameSync(join(ROOT, "bench", `RESULTS${suffix}.md.tmp`), join(ROOT, "bench", `RESULTS${suffix}.md`));
  return md;
}

if (import.meta.main) {
  main().catch((e) => {
    console.error(e instanceof UsageError ? `error: ${e.message}` : e);
    process.exit(e instanceof UsageError ? 2 : 1);
  });
}
