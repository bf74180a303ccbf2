// Property of the gemma4_unified embedder (seeded, 25 cases by default, PROPERTY_RUNS to soak):
// on random embedder inputs that the processor never makes (positions anywhere in the table, -1 on
// one axis only, padding rows in the middle, whole images of padding, batches of 1 or 2), the TS
// VisionEmbedder output and get_image_features (embed_vision, each image's valid prefix rows) are
// byte-identical to mlx-vlm's own model on the same arrays (oracle/python/unified_media.py
// unified_embed), on u1_dense f32 and bf16 (a bf16 table times a float32 mask).

import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { sharedOracle } from "../../oracle/client.ts";
import { oracleMedia } from "../../oracle/media.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { type LoadedUnifiedModel, loadUnifiedModel, validRowCounts } from "../../model/gemma4_unified/index.ts";
import { checkProperty, propertyRuns, propertyTimeout } from "../properties/harness.ts";
import { CKPT_ROOT } from "./run.ts";

const oracle = await sharedOracle();
await oracle.request("make_checkpoints", { only: ["u1_dense/f32", "u1_dense/bf16"] }, 600_000);
const CKPTS = ["u1_dense/f32", "u1_dense/bf16"] as const;
const models = new Map<string, LoadedUnifiedModel>(CKPTS.map((c) => [c, loadUnifiedModel(join(CKPT_ROOT, c))]));

const arbCase = fc.record({
  ckpt: fc.constantFrom(...CKPTS),
  B: fc.constantFrom(1, 2),
  N: fc.integer({ min: 1, max: 9 }),
  seed: fc.integer({ min: 0, max: 2 ** 31 - 1 }),
  // per position and axis: -1 (padding) or an index of the 16-row table
  axes: fc.array(fc.oneof({ weight: 1, arbitrary: fc.constant(-1) }, { weight: 3, arbitrary: fc.integer({ min: 0, max: 15 }) }), { minLength: 2 * 2 * 9, maxLength: 2 * 2 * 9 }),
});

function bytesOf(a: mx.MlxArray): Uint8Array {
  return a.toBytes();
}

describe("gemma4_unified embedder vs mlx-vlm on random inputs", () => {
  it(`VisionEmbedder and get_image_features byte-identical (${propertyRuns(25)} cases)`, async () => {
    let ran = 0;
    await checkProperty(
      "unified embedder",
      fc.asyncProperty(arbCase, async ({ ckpt, B, N, seed, axes }) => {
        const model = models.get(ckpt)!.model;
        const dim = model.vision_embedder!.patch_dim;
        let x = seed >>> 0;
        const pv = Float32Array.from({ length: B * N * dim }, () => {
          x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
          return Math.fround((x / 2 ** 32) * 4 - 2);
        });
        const pos = BigInt64Array.from(axes.slice(0, B * N * 2), (v) => BigInt(v));
        using pixel_values = mx.array(pv, [B, N, dim], "float32");
        using image_position_ids = mx.array(pos, [B, N, 2], "int64");
        using embedded = model.vision_embedder!.call(pixel_values, image_position_ids);
        using features = model.get_image_features(pixel_values, image_position_ids, validRowCounts(image_position_ids));
        const theirs = await oracleMedia(oracle, "unified_embed", {
          model_dir: join(CKPT_ROOT, ckpt),
          pixel_values: { dtype: "float32", shape: [B, N, dim], data: new Uint8Array(pv.buffer) },
          image_position_ids: { dtype: "int64", shape: [B, N, 2], data: new Uint8Array(pos.buffer) },
        });
        const e = theirs.embedded as NpyRecord;
        const f = theirs.features as NpyRecord;
        expect({ ckpt, what: "embedded", dtype: embedded.dtype, shape: embedded.shape }).toEqual({ ckpt, what: "embedded", dtype: e.dtype, shape: e.shape });
        expect(Buffer.from(bytesOf(embedded)).equals(Buffer.from(e.data)), `${ckpt} embedded bytes`).toBe(true);
        expect({ ckpt, what: "features", dtype: features.dtype, shape: features.shape }).toEqual({ ckpt, what: "features", dtype: f.dtype, shape: f.shape });
        expect(Buffer.from(bytesOf(features)).equals(Buffer.from(f.data)), `${ckpt} features bytes`).toBe(true);
        ran++;
      }),
      { runs: propertyRuns(25) },
    );
    expect(ran).toBeGreaterThanOrEqual(propertyRuns(25));
    for (const m of models.values()) m.model.dispose();
  }, propertyTimeout(120_000));
});
