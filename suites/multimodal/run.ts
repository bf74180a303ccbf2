// Running the TS multimodal model the way the oracle ran mlx-vlm (shared by the multimodal
// parity, mutation and property suites): media inputs read back from the oracle's own record
// (the embed call's input taps), every tap collected under the oracle's names.

import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type CallRecord, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { loadGolden, readManifest } from "../../oracle/golden.ts";
import { generateStep } from "../../model/generate.ts";
import type { MediaInputs, MultimodalModel } from "../../model/gemma4/index.ts";
import { disposeMediaInputs } from "../../model/gemma4/gemma4.ts";
import { mediaGenerationModel, mmTokenTypes, stepTaps } from "../../model/runtime.ts";
import { goldenRuleHere } from "../gemma4/run.ts";
import { fixtureImages, type MmScenario, scenarioImages } from "../../oracle/mm_fixtures.ts";
import { fromOracle, TapCollector, type TapData } from "../gemma4/tap_compare.ts";

export const CKPT_ROOT = join(REPO_ROOT, ".cache", "checkpoints");

export { MM_SCENARIOS, type MmScenario, mmScenario } from "../../oracle/mm_fixtures.ts";

export interface MmReference {
  calls: CallRecord[];
  taps: TapData[];
  generated?: number[];
  source: "golden" | "live";
}

const manifest = readManifest();
const memo = new Map<string, Promise<MmReference>>();

/**
 * The oracle's record of a multimodal scenario: the golden full dump if there is one recorded on
 * this platform (goldenRule exact), else a live capture. `exact` (goldens of this platform only)
 * is what every golden used here is now: goldens of another platform are never used.
 */
export function mmReference(ckpt: string, scn: string, { exact = false, live = false }: { exact?: boolean; live?: boolean } = {}): Promise<MmReference> {
  const key = `${ckpt}/${scn}${exact ? "#exact" : ""}${live ? "#live" : ""}`;
  let p = memo.get(key);
  if (!p) {
    p = (async () => {
      const gid = `${ckpt}/${scn}`;
      const rule = await goldenRuleHere();
      if (!live && manifest?.entries[gid] && rule?.mode === "exact") {
        const g = loadGolden(gid);
        if (g.scenario.mode === "full" && g.scenario.calls) {
          return {
            calls: g.scenario.calls as unknown as CallRecord[],
            taps: g.taps.map((t) => fromOracle({ ...t, kind: t.kind ?? "array", array: g.arrays.get(t.name) })),
            generated: (g.scenario.meta as { generated?: number[] } | undefined)?.generated,
            source: "golden",
          } satisfies MmReference;
        }
      }
      const cap = await (await sharedOracle()).capture(ckpt, scn, { mode: "full" });
      return { calls: cap.calls, taps: cap.taps.map(fromOracle), generated: cap.meta.generated, source: "live" } satisfies MmReference;
    })();
    memo.set(key, p);
    p.catch(() => memo.delete(key));
  }
  return p;
}

function arrayOf(t: TapData | undefined): MlxArray | null {
  if (!t || !t.data) return null;
  return mx.fromBytes(t.data, t.shape ?? [], t.dtype as mx.Dtype);
}

/**
 * Taps whose contents the TS side is fed from the oracle's record, not computed (recordedInputs
 * below): the prompt ids (`embed/inputs`; the prompt's chunks as the language model's ids,
 * `prefill{i}/inputs` and `step0/inputs`), the audio features and their mask. Comparing them
 * would compare the oracle with itself, so they are left out of every comparison and count that
 * claims TS computed something (filter with `computedByTs`). The TS processor's own outputs for
 * the same kinds of media (ids, pixel values, audio features, mask) are compared with mlx-vlm's in
 * suites/multimodal/processor.test.ts ("every model input of prepare_inputs") and
 * suites/multimodal/audio.test.ts. Decode steps n >= 1 feed back the TS model's own tokens:
 * computed, so compared.
 */
export const ORACLE_FED = /^(embed\/inputs|embed\/audio_tower\/input_(features|mask)|(prefill\d+|step0)\/inputs)$/;

export function computedByTs<T extends { name: string }>(taps: readonly T[]): T[] {
  return taps.filter((t) => !ORACLE_FED.test(t.name));
}

/**
 * The prompt ids and media of a recorded scenario: ids and audio features from its embed call's
 * input taps, the images rebuilt from the scenario's media specs (oracle/mm_fixtures.ts).
 */
export function recordedInputs(ref: MmReference, scn: MmScenario): { ids: number[]; media: MediaInputs } {
  const images = scenarioImages(scn);
  const get = (n: string) => ref.taps.find((t) => t.name === `embed/${n}`);
  const idsTap = get("inputs");
  if (!idsTap?.data) throw new Error("the reference has no embed/inputs tap");
  const ids = Array.from(new Int32Array(idsTap.data.buffer, idsTap.data.byteOffset, idsTap.data.byteLength / 4));
  const mask = arrayOf(get("audio_tower/input_mask"));
  let valid: MlxArray | null = null;
  if (mask) {
    valid = mx.logicalNot(mask); // the tower's mask is the processor's, inverted
    mask.dispose();
  }
  return { ids, media: { pixel_values: fixtureImages(images), input_features: arrayOf(get("audio_tower/input_features")), input_features_mask: valid } };
}


/** Every tap of a single forward (Model.__call__) of the recorded prompt. */
export function mmForwardTaps(model: MultimodalModel, ref: MmReference, scn: MmScenario): TapData[] {
  const { ids, media } = recordedInputs(ref, scn);
  const col = new TapCollector();
  try {
    using x = mx.array(Int32Array.from(ids), [1, ids.length], "int32");
    const types = mmTokenTypes(ids, model.config);
    using mm = mx.array(Int32Array.from(types), [1, types.length], "int32");
    using logits = model.call(x, { ...media, mm_token_type_ids: mm, taps: col.sink });
  } finally {
    disposeMediaInputs(media);
  }
  return col.taps;
}

/** Every tap of mlx-vlm's generate_step on the recorded prompt (embed call, prefill chunks, steps); the tokens. */
export async function mmGenerateTaps(model: MultimodalModel, ref: MmReference, scn: MmScenario): Promise<{ taps: TapData[]; tokens: number[] }> {
  const { ids, media } = recordedInputs(ref, scn);
  const col = new TapCollector();
  const run = mediaGenerationModel(model, { ids, media }, col.sink);
  const tokens: number[] = [];
  try {
    for await (const t of generateStep(run.generate, ids, { maxTokens: scn.max_tokens!, prefillStepSize: scn.prefill_step_size!, chunkedPrefill: run.chunked, onStep: stepTaps(col.sink) })) {
      tokens.push(t.token);
    }
  } finally {
    run.dispose();
    disposeMediaInputs(media);
  }
  return { taps: col.taps, tokens };
}
