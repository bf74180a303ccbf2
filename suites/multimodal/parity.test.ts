// Tap-by-tap parity of the TS multimodal model (vision tower, audio tower, merge, mlx-vlm's
// language model and generate_step) against mlx-vlm 0.7.10: every multimodal fixture checkpoint
// × every scenario of fixtures/mm_scenarios.json whose towers it has (single forwards, chunked
// media prefill, 20 decode steps after an image prompt).
//
// Default run: every pair against its golden (golden/manifest.json: full dumps of three, the
// logits and tokens of all), and the pair in LIVE against the live oracle. MM_PARITY_FULL=1:
// every pair against the live oracle too (about 3 minutes on 2 cores). Bar: every tap
// byte-identical, in the same order.

import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { sharedOracle } from "../../oracle/client.ts";
import { loadGolden, readManifest } from "../../oracle/golden.ts";
import { type LoadedMultimodalModel, loadMultimodalModel } from "../../model/gemma4/index.ts";
import { goldenRuleHere } from "../gemma4/run.ts";
import { compareTapLists, formatVerdict, fromOracle, type TapData, type Verdict } from "../gemma4/tap_compare.ts";
import { atMlxBug, divergentTapOf, keepMlxBugNote } from "../../oracle/mlx_bugs.ts";
import { mmFixtureConfig, scenarioMedia } from "../../oracle/mm_fixtures.ts";
import { callPrefix, expandMediaTaps, expandTaps, mediaTapConfig, mmCallShape, tapConfig } from "../../oracle/taps.ts";
import { CKPT_ROOT, MM_SCENARIOS, type MmReference, type MmScenario, mmForwardTaps, mmGenerateTaps, mmReference, mmScenario } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

const FULL = process.env.MM_PARITY_FULL === "1";
// both towers in one forward (the rest: the goldens here, and `npm run parity`, which runs every
// multimodal fixture's generation live)
const LIVE = new Set(["m2_e2b/f32 mm_fwd_image_audio"]);

const oracle = await sharedOracle();
await oracle.request("make_checkpoints", { only: ["m*"] }, limit(600_000));
const plan = await oracle.request<{ mm_checkpoints: { id: string; towers: string[] }[] }>("plan");
const pairs: { ckpt: string; scn: MmScenario }[] = [];
for (const c of plan.mm_checkpoints) for (const s of MM_SCENARIOS) if (s.needs.every((t) => c.towers.includes(t))) pairs.push({ ckpt: c.id, scn: s });
const manifest = readManifest();
// The manifest's rule (oracle/golden.ts goldenRule): bit for bit on the recording fingerprint;
// on any other the goldens are not compared (no budget) and every pair runs live instead, said
// in the summary.
const rule = await goldenRuleHere();
const goldensCompared = rule?.mode === "exact";

let loaded: { id: string; m: LoadedMultimodalModel } | null = null;
function model(id: string): LoadedMultimodalModel {
  if (loaded?.id !== id) {
    loaded?.m.model.dispose();
    loaded = { id, m: loadMultimodalModel(join(CKPT_ROOT, id)) };
  }
  return loaded.m;
}

async function runTs(ckpt: string, scn: MmScenario, ref: MmReference): Promise<{ taps: TapData[]; tokens: number[] }> {
  const m = model(ckpt).model;
  return scn.kind === "forward" ? { taps: mmForwardTaps(m, ref, scn), tokens: [] } : mmGenerateTaps(m, ref, scn);
}

/** Which part of the model a tap belongs to (for the per-tower counts). */
function part(name: string): "vision" | "audio" | "merge" | "language" {
  if (/^embed\/(vision_tower|embed_vision)\b/.test(name)) return "vision";
  if (/^embed\/(audio_tower|embed_audio)\b/.test(name)) return "audio";
  if (/^embed\/(merge\/|image_features|audio_features)/.test(name)) return "merge";
  return "language";
}

const counts = { live: { vision: 0, audio: 0, merge: 0, language: 0 }, golden: { vision: 0, audio: 0, merge: 0, language: 0 } };
const totals = { livePairs: 0, goldenPairs: 0, goldenFull: 0 };
const perPair: string[] = [];

describe("multimodal taps vs mlx-vlm", () => {
  it("the TS tap expansion (oracle/taps.ts: media taps, mmCallShape) reproduces mlx-vlm's recorded names and order", async () => {
    for (const [ckpt, sid] of [["m2_e2b/f32", "mm_gen_chunked_av"], ["m3_moe/f32", "mm_gen_chunked"]] as const) {
      const cap = await oracle.capture(ckpt, sid, { mode: "logits" });
      const cfgJson = mmFixtureConfig(ckpt.split("/")[0]!);
      const cfg = tapConfig(cfgJson);
      const want = cap.calls.flatMap((c) => {
        const call = c as unknown as { kind: "embed" | "forward" | "prefill" | "step"; index: number; batch: number; length: number };
        if (call.kind === "embed") return expandMediaTaps(mediaTapConfig(cfgJson), scenarioMedia(mmScenario(sid))).map((n) => `embed/${n}`);
        return expandTaps(cfg, mmCallShape(cfg, { ...call, kind: call.kind })).map((n) => callPrefix(call.kind as "prefill" | "step", call.index) + n);
      });
      expect({ ckpt, names: cap.taps.map((t) => t.name) }).toEqual({ ckpt, names: want });
    }
  }, limit(120_000));

  it("every multimodal checkpoint × scenario has a golden entry", () => {
    const missing = pairs.map((p) => `${p.ckpt}/${p.scn.id}`).filter((id) => !manifest?.entries[id]);
    expect(missing).toEqual([]);
  });

  for (const { ckpt, scn } of pairs) {
    const key = `${ckpt} ${scn.id}`;
    it(key, async () => {
      const gid = `${ckpt}/${scn.id}`;
      if (!goldensCompared) {
        await livePair(ckpt, scn, key);
        return;
      }
      const g = loadGolden(gid);
      const goldenTaps = g.taps.map((t) => fromOracle({ ...t, kind: t.kind ?? "array", array: g.arrays.get(t.name) }));
      const ref: MmReference = { calls: [], taps: goldenTaps, source: "golden" };
      const ours = await runTs(ckpt, scn, ref);
      const names = new Set(goldenTaps.map((t) => t.name));
      const oursG = g.scenario.mode === "full" ? ours.taps : ours.taps.filter((t) => names.has(t.name));
      const gv = compareTapLists(oursG, goldenTaps);
      if (!gv.ok && countedAtMlxBug(ckpt, `${gid} (golden)`, gv, goldenTaps)) return;
      if (!gv.ok) throw new Error(formatVerdict(`${gid} (golden)`, gv));
      if (scn.kind === "generate") expect(ours.tokens).toEqual((g.scenario.meta as { generated: number[] }).generated);
      totals.goldenPairs++;
      if (g.scenario.mode === "full") totals.goldenFull++;
      for (const t of oursG) counts.golden[part(t.name)]++;

      if (FULL || LIVE.has(key)) await livePair(ckpt, scn, key);
    }, limit(120_000));
  }
});

const atMlxBugs: string[] = [];

/** A divergence whose first divergent tap an op on a path of MLX's own proven broken here produced (oracle/mlx_bugs.ts): recorded apart, never as bit-exact. */
function countedAtMlxBug(ckpt: string, label: string, v: Verdict, theirs: readonly TapData[]): boolean {
  const note = atMlxBug(join(CKPT_ROOT, ckpt), formatVerdict(label, v), divergentTapOf(v.first, theirs));
  if (note) keepMlxBugNote(atMlxBugs, "multimodal parity", note);
  return note !== null;
}

/** One pair against live mlx-vlm, its taps counted per part. */
async function livePair(ckpt: string, scn: MmScenario, key: string): Promise<void> {
  const live = await mmReference(ckpt, scn.id, { live: true });
  const mine = await runTs(ckpt, scn, live);
  const v = compareTapLists(mine.taps, live.taps);
  if (!v.ok && countedAtMlxBug(ckpt, `${key} (live)`, v, live.taps)) return;
  if (!v.ok) throw new Error(formatVerdict(`${key} (live)`, v));
  if (scn.kind === "generate") expect(mine.tokens).toEqual(live.generated);
  totals.livePairs++;
  const c = { vision: 0, audio: 0, merge: 0, language: 0 };
  for (const t of mine.taps) c[part(t.name)]++;
  for (const k of Object.keys(c) as (keyof typeof c)[]) counts.live[k] += c[k];
  perPair.push(`${key.padEnd(34)} vision ${String(c.vision).padStart(4)}  audio ${String(c.audio).padStart(4)}  merge ${String(c.merge).padStart(3)}  language ${String(c.language).padStart(5)}`);
}

afterAll(() => {
  loaded?.m.model.dispose();
  const fmt = (c: Record<string, number>) => Object.entries(c).map(([k, v]) => `${k} ${v}`).join(", ");
  console.log(
    `[multimodal parity] ${pairs.length} (checkpoint, scenario) pairs; live mlx-vlm: ${totals.livePairs} pairs bit-identical (${fmt(counts.live)} taps)` +
      `${FULL ? "" : " [MM_PARITY_FULL=1: every pair live]"}; goldens (${!goldensCompared ? (rule && "what" in rule ? rule.what : "not compared: no manifest") : "same platform: bit-exact"}): ` +
      `${totals.goldenPairs} pairs (${totals.goldenFull} full dumps; ${fmt(counts.golden)} taps)` +
      (atMlxBugs.length ? `; ${atMlxBugs.length} pairs diverging at recorded MLX bugs (named above)` : ""),
  );
  if (FULL) console.log(`  live taps per pair:\n  ${perPair.join("\n  ")}`);
});
