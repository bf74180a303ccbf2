// `npm run generate` with several prompts and --kv-bits: the batch runs mlx-vlm 0.7.10's batch
// path (model/generate_batch_vlm.ts, as mlx_vlm.batch_generate runs it: every prompt admitted in
// one prompt batch, greedy) with quantized KV caches, whose calls are bit-exact against mlx-vlm's
// own BatchGenerator (suites/kvquant/batch.test.ts). Plain batches (no --kv-bits) keep mlx-lm's
// batch_generate (parity/generate_batch.ts): mlx-lm has no working quantized cache for Gemma 4.
//
// kvBatchPlan makes every check before the model loads, each bad input one UsageError (exit 2):
// the batch flags (generate_batch.ts batchPlan), then what this path does not take (sampling other
// than greedy, --prefill-batch-size / --completion-batch-size other than their defaults: the path
// admits every prompt at once), then the KV flags by the batch path's rule (cache/kv_quantize_batch.ts:
// the full-attention caches but the last are quantized from the first token, sliding caches stay
// unquantized, so uniform runs on Gemma 4 here; a group size that does not divide the full-attention
// head dim, TurboQuant bits without a codebook or on a head dim that is not a power of two, and a
// quantized donor read by KV-shared layers are refused).
// Not ported on this path (said in the output): stop tokens end no row; each runs --max-tokens.
import * as mx from "@mlx-bun/mlx";
import { kvSharedBatchConflict, shouldQuantizeKvLayer, type BatchKVQuantConfig } from "../model/cache/kv_quantize_batch.ts";
import { codebookValues } from "../model/cache/turboquant.ts";
import { modelArgsFromDict } from "../model/gemma4/config.ts";
import { type LoadedModel, loadModel } from "../model/gemma4/index.ts";
import { VlmBatchGenerator, vlmLanguageModel } from "../model/generate_batch_vlm.ts";
import { fromLegacy, KVQuantError, resolveKvBits, TURBOQUANT_SCHEME, turboquantEnabled, UNIFORM_SCHEME, validateUniformGroup } from "../model/kv_quant.ts";
import { type Parsed, UsageError } from "./args.ts";
import type { DeviceInfo } from "./device.ts";
import { BATCH_FLAGS, type BatchHelpers, batchPlan, type BatchPlan } from "./generate_batch.ts";
import type { CheckpointInfo } from "./inputs.ts";

export interface KvBatchPlan extends BatchPlan {
  kv: BatchKVQuantConfig & { kvBits: number; kvQuantScheme: "turboquant" | "uniform"; kvGroupSize: number };
  prefillStepSize: number;
  /** How many full-attention caches the batch path quantizes (0: the flags change nothing). */
  quantizedCaches: number;
}

const defaultOf = (name: string) => BATCH_FLAGS.find((f) => f.name === name)!.default;

/** The KV flags of a batch run, checked by the batch path's conversion rule. */
export function checkKvBatchFlags(a: Parsed, text: Record<string, unknown>): { kv: KvBatchPlan["kv"]; quantizedCaches: number } {
  const scheme = String(a["kv-quant-scheme"] ?? UNIFORM_SCHEME);
  if (scheme !== UNIFORM_SCHEME && scheme !== TURBOQUANT_SCHEME) throw new UsageError(`argument --kv-quant-scheme: invalid choice: '${scheme}' (choose from 'uniform', 'turboquant')`);
  const start = Number(a["quantized-kv-start"]);
  if (!Number.isSafeInteger(start) || start < 0) throw new UsageError("--quantized-kv-start must be a non-negative integer");
  const bits = Number(a["kv-bits"]);
  const groupSize = Number(a["kv-group-size"]);
  try {
    fromLegacy({ kvBits: bits, kvQuantScheme: scheme, kvGroupSize: groupSize });
    const args = modelArgsFromDict(text);
    const conflict = kvSharedBatchConflict(args.layer_types, args.num_kv_shared_layers);
    if (conflict) throw new UsageError(`--kv-bits on the batch path of this model: KV-shared layer(s) ${conflict.readers.join(", ")} read layer ${conflict.donor}'s cache, which mlx-vlm's batch path quantizes; its attention then fails, so the port refuses`);
    const nCaches = args.layer_types.length - args.num_kv_shared_layers;
    const quantizedCaches = args.layer_types.slice(0, nCaches).filter((t, i) => t === "full_attention" && shouldQuantizeKvLayer(i, nCaches)).length;
    const d = args.global_head_dim || args.head_dim;
    const turbo = turboquantEnabled(bits, scheme);
    if (quantizedCaches > 0 && turbo) {
      if ((d & (d - 1)) !== 0) throw new UsageError(`TurboQuant on head dim ${d} (not a power of two) needs mlx-vlm's numpy-QR rotation matrix, which the faces do not take`);
      const [, kb, vb] = resolveKvBits(bits);
      codebookValues(d, kb);
      codebookValues(d, vb);
    } else if (quantizedCaches > 0) {
      // BatchQuantizedKVCache(left_padding, group_size, int(kv_bits)): mx.quantize's check at the first update
      validateUniformGroup(Math.trunc(bits), groupSize, d);
    }
    return { kv: { kvBits: bits, kvQuantScheme: turbo ? "turboquant" : "uniform", kvGroupSize: groupSize, quantizedKvStart: start }, quantizedCaches };
  } catch (e) {
    if (e instanceof KVQuantError) throw new UsageError(e.message);
    throw e;
  }
}

/** Every check of a quantized batch run before the model is loaded. */
export async function kvBatchPlan(dir: string, a: Parsed, info: CheckpointInfo): Promise<KvBatchPlan> {
  for (const k of ["temp", "top-p", "top-k", "min-p"]) {
    if (a[k] !== undefined && Number(a[k]) !== 0) throw new UsageError(`--kv-bits with several prompts runs mlx-vlm's batch path greedily (the port has no sampler there): --${k} is not taken`);
  }
  for (const k of ["prefill-batch-size", "completion-batch-size"]) {
    if (a[k] !== defaultOf(k)) throw new UsageError(`--kv-bits with several prompts admits every prompt in one batch (mlx_vlm.batch_generate's path as ported): --${k} is not taken`);
  }
  const { kv, quantizedCaches } = checkKvBatchFlags(a, info.text);
  const base = await batchPlan(dir, a, info);
  return { ...base, kv, quantizedCaches, prefillStepSize: Number(a["prefill-step-size"]) };
}

export interface KvBatchResult {
  /** Per prompt, in the order given. */
  tokens: number[][];
  promptSeconds: number;
  generationSeconds: number;
  peakMemory: number;
}

/** The batch through VlmBatchGenerator; the tokens per prompt (uid order). */
export function generateKvBatch(loaded: LoadedModel, plan: Pick<KvBatchPlan, "ids" | "maxTokens" | "kv" | "prefillStepSize">): KvBatchResult {
  const tokens: number[][] = plan.ids.map(() => []);
  const g = new VlmBatchGenerator(vlmLanguageModel(loaded), plan.ids, { maxTokens: plan.maxTokens, prefillStepSize: plan.prefillStepSize, kv: plan.kv });
  mx.resetPeakMemory();
  const t0 = performance.now();
  let tFirst: number | null = null;
  try {
    while (g.hasWork) {
      const c = g.next();
      if (c.responses.length && tFirst === null) tFirst = performance.now();
      for (const r of c.responses) tokens[r.uid]!.push(r.token);
    }
  } finally {
    g.close();
  }
  const t1 = performance.now();
  return { tokens, promptSeconds: ((tFirst ?? t1) - t0) / 1000, generationSeconds: (t1 - (tFirst ?? t1)) / 1000, peakMemory: mx.getPeakMemory() };
}

/** Runs the batch; prints every completion, then the statistics and the device. */
export async function runKvBatch(plan: KvBatchPlan, dev: DeviceInfo, helpers: Pick<BatchHelpers, "loadTokenizer">): Promise<number> {
  const tokenizer = plan.text ? await helpers.loadTokenizer(plan.dir) : null;
  const loaded = loadModel(plan.dir);
  let r: KvBatchResult;
  try {
    r = generateKvBatch(loaded, plan);
  } catch (e) {
    // a refusal of the batch path (KV-shared donor, mixed schemes) or mx.quantize's group check: bad input
    if (e instanceof KVQuantError) throw new UsageError(e.message);
    throw e;
  } finally {
    loaded.model.dispose();
  }
  const { kv } = plan;
  const scheme = kv.kvQuantScheme === "turboquant" ? `TurboQuant ${kv.kvBits} bits` : `uniform ${Math.trunc(kv.kvBits)} bits, group ${kv.kvGroupSize}`;
  process.stdout.write(`KV cache: ${scheme}, quantized_kv_start ${kv.quantizedKvStart}, ${plan.quantizedCaches} full-attention cache(s) quantized (mlx-vlm's batch path; stop tokens end no row: each prompt runs --max-tokens)\n`);
  process.stdout.write("==========\n");
  r.tokens.forEach((t, i) => process.stdout.write(`[${i + 1}] ${tokenizer ? tokenizer.decode(t, { skip_special_tokens: true }) : t.join(" ")}\n`));
  process.stdout.write("==========\n");
  const promptTokens = plan.ids.reduce((s, p) => s + p.length, 0);
  const genTokens = r.tokens.reduce((s, t) => s + t.length, 0);
  process.stdout.write(`[batch_generate] Prompt: ${promptTokens} tokens, ${(promptTokens / r.promptSeconds).toFixed(3)} tokens-per-sec\n`);
  process.stdout.write(`[batch_generate] Generation: ${genTokens} tokens, ${r.generationSeconds > 0 ? (genTokens / r.generationSeconds).toFixed(3) : "n/a"} tokens-per-sec\n`);
  process.stdout.write(`[batch_generate] Peak memory: ${(r.peakMemory / 1e9).toFixed(3)} GB\n`);
  process.stdout.write(`Device: ${dev.device} (${dev.backend} backend${dev.gpu ? `, ${dev.gpu}` : ""})\n`);
  return 0;
}
