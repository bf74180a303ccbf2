// Running the TS gemma4_unified model the way the oracle ran mlx-vlm (suites/unified): the prompt
// ids and the processor outputs computed by TS (oracle/unified_fixtures.ts: the fixture images
// rebuilt from their seeds, through the TS Gemma4UnifiedImageProcessor), every tap collected under
// the oracle's names; the oracle's record of the same scenario (passed inline).

import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { generateStep } from "../../model/generate.ts";
import { type Model, mmTokenTypes, unifiedGenerationModel } from "../../model/gemma4_unified/index.ts";
import { disposeUnifiedMedia } from "../../model/gemma4_unified/gemma4_unified.ts";
import { stepTaps } from "../../model/runtime.ts";
import { type OracleClient, REPO_ROOT } from "../../oracle/client.ts";
import { inlineScenario, type UnifiedScenario, unifiedInputs } from "../../oracle/unified_fixtures.ts";
import { fromOracle, TapCollector, type TapData } from "../gemma4/tap_compare.ts";

export const CKPT_ROOT = join(REPO_ROOT, ".cache", "checkpoints");

export { inlineScenario, UNIFIED_MEDIA, UNIFIED_SCENARIOS, type UnifiedScenario, unifiedInputs, unifiedScenario } from "../../oracle/unified_fixtures.ts";

export interface UnifiedReference {
  taps: TapData[];
  calls: unknown[];
  generated?: number[];
  prefill_chunks?: number[];
}

/** A live capture of mlx-vlm running the scenario (every tap). */
export async function unifiedReference(oracle: OracleClient, ckpt: string, scn: UnifiedScenario): Promise<UnifiedReference> {
  const cap = await oracle.capture(ckpt, inlineScenario(scn) as never, { mode: "full" });
  const meta = cap.meta as { generated?: number[]; prefill_chunks?: number[] };
  return { taps: cap.taps.map(fromOracle), calls: cap.calls, generated: meta.generated, prefill_chunks: meta.prefill_chunks };
}

/** Every tap of a single forward (Model.__call__; mm_token_type_ids passed and dropped, as mlx-vlm does). */
export function unifiedForwardTaps(model: Model, scn: UnifiedScenario): TapData[] {
  const { ids, media } = unifiedInputs(scn, model.config);
  const col = new TapCollector();
  try {
    using x = mx.array(Int32Array.from(ids), [1, ids.length], "int32");
    const types = mmTokenTypes(ids, model.config);
    using mm = mx.array(Int32Array.from(types), [1, types.length], "int32");
    using _logits = model.call(x, { ...media, mm_token_type_ids: mm, taps: col.sink });
  } finally {
    disposeUnifiedMedia(media);
  }
  return col.taps;
}

/** Every tap of mlx-vlm's generate_step on the scenario (embed call, prefill chunks, steps); the tokens. */
export async function unifiedGenerateTaps(model: Model, scn: UnifiedScenario): Promise<{ taps: TapData[]; tokens: number[]; chunks: number[] }> {
  const { ids, media } = unifiedInputs(scn, model.config);
  const col = new TapCollector();
  const run = unifiedGenerationModel(model, { ids, media }, col.sink);
  const tokens: number[] = [];
  const chunks: number[] = [];
  try {
    const onStep = stepTaps(col.sink);
    for await (const t of generateStep(run.generate, ids, {
      maxTokens: scn.max_tokens!,
      prefillStepSize: scn.prefill_step_size!,
      chunkedPrefill: run.chunked,
      onStep: (info) => {
        if (info.call.kind === "prefill") chunks.push(info.inputs.length);
        onStep(info);
      },
    })) {
      tokens.push(t.token);
    }
  } finally {
    run.dispose();
    disposeUnifiedMedia(media);
  }
  return { taps: col.taps, tokens, chunks };
}

export async function unifiedTaps(model: Model, scn: UnifiedScenario): Promise<{ taps: TapData[]; tokens: number[]; chunks: number[] }> {
  return scn.kind === "forward" ? { taps: unifiedForwardTaps(model, scn), tokens: [], chunks: [] } : unifiedGenerateTaps(model, scn);
}
