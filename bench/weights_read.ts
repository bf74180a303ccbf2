// Bytes of weights one decode token reads, for the roofline fraction of the benchmarks: every
// parameter of the checkpoint once (the tied embedding twice over is not counted: the lookup reads
// one row, the lm_head reads it all), except the per-layer-input embedding (one row per token)
// and, for MoE layers, the experts not routed to (top_k of num_experts are read).
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { checkSafetensors } from "../model/gemma4/weights.ts";

function tensorBytes(dir: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".safetensors"))) {
    // the header only: a full-width shard is gigabytes
    for (const [k, v] of Object.entries(checkSafetensors(join(dir, f)))) out.set(k, v.data_offsets[1] - v.data_offsets[0]);
  }
  return out;
}

export interface BytesPerToken {
  total: number;
  perToken: number;
}

export function decodeBytesPerToken(dir: string): BytesPerToken {
  const cfg = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  const text = (cfg.text_config ?? cfg) as Record<string, unknown>;
  const experts = Number(text.num_experts ?? 0);
  const topK = Number(text.top_k_experts ?? 0);
  let total = 0;
  let perToken = 0;
  for (const [k, b] of tensorBytes(dir)) {
    total += b;
    if (k.includes("embed_tokens_per_layer")) continue; // one row per token
    if (experts && /\.experts\.switch_glu\./.test(k)) perToken += (b * topK) / experts;
    else perToken += b;
  }
  return { total, perToken };
}
