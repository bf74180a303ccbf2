// The conformance verdict: every compared tensor against the noise floor of its tap kind
// (noise_floor.json: the largest distance between two trusted float32 implementations, mlx-lm
// and transformers, per kind), the first tensor and layer outside it in execution order, and a
// per-layer summary for the plot. A tensor equal in value to mlx-lm's (bit-exact, or the same
// values in another dtype) is within any floor; a floor still marked "placeholder" never lets
// any other run be called CONFORMS.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { TensorComparison } from "./tensor_compare.ts";

export const NOISE_FLOOR_SCHEMA = "gemma4-conform-noise-floor/1";
export const DEFAULT_FLOOR_PATH = join(dirname(fileURLToPath(import.meta.url)), "noise_floor.json");

export interface FloorValue {
  /** Largest relative L2 error ‖a−b‖₂/‖b‖₂ measured for this kind. */
  rel_l2: number;
  /** logits / logprobs: largest per-row KL(mlx-lm ‖ transformers) measured, in nats. */
  kl?: number;
  /** How many tensors of this kind the value was measured over. */
  n?: number;
}

export interface NoiseFloor {
  schema: string;
  status: "measured" | "placeholder";
  /** How the values were measured; null while they are a placeholder. */
  measured: { what: string; where: string; when: string; versions: Record<string, string> } | null;
  /** Per tap kind, as parsed by parity/engine.ts parseTapName: "output", "self_attn/q_proj", "logits", ... */
  kinds: Record<string, FloorValue>;
  /** For a kind the measurement did not cover. */
  default: FloorValue;
  note?: string;
}

export class NoiseFloorError extends Error {
  override readonly name = "NoiseFloorError";
}

function checkValue(where: string, v: unknown): FloorValue {
  const o = v as Record<string, unknown>;
  if (o === null || typeof o !== "object") throw new NoiseFloorError(`${where} must be an object {rel_l2, kl?, n?}`);
  if (typeof o.rel_l2 !== "number" || !(o.rel_l2 >= 0)) throw new NoiseFloorError(`${where}.rel_l2 must be a number ≥ 0`);
  if (o.kl !== undefined && (typeof o.kl !== "number" || !(o.kl >= 0))) throw new NoiseFloorError(`${where}.kl must be a number ≥ 0`);
  if (o.n !== undefined && (typeof o.n !== "number" || !Number.isInteger(o.n) || o.n < 0)) throw new NoiseFloorError(`${where}.n must be a count`);
  return o as unknown as FloorValue;
}

/** Reads and checks a noise floor file (one clear error naming the field). */
export function loadNoiseFloor(path = DEFAULT_FLOOR_PATH): NoiseFloor {
  if (!existsSync(path)) throw new NoiseFloorError(`noise floor ${path} does not exist`);
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new NoiseFloorError(`noise floor ${path}: not JSON (${(e as Error).message})`);
  }
  if (j === null || typeof j !== "object") throw new NoiseFloorError(`noise floor ${path}: not an object`);
  if (j.schema !== NOISE_FLOOR_SCHEMA) throw new NoiseFloorError(`noise floor ${path}: schema must be "${NOISE_FLOOR_SCHEMA}", got ${JSON.stringify(j.schema)}`);
  if (j.status !== "measured" && j.status !== "placeholder") throw new NoiseFloorError(`noise floor ${path}: status must be "measured" or "placeholder"`);
  const m = j.measured as Record<string, unknown> | null;
  if (j.status === "measured") {
    if (m === null || typeof m !== "object") throw new NoiseFloorError(`noise floor ${path}: a measured floor needs measured {what, where, when, versions}`);
    for (const k of ["what", "where", "when"]) if (typeof m[k] !== "string" || !m[k]) throw new NoiseFloorError(`noise floor ${path}: measured.${k} must be a non-empty string`);
    if (m.versions === null || typeof m.versions !== "object") throw new NoiseFloorError(`noise floor ${path}: measured.versions must be an object`);
  }
  if (j.kinds === null || typeof j.kinds !== "object") throw new NoiseFloorError(`noise floor ${path}: kinds must be an object`);
  for (const [k, v] of Object.entries(j.kinds as object)) checkValue(`noise floor ${path}: kinds["${k}"]`, v);
  checkValue(`noise floor ${path}: default`, j.default);
  return j as unknown as NoiseFloor;
}

/** The floor of a tap kind: its own, logprobs falling back on logits, then the default. */
export function floorFor(floor: NoiseFloor, kind: string): { key: string; value: FloorValue } {
  if (floor.kinds[kind]) return { key: kind, value: floor.kinds[kind]! };
  if (kind === "logprobs" && floor.kinds.logits) return { key: "logits", value: floor.kinds.logits };
  return { key: "default", value: floor.default };
}

export interface TensorVerdict {
  name: string;
  call: string;
  layer: number | null;
  kind: string;
  bitExact: boolean;
  /** Every value equal to the oracle's (bit-exact, or the same values in another dtype). */
  exact: boolean;
  /** Relative L2 error (undefined where not defined: logprobs against logits, integers). */
  relL2?: number;
  /** Largest per-row KL (logits / logprobs). */
  kl?: number;
  floorKey: string;
  floor: FloorValue;
  /** Largest of relL2 / floor.rel_l2 and kl / floor.kl (0 when bit-exact; Infinity when the floor is 0 and the error not). */
  ratio: number;
  within: boolean;
  /** Why it is outside, in words (for the reports). */
  reason?: string;
}

export interface LayerSummary {
  /** "in" (before layer 0), a layer index, or "out" (final norm and logits), per call merged. */
  slot: string;
  layer: number | null;
  /** Largest relative L2 error over the slot's tensors (and calls). */
  maxRelL2: number;
  /**
   * The slot's tensor nearest (or furthest beyond) its floor: the largest ratio, the larger
   * relative L2 error on a tie. Its error and floor are what the plot draws, so a layer outside
   * its floor shows above the floor line even where another tensor has a larger error.
   */
  worst: { name: string; kind: string; relL2: number; floorRelL2: number } | null;
  /** The worst tensor's floor (rel_l2), 0 without one. */
  floorRelL2: number;
  worstRatio: number;
  within: boolean;
  tensors: number;
}

export type Status = "CONFORMS" | "DIVERGES" | "FLOOR_NOT_MEASURED";

export interface Verdict {
  status: Status;
  /** One line: "CONFORMS (every tensor bit-exact)", "DIVERGES at prefill0/layers.3/output (layer 3)", ... */
  headline: string;
  floorStatus: NoiseFloor["status"];
  strict: boolean;
  tensors: TensorVerdict[];
  layers: LayerSummary[];
  /** The first tensor outside the floor, in execution order (the oracle's tap order). */
  firstOutside: TensorVerdict | null;
  /** The layer of the first tensor outside the floor that sits in a layer. */
  firstLayerOutside: number | null;
  /** Index of the first greedy token that differs (generate schedules), or null. */
  firstTokenDiff: number | null;
}

function ratioOf(err: number, floor: number): number {
  if (Number.isNaN(err)) return Infinity;
  if (err === 0) return 0;
  return floor > 0 ? err / floor : Infinity;
}

/** One tensor against its kind's floor (strict: only bit-exact is within). */
export function judgeTensor(c: TensorComparison, floor: NoiseFloor, strict = false): TensorVerdict {
  const { key, value } = floorFor(floor, c.kind);
  const base = { name: c.name, call: c.call, layer: c.layer, kind: c.kind, bitExact: c.bitExact, exact: c.exact, floorKey: key, floor: value };
  if (c.bitExact || (c.exact && !strict)) return { ...base, relL2: c.metrics ? 0 : undefined, kl: c.logits ? 0 : undefined, ratio: 0, within: true };
  if (c.note) return { ...base, ratio: Infinity, within: false, reason: c.note };
  if (c.integerEqual !== undefined) return { ...base, ratio: c.integerEqual ? 0 : Infinity, within: c.integerEqual, ...(c.integerEqual ? {} : { reason: "integer values differ" }) };
  const relL2 = c.metrics?.relL2;
  const kl = c.logits?.klMax;
  // A logprobs judged by the logits' floor is judged by its distribution (KL) only: the relative
  // L2 error of log-probabilities is not that of logits (the log-sum-exp shift changes the norm).
  const judgeRelL2 = relL2 !== undefined && !(c.kind === "logprobs" && key !== "logprobs");
  let ratio = 0;
  if (judgeRelL2) ratio = Math.max(ratio, ratioOf(relL2!, value.rel_l2));
  if (kl !== undefined && value.kl !== undefined) ratio = Math.max(ratio, ratioOf(kl, value.kl));
  // judged by KL alone with no KL floor recorded: only KL 0 is within
  if (!judgeRelL2 && kl !== undefined && value.kl === undefined) ratio = Math.max(ratio, ratioOf(kl, 0));
  if (strict) return { ...base, relL2, kl, ratio, within: false, reason: "not bit-exact (--strict)" };
  const within = ratio <= 1;
  const reason = within ? undefined : judgeRelL2 && ratioOf(relL2!, value.rel_l2) > 1 ? `rel L2 ${relL2.toExponential(2)} > floor ${value.rel_l2.toExponential(2)} (${key})` : `KL ${kl?.toExponential(2)} > floor ${value.kl?.toExponential(2) ?? 0} (${key})`;
  return { ...base, relL2, kl, ratio, within, ...(reason ? { reason } : {}) };
}

/**
 * The verdict over comparisons given in execution order. `tokens`: the engine's and the
 * oracle's greedy tokens of a generation (firstTokenDiff), when the schedule generates.
 */
export function judge(comparisons: readonly TensorComparison[], floor: NoiseFloor, opts: { strict?: boolean; firstTokenDiff?: number | null } = {}): Verdict {
  const strict = opts.strict === true;
  const tensors = comparisons.map((c) => judgeTensor(c, floor, strict));
  const firstOutside = tensors.find((t) => !t.within) ?? null;
  const firstLayerOutside = tensors.find((t) => !t.within && t.layer !== null)?.layer ?? null;
  const firstTokenDiff = opts.firstTokenDiff ?? null;
  const layers = layerSummaries(tensors);
  const allExact = tensors.every((t) => t.exact);
  let status: Status;
  let headline: string;
  const at = (t: TensorVerdict) => `${t.name}${t.layer !== null ? ` (layer ${t.layer})` : ""}`;
  if (tensors.length === 0) {
    status = "DIVERGES";
    headline = "DIVERGES: no tensor was compared";
  } else if (firstOutside) {
    status = floor.status === "measured" || strict ? "DIVERGES" : "FLOOR_NOT_MEASURED";
    headline = status === "DIVERGES" ? `DIVERGES at ${at(firstOutside)}: ${firstOutside.reason}` : `floor not measured (noise_floor.json is a placeholder); first tensor outside the placeholder floor: ${at(firstOutside)}`;
  } else if (firstTokenDiff !== null) {
    status = floor.status === "measured" || strict ? "DIVERGES" : "FLOOR_NOT_MEASURED";
    headline = `${status === "DIVERGES" ? "DIVERGES" : "floor not measured"}: greedy tokens differ from step ${firstTokenDiff}`;
  } else if (allExact) {
    status = "CONFORMS";
    const bits = tensors.filter((t) => t.bitExact).length;
    headline = bits === tensors.length ? "CONFORMS (every tensor bit-exact)" : `CONFORMS (every value equal to mlx-lm's; ${bits}/${tensors.length} tensors bit-exact, the others the same values in another dtype)`;
  } else if (floor.status !== "measured") {
    status = "FLOOR_NOT_MEASURED";
    headline = "floor not measured (noise_floor.json is a placeholder): every tensor is within the placeholder floor, which proves nothing";
  } else {
    status = "CONFORMS";
    headline = `CONFORMS (every tensor within the measured noise floor; ${tensors.filter((t) => t.bitExact).length}/${tensors.length} bit-exact)`;
  }
  return { status, headline, floorStatus: floor.status, strict, tensors, layers, firstOutside, firstLayerOutside, firstTokenDiff };
}

/** Per layer slot (in, 0..n-1, out), the worst tensor over every call. */
export function layerSummaries(tensors: readonly TensorVerdict[]): LayerSummary[] {
  const maxLayer = Math.max(-1, ...tensors.map((t) => t.layer ?? -1));
  const slots = new Map<string, LayerSummary>();
  const order = ["in", ...Array.from({ length: maxLayer + 1 }, (_, i) => String(i)), "out"];
  for (const s of order) slots.set(s, { slot: s, layer: s === "in" || s === "out" ? null : Number(s), maxRelL2: 0, worst: null, floorRelL2: 0, worstRatio: 0, within: true, tensors: 0 });
  // A model-level tap is "in" until the first layer tap of its call has been seen.
  const seenLayer = new Set<string>();
  for (const t of tensors) {
    let slot: string;
    if (t.layer !== null) {
      seenLayer.add(t.call);
      slot = String(t.layer);
    } else slot = seenLayer.has(t.call) ? "out" : "in";
    const s = slots.get(slot)!;
    s.tensors++;
    if (t.relL2 !== undefined && !(t.relL2 <= s.maxRelL2)) s.maxRelL2 = t.relL2;
    const e = t.relL2 ?? 0;
    if (s.worst === null || t.ratio > s.worstRatio || (t.ratio === s.worstRatio && e > s.worst.relL2)) {
      s.worst = { name: t.name, kind: t.kind, relL2: e, floorRelL2: t.floor.rel_l2 };
      s.floorRelL2 = t.floor.rel_l2;
    }
    s.worstRatio = Math.max(s.worstRatio, t.ratio);
    s.within &&= t.within;
  }
  return order.map((s) => slots.get(s)!).filter((s) => s.tensors > 0);
}

/** Exit code of a verdict: 0 conforms, 1 otherwise (a divergence, or a floor not measured). */
export function exitCodeOf(v: Pick<Verdict, "status">): 0 | 1 {
  return v.status === "CONFORMS" ? 0 : 1;
}
