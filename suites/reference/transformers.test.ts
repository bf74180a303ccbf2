// An independent reference: the TS model (bit for bit mlx-lm) against Hugging Face transformers'
// Gemma 4 on every float32 fixture checkpoint, logits and every hidden state, within the one
// recorded bound (oracle/reference.ts: REFERENCE_BOUND, with its measurements and reason). The
// reference files were exported by `npm run reference:export`; this test needs no torch.
// Negative controls: the semantic port bugs of model/gemma4/mutations.ts must land far outside it.
// The bound is defined on MLX's CPU device (referenceBoundApplies): on a GPU the suite runs the TS
// side there, so it judges the same thing on every machine (TS = mlx-lm on the GPU is the tap
// suites' bar).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { join } from "node:path";
import { loadModel } from "../../model/gemma4/index.ts";
import { type Mutation, withMutation } from "../../model/gemma4/mutations.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { compareWithReference, readReferenceManifest, REFERENCE_BOUND, REFERENCE_DIR, referenceBoundApplies, type ReferenceDiff, sha256File } from "../../oracle/reference.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints");
const manifest = readReferenceManifest();

function compare(fixture: string): ReferenceDiff {
  const e = manifest!.fixtures[fixture]!;
  const { model, text } = loadModel(join(CKPT, e.checkpoint));
  try {
    return compareWithReference(e.checkpoint, e, model, text.args.num_hidden_layers);
  } finally {
    model.dispose();
  }
}

describe("TS (= mlx-lm) against transformers' Gemma 4, float32", () => {
  const device = mx.defaultDevice();
  beforeAll(() => {
    if (!referenceBoundApplies()) mx.setDefaultDevice("cpu");
  });
  afterAll(() => mx.setDefaultDevice(device));

  it("has reference files for the 8 float32 fixtures, from these checkpoints' weights", () => {
    expect(manifest, `no ${REFERENCE_DIR}/manifest.json: run npm run reference:export`).not.toBeNull();
    expect(Object.keys(manifest!.fixtures).length).toBe(8);
    expect(manifest!.bound.relative).toBe(REFERENCE_BOUND.relative);
    for (const [fx, e] of Object.entries(manifest!.fixtures)) {
      expect(sha256File(join(REFERENCE_DIR, e.file)), `${e.file} changed since export`).toBe(e.sha256);
      expect(sha256File(join(CKPT, e.checkpoint, "model.safetensors")), `${fx}: the fixture weights changed since the reference was exported; run npm run reference:export`).toBe(e.checkpointSha256);
    }
  });

  for (const fx of Object.keys(manifest?.fixtures ?? {})) {
    it(`${fx}: logits and every hidden state within ${REFERENCE_BOUND.relative} relative`, () => {
      const d = compare(fx);
      console.log(`[reference] ${fx}: logits ${d.logitsRel.toExponential(2)} relative (max abs ${d.logitsAbs.toExponential(2)}), hidden states ${d.hiddenRel.toExponential(2)}; bound ${REFERENCE_BOUND.relative}`);
      expect(d.logitsRel).toBeLessThanOrEqual(REFERENCE_BOUND.relative);
      for (const l of d.layers) expect(l.rel, `${fx} ${l.tap}`).toBeLessThanOrEqual(REFERENCE_BOUND.relative);
    });
  }

  // Each is a semantic port bug (model/gemma4/mutations.ts) on a fixture that has the feature.
  const CONTROLS: [Mutation, string][] = [
    ["rope_full_factor_1", "c1_dense"],
    ["rope_contiguous_partial", "c1_dense"],
    ["no_layer_scalar", "c1_dense"],
    ["mask_wrong_type", "c1_dense"],
    ["no_softcap", "c1_dense"],
    ["v_norm_missing", "c1_dense"],
    ["sdpa_scale_rsqrt", "c1_dense"],
    ["keqv_values_after_norm", "c2_keqv"],
    ["ple_unscaled_embeddings", "c3_e2b"],
    ["per_layer_input_scale_missing", "c3_e2b"],
    ["shared_kv_first_source", "c3_e2b"],
    ["router_normed_input", "c5_moe"],
  ];
  it(`negative controls: ${CONTROLS.length} semantic port bugs land at least 10x outside the bound`, () => {
    for (const [m, fx] of CONTROLS) {
      const d = withMutation(m, () => compare(fx));
      expect(Math.max(d.logitsRel, d.hiddenRel), `${m} on ${fx}`).toBeGreaterThan(10 * REFERENCE_BOUND.relative);
    }
  });
});
