// One side-by-side parity run: the oracle (mlx-lm) captures every tap of generate_step on a
// checkpoint, then the TS model runs the same prompt and every TS tap is compared, in execution
// order, against the oracle's tap at the same position, as soon as TS produces it. Oracle taps
// stay on disk as .npy files until their turn and are deleted right after, and TS taps are
// compared and dropped at once, so memory stays bounded by one tap per side.
import { existsSync, readFileSync, unlinkSync } from "node:fs";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type GenerateModel, generateStep } from "../model/generate.ts";
import { type LoadedMultimodalModel, loadModel, loadMultimodalModel } from "../model/gemma4/index.ts";
import { disposeUnifiedMedia, isUnifiedCheckpoint, loadUnifiedModel, type UnifiedPrompt, unifiedGenerationModel } from "../model/gemma4_unified/index.ts";
import type { TapMeta, TapValue } from "../model/gemma4/taps.ts";
import { generationModel, type MediaPrompt, mediaGenerationModel, stepTaps } from "../model/runtime.ts";
import { type DivergentTap, kvLengthAt, mlxBugAtTap } from "../oracle/mlx_bugs.ts";
import { parseNpy } from "../oracle/npy.ts";
import { disposeMediaInputs } from "../model/gemma4/gemma4.ts";
import { expectReply, type OracleClient, OracleError, REPO_ROOT } from "../oracle/client.ts";
import { join } from "node:path";
import { bisect } from "./bisect.ts";
import { compareRaw, type RawTensor, rawOf } from "../oracle/compare.ts";
import type { Divergence, RunResult, TapResult } from "./schema.ts";

export interface Budget {
  ulp: number;
  atol: number;
}

export interface RunSpec {
  /** Checkpoint the TS model loads. */
  tsDir: string;
  /** Checkpoint (dir or fixture matrix id) mlx-lm loads; normally the same as tsDir. */
  oracleCheckpoint: string;
  model: string;
  variant: string;
  prompt: number[];
  prefillStepSize: number;
  steps: number;
  budget: Budget;
  /** On a divergence, bisect the block of the first divergent tap down to one MLX op. */
  bisect?: boolean;
  /**
   * A multimodal run against mlx-vlm: the scenario mlx-vlm's capture runs (a fixture scenario
   * id, or an inline one with media files). The TS side reads the expanded prompt ids and the
   * processor's media arrays from the capture itself (both sides run the same inputs).
   */
  media?: {
    scenario: string | Record<string, unknown>;
    /** The processor's outputs when known before the capture (the TS processor on the face's files); else read from the capture. */
    prepared?: MediaPrompt;
    /** A gemma4_unified checkpoint: its TS inputs (ids and the TS processor's outputs), made when the run starts and disposed after it. */
    unified?: () => UnifiedPrompt;
  };
}

export type Progress = (p: { call: string; layer: number | null; layers: number; calls: number; callIndex: number }) => void;

interface WireTap {
  name: string;
  kind: "array" | "none" | "str";
  dtype?: string;
  shape?: number[];
  value?: string;
  npy?: string;
  meta?: Record<string, unknown>;
}

const CALL_RE = /^(embed\/|(prefill|step)(\d+)\/)/;
const LAYER_RE = /^layers\.(\d+)\//;

/** Splits a full tap name into (call prefix, layer, kind). */
export function parseTapName(name: string): { call: string; layer: number | null; kind: string } {
  const c = CALL_RE.exec(name);
  const call = c ? c[0].slice(0, -1) : "forward";
  const rest = c ? name.slice(c[0].length) : name;
  const l = LAYER_RE.exec(rest);
  return { call, layer: l ? Number(l[1]) : null, kind: l ? rest.slice(l[0].length) : rest };
}

/** A tap is within budget when every element is bit-exact, or its max ULP / max abs is within the budget. */
export function withinBudget(t: Pick<TapResult, "mismatches" | "maxUlp" | "maxAbs">, b: Budget): boolean {
  return t.mismatches === 0 || t.maxUlp <= b.ulp || (b.atol > 0 && t.maxAbs <= b.atol);
}

function describeValue(v: TapValue): string {
  if (v === null) return "None";
  if (v === "causal") return '"causal"';
  if (typeof v === "number") return `int ${v}`;
  return `${v.dtype}[${v.shape.join(",")}]`;
}

export interface Capture {
  meta: { generated?: number[] };
  taps: WireTap[];
}

/** Asks mlx-lm for every tap of the run (streamed to .npy files as it records them). */
export async function captureOracle(oracle: OracleClient, spec: RunSpec): Promise<Capture> {
  const cap = await oracle.request<Capture>(
    "capture",
    {
      checkpoint: spec.oracleCheckpoint,
      scenario: spec.media?.scenario ?? { id: "parity-cli", kind: "generate", prompt: spec.prompt, prefill_step_size: spec.prefillStepSize, max_tokens: spec.steps },
      mode: "full",
      only: null,
      stream: true,
    },
    1_800_000,
  );
  expectReply("capture", cap, { meta: "object", taps: "array" });
  const bad = cap.taps.find((t) => t === null || typeof t !== "object" || typeof t.name !== "string");
  if (bad !== undefined) throw new OracleError(`malformed reply from oracle to capture: tap ${JSON.stringify(bad)?.slice(0, 200)}`, "capture");
  return cap;
}

/**
 * Runs the TS side of a parity run against an oracle capture (pass a capture already requested
 * to overlap mlx-lm's work on the next run with TS's on this one).
 */
export async function runParity(oracle: OracleClient, spec: RunSpec, progress?: Progress, capture?: Promise<Capture>): Promise<RunResult> {
  const t0 = performance.now();
  const cap = await (capture ?? captureOracle(oracle, spec));
  const theirs = cap.taps;
  const calls = new Set(theirs.map((t) => parseTapName(t.name).call));
  const unified = spec.media && isUnifiedCheckpoint(spec.tsDir) ? loadUnifiedModel(spec.tsDir) : null;
  const loaded = unified ?? (spec.media ? loadMultimodalModel(spec.tsDir) : loadModel(spec.tsDir));
  const layers = "text" in loaded ? loaded.text.args.num_hidden_layers : loaded.config.text.num_hidden_layers;

  const taps: TapResult[] = [];
  const stepOf = new Map<string, number>();
  let first: Divergence | null = null;
  let firstAt: { position: number; expected: RawTensor } | null = null;
  // the first divergent tap as the MLX-bug attribution needs it (null when dtype or shape differ)
  let firstTap: DivergentTap | null = null;
  let index = 0;
  let structural: string | null = null;

  const take = (i: number): WireTap | undefined => theirs[i];
  const sink = (name: string, value: TapValue, _meta?: TapMeta) => {
    const i = index++;
    if (structural) return;
    const ref = take(i);
    const { call, layer, kind } = parseTapName(name);
    if (!stepOf.has(call)) {
      stepOf.set(call, stepOf.size);
      progress?.({ call, layer, layers, calls: calls.size, callIndex: stepOf.size - 1 });
    } else if (kind === "input_layernorm") progress?.({ call, layer, layers, calls: calls.size, callIndex: stepOf.get(call)! });
    if (!ref || ref.name !== name) {
      structural = ref ? `TS emitted tap "${name}" where mlx-lm has "${ref.name}" (position ${i})` : `TS emitted extra tap "${name}" (mlx-lm has ${theirs.length})`;
      return;
    }
    const step = stepOf.get(call)!;
    const base = { step, name, layer, kind };
    if (ref.kind !== "array") {
      // Mask kinds: None or "causal" must agree exactly.
      const same = ref.kind === "none" ? value === null : value === ref.value;
      if (!same) structural = `tap "${name}": TS ${describeValue(value)} vs mlx-lm ${ref.kind === "str" ? JSON.stringify(ref.value) : "None"}`;
      return;
    }
    if (value === null || value === "causal") {
      structural = `tap "${name}": TS ${describeValue(value)} vs mlx-lm ${ref.dtype}[${(ref.shape ?? []).join(",")}]`;
      return;
    }
    if (!ref.npy) {
      structural = `tap "${name}": mlx-lm did not store this tensor`;
      return;
    }
    const expected = oracle.readArray({ npy: ref.npy, dtype: ref.dtype! });
    // A JS number is the no-cache Python int offset; mlx-lm's side records it as an int32 scalar.
    const actual = typeof value === "number" ? intScalar(value) : rawOf(value);
    const d = compareRaw(name, actual, { dtype: expected.dtype, shape: expected.shape, data: expected.data });
    const r: TapResult = {
      ...base,
      dtype: d.dtype,
      shape: d.shape,
      size: d.total,
      // a dtype/shape difference is a divergence of every element (d.total is 0 then)
      mismatches: d.note ? Math.max(1, expected.shape.reduce((a, b) => a * b, 1)) : d.mismatches,
      maxAbs: d.maxAbs,
      maxUlp: d.maxUlp,
      firstIndex: d.firstIndex,
    };
    taps.push(r);
    if (!first && r.mismatches > 0) {
      firstAt = { position: i, expected: { dtype: expected.dtype, shape: expected.shape, data: expected.data } };
      first = { step, tap: name, layer, maxAbs: r.maxAbs, maxUlp: r.maxUlp, mismatches: r.mismatches, firstIndex: r.firstIndex };
      firstTap = d.note ? null : { name, dtype: d.dtype, shape: d.shape, kvLength: kvLengthAt(name, theirs) };
    }
  };

  const tsTokens: number[] = [];
  let prompt = spec.prompt;
  try {
    let run: { generate: GenerateModel; chunked: boolean; dispose(): void };
    if ("text" in loaded) {
      run = { generate: generationModel(loaded, sink), chunked: true, dispose: () => {} };
    } else if (unified) {
      if (!spec.media!.unified) throw new Error(`${spec.tsDir}: a gemma4_unified run needs its TS inputs (spec.media.unified)`);
      const up = spec.media!.unified();
      prompt = [...up.ids];
      try {
        run = unifiedGenerationModel(unified.model, up, sink);
      } finally {
        disposeUnifiedMedia(up.media);
      }
    } else {
      const rec = spec.media!.prepared ?? recordedMedia(theirs);
      prompt = [...rec.ids];
      try {
        run = mediaGenerationModel((loaded as LoadedMultimodalModel).model, rec, sink);
      } finally {
        if (!spec.media!.prepared) disposeMediaInputs(rec.media);
      }
    }
    try {
      for await (const t of generateStep(run.generate, prompt, { maxTokens: spec.steps, prefillStepSize: spec.prefillStepSize, chunkedPrefill: run.chunked, onStep: stepTaps(sink) })) {
        tsTokens.push(t.token);
      }
    } finally {
      run.dispose();
    }
  } finally {
    loaded.model.dispose();
    for (const t of theirs.slice(index)) if (t.npy) unlinkQuiet(t.npy);
  }
  if (!structural && index < theirs.length) structural = `TS stopped after ${index} taps; mlx-lm emitted ${theirs.length}`;
  if (structural) throw new Error(`tap streams differ: ${structural}`);

  // (assigned inside the tap sink, so TypeScript cannot narrow them here)
  const found = first as Divergence | null;
  const at = firstAt as { position: number; expected: RawTensor } | null;
  if (found && at && spec.bisect && !spec.media) {
    const oracleDir = existsSync(spec.oracleCheckpoint) ? spec.oracleCheckpoint : join(REPO_ROOT, ".cache", "checkpoints", spec.oracleCheckpoint);
    found.bisect = await bisect({ tsDir: spec.tsDir, oracleDir, prompt: spec.prompt, prefillStepSize: spec.prefillStepSize, steps: spec.steps, ...at });
  }
  const bitExact = taps.filter((t) => t.mismatches === 0).length;
  const bug = found ? mlxBugField(spec.tsDir, firstTap as DivergentTap | null, taps) : {};
  return {
    model: spec.model,
    variant: spec.variant,
    scenario: `${spec.media ? "media " : ""}prompt ${prompt.length} · prefill ${spec.prefillStepSize} · ${spec.steps} steps`,
    steps: spec.steps,
    tapsCompared: taps.length,
    bitExact,
    withinBudget: taps.filter((t) => withinBudget(t, spec.budget)).length,
    firstDivergence: first,
    ...bug,
    tokens: { ts: tsTokens, oracle: cap.meta.generated ?? [] },
    taps,
    seconds: (performance.now() - t0) / 1000,
  };
}

/**
 * A divergent run whose first divergent tap an op on a recorded MLX bug's path produced (on this
 * backend) names the bug; the taps from that one on are unverified. Any other divergence: nothing
 * (a failure).
 */
function mlxBugField(dir: string, tap: DivergentTap | null, taps: readonly TapResult[]): Pick<RunResult, "mlxBug" | "unverifiedTaps"> {
  const b = tap && mlxBugAtTap(dir, tap);
  if (!b) return {};
  const at = taps.findIndex((t) => t.name === tap!.name);
  return { mlxBug: { ...b, tap: tap!.name }, unverifiedTaps: taps.length - at };
}

/**
 * The prompt ids and media of a multimodal capture, read from its embed call's input taps (the
 * .npy files stay for the comparison): the processor's arrays, so both sides run the same inputs.
 */
function recordedMedia(theirs: readonly WireTap[]): MediaPrompt {
  const read = (name: string): MlxArray | null => {
    const t = theirs.find((x) => x.name === `embed/${name}`);
    if (!t?.npy) return null;
    const r = parseNpy(new Uint8Array(readFileSync(t.npy)), t.dtype);
    return mx.fromBytes(r.data, r.shape, r.dtype as mx.Dtype);
  };
  const ids = read("inputs");
  if (!ids) throw new Error("the multimodal capture has no embed/inputs tap");
  using _ids = ids;
  const mask = read("audio_tower/input_mask");
  const valid = mask ? mx.logicalNot(mask) : null; // the tower's mask is the processor's, inverted
  mask?.dispose();
  return { ids: ids.toNumbers(), media: { pixel_values: read("vision_tower/pixel_values"), input_features: read("audio_tower/input_features"), input_features_mask: valid } };
}

function intScalar(v: number): RawTensor {
  const data = new Uint8Array(4);
  new DataView(data.buffer).setInt32(0, v, true);
  return { dtype: "int32", shape: [], data };
}

function unlinkQuiet(p: string): void {
  if (existsSync(p)) unlinkSync(p);
}
