// `npm run bench:quant`: quantization scoring (issue 24, item 5), the numbers
// `llama-perplexity --kl-divergence` gives for a GGUF quant, for mlx-lm's quantizations.
//
// Both sides are mlx-lm (the oracle server's `capture` request, an inline forward scenario, only
// the L1 taps shipped back: `embed_scaled`, `layers.{i}/output`, `logits`), run on the same token
// ids: a seeded prompt. Compared, the quantized checkpoint (the "engine" side) against its float
// source (the "oracle" side), with oracle/conform/metrics.ts and nothing else:
// - per position, KL(source ‖ quant) of the two softmaxes (logitMetricsOf on one row), then over
//   positions: mean, median, 99th percentile (linear interpolation between ranks, numpy's default
//   percentile, as llama-perplexity's "99.0%   KLD") and max; top-1 agreement ("Same top p"),
//   top-10 overlap, |Δp| of the source's top token (mean, max);
// - relative L2 error ‖q − s‖₂/‖s‖₂ of embed_scaled, of every layers.{i}/output and of the logits
//   (tensorMetrics), and the first of them that is not bit-identical.
// Pairs: every text checkpoint of .cache/checkpoints/index.json against the float checkpoint it
// was made from (oracle/python/make_checkpoints.py: the bf16 variants are cast from the f32
// weights, the bf16-based quantizations quantize the bf16 cast, MoE has no bf16 variant so its
// quantizations are scored against f32), plus the cast-only and layout-only variants against
// f32 as baselines; and a full-width random E2B (bench/python/quant_e2b.py), float32 by default (--e2b-dtype), against
// its quantizations by mlx-lm's quantize_model.
// Results: bench/QUANT-SCORES.md and bench/quant_scores.json.
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { spawnSync } from "node:child_process";
import { DEFAULT_PYTHON, expectReply, type NpyRef, OracleClient, OracleError } from "../oracle/client.ts";
import { logitMetricsOf, logSoftmax, type RawTensor, tensorMetrics, toFloat64 } from "../oracle/conform/metrics.ts";
import { helpText, parseArgs, runMain, type FlagSpec, UsageError } from "../parity/args.ts";

const ROOT = join(import.meta.dir, "..");
const CKPT_ROOT = join(ROOT, ".cache", "checkpoints");
const OUT_JSON = join(ROOT, "bench", "quant_scores.json");
const OUT_MD = join(ROOT, "bench", "QUANT-SCORES.md");
/** The taps a score needs: the L1 residual stream and the logits of one forward call. */
export const SCORE_TAPS = ["embed_scaled", "layers.*/output", "logits"];

export const FLAGS: FlagSpec[] = [
  { name: "only", kind: "string", valueName: "sets", help: "fixtures, e2b or both (comma-separated); a run of one keeps the other's rows from the previous results", default: "fixtures,e2b" },
  { name: "tokens", kind: "int", help: "prompt length for the tiny fixtures (their max_position_embeddings is 4096, sliding window 8)", default: 256 },
  { name: "e2b-layers", kind: "int", help: "layers of the full-width random E2B (35 = the real model)", default: 4 },
  { name: "e2b-tokens", kind: "int", help: "prompt length for the full-width E2B", default: 256 },
  { name: "e2b-dtype", kind: "string", valueName: "dtype", help: "dtype of the E2B source, hence of the quantizations' scales and of the activations: float32 (default: libmlx's CPU matmuls, quantized ones too, are many times faster in float32 than in bfloat16) or bfloat16 (as released)", default: "float32" },
  { name: "match", kind: "string", valueName: "globs", help: "score only checkpoint ids matching these comma-separated globs (e.g. 'c5_moe/*,*/q8g64'); rows of the others are kept from the previous results" },
  { name: "seed", kind: "int", help: "prompt seed", default: 24 },
  { name: "help", kind: "bool", help: "show this help" },
];

// ------------------------------------------------------------------ scoring

/** A seeded prompt of `n` token ids in [3, vocab) (ids 0-2 are pad/eos/bos in Gemma's vocabulary). */
export function seededPrompt(n: number, vocab: number, seed: number): number[] {
  let a = (seed * 0x9e3779b1) >>> 0;
  const next = () => {
    // mulberry32
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return Array.from({ length: n }, () => 3 + Math.floor(next() * (vocab - 3)));
}

/** The L1 taps of one mlx-lm forward over `prompt` (no cache, batch 1), by tap name. */
export async function captureL1(oracle: OracleClient, checkpoint: string, prompt: number[]): Promise<Map<string, RawTensor>> {
  const cap = await oracle.request<{ taps: { name: string; dtype?: string; npy?: string }[] }>(
    "capture",
    { checkpoint, scenario: { id: "quant-score", kind: "forward", tokens: [prompt] }, mode: "full", only: SCORE_TAPS },
    1_800_000,
  );
  expectReply("capture", cap, { taps: "array" });
  const out = new Map<string, RawTensor>();
  for (const t of cap.taps) {
    if (!t.npy) continue;
    if (typeof t.dtype !== "string") throw new OracleError(`malformed reply from oracle to capture: tap ${t.name} has no dtype`, "capture");
    out.set(t.name, oracle.readArray({ npy: t.npy, dtype: t.dtype } as NpyRef));
  }
  return out;
}

export interface TapError {
  /** Tap name: embed_scaled, layers.{i}/output or logits. */
  tap: string;
  relL2: number;
  cosine: number;
  maxAbs: number;
  /** Bit-identical (every element's bytes equal, same dtype). */
  identical: boolean;
}

export interface LogitScore {
  rows: number;
  vocab: number;
  klMean: number;
  klMedian: number;
  klP99: number;
  klMax: number;
  top1: number;
  k: number;
  topkOverlap: number;
  dpTopMean: number;
  dpTopMax: number;
  /** Context, not a distance: the source's own top-token probability, mean over positions (a flat distribution makes top-1 fragile). */
  sourceTopP: number;
}

export interface Score {
  logits: LogitScore;
  /** embed_scaled, layers.0/output, ..., logits in that order. */
  taps: TapError[];
  /** The first tap of `taps` that is not bit-identical, or null. */
  firstDifferent: string | null;
}

/** Linear interpolation between closest ranks of sorted values (numpy's default percentile). */
export function percentile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  const p = (q / 100) * (sorted.length - 1);
  const i = Math.floor(p);
  const j = Math.min(i + 1, sorted.length - 1);
  return sorted[i]! + (p - i) * (sorted[j]! - sorted[i]!);
}

const BYTES: Record<string, number> = { float16: 2, bfloat16: 2, float32: 4, float64: 8 };

function row(t: RawTensor, r: number, V: number): Float64Array {
  const b = BYTES[t.dtype];
  if (b === undefined) throw new Error(`logits of dtype ${t.dtype}: not a float`);
  return toFloat64({ dtype: t.dtype, shape: [V], data: t.data.subarray(r * V * b, (r + 1) * V * b) });
}

/**
 * Logit metrics of the quantized side `q` against the source `s`, one position at a time through
 * metrics.ts's logitMetricsOf (the per-position KLs give the percentiles; the means are the
 * means logitMetrics gives over the whole tensor, summed in the same order).
 */
export function scoreLogits(q: RawTensor, s: RawTensor, k = 10): LogitScore {
  const V = s.shape.at(-1) ?? 1;
  const rows = s.shape.reduce((a, b) => a * b, 1) / V;
  if ((q.shape.at(-1) ?? 1) !== V || q.shape.reduce((a, b) => a * b, 1) !== rows * V) throw new Error(`logits [${q.shape}] vs the source's [${s.shape}]`);
  const kls: number[] = [];
  let top1 = 0, overlap = 0, dpSum = 0, dpMax = 0, kk = 0, topP = 0;
  for (let r = 0; r < rows; r++) {
    const sr = row(s, r, V);
    const m = logitMetricsOf(row(q, r, V), sr, V, k);
    topP += Math.exp(logSoftmax(sr).reduce((a, b) => Math.max(a, b), -Infinity));
    kls.push(m.klMean);
    top1 += m.top1;
    overlap += m.topkOverlap;
    dpSum += m.dpTopMean;
    dpMax = Math.max(dpMax, m.dpTopMax);
    kk = m.k;
  }
  const n = Math.max(1, rows);
  const klSum = kls.reduce((a, b) => a + b, 0);
  const sorted = [...kls].sort((a, b) => a - b);
  return {
    rows, vocab: V, klMean: klSum / n, klMedian: percentile(sorted, 50), klP99: percentile(sorted, 99), klMax: sorted.at(-1) ?? 0,
    top1: top1 / n, k: kk, topkOverlap: overlap / n, dpTopMean: dpSum / n, dpTopMax: dpMax, sourceTopP: topP / n,
  };
}

function bytesEqual(a: RawTensor, b: RawTensor): boolean {
  if (a.dtype !== b.dtype || a.data.length !== b.data.length) return false;
  for (let i = 0; i < a.data.length; i++) if (a.data[i] !== b.data[i]) return false;
  return true;
}

/** The ordered L1 tap names present in a capture: embed_scaled, layers.0..N-1/output, logits. */
export function l1Order(names: Iterable<string>): string[] {
  const layers = [...names].map((n) => /^layers\.(\d+)\/output$/.exec(n)).filter((m) => m !== null).map((m) => Number(m![1])).sort((a, b) => a - b);
  return ["embed_scaled", ...layers.map((i) => `layers.${i}/output`), "logits"];
}

/** Scores a quantized capture `q` against its source's capture `s` (same prompt). */
export function scoreCaptures(q: Map<string, RawTensor>, s: Map<string, RawTensor>): Score {
  const taps: TapError[] = [];
  for (const name of l1Order(s.keys())) {
    const a = q.get(name), b = s.get(name);
    if (!a || !b) throw new Error(`tap ${name} missing from the ${a ? "source's" : "quantized"} capture`);
    const m = tensorMetrics(a, b);
    taps.push({ tap: name, relL2: m.relL2, cosine: m.cosine, maxAbs: m.maxAbs, identical: bytesEqual(a, b) });
  }
  const logits = scoreLogits(q.get("logits")!, s.get("logits")!);
  return { logits, taps, firstDifferent: taps.find((t) => !t.identical)?.tap ?? null };
}

// ------------------------------------------------------------------ pairs

export interface Pair {
  /** The quantized (or cast) checkpoint's id, e.g. c5_moe/q4g32 or e2b-4l/q4g64. */
  id: string;
  /** Its source's id. */
  source: string;
  quantDir: string;
  sourceDir: string;
  /** What the variant is, from the index: dtype and quantization. */
  what: string;
  /** Baseline rows: a cast or a layout change, no quantization. */
  baseline: boolean;
}

interface IndexEntry {
  fixture: string;
  variant: string;
  layout: string;
  dtype: string;
  quantization: { group_size: number; bits: number; mode: string; per_path?: unknown } | null;
}

function describe(e: { dtype: string; quantization: IndexEntry["quantization"]; layout?: string }): string {
  const q = e.quantization;
  const base = q ? `${q.mode === "affine" ? "affine " : ""}${q.mode === "affine" ? `${q.bits}-bit` : q.mode} g${q.group_size}${q.per_path ? " + per-path" : ""}, ${e.dtype} scales` : e.dtype;
  return e.layout && e.layout !== "flat" ? `${base} (${e.layout} layout)` : base;
}

/**
 * The fixture pairs, from the checkpoint index: a quantization made from a bfloat16 cast is scored
 * against the bf16 variant where one exists (MoE has none: against f32), one made from float32
 * against f32; unquantized casts and layouts against f32. Multimodal checkpoints are left out
 * (their text is scored through the text fixtures; their capture is mlx-vlm's).
 */
export function fixturePairs(indexFile = join(CKPT_ROOT, "index.json")): Pair[] {
  const idx = JSON.parse(readFileSync(indexFile, "utf8")) as { checkpoints: Record<string, IndexEntry> };
  const ids = new Set(Object.keys(idx.checkpoints));
  const pairs: Pair[] = [];
  for (const [id, e] of Object.entries(idx.checkpoints)) {
    if (e.layout === "gemma4_multimodal" || id === `${e.fixture}/f32`) continue;
    const bf16 = `${e.fixture}/bf16`;
    const source = e.quantization && e.dtype === "bfloat16" && ids.has(bf16) ? bf16 : `${e.fixture}/f32`;
    if (!ids.has(source)) continue;
    pairs.push({ id, source, quantDir: join(CKPT_ROOT, id), sourceDir: join(CKPT_ROOT, source), what: describe(e), baseline: e.quantization === null });
  }
  // quantizations first, then baselines; fixture order within each
  return [...pairs.filter((p) => !p.baseline), ...pairs.filter((p) => p.baseline)];
}

const E2B_VARIANTS: [string, string][] = [
  ["q4g64", "affine 4-bit g64"],
  ["q4g32", "affine 4-bit g32"],
  ["q8g64", "affine 8-bit g64"],
  ["mxfp4", "mxfp4 g32"],
];
const SOURCE_NAME: Record<string, string> = { float32: "f32", bfloat16: "bf16" };

/** The E2B build's folder under .cache/quant (bench/python/quant_e2b.py writes it). */
export function e2bDir(layers: number, dtype: string): string {
  return join(ROOT, ".cache", "quant", `e2b-${layers}l-${SOURCE_NAME[dtype]}`);
}

export function e2bPairs(layers: number, dtype: string): Pair[] {
  const dir = e2bDir(layers, dtype);
  const name = `e2b-${layers}l`;
  const src = SOURCE_NAME[dtype]!;
  // mxfp4 only from bfloat16 (bench/python/quant_e2b.py SKIP: libmlx's CPU mxfp4 quantize of the
  // float32 embeddings needs more memory than a 23 GB machine has)
  return E2B_VARIANTS.filter(([v]) => dtype === "bfloat16" || v !== "mxfp4").map(([v, what]) => ({ id: `${name}/${v}`, source: `${name}/${src}`, quantDir: join(dir, v), sourceDir: join(dir, src), what: v === "mxfp4" ? what : `${what}, ${dtype} scales`, baseline: false }));
}

// ------------------------------------------------------------------ report

export interface PairResult extends Pair {
  prompt: { tokens: number; seed: number };
  score: Score;
  seconds: number;
}

interface Results {
  schema: "gemma4-quant-scores/1";
  versions: Record<string, string>;
  sets: Record<string, { date: string; e2bLayers?: number; e2bDtype?: string; pairs: Omit<PairResult, "quantDir" | "sourceDir">[] }>;
}

const sci = (x: number) => (x === 0 ? "0" : Math.abs(x) >= 0.01 && Math.abs(x) < 100 ? x.toFixed(4) : x.toExponential(2));
const pct = (x: number) => `${(100 * x).toFixed(2)}%`;

function layerCell(p: Omit<PairResult, "quantDir" | "sourceDir">): string {
  return p.score.taps.filter((t) => t.tap !== "logits").map((t) => (t.identical ? "=" : sci(t.relL2))).join(" · ");
}

export function renderMarkdown(r: Results): string {
  const out: string[] = [
    "# Quantization scores",
    "",
    "Generated by `npm run bench:quant` (bench/quant_score.ts); do not edit by hand. Machine-readable: `bench/quant_scores.json`.",
    "",
    "What `llama-perplexity --kl-divergence` reports for a GGUF quant against its base, here for mlx-lm's quantizations: each quantized checkpoint and the float checkpoint it was made from run in mlx-lm 0.32.2 (the oracle server's `capture`, one forward over the same seeded prompt, no cache), compared with `oracle/conform/metrics.ts`.",
    "",
    "- **KL** = KL(source ‖ quant) of the softmaxes at each prompt position, in nats: mean, median, 99th percentile (linear between ranks, numpy's default) and max over positions.",
    "- **top-1** = positions whose argmax agrees (llama-perplexity's \"Same top p\"); **top-10** = mean overlap of the ten most likely tokens.",
    "- **|Δp|** = |p_quant(t) − p_source(t)| for t = the source's top token: mean and max over positions (llama-perplexity's Δp is of the next token of a real text; with a random prompt the source's top token is the one that matters).",
    "- **source p(top)** = the source's own probability of its top token, mean over positions: context for top-1 (the random fixtures' distributions are nearly flat, so a small logit error flips the argmax).",
    "- **rel L2** = ‖q − s‖₂ / ‖s‖₂ of the logits, and per layer of `embed_scaled` (first) and each `layers.{i}/output` (`=` where bit-identical).",
    "",
  ];
  for (const [set, s] of Object.entries(r.sets)) {
    const title = set === "e2b" ? `Full-width random E2B (${s.e2bLayers} layers of 35, ${s.e2bDtype}, random MLX init; 262,144-token vocabulary)` : "Tiny fixtures (vocabulary 256, hidden 64, 6-8 layers)";
    const first = s.pairs[0];
    out.push(`## ${title}`, "", `Run ${s.date}; prompt: ${first ? `${first.prompt.tokens} seeded tokens (seed ${first.prompt.seed})` : "-"}.`, "");
    out.push("| checkpoint | source | what | KL mean | KL median | KL p99 | KL max | top-1 | top-10 | \\|Δp\\| mean | \\|Δp\\| max | source p(top) | logits rel L2 | rel L2 per layer (embed · layers 0…) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (const p of s.pairs) {
      const l = p.score.logits;
      const lg = p.score.taps.find((t) => t.tap === "logits")!;
      out.push(`| ${p.id}${p.baseline ? " (baseline)" : ""} | ${p.source} | ${p.what} | ${sci(l.klMean)} | ${sci(l.klMedian)} | ${sci(l.klP99)} | ${sci(l.klMax)} | ${pct(l.top1)} | ${pct(l.topkOverlap)} | ${sci(l.dpTopMean)} | ${sci(l.dpTopMax)} | ${sci(l.sourceTopP)} | ${lg.identical ? "=" : sci(lg.relL2)} | ${layerCell(p)} |`);
    }
    out.push("");
  }
  out.push(`Versions: ${Object.entries(r.versions).map(([k, v]) => `${k} ${v}`).join(", ")}.`, "");
  return out.join("\n");
}

// ------------------------------------------------------------------ main

function write(results: Results): void {
  const ordered: Results = { ...results, sets: Object.fromEntries(["fixtures", "e2b"].filter((s) => results.sets[s]).map((s) => [s, results.sets[s]!])) };
  for (const [file, text] of [[OUT_JSON, JSON.stringify(ordered, null, 1) + "\n"], [OUT_MD, renderMarkdown(ordered)]] as const) {
    writeFileSync(`${file}.tmp`, text);
    renameSync(`${file}.tmp`, file);
  }
}

function globRegex(glob: string): RegExp {
  return new RegExp(`^${glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".")}$`);
}

/** Rows of `fresh` replace the rows of `old` with the same id; the set's order is `order`'s. */
function mergeRows<T extends { id: string }>(old: readonly T[], fresh: readonly T[], order: readonly string[]): T[] {
  const by = new Map(old.map((r) => [r.id, r]));
  for (const r of fresh) by.set(r.id, r);
  return order.flatMap((id) => by.get(id) ?? []);
}

function log(msg: string): void {
  process.stderr.write(`[quant] ${msg}\n`);
}

async function scorePairs(oracle: OracleClient, pairs: Pair[], tokens: number, seed: number, onPair: (done: PairResult[]) => void): Promise<PairResult[]> {
  const out: PairResult[] = [];
  let cached = null as { dir: string; prompt: number[]; cap: Map<string, RawTensor> } | null;
  for (const [i, p] of pairs.entries()) {
    const t0 = performance.now();
    const cfg = JSON.parse(readFileSync(join(p.sourceDir, "config.json"), "utf8")) as { vocab_size?: number; text_config?: { vocab_size?: number } };
    const vocab = cfg.vocab_size ?? cfg.text_config?.vocab_size;
    if (!vocab) throw new UsageError(`${p.source}: config.json has no vocab_size`);
    const prompt = seededPrompt(tokens, vocab, seed);
    log(`${i + 1}/${pairs.length} ${p.id} against ${p.source}: mlx-lm forward over ${tokens} tokens, both sides`);
    // a source shared by consecutive pairs is captured once
    const since = () => `${((performance.now() - t0) / 1000).toFixed(0)} s`;
    if (cached === null || cached.dir !== p.sourceDir || cached.prompt.length !== prompt.length) {
      cached = { dir: p.sourceDir, prompt, cap: await captureL1(oracle, p.sourceDir, prompt) };
      log(`  ${p.source} captured (${since()})`);
    }
    const q = await captureL1(oracle, p.quantDir, prompt);
    log(`  ${p.id} captured (${since()}); scoring ${tokens} positions`);
    const score = scoreCaptures(q, cached.cap);
    const seconds = (performance.now() - t0) / 1000;
    log(`${i + 1}/${pairs.length} ${p.id}: KL mean ${sci(score.logits.klMean)} p99 ${sci(score.logits.klP99)} max ${sci(score.logits.klMax)}, top-1 ${pct(score.logits.top1)} (${seconds.toFixed(1)} s)`);
    out.push({ ...p, prompt: { tokens, seed }, score, seconds });
    onPair(out);
  }
  return out;
}

function buildE2b(layers: number, dtype: string): void {
  const dir = e2bDir(layers, dtype);
  log(`building the full-width E2B (${layers} layers, ${dtype}) and its quantizations in ${relative(ROOT, dir)} (skipped when up to date)`);
  const r = spawnSync(DEFAULT_PYTHON, [join(ROOT, "bench", "python", "quant_e2b.py"), "--out", dir, "--layers", String(layers), "--dtype", dtype], { stdio: ["ignore", "inherit", "inherit"] });
  if (r.status !== 0) throw new Error(`bench/python/quant_e2b.py failed (exit ${r.status})`);
}

async function main(argv: string[]): Promise<number> {
  const a = parseArgs(argv, FLAGS);
  if (a.help) {
    process.stdout.write(helpText("npm run bench:quant -- [options]", "Scores mlx-lm quantizations against their float sources (KL, top-1, |Δp|, per-layer rel L2).", FLAGS));
    return 0;
  }
  const sets = String(a.only).split(",");
  if (sets.length === 0 || sets.some((s) => s !== "fixtures" && s !== "e2b")) throw new UsageError("--only takes fixtures, e2b or fixtures,e2b");
  for (const k of ["tokens", "e2b-layers", "e2b-tokens"] as const) if ((a[k] as number) < 1) throw new UsageError(`--${k} must be a positive integer`);
  const seed = a.seed as number;
  const globs = typeof a.match === "string" ? a.match.split(",").map(globRegex) : null;
  const picked = (p: Pair) => globs === null || globs.some((g) => g.test(p.id));
  const prev: Results | null = existsSync(OUT_JSON) ? (JSON.parse(readFileSync(OUT_JSON, "utf8")) as Results) : null;
  const results: Results = { schema: "gemma4-quant-scores/1", versions: prev?.versions ?? {}, sets: { ...(prev?.sets ?? {}) } };
  const e2bDtype = String(a["e2b-dtype"]);
  if (!(e2bDtype in SOURCE_NAME)) throw new UsageError("--e2b-dtype must be float32 or bfloat16");
  if (sets.includes("e2b")) buildE2b(a["e2b-layers"] as number, e2bDtype);
  let scored = 0;
  const oracle = await OracleClient.start();
  try {
    results.versions = { ...(oracle.versions ?? {}), bun: Bun.version };
    const strip = (r: PairResult[]) => r.map(({ quantDir: _q, sourceDir: _s, ...rest }) => rest);
    const date = new Date().toISOString().slice(0, 10);
    const run = async (set: "fixtures" | "e2b", all: Pair[], tokens: number, extra: { e2bLayers?: number; e2bDtype?: string }) => {
      const pairs = all.filter(picked);
      if (pairs.length === 0) return;
      const old = results.sets[set];
      // a partial run keeps the other rows only when they were scored on the same prompt
      const keep = old && old.pairs.every((r) => r.prompt.tokens === tokens && r.prompt.seed === seed) && old.e2bLayers === extra.e2bLayers && old.e2bDtype === extra.e2bDtype ? old.pairs : [];
      // the results are written after every pair: a long run stopped part way keeps what it scored
      await scorePairs(oracle, pairs, tokens, seed, (done) => {
        results.sets[set] = { date, ...extra, pairs: mergeRows(keep, strip(done), all.map((p) => p.id)) };
        write(results);
      });
      scored += pairs.length;
    };
    if (sets.includes("fixtures")) await run("fixtures", fixturePairs(), a.tokens as number, {});
    if (sets.includes("e2b")) await run("e2b", e2bPairs(a["e2b-layers"] as number, e2bDtype), a["e2b-tokens"] as number, { e2bLayers: a["e2b-layers"] as number, e2bDtype });
  } finally {
    await oracle.close();
  }
  if (scored === 0) throw new UsageError("--match matched no checkpoint of the chosen sets");
  log(`wrote ${relative(ROOT, OUT_MD)} and ${relative(ROOT, OUT_JSON)}`);
  return 0;
}

if (import.meta.main) runMain(main);
