// The conformance noise floor, measured (issue 24): the distance between two trusted float32
// implementations of Gemma 4, mlx-lm (the oracle) and Hugging Face transformers, per tap kind, on
// every float32 fixture checkpoint (.cache/checkpoints/c*/f32), one forward of the 16 seeded
// tokens the independent reference uses (oracle/reference_export.ts tokensFor, seed 1 + k).
//
// Per tensor it measures, in float64 from the raw values:
//   measured = ‖hf32 − mlx‖₂ / ‖mlx‖₂                      (transformers float32 against mlx-lm)
//   bound    = (‖hf32 − x64‖₂ + ‖mlx − x64‖₂) / ‖mlx‖₂      (x64: transformers run in float64)
// and per logits row KL(mlx ‖ hf32), with its bound (s(hf32 − x64) + s(mlx − x64))², s(Δ) =
// sqrt(½ Σ p_i (Δ_i − Σ p Δ)²) under mlx-lm's softmax p (KL to second order is s(Δ)²; s is a
// seminorm, so it obeys the triangle inequality). Why the bound: the floor must admit any float32
// engine E whose own rounding error (its distance from the exact computation) is no larger than
// transformers'; by the triangle inequality ‖E − mlx‖ ≤ ‖E − x64‖ + ‖mlx − x64‖, which is the
// bound when ‖E − x64‖ ≤ ‖hf32 − x64‖. The floor of a kind is max(measured, bound) over its
// tensors. Integer taps (token ids, RoPE offsets, router indices) and masks are not floored:
// they must be equal, and the measurement fails if they are not.
//
// Tensors with an expert axis K (router/indices, router/weights, experts/switch_glu/*) are
// compared after putting transformers' K axis in mlx-lm's order: mlx-lm lists a token's experts in
// argpartition order, transformers in descending probability (both the same set of experts).
//
//   bun engines/transformers/measure_floor.ts [--out oracle/conform/noise_floor.json]
// (needs .venv-reference: ensureVenv installs it on demand). Exit 0 written; 1 a measurement failed.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join, resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadConfig } from "../../model/gemma4/index.ts";
import { OracleClient, REPO_ROOT } from "../../oracle/client.ts";
import { rawOf, rawOfNpy } from "../../oracle/compare.ts";
import { logitMetricsOf, logSoftmax, toFloat64 } from "../../oracle/conform/metrics.ts";
import { NOISE_FLOOR_SCHEMA } from "../../oracle/conform/verdict.ts";
import type { DumpSchedule } from "../../oracle/conform/dump.ts";
import type { RawTensor } from "../../oracle/tensor_diff.ts";
import { tokensFor } from "../../oracle/reference_export.ts";
import { runTransformers } from "./dump.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints");
/**
 * The schedules measured on every fixture: the forward (every tap), and mlx-lm's generate_step
 * on transformers' own cache (prompt in chunks of 4, 6 decode steps): its one-token step calls
 * have relative errors of their own (a single row, fewer elements to average over), measured above
 * the forward's by up to 1.6x before they were included.
 */
const SCHEDULES: DumpSchedule[] = [{ kind: "forward" }, { kind: "generate", prefill_step_size: 4, max_tokens: 6 }];
/**
 * The smallest floor of a kind: one float32 rounding (2^-24, relative). Where both implementations
 * happen to compute a value exactly (an embedding row times sqrt(64) = 8) the measurement gives 0,
 * but an engine that rounds the same value once (sqrt of another hidden size, a scale folded into
 * the weights) is still as exact as float32 allows.
 */
const F32_UNIT_ROUNDOFF = 2 ** -24;

/** The tap kind: the name without call prefix and layer (what the verdict keys the floor by). */
export function tapKind(name: string): string {
  return name.replace(/^(prefill|step)\d+\//, "").replace(/^layers\.\d+\//, "");
}

const K_AXIS = /(^|\/)(router\/indices|router\/weights|experts\/switch_glu(\/(up_proj|gate_proj|activation|down_proj))?)$/;
const INTEGER = /^(inputs|token)$|(^|\/)(offset|router\/indices)$/;

/** Permutes `eng` (1, L, K, ...) along K so that its expert order matches the oracle's. */
function alignK(eng: Float64Array, engIdx: Float64Array, orIdx: Float64Array, L: number, K: number): Float64Array {
  const inner = eng.length / (L * K);
  const out = new Float64Array(eng.length);
  for (let l = 0; l < L; l++) {
    for (let k = 0; k < K; k++) {
      const want = orIdx[l * K + k]!;
      let src = -1;
      for (let j = 0; j < K; j++) if (engIdx[l * K + j] === want) src = j;
      if (src < 0) throw new Error(`token ${l}: transformers routes to other experts than mlx-lm (expert ${want} missing)`);
      out.set(eng.subarray((l * K + src) * inner, (l * K + src + 1) * inner), (l * K + k) * inner);
    }
  }
  return out;
}

function l2(a: Float64Array, b?: Float64Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) {
    const d = b ? a[i]! - b[i]! : a[i]!;
    s += d * d;
  }
  return Math.sqrt(s);
}

/** s(Δ) of one row: sqrt(½ Σ p (Δ − Σ p Δ)²), p = softmax of the oracle row. */
function klSeminorm(p: Float64Array, x: Float64Array, y: Float64Array): number {
  let mean = 0;
  for (let i = 0; i < p.length; i++) mean += p[i]! * (x[i]! - y[i]!);
  let v = 0;
  for (let i = 0; i < p.length; i++) v += p[i]! * (x[i]! - y[i]! - mean) ** 2;
  return Math.sqrt(v / 2);
}

interface KindAcc {
  n: number;
  measured: number;
  bound: number;
  mlxVsF64: number;
  hfVsF64: number;
  worst: string;
  kl?: number;
  klBound?: number;
}

interface FixtureResult {
  fixture: string;
  schedule: "forward" | "generate";
  /** generate: the greedy tokens (equal on mlx-lm, transformers float32 and float64). */
  generated?: number[];
  tokens: number;
  taps: number;
  integersEqual: number;
  masksEqual: number;
  /** Largest measured rel L2 over the residual stream (embed_scaled, layers.*\/output, norm). */
  residualRelL2: number;
  logitsRelL2: number;
  klMax: number;
  top1: number;
}

function f64Of(run: Map<string, mx.MlxArray>, name: string): Float64Array {
  const a = run.get(name)!;
  // float64 travels as uint64 bit patterns (MLX reads no F64 safetensors)
  return a.dtype === "uint64" ? new Float64Array(a.toBytes().slice().buffer) : toFloat64(rawOf(a));
}

async function main(argv: string[]): Promise<number> {
  const outPath = resolve(argv[argv.indexOf("--out") + 1] && argv.includes("--out") ? argv[argv.indexOf("--out") + 1]! : join(REPO_ROOT, "oracle", "conform", "noise_floor.json"));
  const index = JSON.parse(readFileSync(join(CKPT, "index.json"), "utf8")) as { checkpoints: Record<string, unknown> };
  const ids = Object.keys(index.checkpoints).filter((id) => /^c[^/]*\/f32$/.test(id)).sort();
  const kinds = new Map<string, KindAcc>();
  const fixtures: FixtureResult[] = [];
  let versions: Record<string, string> = {};
  const oracle = await OracleClient.start({ requestTimeoutMs: 600_000 });
  try {
    for (const [k, id] of ids.entries()) {
      const dir = join(CKPT, id);
      if (!existsSync(join(dir, "config.json"))) throw new Error(`${id}: no checkpoint (run npm run setup)`);
      const prompt = tokensFor(loadConfig(dir).args.vocab_size, 1 + k);
      for (const schedule of SCHEDULES) {
      const t0 = performance.now();
      const h32 = runTransformers(dir, prompt, "float32", schedule);
      const h64 = runTransformers(dir, prompt, "float64", schedule);
      const cap = await oracle.capture(dir, schedule.kind === "forward" ? { id: "noise-floor", kind: "forward", tokens: [prompt] } : { id: "noise-floor", kind: "generate", prompt, prefill_step_size: schedule.prefill_step_size, max_tokens: schedule.max_tokens });
      const what = `${id} ${schedule.kind}`;
      const s32 = mx.loadSafetensors(join(h32.dir, "tensors.safetensors"));
      const s64 = mx.loadSafetensors(join(h64.dir, "tensors.safetensors"));
      versions = { ...h32.versions, ...(oracle.versions ?? {}) };
      try {
        const theirs = new Map(cap.taps.map((t) => [t.name, t]));
        const fx: FixtureResult = { fixture: id, schedule: schedule.kind, tokens: prompt.length, taps: 0, integersEqual: 0, masksEqual: 0, residualRelL2: 0, logitsRelL2: 0, klMax: 0, top1: 1 };
        // a forward reads every tap; a generation all but the masks and the cache taps (their
        // layouts are each cache's own), whose absence is checked here
        const unread = h32.notRead.filter((n) => schedule.kind === "forward" || !/(^|\/)(mask\/[a-z_]+|self_attn\/cache_(keys|values))$/.test(n));
        if (unread.length) throw new Error(`${what}: transformers did not read ${unread.join(", ")}`);
        if (schedule.kind === "generate") {
          const tokens = [h32.generated, h64.generated, cap.meta.generated ?? []].map((g) => g.join(","));
          if (tokens[0] !== tokens[2] || tokens[1] !== tokens[2]) throw new Error(`${what}: greedy tokens differ (transformers f32 ${tokens[0]}, f64 ${tokens[1]}, mlx-lm ${tokens[2]}): later steps are fed different tokens`);
          fx.generated = h32.generated;
        }
        for (const name of h32.written) {
          const t = theirs.get(name);
          if (!t) throw new Error(`${what}: mlx-lm has no tap ${name}`);
          const kind = tapKind(name);
          const mine = s32.arrays.get(name)!;
          fx.taps++;
          if (kind.startsWith("mask/")) {
            const want = t.kind === "str" && t.value === "causal" ? causal(prompt.length) : t.array ? new Uint8Array(t.array.data) : null;
            const got = mine.toBytes();
            if (!want || want.length !== got.length || want.some((v, i) => (v !== 0) !== (got[i] !== 0))) throw new Error(`${id}: ${name} differs from mlx-lm's (${t.kind} ${t.value ?? ""})`);
            fx.masksEqual++;
            continue;
          }
          if (!t.array) throw new Error(`${id}: mlx-lm's ${name} was not stored`);
          const b = toFloat64(rawOfNpy(t.array));
          let a = toFloat64(rawOf(mine));
          let x = f64Of(s64.arrays, name);
          if (K_AXIS.test(name)) {
            const idxName = name.replace(/(router|experts)\/.*$/, "router/indices");
            const L = t.array.shape[1]!;
            const K = t.array.shape[2]!;
            const orIdx = toFloat64(rawOfNpy(theirs.get(idxName)!.array!));
            a = alignK(a, toFloat64(rawOf(s32.arrays.get(idxName)!)), orIdx, L, K);
            x = alignK(x, f64Of(s64.arrays, idxName), orIdx, L, K);
          }
          if (INTEGER.test(kind)) {
            if (a.length !== b.length || a.some((v, i) => v !== b[i])) throw new Error(`${id}: ${name} (integers) differs from mlx-lm's`);
            fx.integersEqual++;
            continue;
          }
          const nb = l2(b);
          const measured = nb > 0 ? l2(a, b) / nb : l2(a) > 0 ? Infinity : 0;
          const bound = nb > 0 ? (l2(a, x) + l2(b, x)) / nb : measured;
          const acc = kinds.get(kind) ?? { n: 0, measured: 0, bound: 0, mlxVsF64: 0, hfVsF64: 0, worst: "" };
          acc.n++;
          if (measured > acc.measured) {
            acc.measured = measured;
            acc.worst = `${id} ${name}`;
          }
          acc.bound = Math.max(acc.bound, bound);
          const nx = l2(x);
          if (nx > 0) {
            acc.mlxVsF64 = Math.max(acc.mlxVsF64, l2(b, x) / nx);
            acc.hfVsF64 = Math.max(acc.hfVsF64, l2(a, x) / nx);
          }
          if (kind === "logits" || kind === "logprobs") {
            const V = t.array.shape.at(-1)!;
            const lm = logitMetricsOf(a, b, V);
            let klBound = 0;
            for (let r = 0; r < a.length / V; r++) {
              const row = (v: Float64Array) => v.subarray(r * V, (r + 1) * V);
              const p = logSoftmax(row(b)).map(Math.exp);
              klBound = Math.max(klBound, (klSeminorm(p, row(a), row(x)) + klSeminorm(p, row(b), row(x))) ** 2);
            }
            acc.kl = Math.max(acc.kl ?? 0, lm.klMax);
            acc.klBound = Math.max(acc.klBound ?? 0, klBound);
            if (kind === "logits") fx.logitsRelL2 = Math.max(fx.logitsRelL2, measured);
            fx.klMax = Math.max(fx.klMax, lm.klMax);
            fx.top1 = Math.min(fx.top1, lm.top1);
          }
          if (kind === "embed_scaled" || kind === "output" || kind === "norm") fx.residualRelL2 = Math.max(fx.residualRelL2, measured);
          kinds.set(kind, acc);
        }
        fixtures.push(fx);
        process.stderr.write(`[floor] ${what}: ${fx.taps} taps (${fx.integersEqual} integer and ${fx.masksEqual} mask taps equal), residual rel L2 ≤ ${fx.residualRelL2.toExponential(2)}, logits ${fx.logitsRelL2.toExponential(2)}, KL ${fx.klMax.toExponential(2)}, top-1 ${fx.top1} (${((performance.now() - t0) / 1000).toFixed(1)} s)\n`);
      } finally {
        for (const a of s32.arrays.values()) a.dispose();
        for (const a of s64.arrays.values()) a.dispose();
        h32.dispose();
        h64.dispose();
      }
      }
    }
  } finally {
    await oracle.close();
  }
  const sig = (v: number) => Number(v.toPrecision(3));
  const up = (v: number) => Number((v * (1 + 5e-3)).toPrecision(3)); // rounded up, never below what was measured
  const floorKinds = Object.fromEntries(
    [...kinds.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([kind, v]) => [
      kind,
      {
        rel_l2: up(Math.max(v.measured, v.bound, F32_UNIT_ROUNDOFF)),
        ...(v.kl !== undefined ? { kl: up(Math.max(v.kl, v.klBound ?? 0)) } : {}),
        n: v.n,
        measured_rel_l2: sig(v.measured),
        bound_rel_l2: sig(v.bound),
        mlx_vs_f64: sig(v.mlxVsF64),
        hf32_vs_f64: sig(v.hfVsF64),
        ...(v.kl !== undefined ? { measured_kl: sig(v.kl), bound_kl: sig(v.klBound ?? 0) } : {}),
        worst: v.worst,
      },
    ]),
  );
  const allRel = Object.values(floorKinds).map((v) => v.rel_l2);
  const file = {
    schema: NOISE_FLOOR_SCHEMA,
    status: "measured",
    note:
      "Per tap kind: rel_l2 = max over the kind's tensors (forward and generate_step calls) of max(measured, bound, 2^-24 = one float32 rounding), rounded up to 3 digits; measured = ‖hf32 − mlx‖₂/‖mlx‖₂ (transformers float32 against mlx-lm float32), bound = (‖hf32 − x64‖₂ + ‖mlx − x64‖₂)/‖mlx‖₂ with x64 = transformers run in float64: by the triangle inequality the largest distance from mlx-lm of any float32 engine no less exact than transformers (the margin, justified by the float64 run). kl (logits, logprobs): max of the measured per-row KL(mlx ‖ hf32) and its second-order bound (s(hf32 − x64) + s(mlx − x64))², s(Δ)² = ½ Var_p(Δ) under mlx-lm's softmax. Integer taps and masks are not floored: equal on every fixture. Tensors with an expert axis were compared with transformers' K axis in mlx-lm's expert order. default = the largest kind's value (for kinds not measured). Written by engines/transformers/measure_floor.ts.",
    measured: {
      what: `mlx-lm vs transformers, float32, per checkpoint ${fixtures[0]?.tokens ?? 16} seeded tokens (oracle/reference_export.ts tokensFor, seed 1 + k): one forward (every tap of the scheme, level 2) and generate_step (prefill_step_size 4, max_tokens 6; transformers on its DynamicCache; every tap but masks and cache taps); transformers also in float64`,
      where: `CPU: ${cpus()[0]?.model ?? "unknown"}, ${cpus().length} cores, ${process.platform} ${process.arch}; MLX CPU device; torch on one thread, eager attention`,
      when: new Date().toISOString(),
      versions,
      fixtures: [...new Set(fixtures.map((f) => f.fixture))],
    },
    kinds: floorKinds,
    default: { rel_l2: Math.max(...allRel), kl: (floorKinds as Record<string, { kl?: number }>).logits?.kl ?? 0 },
    fixtures,
  };
  writeFileSync(outPath, `${JSON.stringify(file, null, 2)}\n`);
  process.stderr.write(`[floor] wrote ${outPath}: ${Object.keys(floorKinds).length} kinds over ${new Set(fixtures.map((f) => f.fixture)).size} checkpoints (${fixtures.length} runs)\n`);
  return 0;
}

function causal(L: number): Uint8Array {
  const m = new Uint8Array(L * L);
  for (let i = 0; i < L; i++) for (let j = 0; j <= i; j++) m[i * L + j] = 1;
  return m;
}

if (import.meta.main) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (e) => {
      process.stderr.write(`error: ${(e as Error).message}\n`);
      process.exit(1);
    },
  );
}
