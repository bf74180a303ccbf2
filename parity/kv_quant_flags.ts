// --kv-bits, --kv-quant-scheme, --kv-group-size, --quantized-kv-start (mlx-vlm 0.7.10's flag names
// and defaults) for `npm run generate`: checked before the model loads, each bad input one clear
// UsageError (exit 2):
// - a scheme other than uniform / turboquant (argparse's choices), bits TurboQuant refuses
//   (below 1, not integer or .5), fractional bits with --kv-quant-scheme uniform given per key/value
//   (from_legacy's messages);
// - uniform: on a model with sliding layers (every Gemma 4 shape), mlx-vlm raises
//   NotImplementedError("RotatingKVCache Quantization NYI") once a sliding cache reaches
//   --quantized-kv-start: refused up front when the run gets there (prompt + max tokens >= start);
//   then a group size / bits mx.quantize refuses for the full-attention head dim (checked even
//   when the run would not reach the start, where mlx-vlm would never call mx.quantize);
// - TurboQuant on a model whose KV-shared layers read a cache that would be converted (mlx-vlm
//   fails inside attention: bench/kvquant/kv_shared_repro.py); a full-attention head dim that is
//   not a power of two (mlx-vlm's rotation is numpy QR: not portable); bits with no carried codebook;
// - with --draft-model, --prompt-cache-file, media or a batch: not ported.
import * as mx from "@mlx-bun/mlx";
import { kvSharedDonorConflict, kvSharedRefusal, type KVQuantConfig, makeKvQuantizer } from "../model/cache/kv_quantize.ts";
import { codebookValues } from "../model/cache/turboquant.ts";
import { modelArgsFromDict } from "../model/gemma4/config.ts";
import { DEFAULT_KV_GROUP_SIZE, DEFAULT_QUANTIZED_KV_START, fromLegacy, KVQuantError, resolveKvBits, TURBOQUANT_SCHEME, turboquantEnabled, UNIFORM_SCHEME, validateUniformGroup } from "../model/kv_quant.ts";
import { loadModel } from "../model/gemma4/index.ts";
import { compareGenerations, type GenerationRecord, type KvQuantCase, oracleGeneration, portGeneration } from "../oracle/kv_quant.ts";
import { type FlagSpec, type Parsed, UsageError } from "./args.ts";

export const KV_QUANT_FLAGS: FlagSpec[] = [
  { name: "kv-bits", kind: "number", valueName: "B", help: "quantize the KV cache to B bits (mlx-vlm's; fractional B such as 3.5 uses TurboQuant)" },
  { name: "kv-quant-scheme", kind: "string", valueName: "S", help: "uniform or turboquant (mlx-vlm's KV quantization backend)", default: UNIFORM_SCHEME },
  { name: "kv-group-size", kind: "int", valueName: "G", help: "group size of the uniform scheme", default: DEFAULT_KV_GROUP_SIZE },
  { name: "quantized-kv-start", kind: "int", valueName: "N", help: "quantize a cache once it holds N tokens", default: DEFAULT_QUANTIZED_KV_START },
];

export interface KvQuantRun {
  prompt: number;
  maxTokens: number;
  /** Why the run cannot take --kv-bits (another mode), or null. */
  otherMode: string | null;
}

/** The checked KV quantization config of a generate run, or null without --kv-bits. */
export function kvQuantPlan(a: Parsed, text: Record<string, unknown>, run: KvQuantRun): KVQuantConfig | null {
  const scheme = String(a["kv-quant-scheme"] ?? UNIFORM_SCHEME);
  if (scheme !== UNIFORM_SCHEME && scheme !== TURBOQUANT_SCHEME) throw new UsageError(`argument --kv-quant-scheme: invalid choice: '${scheme}' (choose from 'uniform', 'turboquant')`);
  const start = Number(a["quantized-kv-start"]);
  if (!Number.isSafeInteger(start) || start < 0) throw new UsageError("--quantized-kv-start must be a non-negative integer");
  if (a["kv-bits"] === undefined) return null;
  const bits = Number(a["kv-bits"]);
  if (run.otherMode) throw new UsageError(`--kv-bits does not apply to ${run.otherMode} (not ported)`);
  const groupSize = Number(a["kv-group-size"]);
  const cfg: KVQuantConfig = { kvBits: bits, kvQuantScheme: scheme, kvGroupSize: groupSize, quantizedKvStart: start };
  try {
    fromLegacy(cfg);
    const args = modelArgsFromDict(text);
    if (turboquantEnabled(bits, scheme)) {
      const conflict = kvSharedDonorConflict(args.layer_types, args.num_kv_shared_layers);
      if (conflict) throw new UsageError(kvSharedRefusal(conflict));
      // only full-attention caches are converted (sliding layers keep RotatingKVCache)
      const d = args.global_head_dim || args.head_dim;
      if ((d & (d - 1)) !== 0) throw new UsageError(`TurboQuant on head dim ${d} (not a power of two) needs mlx-vlm's numpy-QR rotation matrix, which the generate face does not take`);
      makeKvQuantizer(cfg); // the bits as the caches will take them (the split codec is refused here)
      const [, keyBits, valueBits] = resolveKvBits(bits);
      codebookValues(d, keyBits);
      codebookValues(d, valueBits);
      return cfg;
    }
    if (args.layer_types.includes("sliding_attention") && run.prompt + run.maxTokens >= start) {
      throw new UsageError(
        `--kv-quant-scheme uniform on a model with sliding-window layers: mlx-vlm 0.7.10 raises NotImplementedError: RotatingKVCache Quantization NYI once a sliding layer's cache reaches --quantized-kv-start (${start}); use --kv-quant-scheme turboquant (sliding layers stay unquantized) or a larger --quantized-kv-start`,
      );
    }
    // the dim mlx-vlm would hand mx.quantize (sliding caches never get there)
    validateUniformGroup(bits, groupSize, args.layer_types.includes("full_attention") ? args.global_head_dim || args.head_dim : args.head_dim);
    return cfg;
  } catch (e) {
    if (e instanceof KVQuantError) throw new UsageError(e.message);
    throw e;
  }
}

// ------------------------------------------------------------------ npm run parity --kv-bits

/** A --model run of `npm run parity` as the KV-quantized comparison sees it (parity/cli.ts modelSpec). */
export interface KvQuantParitySpec {
  tsDir: string;
  oracleCheckpoint: string;
  prompt: number[];
  steps: number;
  prefillStepSize: number;
}

/**
 * `npm run parity -- --model DIR --kv-bits B ...`: checked before any oracle starts (kvQuantPlan's
 * checks, plus what the oracle's loader takes: a flat gemma4_text checkpoint with tied embeddings,
 * held by mlx-vlm's gemma4 Model). Returns the run (the port's generateStep with the quantizer
 * against mlx-vlm's generate_step(kv_bits=...), greedy, per step: token, logprobs sha256, every
 * cache's type/offset and TurboQuant state sha256 + meta_state), or null without --kv-bits.
 */
export function kvQuantParityRun(a: Parsed, spec: KvQuantParitySpec | null, text: Record<string, unknown> | null): (() => Promise<boolean>) | null {
  if (a["kv-bits"] === undefined) {
    for (const f of ["kv-quant-scheme", "kv-group-size", "quantized-kv-start"] as const) {
      if (a[f] !== undefined && a[f] !== KV_QUANT_FLAGS.find((s) => s.name === f)!.default) throw new UsageError(`--${f} needs --kv-bits`);
    }
    return null;
  }
  if (spec === null || text === null) throw new UsageError("--kv-bits needs --model (a text checkpoint) and no --mode / --video / media");
  if (a["oracle-model"] !== undefined || a.bisect) throw new UsageError("--kv-bits does not take --oracle-model or --bisect");
  if (text.model_type !== "gemma4_text" || text.tie_word_embeddings === false) {
    throw new UsageError("--kv-bits in npm run parity takes a flat gemma4_text checkpoint with tied embeddings (the KV-quantization oracle holds it in mlx-vlm's gemma4 Model)");
  }
  const cfg = kvQuantPlan(a, text, { prompt: spec.prompt.length, maxTokens: spec.steps, otherMode: null });
  if (cfg === null) return null;
  const k: KvQuantCase = {
    checkpoint: spec.tsDir,
    prompt: spec.prompt,
    maxTokens: spec.steps,
    kvBits: cfg.kvBits!,
    kvQuantScheme: cfg.kvQuantScheme === TURBOQUANT_SCHEME ? "turboquant" : "uniform",
    kvGroupSize: cfg.kvGroupSize,
    quantizedKvStart: cfg.quantizedKvStart,
    prefillStepSize: spec.prefillStepSize,
  };
  return async () => {
    const want = oracleGeneration({ ...k, checkpoint: spec.oracleCheckpoint });
    const loaded = loadModel(spec.tsDir);
    let got;
    try {
      got = await portGeneration(loaded, k);
    } finally {
      loaded.model.dispose();
    }
    const lines = kvQuantStepVerdicts(got, want);
    const c = compareGenerations(got, want);
    process.stdout.write(`KV quantization ${turboquantEnabled(k.kvBits, k.kvQuantScheme) ? "TurboQuant" : "uniform"} ${k.kvBits} bits, quantized_kv_start ${k.quantizedKvStart}: the port vs mlx-vlm's generate_step, per step\n`);
    for (const l of lines) process.stdout.write(`${l}\n`);
    process.stdout.write(
      c.firstMismatch !== null
        ? `FAIL: ${c.firstMismatch}\n`
        : c.unsupported !== null
          ? `UNSUPPORTED on ${mx.backend()}: both sides stop at the same MLX error after ${c.tokens} equal steps: ${c.unsupported}\n`
          : `PASS: ${c.tokens} steps bit-exact (tokens, logprobs, ${c.turboCaches} quantized cache(s), ${c.quantizedArrays} state arrays)\n`,
    );
    return c.firstMismatch === null;
  };
}

/** One line per step: token, logprobs and cache verdicts (and the error both sides stopped with). */
export function kvQuantStepVerdicts(port: GenerationRecord, ref: GenerationRecord): string[] {
  const out: string[] = [];
  const n = Math.max(port.steps.length, ref.steps.length);
  for (let i = 0; i < n; i++) {
    const p = port.steps[i];
    const r = ref.steps[i];
    if (!p || !r) {
      out.push(`step ${i}: ${p ? "port only" : "mlx-vlm only"}`);
      continue;
    }
    const tok = p.token === r.token ? `token ${p.token} =` : `token ${p.token} vs ${r.token} DIFFERS`;
    const lp = p.logprobs_sha256 === r.logprobs_sha256 ? "logprobs =" : "logprobs DIFFER";
    // the step's caches as compareGenerations checks them (types, offsets, TurboQuant states)
    const m = compareGenerations({ steps: [{ ...p, token: r.token, logprobs_sha256: r.logprobs_sha256 }], error: null }, { steps: [r], error: null }).firstMismatch;
    const cache = m === null ? `caches = (${r.cache.map((c) => `${c.type}@${c.offset}`).join(" ")})` : `caches DIFFER (${m.replace(/^step 0 /, "")})`;
    out.push(`step ${i}: ${tok}, ${lp}, ${cache}`);
  }
  if (port.error || ref.error) out.push(`then: port ${port.error ? `${port.error.type}: ${port.error.message}` : "no error"}; mlx-vlm ${ref.error ? `${ref.error.type}: ${ref.error.message}` : "no error"}`);
  return out;
}
