// Tap-by-tap parity of the TS multimodal model (vision tower, audio tower, merge, mlx-vlm's
// language model and generate_step) against mlx-vlm 0.7.10: every multimodal fixture checkpoint
// × every scenario of fixtures/mm_scenarios.json whose towers it has (single forwards, chunked
// media prefill, 20 decode steps after an image prompt).
//
// What `npm test` compares (counts asserted per pair, in its title, and in total):
//  - goldens recorded on this machine's fingerprint (oracle/golden.ts goldenRule "exact"): every
//    pair against its golden, bit for bit, on the taps the golden stores that TS computes. Of the
//    44 entries, 3 are full dumps (189, 374 and 287 taps: all but the inputs fed from the record)
//    and 41 store logits only (a forward: its 1 logits tap; a generation: the logits of its first
//    4 or all 21 decode steps, plus its generated tokens): 1,061 of the 52,783 taps mlx-vlm
//    recorded for these pairs. Plus the pair in LIVE against the live oracle: every tap TS
//    computes (374 of the 377 recorded).
//  - elsewhere (goldens not compared, said in the summary): every pair against the live oracle,
//    every tap TS computes.
//  - MM_PARITY_FULL=1: every pair against the live oracle as well (about 3 minutes on 2 cores).
// Never compared here: the taps TS is fed from the oracle's record (run.ts ORACLE_FED: the prompt
// ids, the audio features and mask); the TS processor's own outputs are compared with mlx-vlm's
// in processor.test.ts and audio.test.ts. Bar: byte-identical, in the same order.

import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { sharedOracle } from "../../oracle/client.ts";
import { type GoldenIndex, loadGolden, readIndex, readManifest } from "../../oracle/golden.ts";
import { type LoadedMultimodalModel, loadMultimodalModel } from "../../model/gemma4/index.ts";
import { goldenRuleHere } from "../gemma4/run.ts";
import { compareTapLists, formatVerdict, fromOracle, type TapData, type Verdict } from "../gemma4/tap_compare.ts";
import { atMlxBug, divergentTapOf, keepMlxBugNote } from "../../oracle/mlx_bugs.ts";
import { mmFixtureConfig, scenarioMedia } from "../../oracle/mm_fixtures.ts";
import { callPrefix, expandMediaTaps, expandTaps, mediaTapConfig, mmCallShape, tapConfig } from "../../oracle/taps.ts";
import { CKPT_ROOT, computedByTs, MM_SCENARIOS, type MmReference, type MmScenario, mmForwardTaps, mmGenerateTaps, mmReference, mmScenario } from "./run.ts";
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

const indexes = new Map<string, GoldenIndex>();
/** What a pair's golden holds: the oracle's recorded tap count, and how many stored taps TS computes. */
function goldenHolds(gid: string): { mode: "full" | "logits"; recorded: number; computed: number } | null {
  const e = manifest?.entries[gid];
  if (!e) return null;
  let idx = indexes.get(e.index);
  if (!idx) indexes.set(e.index, (idx = readIndex(e.index)));
  const stored = idx.taps.filter((t) => t.name.startsWith(e.prefix)).map((t) => ({ name: t.name.slice(e.prefix.length) }));
  return { mode: e.mode, recorded: e.taps, computed: computedByTs(stored).length };
}

/** The test's title: what it compares, with the counts. */
function title(ckpt: string, scn: MmScenario): string {
  const key = `${ckpt} ${scn.id}`;
  const live = "live: every tap TS computes";
  const h = goldenHolds(`${ckpt}/${scn.id}`);
  if (!goldensCompared || !h) return `${key}: ${live}`;
  const what = h.mode === "full" ? "every tap TS computes" : scn.kind === "generate" ? `logits of ${h.computed} steps, and the tokens` : "the logits";
  return `${key}: golden ${h.computed} of ${h.recorded} taps (${what})${FULL || LIVE.has(key) ? `; ${live}` : ""}`;
}

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

  it("the goldens hold what the header says: 44 entries, 3 full dumps, 1,061 TS-computed taps of 52,783 recorded", () => {
    const held = pairs.map((p) => goldenHolds(`${p.ckpt}/${p.scn.id}`)!);
    const sum = (f: (h: (typeof held)[number]) => number) => held.reduce((a, h) => a + f(h), 0);
    expect({ entries: held.length, full: held.filter((h) => h.mode === "full").length, computed: sum((h) => h.computed), recorded: sum((h) => h.recorded) }).toEqual({
      entries: 44,
      full: 3,
      computed: 1061,
      recorded: 52783,
    });
  });

  for (const { ckpt, scn } of pairs) {
    const key = `${ckpt} ${scn.id}`;
    it(title(ckpt, scn), async () => {
      const gid = `${ckpt}/${scn.id}`;
      if (!goldensCompared) {
        await livePair(ckpt, scn, key);
        return;
      }
      const g = loadGolden(gid);
      const recorded = g.taps.map((t) => fromOracle({ ...t, kind: t.kind ?? "array", array: g.arrays.get(t.name) }));
      const ref: MmReference = { calls: [], taps: recorded, source: "golden" };
      const ours = await runTs(ckpt, scn, ref);
      // compared: what TS computed (the inputs it was fed from the golden are left out)
      const goldenTaps = computedByTs(recorded);
      const names = new Set(goldenTaps.map((t) => t.name));
      const oursG = computedByTs(g.scenario.mode === "full" ? ours.taps : ours.taps.filter((t) => names.has(t.name)));
      const gv = compareTapLists(oursG, goldenTaps);
      if (!gv.ok && countedAtMlxBug(ckpt, `${gid} (golden)`, gv, goldenTaps)) return;
      if (!gv.ok) throw new Error(formatVerdict(`${gid} (golden)`, gv));
      if (scn.kind === "generate") expect(ours.tokens).toEqual((g.scenario.meta as { generated: number[] }).generated);
      expect(gv.compared, `${gid}: golden taps compared`).toBe(goldenHolds(gid)!.computed);
      expect(gv.arrays, `${gid}: golden arrays compared`).toBeGreaterThan(0);
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
  const record = await mmReference(ckpt, scn.id, { live: true });
  const ran = await runTs(ckpt, scn, record);
  // compared: what TS computed (the inputs it was fed from the record are left out)
  const live = { ...record, taps: computedByTs(record.taps) };
  const mine = { ...ran, taps: computedByTs(ran.taps) };
  const v = compareTapLists(mine.taps, live.taps);
  if (!v.ok && countedAtMlxBug(ckpt, `${key} (live)`, v, live.taps)) return;
  if (!v.ok) throw new Error(formatVerdict(`${key} (live)`, v));
  if (scn.kind === "generate") expect(mine.tokens).toEqual(live.generated);
  const recordedHere = manifest?.entries[`${ckpt}/${scn.id}`]?.taps;
  if (recordedHere !== undefined) expect(record.taps.length, `${key}: taps mlx-vlm recorded live (the manifest's count)`).toBe(recordedHere);
  expect(v.compared, `${key}: live taps compared`).toBe(live.taps.length);
  expect(v.arrays, `${key}: live arrays compared`).toBeGreaterThan(0);
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
