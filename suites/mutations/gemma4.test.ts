// Mutation checks for the Gemma 4 model: each case re-introduces ONE known port bug
// (../shared/docs/gemma4-port-bugs.md, gemma4-spec.md §10/§12) through the test-only switch in
// model/gemma4/mutations.ts, runs the same comparison the parity suites run, and asserts that it
// fails FIRST at the tap where the bug lives (or, for bugs that break loading, that loading
// fails naming the parameter at fault). The unmutated model must pass the same case (control).
// Reports the mutation score (caught / applied).

import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { readFileSync } from "node:fs";
import { REPO_ROOT } from "../../oracle/client.ts";
import { loadModel } from "../../model/gemma4/index.ts";
import { MUTATIONS, type Mutation, withMutation } from "../../model/gemma4/mutations.ts";
import { CKPT_ROOT, forwardTaps, modelTapsOnly, reference, replayTaps } from "../gemma4/run.ts";
import { compareTapLists, formatVerdict, type Verdict } from "../gemma4/tap_compare.ts";
import { limit } from "../../tests/time_limit.ts";

interface Case {
  mutation: Mutation;
  why: string;
  ckpt: string;
  /** A forward scenario id, or a generate scenario (replayed with caches). */
  scn: string;
  /** The tap where the bug lives: the first divergence must be this one. */
  firstTap?: RegExp;
  /** For bugs that break loading: the error must match. */
  loadError?: RegExp;
}

const CASES: Case[] = [
  { mutation: "rope_full_factor_1", why: "full-attention partial_rotary_factor 1.0 (mlx-lm #1114)", ckpt: "c1_dense/f32", scn: "fwd_L13", firstTap: /^layers\.2\/self_attn\/rope_k$/ },
  { mutation: "rope_contiguous_partial", why: "proportional RoPE as a contiguous nn.RoPE(hd*prf) (pre-merge, coreai #66)", ckpt: "c1_dense/f32", scn: "fwd_L13", firstTap: /^layers\.2\/self_attn\/rope_k$/ },
  { mutation: "router_softmax_all", why: "softmax over all experts before top-k (mlx-swift #228, pre-#1114)", ckpt: "c5_moe/f32", scn: "fwd_L13", firstTap: /^layers\.0\/router\/(indices|weights)$/ },
  { mutation: "router_normed_input", why: "router fed the pre-FFN-normed h instead of the residual", ckpt: "c5_moe/f32", scn: "fwd_L13", firstTap: /^layers\.0\/router\/norm$/ },
  { mutation: "keqv_values_after_norm", why: "k_eq_v values taken from the normed K (mlx-swift #231)", ckpt: "c2_keqv/f32", scn: "fwd_L13", firstTap: /^layers\.2\/self_attn\/v_norm$/ },
  { mutation: "v_norm_missing", why: "values not passed through the no-scale RMSNorm", ckpt: "c1_dense/f32", scn: "fwd_L13", firstTap: /^layers\.0\/self_attn\/v_norm$/ },
  { mutation: "no_layer_scalar", why: "layer_scalar multiply missing", ckpt: "c1_dense/f32", scn: "fwd_L13", firstTap: /^layers\.0\/output$/ },
  { mutation: "no_double_wide", why: "double-wide MLP off on KV-shared layers (E2B)", ckpt: "c3_e2b/f32", scn: "fwd_L13", loadError: /model\.layers\.4\.mlp\.(gate|up|down)_proj\.weight.*expected shape/ },
  { mutation: "embed_scale_f32", why: "embed scale as a float32 array promotes bf16 to float32 (hazard #1)", ckpt: "c1_dense/bf16", scn: "fwd_L5", firstTap: /^embed_scaled$/ },
  { mutation: "gelu_cube_mul", why: "x*x*x in place of power(x, 3) in gelu_approx (hazard #2)", ckpt: "c1_dense/bf16", scn: "fwd_L5", firstTap: /^layers\.0\/mlp\/geglu$/ },
  { mutation: "rope_offset_after_update", why: "RoPE offset read after the cache update (pre-#1114 branch)", ckpt: "c1_dense/f32", scn: "gen_P9_S5", firstTap: /^prefill0\/layers\.0\/self_attn\/offset$/ },
  { mutation: "mask_wrong_type", why: "sliding and full masks swapped (mlx-lm #465 class)", ckpt: "c1_dense/f32", scn: "fwd_L13", firstTap: /^layers\.0\/self_attn\/sdpa$/ },
  { mutation: "no_sanitize_shared_kv", why: "sanitize keeps shared-layer K/V (mlx-lm #1242/#1240)", ckpt: "c3_e2b/hf_bf16", scn: "fwd_L5", loadError: /parameters not in model[\s\S]*model\.layers\.4\.self_attn\.k_proj\.weight/ },
  { mutation: "ple_unscaled_embeddings", why: "per-layer projection fed the unscaled embeddings (hazard #12)", ckpt: "c3_e2b/f32", scn: "fwd_L13", firstTap: /^per_layer_model_projection$/ },
  { mutation: "per_layer_input_scale_missing", why: "(projection + token inputs) not scaled by 2**-0.5", ckpt: "c3_e2b/f32", scn: "fwd_L13", firstTap: /^per_layer_inputs$/ },
  { mutation: "ple_projection_scaled_linear", why: "PLE projection without to_quantized: quantized checkpoints fail to load (mlx-lm #1112, omlx #592)", ckpt: "c3_e2b/q4g32", scn: "fwd_L5", loadError: /per_layer_model_projection\.(scales|biases)[\s\S]*per_layer_model_projection\.weight.*expected shape/ },
  { mutation: "shared_kv_first_source", why: "KV-shared layers read the FIRST non-shared layer of their type, not the last", ckpt: "c3_e2b/f32", scn: "fwd_L13", firstTap: /^layers\.4\/self_attn\/sdpa$/ },
  { mutation: "sdpa_scale_rsqrt", why: "attention scale 1/sqrt(head_dim) instead of 1.0 (ferrox #40 class)", ckpt: "c1_dense/f32", scn: "fwd_L13", firstTap: /^layers\.0\/self_attn\/sdpa$/ },
  { mutation: "no_softcap", why: "final logit softcap missing (llama.cpp #21390, vLLM #52173)", ckpt: "c1_dense/f32", scn: "fwd_L13", firstTap: /^logits$/ },
];

const scenarios = new Map<string, number[][]>(
  (JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "scenarios.json"), "utf8")) as { scenarios: { id: string; tokens?: number[][] }[] }).scenarios
    .filter((s) => s.tokens)
    .map((s) => [s.id, s.tokens!]),
);

const score = { applied: 0, caught: 0, lines: [] as string[] };

async function run(c: Case, mutation: Mutation | null): Promise<{ verdict?: Verdict; loadError?: Error }> {
  const ref = await reference(c.ckpt, c.scn);
  const go = () => {
    let loaded;
    try {
      loaded = loadModel(join(CKPT_ROOT, c.ckpt));
    } catch (e) {
      return { loadError: e as Error };
    }
    try {
      const tokens = scenarios.get(c.scn);
      const theirs = tokens ? ref.taps : modelTapsOnly(ref.taps);
      const ours = tokens ? forwardTaps(loaded.model, tokens) : replayTaps(loaded.model, ref.calls, theirs);
      return { verdict: compareTapLists(ours, theirs) };
    } finally {
      loaded.model.dispose();
    }
  };
  return mutation ? withMutation(mutation, go) : go();
}

describe("gemma4 mutations: each known bug fails first where it lives", () => {
  it("every mutation switch has a case", () => {
    expect(new Set(CASES.map((c) => c.mutation))).toEqual(new Set(MUTATIONS));
  });

  for (const c of CASES) {
    it(`${c.mutation}: ${c.why}`, async () => {
      // control: the unmutated model passes the same case
      const control = await run(c, null);
      expect(control.loadError).toBeUndefined();
      if (!control.verdict!.ok) throw new Error(`control failed: ${formatVerdict(`${c.ckpt} ${c.scn}`, control.verdict!)}`);

      score.applied++;
      const r = await run(c, c.mutation);
      let caught = false;
      let what: string;
      if (c.loadError) {
        what = r.loadError ? `load failed: ${r.loadError.message.split("\n").slice(0, 3).join(" | ")}` : "loaded without error";
        caught = !!r.loadError && c.loadError.test(r.loadError.message);
      } else {
        const v = r.verdict;
        what = r.loadError ? `load failed: ${r.loadError.message}` : formatVerdict(`${c.ckpt} ${c.scn}`, v!);
        caught = !!v && !v.ok && c.firstTap!.test(v.first!.name);
      }
      if (caught) score.caught++;
      score.lines.push(`${caught ? "caught" : "MISSED"} ${c.mutation}: ${what}`);
      if (!caught) throw new Error(`mutation ${c.mutation} not caught where expected (${c.firstTap ?? c.loadError}): ${what}`);
    }, limit(120_000));
  }
});

afterAll(() => {
  console.log(`[gemma4 mutations] score ${score.caught}/${score.applied}\n  ${score.lines.join("\n  ")}`);
});
