// The `media` command of the oracle server: mlx-vlm's own preprocessing (oracle/python/media.py)
// called with plain values and .npy records, answering records.

import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { OracleClient } from "./client.ts";
import { type NpyRecord, toNpy } from "./npy.ts";

export type MediaFn = "decode_image" | "image" | "pil_resize" | "target_sizes" | "load_audio" | "audio" | "prepare" | "processor_info" | "rfft" | "tables"
  // the video path (oracle/python/video_media.py)
  | "video_load" | "video_process" | "video_expand" | "video_forward" | "video_generate" | "video_prepare" | "make_video_variant"
  // the gemma4_unified processor (oracle/python/unified_media.py)
  | "unified_image" | "unified_audio" | "unified_processor_config" | "unified_embed" | "unified_video" | "unified_video_processor_config" | "unified_prepare_video";

function isRef(v: unknown): v is { npy: string; dtype: string; shape: number[] } {
  return typeof v === "object" && v !== null && typeof (v as { npy?: unknown }).npy === "string";
}

function isRecord(v: unknown): v is NpyRecord {
  return typeof v === "object" && v !== null && (v as NpyRecord).data instanceof Uint8Array && Array.isArray((v as NpyRecord).shape);
}

/** Run one media function; array results come back as NpyRecords (their files deleted). */
export async function oracleMedia(o: OracleClient, fn: MediaFn, args: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
  const dir = mkdtempSync(join(tmpdir(), "oracle-media-"));
  try {
    const sent: Record<string, unknown> = {};
    let i = 0;
    for (const [k, v] of Object.entries(args)) {
      if (isRecord(v)) {
        const p = join(dir, `in-${i++}.npy`);
        writeFileSync(p, toNpy(v));
        sent[k] = { npy: p, dtype: v.dtype };
      } else sent[k] = v;
    }
    const reply = await o.request<Record<string, unknown>>("media", { fn, args: sent });
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(reply)) out[k] = isRef(v) ? o.readArray(v as Parameters<OracleClient["readArray"]>[0]) : v;
    return out;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
