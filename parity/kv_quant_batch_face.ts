// `npm run parity -- --model DIR --kv-batch-tokens "1,2,3;4,5" --kv-bits B [...]`: a batch of
// prompts through mlx-vlm 0.7.10's batch path with quantized KV caches (model/generate_batch_vlm.ts
// against mlx-vlm's own BatchGenerator, oracle/kv_quant_batch.ts), a verdict per next() call
// (logprobs, responses, every batch cache's state) and PASS/FAIL (exit 0/1; UNSUPPORTED on <backend>, exit 0,
// where both sides stop at the same MLX error after equal calls). Checked before any
// oracle starts, each bad input one UsageError (exit 2): the flags of kv_quant_flags.ts with the
// batch path's rule (uniform runs on sliding shapes here; TurboQuant and uniform quantize from the
// first token, so a group size that does not divide the full-attention head dim is refused at
// once), the prompts (token ids inside the vocabulary), a flat gemma4_text checkpoint with tied
// embeddings (what the oracle's loader takes), a quantized donor read by KV-shared layers.
import * as mx from "@mlx-bun/mlx";
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { loadModel } from "../model/gemma4/index.ts";
import { compareBatchGenerations, type BatchGenerationRecord, type KvQuantBatchCase, oracleBatchGenerations, portBatchGeneration } from "../oracle/kv_quant_batch.ts";
import { type FlagSpec, type Parsed, UsageError } from "./args.ts";
import { checkKvBatchFlags } from "./kv_quant_batch_generate.ts";

export const KV_BATCH_FLAG: FlagSpec = {
  name: "kv-batch-tokens",
  kind: "string",
  valueName: "1,2;3,4",
  help: "with --model and --kv-bits: a batch of prompts (token ids, ';' between prompts) through mlx-vlm's batch path (BatchGenerator) instead of generate_step; --steps tokens each",
};

function parsePrompts(v: string, vocab: number): number[][] {
  const prompts = v.split(";").map((p, i) => {
    const ids = p.split(",").map((t) => t.trim());
    if (ids.length === 0 || ids.some((t) => !/^\d+$/.test(t))) throw new UsageError(`--kv-batch-tokens: prompt ${i + 1} must be comma-separated token ids, got '${p}'`);
    return ids.map(Number);
  });
  const bad = prompts.flat().find((t) => t >= vocab);
  if (bad !== undefined) throw new UsageError(`token id ${bad} is outside the vocabulary (vocab_size ${vocab})`);
  return prompts;
}

/** The batch run of `npm run parity`, or null without --kv-batch-tokens. */
export function kvQuantBatchParityRun(a: Parsed): (() => Promise<boolean>) | null {
  if (a["kv-batch-tokens"] === undefined) return null;
  if (a.model === undefined) throw new UsageError("--kv-batch-tokens needs --model");
  if (a["kv-bits"] === undefined) throw new UsageError("--kv-batch-tokens needs --kv-bits (the batch path compared is the quantized one)");
  for (const f of ["prompt", "tokens", "chat", "image", "audio", "video", "oracle-model", "bisect", "mode"]) if (a[f] !== undefined && a[f] !== false) throw new UsageError(`--kv-batch-tokens does not take --${f}`);
  const dir = resolve(String(a.model));
  const cfgPath = join(dir, "config.json");
  if (!existsSync(cfgPath)) throw new UsageError(`${dir} has no config.json`);
  const text = JSON.parse(readFileSync(cfgPath, "utf8")) as Record<string, unknown>;
  if (text.model_type !== "gemma4_text" || text.tie_word_embeddings === false) {
    throw new UsageError("--kv-batch-tokens takes a flat gemma4_text checkpoint with tied embeddings (the KV-quantization oracle holds it in mlx-vlm's gemma4 Model)");
  }
  const prompts = parsePrompts(String(a["kv-batch-tokens"]), Number(text.vocab_size ?? 262144));
  const steps = Number(a.steps);
  const prefill = Number(a["prefill-step-size"]);
  if (!(steps >= 1)) throw new UsageError("--steps must be at least 1");
  if (!(prefill >= 1)) throw new UsageError("--prefill-step-size must be at least 1");
  // the same checks as `npm run generate` with several prompts and --kv-bits (one error each)
  const { kv } = checkKvBatchFlags(a, text);
  const k: KvQuantBatchCase = {
    checkpoint: dir,
    prompts,
    maxTokens: prompts.map(() => steps),
    ...kv,
    prefillStepSize: prefill,
  };
  return async () => {
    const [want] = oracleBatchGenerations([k]);
    const loaded = loadModel(dir);
    let got: BatchGenerationRecord;
    try {
      got = portBatchGeneration(loaded, k);
    } finally {
      loaded.model.dispose();
    }
    const c = compareBatchGenerations(got, want!);
    process.stdout.write(`KV quantization ${k.kvQuantScheme === "turboquant" ? "TurboQuant" : "uniform"} ${k.kvBits} bits, ${prompts.length} prompts through mlx-vlm's batch path: the port vs mlx-vlm's BatchGenerator, per next() call\n`);
    for (const l of batchCallVerdicts(got, want!)) process.stdout.write(`${l}\n`);
    process.stdout.write(
      c.firstMismatch !== null
        ? `FAIL: ${c.firstMismatch}\n`
        : c.unsupported !== null
          ? `UNSUPPORTED on ${mx.backend()}: both sides stop at the same MLX error after ${c.calls} equal calls: ${c.unsupported}\n`
          : `PASS: ${c.calls} calls, ${c.tokens} tokens bit-exact (logprobs, responses, ${c.quantizedCaches} quantized cache(s), ${c.quantizedArrays} state arrays)\n`,
    );
    return c.firstMismatch === null;
  };
}

/** One line per next() call: what it did and whether logprobs, responses and caches are equal. */
export function batchCallVerdicts(port: BatchGenerationRecord, ref: BatchGenerationRecord): string[] {
  const out: string[] = [];
  const n = Math.max(port.calls.length, ref.calls.length);
  for (let i = 0; i < n; i++) {
    const p = port.calls[i];
    const r = ref.calls[i];
    if (!p || !r) {
      out.push(`call ${i}: ${p ? "port only" : "mlx-vlm only"}`);
      continue;
    }
    const one = compareBatchGenerations({ calls: [p], error: null }, { calls: [r], error: null }).firstMismatch;
    const toks = r.responses.map((x) => `${x.uid}:${x.token}${x.finish ? ` (${x.finish})` : ""}`).join(" ");
    out.push(`call ${i}: ${r.responses.length ? `tokens ${toks}` : "prefill"}, ${one === null ? "equal" : `DIFFERS (${one.replace(/^call 0: /, "")})`}`);
  }
  if (port.error || ref.error) out.push(`then: port ${port.error ? `${port.error.type}: ${port.error.message}` : "no error"}; mlx-vlm ${ref.error ? `${ref.error.type}: ${ref.error.message}` : "no error"}`);
  return out;
}
