// Tap-by-tap parity of the TS gemma4_unified model (model/gemma4_unified: the encoder-free
// VisionEmbedder, embed_vision, embed_audio on raw frames, the merges, gemma4's language model and
// generate_step) against live mlx-vlm 0.7.10, every input computed by TS (the prompt ids and the
// processor outputs from the fixture media's seeds: nothing is fed from the oracle's record, so
// embed/inputs, embed/vision_embedder/pixel_values and image_position_ids are compared too).
//
// Fixtures (make_mm_checkpoints.UNIFIED_MATRIX): u1_dense f32, bf16, q4g64 (text config 'vision':
// generation makes image blocks bidirectional and never chunks an image-only prompt); u2_e2b f32
// (per-layer inputs, KV-shared layers, causal text config, no audio part). Scenarios
// (fixtures/unified_scenarios.json): a forward with a padded image; two images in one batch (9 and
// 6 valid rows, compacted); 20 decode steps after an image prompt; a chunked media prefill
// (prefill_step_size 5: chunks only on u2); an image + audio forward; an image + audio generation
// (chunks of 7: audio lets mlx-vlm chunk under 'vision'). Which mask each compares: the forwards
// are Model.__call__, where mlx-vlm drops mm_token_type_ids (plain causal masks, asserted below);
// the generations are generate_step, which passes them on (the image-block overlay on u1).
//
// What `npm test` runs (a few seconds): one pair live, u1_dense/bf16 × u_fwd_image (bf16: the
// embedder's float32 promotion and the cast at the merge), every tap, with the TS tap expansion
// (oracle/taps.ts, media condition "unified") equal to mlx-vlm's recorded names and order; the two
// unified mutations, each caught first at its own tap; the bad inputs; and the goldens (npm run
// golden:regen, logits mode with tap digests): all 22 pairs run by TS, each pair's stored taps
// (the embed call's ids, the logits) by value and every recorded tap by its sha256 digest, the
// tokens equal (about 4 s; on the recording fingerprint only, else skipped with the reason in the
// title). UNIFIED_FULL=1: every
// fixture × scenario whose parts the checkpoint has, live (22 pairs, about 150 s on 2 cores),
// tokens and prefill chunks equal, the per-block tap counts equal to the table checked in at
// suites/unified/RESULTS.md, and the generations' prompt-call masks open the image block exactly
// on u1 without audio. Bar: byte-identical, in the same order.

import { describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { sharedOracle } from "../../oracle/client.ts";
import { callPrefix, expandMediaTaps, expandTaps, mediaTapConfig, mmCallShape, tapConfig } from "../../oracle/taps.ts";
import { MediaError } from "../../model/gemma4/gemma4.ts";
import { disposeUnifiedMedia, type LoadedUnifiedModel, loadUnifiedModel, modelConfigFromDict, UNIFIED_MUTATIONS, type UnifiedMutation, withUnifiedMutation } from "../../model/gemma4_unified/index.ts";
import { compareTapLists, formatVerdict, type TapData } from "../gemma4/tap_compare.ts";
import { limit } from "../../tests/time_limit.ts";
import { scenarioFits } from "../../oracle/unified_fixtures.ts";
import { CKPT_ROOT, UNIFIED_SCENARIOS, type UnifiedReference, type UnifiedScenario, unifiedForwardTaps, unifiedInputs, unifiedReference, unifiedScenario, unifiedTaps } from "./run.ts";
import { loadGolden, readManifest } from "../../oracle/golden.ts";
import { checkDigests, formatDigestVerdict } from "../../oracle/tap_digest.ts";
import { fromOracle } from "../gemma4/tap_compare.ts";
import { goldenRuleHere } from "../gemma4/run.ts";

const FULL = process.env.UNIFIED_FULL === "1";
const CHECKPOINTS = ["u1_dense/f32", "u1_dense/bf16", "u1_dense/q4g64", "u2_e2b/f32"] as const;
const DEFAULT = { ckpt: "u1_dense/bf16", scn: "u_fwd_image" } as const;
/** Where each mutation must first show: the position sum, the input of pos_norm. */
const CAUGHT_AT: Record<UnifiedMutation, string> = {
  position_xy_swapped: "embed/vision_embedder/position_added",
  padding_not_masked: "embed/vision_embedder/position_added",
};

const oracle = await sharedOracle();
await oracle.request("make_checkpoints", { only: ["u*"] }, limit(600_000));
const manifest = readManifest();
const rule = await goldenRuleHere();
const goldensHere = rule?.mode === "exact";

let loaded: { id: string; m: LoadedUnifiedModel } | null = null;
function model(id: string): LoadedUnifiedModel {
  if (loaded?.id !== id) {
    loaded?.m.model.dispose();
    loaded = { id, m: loadUnifiedModel(join(CKPT_ROOT, id)) };
  }
  return loaded.m;
}

/** Which block a tap belongs to (the counts of RESULTS.md). */
function block(name: string): "embedder" | "embed_vision" | "embed_audio" | "merge" | "language" {
  if (name.startsWith("embed/vision_embedder/")) return "embedder";
  if (name.startsWith("embed/embed_vision/")) return "embed_vision";
  if (name.startsWith("embed/embed_audio/")) return "embed_audio";
  if (/^embed\/((image|audio)_features|merge\/(image|audio))$/.test(name)) return "merge";
  return "language";
}

type Counts = Record<ReturnType<typeof block>, number>;

function countBlocks(taps: readonly TapData[]): Counts {
  const c: Counts = { embedder: 0, embed_vision: 0, embed_audio: 0, merge: 0, language: 0 };
  for (const t of taps) c[block(t.name)]++;
  return c;
}

const refs = new Map<string, Promise<UnifiedReference>>();
function reference(ckpt: string, scn: UnifiedScenario): Promise<UnifiedReference> {
  const key = `${ckpt} ${scn.id}`;
  if (!refs.has(key)) refs.set(key, unifiedReference(oracle, ckpt, scn));
  return refs.get(key)!;
}

/** One pair against live mlx-vlm: every tap, the tokens and the prefill chunks; its block counts. */
async function livePair(ckpt: string, scn: UnifiedScenario): Promise<Counts> {
  const ref = await reference(ckpt, scn);
  const ours = await unifiedTaps(model(ckpt).model, scn);
  const v = compareTapLists(ours.taps, ref.taps);
  if (!v.ok) throw new Error(formatVerdict(`${ckpt} ${scn.id}`, v));
  expect(v.compared, `${ckpt} ${scn.id}: taps compared`).toBe(ref.taps.length);
  expect(v.arrays).toBeGreaterThan(0);
  if (scn.kind === "generate") {
    expect(ours.tokens).toEqual(ref.generated);
    expect(ours.tokens.length).toBe(scn.max_tokens);
    expect(ours.chunks).toEqual(ref.prefill_chunks);
  }
  return countBlocks(ours.taps);
}

/** The checked-in table: `| checkpoint | scenario | embedder | embed_vision | embed_audio | merge | language | total | ... |`. */
function resultsTable(): Map<string, Counts & { total: number }> {
  const text = readFileSync(join(import.meta.dir, "RESULTS.md"), "utf8");
  const rows = new Map<string, Counts & { total: number }>();
  for (const m of text.matchAll(/^\| (u\d_\w+\/\w+) \| (u_\w+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([\d,]+) \| ([\d,]+) \|/gm)) {
    const n = (s: string) => Number(s.replace(/,/g, ""));
    rows.set(`${m[1]} ${m[2]}`, { embedder: n(m[3]!), embed_vision: n(m[4]!), embed_audio: n(m[5]!), merge: n(m[6]!), language: n(m[7]!), total: n(m[8]!) });
  }
  return rows;
}

/** The fixture × scenario pairs: the scenarios whose parts (vision, audio) the checkpoint has. */
function pairsOf(ckpt: string): UnifiedScenario[] {
  const cfg = modelConfigFromDict(JSON.parse(readFileSync(join(CKPT_ROOT, ckpt, "config.json"), "utf8")) as Record<string, unknown>);
  return UNIFIED_SCENARIOS.filter((s) => scenarioFits(s, { vision: cfg.vision !== null, audio: cfg.audio !== null }));
}

describe("gemma4_unified taps vs mlx-vlm", () => {
  it(`${DEFAULT.ckpt} ${DEFAULT.scn}: every tap byte-identical to live mlx-vlm; the TS expansion equals its recorded names; the forward's masks are causal`, async () => {
    const scn = unifiedScenario(DEFAULT.scn);
    const ref = await reference(DEFAULT.ckpt, scn);
    const c = await livePair(DEFAULT.ckpt, scn);
    expect(c.embedder).toBe(7);
    // the expansion (oracle/taps.ts) for the two calls mlx-vlm made: embed/ and the forward
    const cfgJson = JSON.parse(readFileSync(join(CKPT_ROOT, DEFAULT.ckpt, "config.json"), "utf8")) as Record<string, unknown>;
    const cfg = tapConfig(cfgJson);
    const L = (ref.calls[1] as { length: number }).length;
    const want = [
      ...expandMediaTaps(mediaTapConfig(cfgJson), { image: true, audio: false }).map((n) => `embed/${n}`),
      ...expandTaps(cfg, mmCallShape(cfg, { kind: "forward", index: 0, batch: 1, length: L })).map((n) => callPrefix("forward") + n),
    ];
    expect(ref.taps.map((t) => t.name)).toEqual(want);
    // Model.__call__ drops mm_token_type_ids: no image-block overlay in a forward
    const masks = ref.taps.filter((t) => t.name.startsWith("mask/"));
    expect(masks.length).toBeGreaterThan(0);
    const window = Number((cfgJson.text_config as Record<string, unknown>).sliding_window);
    for (const m of masks) {
      if (m.kind === "str") {
        expect({ name: m.name, value: m.value }).toEqual({ name: m.name, value: "causal" });
        continue;
      }
      // an array only where the sliding window cuts (L > window): causal within the window, no image block open
      const want = Uint8Array.from({ length: L * L }, (_, k) => Number(k % L <= Math.floor(k / L) && Math.floor(k / L) - (k % L) < window));
      expect({ name: m.name, shape: m.shape, bytes: Buffer.from(m.data!).equals(Buffer.from(want)) }).toEqual({ name: m.name, shape: [L, L], bytes: true });
    }
  }, limit(120_000));

  it(`mutations caught at their own tap (${UNIFIED_MUTATIONS.length} of ${UNIFIED_MUTATIONS.length})`, async () => {
    const scn = unifiedScenario(DEFAULT.scn);
    const ref = await reference(DEFAULT.ckpt, scn);
    let caught = 0;
    for (const mut of UNIFIED_MUTATIONS) {
      const taps = withUnifiedMutation(mut, () => unifiedForwardTaps(model(DEFAULT.ckpt).model, scn));
      const v = compareTapLists(taps, ref.taps);
      expect({ mut, ok: v.ok, first: v.first?.name, reason: v.first?.reason }).toEqual({ mut, ok: false, first: CAUGHT_AT[mut], reason: "value" });
      caught++;
    }
    expect(caught).toBe(2);
  }, limit(60_000));

  it("bad input: one MediaError each (image placeholders ≠ valid rows, positions missing or of another shape, image tokens without an image, audio placeholders ≠ frames, a mask of another shape)", () => {
    const m = model(DEFAULT.ckpt).model;
    const { ids, media } = unifiedInputs(unifiedScenario(DEFAULT.scn), m.config);
    try {
      const call = (xs: number[], md: Parameters<typeof m.call>[1]) => {
        using x = mx.array(Int32Array.from(xs), [1, xs.length], "int32");
        m.call(x, md).dispose();
      };
      const img = m.config.image_token_id;
      const oneMore = [...ids.slice(0, 4), img, ...ids.slice(4)];
      expect(() => call(oneMore, media)).toThrow(/7 image placeholder tokens .* 6 valid patch rows/);
      expect(() => call(ids.filter((t, i) => t !== img || i !== 5), media)).toThrow(MediaError);
      expect(() => call(ids, { pixel_values: media.pixel_values })).toThrow(/without image_position_ids/);
      using wrong = mx.zeros([1, 8, 2], "int64");
      expect(() => call(ids, { pixel_values: media.pixel_values, image_position_ids: wrong })).toThrow(/do not match pixel_values/);
      expect(() => call(ids, {})).toThrow(/no image input/);
      // audio: a placeholder count other than the clips' frames, a mask of another shape
      const av = unifiedInputs(unifiedScenario("u_fwd_image_audio"), m.config);
      try {
        const aud = m.config.audio_token_id;
        const lastAudio = av.ids.lastIndexOf(aud);
        expect(() => call(av.ids.filter((_, i) => i !== lastAudio), av.media)).toThrow(/25 audio placeholder tokens .* 26 frames/);
        using badMask = mx.ones([1, 5], "bool");
        expect(() => call(av.ids, { ...av.media, input_features_mask: badMask })).toThrow(/does not match input_features/);
      } finally {
        disposeUnifiedMedia(av.media);
      }
    } finally {
      media.pixel_values?.dispose();
      media.image_position_ids?.dispose();
    }
  });

  // The goldens (npm run golden:regen; oracle/golden_plan.json: every u* checkpoint × scenario,
  // logits mode): each pair's stored taps (the embed call's ids, the logits of the forward or of
  // every step) by value, and every recorded tap by its sha256 digest (oracle/tap_digest.ts),
  // against the TS taps of the same pair; the tokens against the recorded ones. Applied bit for
  // bit on the recording fingerprint only (oracle/golden.ts goldenRule); elsewhere these tests
  // are skipped, said in their title, and UNIFIED_FULL=1 runs every pair live instead.
  const goldenPairs = CHECKPOINTS.flatMap((ckpt) => pairsOf(ckpt).map((scn) => ({ ckpt, scn })));
  const table = resultsTable();
  const goldenTotals = { pairs: 0, byValue: 0, byDigest: 0 };

  it("every unified checkpoint × scenario has a logits golden with tap digests (22 pairs)", () => {
    expect(goldenPairs.length).toBe(22);
    const missing = goldenPairs.map((p) => `${p.ckpt}/${p.scn.id}`).filter((id) => manifest?.entries[id]?.mode !== "logits");
    expect(missing).toEqual([]);
  });

  for (const { ckpt, scn } of goldenPairs) {
    const gid = `${ckpt}/${scn.id}`;
    it.skipIf(!goldensHere)(`${gid}: golden (stored taps by value, every tap by digest, tokens)${goldensHere ? "" : ` skipped: ${rule?.mode === "live" ? rule.what : "no golden manifest"}`}`, async () => {
      const g = loadGolden(gid);
      const recorded = g.taps.map((t) => fromOracle({ ...t, kind: t.kind ?? "array", array: g.arrays.get(t.name) }));
      const ours = await unifiedTaps(model(ckpt).model, scn);
      const names = new Set(recorded.map((t) => t.name));
      const v = compareTapLists(ours.taps.filter((t) => names.has(t.name)), recorded);
      if (!v.ok) throw new Error(formatVerdict(`${gid} (golden)`, v));
      expect(v.compared).toBe(recorded.length);
      expect(v.arrays).toBeGreaterThan(0);
      if (!g.digests) throw new Error(`${gid}: a logits golden without tap digests; regenerate (npm run golden:regen -- --only '${ckpt}/*')`);
      const dv = checkDigests(ours.taps, g.digests);
      if (!dv.ok) throw new Error(formatDigestVerdict(`${gid} (golden digests)`, dv));
      // every recorded tap: the per-pair total of RESULTS.md (the live table)
      expect({ gid, taps: dv.matched }).toEqual({ gid, taps: table.get(`${ckpt} ${scn.id}`)?.total });
      if (scn.kind === "generate") {
        expect(ours.tokens).toEqual((g.scenario.meta as { generated: number[] }).generated);
        expect(ours.tokens.length).toBe(scn.max_tokens);
      }
      goldenTotals.pairs++;
      goldenTotals.byValue += v.compared;
      goldenTotals.byDigest += dv.matched - v.compared;
    }, limit(60_000));
  }

  it.skipIf(!goldensHere)("the goldens compared all 22 pairs: 24,039 taps by digest, 145 of them (the ids, the logits) by value too", () => {
    expect(goldenTotals).toEqual({ pairs: 22, byValue: 145, byDigest: 24_039 - 145 });
  });

  if (FULL) {
    const lines: string[] = [];
    const pairs = CHECKPOINTS.flatMap((ckpt) => pairsOf(ckpt).map((scn) => ({ ckpt, scn })));
    for (const { ckpt, scn } of pairs) {
      {
        it(`UNIFIED_FULL ${ckpt} ${scn.id}: every tap byte-identical to live mlx-vlm, counts as RESULTS.md`, async () => {
          const c = await livePair(ckpt, scn);
          if (scn.kind === "generate") {
            // which mask a generation compares: under the 'vision' text config (u1) the prompt call's
            // masks are arrays with the image block open (a query sees a later image token), unless
            // the prompt has audio too (then mlx-vlm prefills in causal chunks, no block opened);
            // under the causal one (u2) no mask opens anything
            const ref = await reference(ckpt, scn);
            const open = ref.taps.filter((t) => /^(step0|prefill\d+)\/mask\//.test(t.name) && t.kind === "array").some((t) => {
              const [q, k] = t.shape!.slice(-2) as [number, number];
              const off = k - q;
              for (let i = 0; i < q; i++) for (let j = i + off + 1; j < k; j++) if (t.data![i * k + j]) return true;
              return false;
            });
            expect({ pair: `${ckpt} ${scn.id}`, imageBlockOpen: open }).toEqual({ pair: `${ckpt} ${scn.id}`, imageBlockOpen: ckpt.startsWith("u1_") && !scn.needs.includes("audio") });
          }
          const total = c.embedder + c.embed_vision + c.embed_audio + c.merge + c.language;
          lines.push(`| ${ckpt} | ${scn.id} | ${c.embedder} | ${c.embed_vision} | ${c.embed_audio} | ${c.merge} | ${c.language.toLocaleString("en")} | ${total.toLocaleString("en")} |`);
          expect({ pair: `${ckpt} ${scn.id}`, ...c, total }).toEqual({ pair: `${ckpt} ${scn.id}`, ...table.get(`${ckpt} ${scn.id}`) });
        }, limit(300_000));
      }
    }
    it("UNIFIED_FULL: all 22 pairs ran (u1 × 6 scenarios × 3 variants, u2 × the 4 without audio)", () => {
      console.log(`[unified parity] live rows:\n${lines.join("\n")}`);
      expect(lines.length).toBe(pairs.length);
      expect(lines.length).toBe(22);
      loaded?.m.model.dispose();
      loaded = null;
    });
  }
});
