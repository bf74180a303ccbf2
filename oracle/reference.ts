// The independent reference: Hugging Face transformers' Gemma 4 (PyTorch, float32), a second
// implementation beside mlx-lm. `npm run reference:export` stores its logits and per-layer hidden
// states for the float32 fixture checkpoints in fixtures/reference/ (with the versions in
// manifest.json); this module compares a model's float32 forward with them. The suites and the
// parity report both stand on it, and it needs no torch.
import { existsSync, readFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { AnyModel } from "../model/gemma4/index.ts";
import { REPO_ROOT } from "./client.ts";

export const REFERENCE_DIR = join(REPO_ROOT, "fixtures", "reference");

/**
 * The one tolerance against transformers, relative to the largest reference value (max |a - b| /
 * max |b|), for the logits and for every hidden state. Why a tolerance at all: two
 * implementations (PyTorch's CPU kernels, libmlx's) round float32 sums in different orders.
 * Measured by `npm run reference:export` on the 8 float32 fixtures (manifest.json keeps each):
 * - TS (= mlx-lm, bit for bit) against transformers float32: 2.3e-6 to 8.9e-6;
 * - each against the same model run by transformers in float64: TS 1.9e-6 to 4.9e-6,
 *   transformers' own float32 run 2.0e-6 to 5.3e-6: the two are equally far from the exact
 *   computation, so their difference is rounding (at most about 5.3e-6 + 4.9e-6 ≈ 1.0e-5);
 * - a real mistake is far larger: the semantic port bugs of model/gemma4/mutations.ts move it by
 *   2.1e-4 (PLE inputs without their 2^-0.5 scale) up to 2 (wrong masks).
 * The bound, 2e-5, sits above the rounding and ten times below the smallest mistake.
 */
export const REFERENCE_BOUND = { relative: 2e-5 } as const;

/**
 * Where the bound was measured: MLX's CPU device. On a GPU, MLX computes float32 matmuls in TF32
 * by default (MLX_ENABLE_TF32=1 in mlx/utils.h; both MLX sides alike): measured on the H200, TS and
 * mlx-lm, still bit for bit equal, sit 4.3e-3 to 1.6e-2 (logits) and up to 3.0e-2 (hidden states)
 * from transformers over the 8 float32 fixtures. There the parity command reports the distance and
 * requires TS = mlx-lm, but the bound does not judge it; the reference suite runs on the CPU device.
 */
export function referenceBoundApplies(): boolean {
  return mx.defaultDevice() === "cpu";
}

export interface ReferenceFixture {
  /** Fixture checkpoint id, e.g. "c1_dense/f32". */
  checkpoint: string;
  file: string;
  sha256: string;
  /** sha256 of the checkpoint's model.safetensors the reference was computed from. */
  checkpointSha256: string;
  tokens: number;
  /** transformers parameters the checkpoint leaves out (unused ones: tied head, shared-layer K/V). */
  missingUnused: string[];
  /**
   * At export: TS (= mlx-lm, bit for bit) against transformers in float32, the rounding of each
   * float32 implementation against transformers run in float64 (the exact computation, up to
   * float64 rounding), each as {logits, hidden} relative differences.
   */
  measured: { tsVsHf32: RelPair; tsVsHf64: RelPair; hf32VsHf64: RelPair; logitsAbs: number };
}

export interface RelPair {
  logits: number;
  hidden: number;
}

export interface ReferenceManifest {
  note: string;
  versions: Record<string, string>;
  bound: { relative: number };
  fixtures: Record<string, ReferenceFixture>;
}

export function readReferenceManifest(): ReferenceManifest | null {
  const p = join(REFERENCE_DIR, "manifest.json");
  return existsSync(p) ? (JSON.parse(readFileSync(p, "utf8")) as ReferenceManifest) : null;
}

export const sha256File = (p: string): string => createHash("sha256").update(readFileSync(p)).digest("hex");

export interface LayerDiff {
  /** "embed_scaled", "layers.<i>/output" or "norm" (transformers' hidden_states[i]). */
  tap: string;
  maxAbs: number;
  rel: number;
}

export interface ReferenceDiff {
  checkpoint: string;
  logitsAbs: number;
  logitsRel: number;
  /** The largest relative difference over every hidden state. */
  hiddenRel: number;
  layers: LayerDiff[];
  /** The model's float32 logits (to compare with mlx-lm's bit for bit) and the reference's. */
  logits: Float32Array;
  referenceLogits: Float32Array;
  /** The reference forward's token ids. */
  tokens: number[];
  ok: boolean;
}

/** max |a - b| and max |a - b| / max |b|. */
export function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): { maxAbs: number; rel: number } {
  if (a.length !== b.length) throw new Error(`reference comparison: ${a.length} values against ${b.length}`);
  let maxAbs = 0;
  let maxRef = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i]! - b[i]!);
    if (!(d <= maxAbs)) maxAbs = d; // NaN propagates
    const r = Math.abs(b[i]!);
    if (r > maxRef) maxRef = r;
  }
  return { maxAbs, rel: maxAbs / Math.max(maxRef, 1e-30) };
}

/** transformers' hidden_states[i] as TS tap names: embeddings, each layer's output, and the last one after the final norm. */
export function hiddenStateTaps(layers: number): string[] {
  return ["embed_scaled", ...Array.from({ length: layers - 1 }, (_, i) => `layers.${i}/output`), "norm"];
}

/** One float32 forward of `model` on the reference's tokens, compared with transformers' logits and hidden states. */
export function compareWithReference(checkpoint: string, fixture: ReferenceFixture, model: AnyModel, layers: number, dir = REFERENCE_DIR, file = fixture.file): ReferenceDiff {
  const ref = mx.loadSafetensors(join(dir, file));
  try {
    const f32 = (k: string): ArrayLike<number> => {
      const a = ref.arrays.get(k);
      if (!a) throw new Error(`${file} has no ${k}`);
      // float64 values are stored as uint64 bit patterns (MLX reads no F64 safetensors)
      return a.dtype === "uint64" ? new Float64Array(a.toBytes().buffer) : new Float32Array(a.toBytes().buffer);
    };
    const want = new Set(hiddenStateTaps(layers));
    const got = new Map<string, Float32Array>();
    const ids = ref.arrays.get("input_ids")!;
    const out = model.call(ids, {
      taps: (name, v) => {
        if (want.has(name) && v instanceof mx.MlxArray) got.set(name, new Float32Array(v.toBytes().slice().buffer));
      },
    });
    let logits: Float32Array;
    try {
      if (out.dtype !== "float32") throw new Error(`${checkpoint}: the reference comparison needs float32 logits, got ${out.dtype}`);
      logits = new Float32Array(out.toBytes().slice().buffer);
    } finally {
      out.dispose();
    }
    const referenceLogits = f32("logits") as Float32Array;
    const l = relDiff(logits, referenceLogits);
    const layerDiffs = hiddenStateTaps(layers).map((tap, i): LayerDiff => {
      const mine = got.get(tap);
      if (!mine) throw new Error(`${checkpoint}: the model emitted no ${tap} tap`);
      return { tap, ...relDiff(mine, f32(`hidden_states.${i}`)) };
    });
    const hiddenRel = Math.max(...layerDiffs.map((d) => d.rel));
    const ok = l.rel <= REFERENCE_BOUND.relative && layerDiffs.every((d) => d.rel <= REFERENCE_BOUND.relative);
    const tokens = Array.from(new Int32Array(ids.toBytes().buffer));
    return { checkpoint, logitsAbs: l.maxAbs, logitsRel: l.rel, hiddenRel, layers: layerDiffs, logits, referenceLogits, tokens, ok };
  } finally {
    for (const a of ref.arrays.values()) a.dispose();
  }
}
