// The comparison core of DFlash speculative decoding (suites/speculative/gemma4_dflash.test.ts and
// `npm run parity -- --mode dflash`): TS dflashGenerateStep (model/speculative/dflash.ts) against
// mlx-vlm 0.7.10's _dflash_rounds (oracle command `dflash`), byte for byte:
//
//   config        the drafter's resolved config (mask token, target layers, block size, layer types)
//   prefill       first token, its logprobs, every target cache, the captured prompt hidden
//   per round     block size, drafted tokens, drafter logits, every drafter cache after the draft,
//                 verify input, target verify logits and captured hidden, (sampled runs) the global
//                 random key after the walk, accepted count, the walk's emitted tokens, every
//                 target cache after the rollback (type, integers, raw buffers)
//   end           round count, tokens, accept_lens / draft_lens
//
// and the TS DFlash tokens against TS plain generate_step (tokens): greedy, or for a sampled run
// the same seed and sampler (every emitted token costs one key in both, see model/speculative/dflash.ts).
import * as mx from "@mlx-bun/mlx";
import { GenerateError } from "../model/generate.ts";
import { loadDFlashDrafter } from "../model/speculative/drafters/index.ts";
import type { DFlashDraftModel } from "../model/speculative/drafters/qwen3_dflash/dflash.ts";
import { dflashGenerateStep, type DFlashRound } from "../model/speculative/dflash.ts";
import type { NpyRecord } from "./npy.ts";
import type { OracleClient } from "./client.ts";
import { rawOf, rawOfNpy, type RawTensor } from "./compare.ts";
import { compareCaches, type ModelPool, plainTokens, readTree, RoundCounts, type RoundTotals, type SampledSpec, samplingRequest, Tally, type TallySummary } from "./speculative.ts";

const rawN = (r: NpyRecord | null | undefined): RawTensor | null => (r ? rawOfNpy(r) : null);

/** Loaded DFlash drafters, one per directory. */
export class DrafterPool {
  private readonly drafters = new Map<string, DFlashDraftModel>();
  drafter(dir: string): DFlashDraftModel {
    let d = this.drafters.get(dir);
    if (!d) this.drafters.set(dir, (d = loadDFlashDrafter(dir)));
    return d;
  }
  dispose(): void {
    for (const d of this.drafters.values()) d.dispose();
    this.drafters.clear();
  }
}

export interface DFlashSpec {
  /** Target checkpoint (flat gemma4_text, tied) and gemma4_dflash drafter directories. */
  target: string;
  drafter: string;
  prompt: number[];
  maxTokens: number;
  draftBlockSize?: number;
  /** Sampled run (mlx_vlm.generate --temp T --seed S and top_p / top_k / min_p); absent: greedy. */
  sampling?: SampledSpec;
  /** Skip the plain decoding run (the mutation check needs only the oracle comparison). */
  skipGreedy?: boolean;
}

export interface DFlashResult extends RoundTotals {
  spec: DFlashSpec;
  tokens: number[];
  blockSizes: number[];
  /** TS vs mlx-vlm, round by round. */
  vsOracle: TallySummary;
  /** TS DFlash tokens vs TS plain generate_step (greedy, or sampled with the same seed); null when skipped. */
  vsGreedy: TallySummary | null;
  /** The drafter config mlx-vlm resolved (the `config` comparison's expected side). */
  oracleConfig: Record<string, unknown>;
  /** mlx-vlm's DFlash tokens equal TS greedy (a relation of the oracle's own output). */
  oracleEqualsGreedy: boolean | null;
  ms: number;
}

export async function dflashParity(oracle: OracleClient, pool: ModelPool, drafters: DrafterPool, spec: DFlashSpec): Promise<DFlashResult> {
  const t0 = performance.now();
  const sp = spec.sampling;
  const sampling = samplingRequest(sp);
  const orc = readTree(oracle, await oracle.request("dflash", { checkpoint: spec.target, drafter: spec.drafter, prompt: spec.prompt, max_tokens: spec.maxTokens, draft_block_size: spec.draftBlockSize ?? null, sampling }));
  const target = pool.model(spec.target).text;
  const drafter = drafters.drafter(spec.drafter);
  const t = new Tally();
  const c = drafter.config;
  t.value("config", { mask_token_id: c.mask_token_id, target_layer_ids: c.target_layer_ids, block_size: c.block_size, layer_types: c.layer_types, sliding_window: c.sliding_window, is_causal: c.is_causal, num_target_layers: c.num_target_layers }, orc.config);
  const tokens: number[] = [];
  const blockSizes: number[] = [];
  const n = new RoundCounts();
  const onRound = (r: DFlashRound): void => {
    blockSizes.push(r.blockSize);
    const { w, o } = n.next(t, orc.rounds, r.accepted, r.drafted.length);
    if (!o) return;
    t.value(`${w} block_size`, r.blockSize, o.block_size);
    t.value(`${w} drafted`, r.drafted, o.drafted);
    t.tensor(`${w} drafter logits`, rawOf(r.draftLogits), rawN(o.draft_logits));
    compareCaches(t, `${w} drafter cache`, r.draftCache, o.draft_cache);
    t.value(`${w} verify input`, r.verifyInput, o.verify_input);
    t.tensor(`${w} target logits`, rawOf(r.targetLogits), rawN(o.target_logits));
    t.tensor(`${w} target hidden`, rawOf(r.targetHidden), rawN(o.target_hidden));
    if (sp && !sp.positioned) t.tensor(`${w} random key`, r.rngKey ? rawOf(r.rngKey) : null, rawN(o.rng));
    t.value(`${w} accepted`, r.accepted, o.accepted);
    t.value(`${w} emitted`, r.emitted, o.emitted);
    compareCaches(t, `${w} cache`, r.cache, o.cache);
  };
  // a TS refusal where mlx-vlm ran is a divergence, kept behind whatever differed first (a resolved
  // config that makes the pairing invalid is caught at "config", its refusal is the consequence)
  try {
    for await (const tok of dflashGenerateStep(target, drafter, spec.prompt, {
      maxTokens: spec.maxTokens,
      draftBlockSize: spec.draftBlockSize,
      sampling: sp,
      seed: sp?.seed,
      onPrefill: (p) => {
        t.value("first token", p.token, orc.first.token);
        using lp = mx.squeeze(p.logprobs, 0);
        t.tensor("first logprobs", rawOf(lp), rawN(orc.first.logprobs));
        compareCaches(t, "cache after prefill", p.cache, orc.first.cache);
        t.tensor("prefill hidden", rawOf(p.hidden), rawN(orc.prefill_hidden));
      },
      onRound,
    })) {
      tokens.push(tok.token);
    }
  } catch (e) {
    if (!(e instanceof GenerateError)) throw e;
    t.value("TS run", `refused: ${e.message}`, "ran");
  }
  t.value("rounds", n.rounds, orc.rounds.length);
  t.value("tokens", tokens, orc.tokens);
  t.value("accept_lens", drafter.accept_lens, orc.accept_lens);
  t.value("draft_lens", drafter.draft_lens, orc.draft_lens);
  let vsGreedy: Tally | null = null;
  let oracleEqualsGreedy: boolean | null = null;
  if (!spec.skipGreedy) {
    vsGreedy = new Tally();
    const greedy = await plainTokens(pool.generation(spec.target), spec.prompt, spec.maxTokens, sp);
    greedy.forEach((g, i) => vsGreedy!.value(`token ${i}`, tokens[i], g));
    vsGreedy.value("length", tokens.length, greedy.length);
    oracleEqualsGreedy = JSON.stringify(orc.tokens) === JSON.stringify(greedy);
  }
  return { spec, tokens, ...n.totals(), blockSizes, vsOracle: t.summary(), vsGreedy: vsGreedy?.summary() ?? null, oracleConfig: orc.config, oracleEqualsGreedy, ms: performance.now() - t0 };
}
