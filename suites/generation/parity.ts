// Generation parity harness: runs model/generate.ts on a fixture checkpoint and compares, call by
// call (every prefill chunk and every decode step), against mlx-lm's generate_step captured by the
// oracle: the masks, each layer's keys/values returned by the cache (update_and_fetch), the
// logits, the logprobs and the token, then every cache's scalars and buffer shapes after the call.
// The first divergence is named by call ("prefill1/", "step7/") and tap; on a divergence the call
// is re-captured with every tap stored to name the first divergent model tap.
import { join } from "node:path";
import { readFileSync } from "node:fs";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type CallRecord, type CaptureResult, type OracleClient, REPO_ROOT, type TapRecord } from "../../oracle/client.ts";
import { KVCache, RotatingKVCache, type KVCacheLike } from "../../model/cache/index.ts";
import { generateStep, type CallInfo, type GenerateModel, type StepInfo } from "../../model/generate.ts";
import { loadModel, type LoadedModel } from "../../model/gemma4/index.ts";
import type { TapSink } from "../../model/gemma4/taps.ts";
import { compareRaw, formatDiff, rawOfNpy, type RawTensor, type TensorDiff } from "../../oracle/compare.ts";
import { type DivergentTap, kvLengthAt } from "../../oracle/mlx_bugs.ts";

export const CKPT_ROOT = join(REPO_ROOT, ".cache", "checkpoints");

export interface Scenario {
  id: string;
  kind: string;
  applies_to: "all" | "moe";
  prompt?: number[];
  prefill_step_size?: number;
  max_tokens?: number;
  /** Not in fixtures/scenarios.json: sent to the oracle inline. */
  inline?: boolean;
}

function scenarioArg(sc: Scenario): string | { id: string; kind: "generate"; prompt: number[]; prefill_step_size?: number; max_tokens?: number } {
  return sc.inline ? { id: sc.id, kind: "generate", prompt: sc.prompt!, prefill_step_size: sc.prefill_step_size, max_tokens: sc.max_tokens } : sc.id;
}

export function loadScenarios(): Scenario[] {
  return JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "scenarios.json"), "utf8")).scenarios;
}

export interface CheckpointInfo {
  id: string;
  features: string[];
}

export function loadCheckpoints(): CheckpointInfo[] {
  const idx = JSON.parse(readFileSync(join(CKPT_ROOT, "index.json"), "utf8")).checkpoints as Record<string, { features: string[] }>;
  return Object.entries(idx).map(([id, v]) => ({ id, features: v.features ?? [] }));
}

export function isMoe(c: CheckpointInfo): boolean {
  return c.features.includes("moe") || c.id.startsWith("c5_") || c.id.startsWith("c6_");
}

const models = new Map<string, LoadedModel>();
export function model(ckpt: string): LoadedModel {
  let m = models.get(ckpt);
  if (!m) {
    m = loadModel(join(CKPT_ROOT, ckpt));
    models.set(ckpt, m);
  }
  return m;
}

export function generateModel(lm: LoadedModel, taps?: (call: CallInfo) => TapSink | undefined): GenerateModel {
  return {
    makeCache: () => lm.model.makeCache({ kvCache: () => new KVCache(), rotatingKVCache: (m, k) => new RotatingKVCache(m, k) }),
    forward: (inputs, cache, call) => lm.model.call(inputs, { cache, taps: taps?.(call) }),
  };
}

/** One tap as raw bytes (or a mask kind). */
interface Got {
  name: string;
  kind: "array" | "none" | "str";
  t?: RawTensor;
  value?: string;
}

function prefixOf(c: CallInfo): string {
  return c.kind === "prefill" ? `prefill${c.index}/` : `step${c.index}/`;
}

export const PARITY_TAPS = ["*logits", "*logprobs", "*token", "*cache_keys", "*cache_values", "*mask/*"];
const wanted = (name: string) => /\/(logits|logprobs|token)$|\/cache_(keys|values)$|\/mask\//.test(name);

export interface ParityRun {
  ckpt: string;
  scenario: string;
  calls: number;
  steps: number;
  tensors: number;
  tokens: number[];
  first: { call: string; tap: string; detail: string } | null;
  ms: { oracle: number; ts: number };
}

function cacheMeta(c: KVCacheLike): Record<string, unknown> {
  const o: Record<string, unknown> = { type: c instanceof KVCache ? "KVCache" : "RotatingKVCache", offset: c.offset };
  if (c instanceof RotatingKVCache) Object.assign(o, { keep: c.keep, max_size: c.maxSize, idx: c.idx });
  const k = (c as KVCache).keys;
  const v = (c as KVCache).values;
  o.keys_shape = k ? k.shape : null;
  o.values_shape = v ? v.shape : null;
  return o;
}

/** Runs the TS generation, collecting the parity taps per call and the cache metas after each call. */
export async function runTs(
  lm: LoadedModel,
  prompt: number[],
  prefill: number,
  maxTokens: number,
  filter: (name: string) => boolean = wanted,
): Promise<{ taps: Got[]; metas: Record<string, unknown>[][]; tokens: number[]; error?: Error }> {
  const taps: Got[] = [];
  const metas: Record<string, unknown>[][] = [];
  const sinkFor = (call: CallInfo): TapSink => {
    const p = prefixOf(call);
    return (name, value) => {
      const n = p + name;
      if (!filter(n)) return;
      if (value === null) taps.push({ name: n, kind: "none" });
      else if (typeof value === "string") taps.push({ name: n, kind: "str", value });
      else if (typeof value === "number") taps.push({ name: n, kind: "str", value: String(value) });
      else taps.push({ name: n, kind: "array", t: { dtype: value.dtype, shape: value.shape, data: value.toBytes() } });
    };
  };
  const onStep = (s: StepInfo) => {
    const p = prefixOf(s.call);
    if (s.logprobs && filter(`${p}logprobs`)) taps.push({ name: `${p}logprobs`, kind: "array", t: arr(s.logprobs) });
    if (s.sampled && filter(`${p}token`)) taps.push({ name: `${p}token`, kind: "array", t: arr(s.sampled) });
    metas.push(s.cache.map(cacheMeta));
  };
  const tokens: number[] = [];
  try {
    for await (const t of generateStep(generateModel(lm, sinkFor), prompt, { maxTokens, prefillStepSize: prefill, onStep })) tokens.push(t.token);
  } catch (e) {
    // A crash (e.g. a mask/key shape mismatch) is a divergence too: keep the taps seen so far.
    return { taps, metas, tokens, error: e as Error };
  }
  return { taps, metas, tokens };
}

function arr(a: MlxArray): RawTensor {
  return { dtype: a.dtype, shape: a.shape, data: a.toBytes() };
}

function tapDiff(name: string, got: Got | undefined, want: TapRecord | undefined): TensorDiff | string | null {
  if (!want) return `${name}: not captured by the oracle`;
  if (!got) return `${name}: missing on the TS side`;
  if (want.kind !== "array" || got.kind !== "array") {
    const a = got.kind === "array" ? "array" : got.kind === "none" ? "None" : got.value;
    const e = want.kind === "array" ? "array" : want.kind === "none" ? "None" : want.value;
    return a === e ? null : `${name}: ${a} vs oracle ${e}`;
  }
  if (!want.array) return null; // not stored
  const d = compareRaw(name, got.t!, rawOfNpy(want.array));
  return d.equal ? null : d;
}

/** The oracle's side of a parity run: generate_step's calls with the parity taps. */
export function parityCapture(oracle: OracleClient, ckpt: string, sc: Scenario): Promise<CaptureResult> {
  return oracle.capture(ckpt, scenarioArg(sc), { mode: "full", only: PARITY_TAPS });
}

/**
 * Compares one scenario; returns counts and the first divergence (null when bit-exact). `capture`:
 * the oracle's side when the caller already has it (parityCapture; the oracle is deterministic,
 * so runs of one scenario can share it), else it is requested here.
 */
export async function parityRun(oracle: OracleClient, ckpt: string, sc: Scenario, capture?: Promise<CaptureResult>): Promise<ParityRun> {
  const t0 = performance.now();
  // the oracle captures in its process while TS runs (each on its own core)
  let tOracle = 0;
  const pending = (capture ?? parityCapture(oracle, ckpt, sc)).then((c) => {
    tOracle = performance.now() - t0;
    return c;
  });
  pending.catch(() => {}); // surfaces at the await below
  await oracle.sent();
  const lm = model(ckpt);
  const t1 = performance.now();
  const ts = await runTs(lm, sc.prompt!, sc.prefill_step_size ?? 2048, sc.max_tokens ?? 20);
  const t2 = performance.now();
  const cap = await pending;
  const res: ParityRun = { ckpt, scenario: sc.id, calls: cap.calls.length, steps: 0, tensors: 0, tokens: ts.tokens, first: null, ms: { oracle: tOracle, ts: t2 - t1 } };
  const want = new Map<string, TapRecord>();
  for (const t of cap.taps) if (wanted(t.name)) want.set(t.name, t);
  const got = new Map<string, Got>();
  for (const t of ts.taps) got.set(t.name, t);
  if (!ts.error && ts.metas.length !== cap.calls.length) {
    res.first = { call: "-", tap: "calls", detail: `TS made ${ts.metas.length} model calls, oracle ${cap.calls.length}` };
    return res;
  }
  // Walk the oracle's calls in order; inside a call its taps in execution order.
  const byCall = new Map<string, TapRecord[]>();
  for (const t of cap.taps) {
    if (!wanted(t.name)) continue;
    const p = t.name.slice(0, t.name.indexOf("/") + 1);
    (byCall.get(p) ?? byCall.set(p, []).get(p)!).push(t);
  }
  for (let ci = 0; ci < cap.calls.length; ci++) {
    const call: CallRecord = cap.calls[ci]!;
    for (const w of byCall.get(call.prefix) ?? []) {
      if (ts.error && !got.has(w.name)) {
        res.first = { call: call.prefix, tap: "error", detail: `TS run failed before ${w.name}: ${ts.error.message}` };
        return res;
      }
      const d = tapDiff(w.name, got.get(w.name), w);
      if (w.kind === "array" && w.array) res.tensors++;
      if (d !== null) {
        res.first = { call: call.prefix, tap: w.name, detail: typeof d === "string" ? d : formatDiff(d) };
        return res;
      }
    }
    if (ts.error && ci >= ts.metas.length) {
      res.first = { call: call.prefix, tap: "error", detail: `TS run failed in this call: ${ts.error.message}` };
      return res;
    }
    const tsMeta = JSON.stringify(ts.metas[ci]);
    const pyMeta = JSON.stringify(call.cache_after.map(({ layer: _l, ...m }) => m));
    if (tsMeta !== pyMeta) {
      res.first = { call: call.prefix, tap: "cache_after", detail: `cache state after the call: TS ${tsMeta} vs oracle ${pyMeta}` };
      return res;
    }
    if (call.kind === "step") res.steps++;
  }
  const gen = cap.meta.generated ?? [];
  if (JSON.stringify(gen) !== JSON.stringify(ts.tokens)) res.first = { call: "-", tap: "tokens", detail: `tokens ${ts.tokens} vs oracle ${gen}` };
  return res;
}

/** On a divergence: re-capture the divergent call with every tap and name the first divergent model tap. */
export async function explain(oracle: OracleClient, ckpt: string, sc: Scenario, callPrefix: string): Promise<string> {
  if (!/^(prefill|step)\d+\/$/.test(callPrefix)) return "";
  const cap = await oracle.capture(ckpt, scenarioArg(sc), { mode: "full", only: [`${callPrefix}*`] });
  const ts = await runTs(model(ckpt), sc.prompt!, sc.prefill_step_size ?? 2048, sc.max_tokens ?? 20, (n) => n.startsWith(callPrefix));
  const got = new Map(ts.taps.map((t) => [t.name, t]));
  for (const w of cap.taps) {
    if (!w.name.startsWith(callPrefix)) continue;
    const d = tapDiff(w.name, got.get(w.name), w);
    if (d !== null) return `first divergent model tap: ${typeof d === "string" ? d : formatDiff(d)}`;
  }
  return "no model tap differs in that call";
}

/**
 * The first divergent tap of call `callPrefix`, re-captured with every tap, for the MLX-bug
 * attribution (oracle/mlx_bugs.ts mlxBugAtTap); null when no tap's bytes differ there or the first
 * difference is structural (a name, kind, dtype or shape).
 */
export async function firstDivergentTapOfCall(oracle: OracleClient, ckpt: string, sc: Scenario, callPrefix: string): Promise<DivergentTap | null> {
  if (!/^(prefill|step)\d+\/$/.test(callPrefix)) return null;
  const cap = await oracle.capture(ckpt, scenarioArg(sc), { mode: "full", only: [`${callPrefix}*`] });
  const ts = await runTs(model(ckpt), sc.prompt!, sc.prefill_step_size ?? 2048, sc.max_tokens ?? 20, (n) => n.startsWith(callPrefix));
  const got = new Map(ts.taps.map((t) => [t.name, t]));
  for (const w of cap.taps) {
    if (!w.name.startsWith(callPrefix)) continue;
    const d = tapDiff(w.name, got.get(w.name), w);
    if (d === null) continue;
    if (typeof d === "string" || d.note) return null;
    return { name: w.name, dtype: d.dtype, shape: d.shape, kvLength: kvLengthAt(w.name, cap.taps) };
  }
  return null;
}

export function freeModels(): void {
  for (const m of models.values()) m.model.dispose();
  models.clear();
  mx.clearCache();
}
