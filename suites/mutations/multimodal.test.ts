// Mutation checks for the multimodal port: each case re-introduces ONE plausible bug of the
// vision tower, the audio tower, the merge or the media masks (model/gemma4/mutations.ts,
// MEDIA_MUTATIONS), runs the same comparison as suites/multimodal/parity.test.ts against
// mlx-vlm's record (the full-dump goldens on their own platform, else a live capture), and
// asserts that the first divergent tap is the one where the bug lives.
// The unmutated model passes the same case (control). Reports the mutation score.

import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { loadMultimodalModel } from "../../model/gemma4/index.ts";
import { MEDIA_MUTATIONS, type MediaMutation, withMutationAsync } from "../../model/gemma4/mutations.ts";
import { compareTapLists, formatVerdict, type Verdict } from "../gemma4/tap_compare.ts";
import { CKPT_ROOT, mmForwardTaps, mmGenerateTaps, mmReference, mmScenario } from "../multimodal/run.ts";
import { limit } from "../../tests/time_limit.ts";

interface Case {
  mutation: MediaMutation;
  why: string;
  ckpt: string;
  scn: string;
  /** The tap where the bug lives: the first divergence must be this one. */
  firstTap: RegExp;
}

const V = "embed/vision_tower";
const A = "embed/audio_tower";
const CASES: Case[] = [
  { mutation: "rope_axes_swapped", why: "2-D RoPE halves rotated by the wrong coordinate", ckpt: "m1_dense/bf16", scn: "mm_fwd_image", firstTap: new RegExp(`^${V}/encoder/layers\\.0/self_attn/rope_q$`) },
  { mutation: "patchify_channel_major", why: "patch vectors ordered (channel, row, col)", ckpt: "m1_dense/bf16", scn: "mm_fwd_image", firstTap: new RegExp(`^${V}/patch_embedder/patches$`) },
  { mutation: "pool_window_off_by_one", why: "position pooler bins one patch too wide", ckpt: "m1_dense/bf16", scn: "mm_fwd_image", firstTap: new RegExp(`^${V}/pooler/pooled$`) },
  { mutation: "no_pooler_scale", why: "the pooler's final sqrt(hidden_size) scale missing", ckpt: "m1_dense/bf16", scn: "mm_fwd_image", firstTap: new RegExp(`^${V}/pooler$`) },
  { mutation: "image_block_causal", why: "causal instead of bidirectional attention inside an image", ckpt: "m1_dense/bf16", scn: "mm_fwd_image", firstTap: /^mask\/sliding_attention$/ },
  { mutation: "merge_order_reversed", why: "placeholders filled with the image features in the wrong order", ckpt: "m1_dense/bf16", scn: "mm_fwd_image", firstTap: /^embed\/merge\/image$/ },
  { mutation: "ple_media_ids_kept", why: "per-layer inputs looked up from the placeholder ids (not the pad id)", ckpt: "m2_e2b/bf16", scn: "mm_fwd_image_audio", firstTap: /^embed\/per_layer_input_ids$/ },
  { mutation: "audio_mask_not_inverted", why: "the processor's valid-frame mask given to the tower as its invalid mask", ckpt: "m2_e2b/bf16", scn: "mm_fwd_image_audio", firstTap: new RegExp(`^${A}/input_mask$`) },
  { mutation: "audio_chunk_mask_shifted", why: "the chunked attention's causal window shifted by one frame", ckpt: "m2_e2b/bf16", scn: "mm_fwd_image_audio", firstTap: new RegExp(`^${A}/causal_valid_mask$`) },
  { mutation: "audio_q_scale_f32", why: "q_scale * softplus(per_dim_scale) in float32, not the bf16 parameter dtype", ckpt: "m2_e2b/bf16", scn: "mm_fwd_image_audio", firstTap: new RegExp(`^${A}/layers\\.0/self_attn/_rel_pos$`) },
];

const score = { applied: 0, caught: 0, lines: [] as string[] };

async function run(c: Case, mutation: MediaMutation | null): Promise<Verdict> {
  // the full-dump goldens when recorded on this platform (bit-exact), else the live oracle
  const ref = await mmReference(c.ckpt, c.scn, { exact: true });
  const scn = mmScenario(c.scn);
  const go = async () => {
    const { model } = loadMultimodalModel(join(CKPT_ROOT, c.ckpt));
    try {
      const ours = scn.kind === "forward" ? mmForwardTaps(model, ref, scn) : (await mmGenerateTaps(model, ref, scn)).taps;
      return compareTapLists(ours, ref.taps);
    } finally {
      model.dispose();
    }
  };
  return mutation ? withMutationAsync(mutation, go) : go();
}

describe("multimodal mutations: each bug fails first where it lives", () => {
  it("every media mutation switch has a case", () => {
    expect(new Set(CASES.map((c) => c.mutation))).toEqual(new Set(MEDIA_MUTATIONS));
  });

  for (const c of CASES) {
    it(`${c.mutation}: ${c.why}`, async () => {
      const control = await run(c, null);
      if (!control.ok) throw new Error(`control failed: ${formatVerdict(`${c.ckpt} ${c.scn}`, control)}`);
      score.applied++;
      const v = await run(c, c.mutation);
      const caught = !v.ok && c.firstTap.test(v.first!.name);
      if (caught) score.caught++;
      const what = formatVerdict(`${c.ckpt} ${c.scn}`, v);
      score.lines.push(`${caught ? "caught" : "MISSED"} ${c.mutation}: ${what.slice(0, 220)}`);
      if (!caught) throw new Error(`mutation ${c.mutation} not caught where expected (${c.firstTap}): ${what}`);
    }, limit(120_000));
  }
});

afterAll(() => {
  console.log(`[multimodal mutations] score ${score.caught}/${score.applied}\n  ${score.lines.join("\n  ")}`);
});
