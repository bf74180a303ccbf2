// `npm run bench -- --kv-bits B [--kv-quant-scheme S] [--kv-group-size G] [--quantized-kv-start N]`
// (mlx-vlm 0.7.10's flag names): the prefill/decode rows run with a quantized KV cache on both
// sides. The reference side is then mlx-vlm's generate_step(kv_bits=..., kv_quant_scheme=...,
// kv_group_size=..., quantized_kv_start=...) (bench/python/kvquant_worker.py), not mlx-lm's:
// mlx-lm's --kv-bits breaks on Gemma 4 once a sliding cache reaches quantized_kv_start. The port's
// quantized single-sequence path is bit-exact against that generate_step per step
// (suites/kvquant/parity.test.ts); the bench checks the generated tokens are equal in every pair.
// This module holds the flag checks and the labels; bench/run.ts runs the rows.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { KVQuantConfig } from "../model/cache/kv_quantize.ts";
import { fromLegacy, KVQuantError, TURBOQUANT_SCHEME, turboquantEnabled, UNIFORM_SCHEME } from "../model/kv_quant.ts";
import { type Parsed, UsageError } from "../parity/args.ts";
import { KV_QUANT_FLAGS, kvQuantPlan } from "../parity/kv_quant_flags.ts";

export { KV_QUANT_FLAGS };

export interface BenchKv {
  cfg: KVQuantConfig & { kvBits: number };
  /** e.g. "KV turboquant 3.5 bits, start 0" (the workload names carry it). */
  label: string;
}

/** The KV flags of a bench run: null without --kv-bits (the other three then must keep their defaults). */
export function benchKv(a: Parsed): BenchKv | null {
  if (a["kv-bits"] === undefined) {
    for (const f of KV_QUANT_FLAGS) {
      if (f.name !== "kv-bits" && a[f.name] !== f.default) throw new UsageError(`--${f.name} needs --kv-bits`);
    }
    return null;
  }
  const bits = Number(a["kv-bits"]);
  const scheme = String(a["kv-quant-scheme"]);
  const groupSize = Number(a["kv-group-size"]);
  const start = Number(a["quantized-kv-start"]);
  // the checks that need no checkpoint (kvQuantPlan's first ones; the rest per workload)
  if (scheme !== UNIFORM_SCHEME && scheme !== TURBOQUANT_SCHEME) throw new UsageError(`argument --kv-quant-scheme: invalid choice: '${scheme}' (choose from 'uniform', 'turboquant')`);
  if (!Number.isSafeInteger(start) || start < 0) throw new UsageError("--quantized-kv-start must be a non-negative integer");
  try {
    fromLegacy({ kvBits: bits, kvQuantScheme: scheme, kvGroupSize: groupSize });
  } catch (e) {
    if (e instanceof KVQuantError) throw new UsageError(e.message);
    throw e;
  }
  const turbo = turboquantEnabled(bits, scheme);
  const label = `KV ${turbo ? "turboquant" : "uniform"} ${bits} bits${turbo ? "" : ` g${groupSize}`}, start ${start}`;
  return { cfg: { kvBits: bits, kvQuantScheme: scheme, kvGroupSize: groupSize, quantizedKvStart: start }, label };
}

/** The name of a workload's quantized rows: "tiny-dense (KV turboquant 3.5 bits, start 0)". */
export const kvWorkloadName = (name: string, kv: BenchKv) => `${name} (${kv.label})`;

/** The base workload of a row's name (for ordering). */
export const baseWorkload = (name: string) => name.split(" (")[0]!;

/**
 * `npm run generate`'s checks of the flags against one workload's checkpoint (the longest run
 * it makes): uniform refused where a sliding cache reaches the start (mlx-vlm's NYI), the group
 * size against the full-attention head dim, TurboQuant's head dim, bits and KV-shared donors.
 */
export function checkKvWorkload(kv: BenchKv, dir: string, promptLens: readonly number[], decode: number): void {
  const p = join(dir, "config.json");
  if (!existsSync(p)) return; // built later: checked again once built
  const text = JSON.parse(readFileSync(p, "utf8")) as Record<string, unknown>;
  const a: Parsed = { "kv-bits": kv.cfg.kvBits, "kv-quant-scheme": kv.cfg.kvQuantScheme!, "kv-group-size": kv.cfg.kvGroupSize!, "quantized-kv-start": kv.cfg.quantizedKvStart };
  try {
    kvQuantPlan(a, (text.text_config as Record<string, unknown> | undefined) ?? text, { prompt: Math.max(...promptLens), maxTokens: decode, otherMode: null });
    // rows labelled with a scheme must measure it: a run that never reaches the start converts nothing
    // (the first prompt runs `decode` tokens, the others 2)
    const longest = Math.max(...promptLens.map((p, k) => p + (k === 0 ? decode : 2)));
    if (longest < kv.cfg.quantizedKvStart) {
      throw new UsageError(`--quantized-kv-start ${kv.cfg.quantizedKvStart}: the workload's runs (at most ${longest} tokens) never reach it, so nothing would be quantized; give a smaller --quantized-kv-start (with uniform on a layout with sliding layers, mlx-vlm's single-sequence generate_step then stops with RotatingKVCache Quantization NYI: use --kv-quant-scheme turboquant)`);
    }
  } catch (e) {
    if (e instanceof UsageError) throw new UsageError(`${dir.split("/").slice(-2).join("/")}: ${e.message}`);
    throw e;
  }
}

/** The mlx-vlm worker's generate request with the KV flags. */
export function kvRequest(kv: BenchKv): Record<string, unknown> {
  return { kv_bits: kv.cfg.kvBits, kv_quant_scheme: kv.cfg.kvQuantScheme, kv_group_size: kv.cfg.kvGroupSize, quantized_kv_start: kv.cfg.quantizedKvStart };
}
