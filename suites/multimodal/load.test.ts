// Loading multimodal checkpoint layouts the way mlx-vlm's load_model does: a raw Hugging Face
// layout (model.language_model.* / model.vision_tower.* / model.audio_tower.* keys, PyTorch's
// conv layouts [O, I, kH, kW] and [O, 1, K], rotary buffers, clip bounds outside the towers)
// must give the model mlx-vlm builds from it, tap for tap (the 374 taps of a forward with both
// towers that TS computes: the 3 inputs it is fed from the record, run.ts ORACLE_FED, are left
// out); every tower weight is kept.
import { afterAll, describe, expect, it } from "vitest";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadMultimodalModel } from "../../model/gemma4/index.ts";
import { compareTapLists, formatVerdict } from "../gemma4/tap_compare.ts";
import { CKPT_ROOT, computedByTs, mmForwardTaps, mmReference, mmScenario } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "mm-load-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** m2_e2b/f32 rewritten in the raw Hugging Face layout. */
function hfCopy(): string {
  const src = join(CKPT_ROOT, "m2_e2b/f32");
  const d = join(tmp, "hf");
  mkdirSync(d, { recursive: true });
  copyFileSync(join(src, "config.json"), join(d, "config.json"));
  const w = mx.loadSafetensors(join(src, "model.safetensors"));
  const out = new Map<string, mx.MlxArray>();
  for (const [k, a] of w.arrays) {
    const nk = k.startsWith("language_model.model.") ? `model.language_model.${k.slice("language_model.model.".length)}` : `model.${k}`;
    let v = a;
    if (k.includes("subsample_conv_projection") && k.endsWith("conv.weight")) v = mx.contiguous(mx.transpose(a, [0, 3, 1, 2])); // MLX OHWI → PyTorch OIHW
    if (k.endsWith("depthwise_conv1d.weight")) v = mx.contiguous(mx.transpose(a, [0, 2, 1])); // [O, K, 1] → [O, 1, K]
    out.set(nk, v);
  }
  out.set("model.language_model.layers.0.self_attn.rotary_emb.inv_freq", mx.zeros([8]));
  out.set("model.language_model.layers.0.mlp.gate_proj.input_max", mx.scalar(3.0)); // a clip bound outside the towers: dropped
  mx.saveSafetensors(join(d, "model.safetensors"), out, { format: "pt" });
  for (const a of w.arrays.values()) a.dispose();
  for (const a of out.values()) a.dispose();
  return d;
}

describe("multimodal checkpoint layouts", () => {
  it("raw Hugging Face layout: the same model as mlx-vlm's load_model builds, every tap TS computes in a forward with both towers (374 of 377)", async () => {
    const dir = hfCopy();
    const { model } = loadMultimodalModel(dir);
    try {
      const towers = [...model.parameters().keys()].filter((k) => k.startsWith("vision_tower.") || k.startsWith("audio_tower."));
      expect(towers.length).toBeGreaterThan(100);
      const ref = await mmReference(dir, "mm_fwd_image_audio", { live: true });
      expect(ref.taps.length, "taps mlx-vlm recorded").toBe(377);
      const v = compareTapLists(computedByTs(mmForwardTaps(model, ref, mmScenario("mm_fwd_image_audio"))), computedByTs(ref.taps));
      if (!v.ok) throw new Error(formatVerdict("hf layout", v));
      expect(v.compared).toBe(374);
    } finally {
      model.dispose();
    }
  }, limit(120_000));
});
