// Bytes of weights one decode token reads, for the roofline fraction of the benchmarks: every
// parameter of the checkpoint once (the tied embedding twice over is not counted: the lookup reads
// one row, the lm_head reads it all), except the per-layer-input embedding (one row per token)
// and, for MoE layers, the experts not routed to (top_k of num_experts are read).
import { closeSync, openSync, readdirSync, readFileSync, readSync } from "node:fs";
import { join } from "node:path";

interface Header {
  [name: string]: { dtype: string; shape: number[]; data_offsets: [number, number] } | Record<string, string>;
}

function tensorBytes(dir: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".safetensors"))) {
    // the header only: a full-width shard is gigabytes
    const fd = openSync(join(dir, f), "r");
    let header: Header;
    try {
      const len = Buffer.alloc(8);
      readSync(fd, len, 0, 8, 0);
      const head = Buffer.alloc(Number(len.readBigUInt64LE(0)));
      readSync(fd, head, 0, head.length, 8);
      header = JSON.parse(head.toString("utf8")) as Header;
    } finally {
      closeSync(fd);
    }
    for (const [k, v] of Object.entries(header)) {
      if (k === "__metadata__" || !("data_offsets" in v)) continue;
      const [a, b] = v.data_offsets as [number, number];
      out.set(k, b - a);
    }
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
