// `bun run serve/prefix_ttft.ts --model DIR [--tokenizer DIR] [--shared N] [--suffix N] [--pairs N]`:
// time to first token with and without chunk-boundary snapshots (--prompt-cache-snapshots), on a
// prompt longer than the model's sliding window, through the server's own engine (serve/engine.ts:
// BatchGenerator, the prompt cache, the scheduling loop; no HTTP, which costs the same for both).
// Two engines on one loaded model, both with mlx_lm.server's default prompt cache (LRU, 10
// entries): "mlx-lm reuse" (no snapshots, i.e. what mlx_lm.server can reuse) and "snapshots"
// (--prompt-cache-snapshots 64). Each first serves a warm-up prompt (a shared prefix of --shared
// tokens + a distinct tail), then --pairs requests that share the prefix and differ after it, one
// at a time, alternating which engine goes first in each pair. The LRU entries of earlier
// requests (their segment end and their end) are not prefixes of a new request, and past the
// window they cannot be trimmed back, so without snapshots every request is prefilled in full.
// The two engines' responses must be equal bit for bit (the equivalence of serve/prefix_cache.ts:
// the snapshot sits at a chunk end of the fresh run): tokens and logprobs are compared and a
// difference is exit 1. Output: a Markdown section (stdout) and, with --out, JSON.
// Exit codes: 0 ok, 1 the two engines' responses differ, 2 bad usage or input.
import { readFileSync, writeFileSync } from "node:fs";
import { cpus, loadavg, totalmem } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { batchModel } from "../model/generate_batch.ts";
import { loadGenerationModel } from "../model/runtime.ts";
import { REPO_ROOT } from "../oracle/client.ts";
import { type FlagSpec, helpText, parseArgs, runMain, UsageError } from "../parity/args.ts";
import { applyDeviceFlag, DEVICE_FLAG } from "../parity/device.ts";
import { inspectCheckpoint } from "../parity/inputs.ts";
import { Engine } from "./engine.ts";
import { PrefixReuse } from "./prefix_cache.ts";
import { makeStopSequences } from "./text_state.ts";
import { loadServedTokenizer } from "./tokenizer.ts";

const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "the checkpoint (required)" },
  { name: "tokenizer", kind: "string", valueName: "dir", help: "where tokenizer.json is (default: the model's folder, else the tokenizer fixture)" },
  { name: "shared", kind: "int", valueName: "N", help: "tokens of the shared prefix (a multiple of --prefill-step-size puts the snapshot right at it)", default: 4096 },
  { name: "suffix", kind: "int", valueName: "N", help: "distinct tokens after the prefix in each request", default: 16 },
  { name: "pairs", kind: "int", valueName: "N", help: "measured requests per engine", default: 4 },
  { name: "max-tokens", kind: "int", valueName: "N", help: "tokens generated per request", default: 4 },
  { name: "prefill-step-size", kind: "int", valueName: "N", help: "as the server's flag", default: 2048 },
  { name: "out", kind: "string", valueName: "file", help: "write the measurements as JSON here" },
  DEVICE_FLAG,
  { name: "help", kind: "bool", help: "show this help" },
];

interface Served {
  ttftMs: number;
  totalMs: number;
  cached: number;
  tokens: number[];
  logprobs: number[];
}

/** ", N-bit" for a quantized checkpoint (config.json's quantization), else "". */
function quantBits(dir: string): string {
  const q = (JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as { quantization?: { bits?: number } }).quantization;
  return q?.bits ? `, ${q.bits}-bit` : "";
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

async function serve(e: Engine, prompt: number[], maxTokens: number): Promise<Served> {
  let cached = -1;
  const tokens: number[] = [];
  const logprobs: number[] = [];
  const t0 = performance.now();
  let first = 0;
  for await (const r of e.run({ prompt, maxTokens, sampler: { temp: 0 }, seed: null, topLogprobs: 0, stop: makeStopSequences([], [], () => []), cancelled: () => false, onCached: (n) => void (cached = n) })) {
    if (tokens.length === 0) first = performance.now();
    tokens.push(r.token);
    logprobs.push(r.logprob);
  }
  return { ttftMs: first - t0, totalMs: performance.now() - t0, cached, tokens, logprobs };
}

async function main(argv: string[]): Promise<number> {
  const a = parseArgs(argv, FLAGS);
  if (a.help) {
    process.stdout.write(helpText("bun run serve/prefix_ttft.ts --model <dir> [options]", "Time to first token with and without prefix snapshots, through the server's engine.", FLAGS));
    return 0;
  }
  if (typeof a.model !== "string") throw new UsageError("--model <dir> is required");
  const dev = applyDeviceFlag(a.device);
  const info = inspectCheckpoint(a.model);
  const [shared, suffix, pairs, maxTokens, step] = (["shared", "suffix", "pairs", "max-tokens", "prefill-step-size"] as const).map((k) => {
    const v = Number(a[k]);
    if (!Number.isSafeInteger(v) || v < 1) throw new UsageError(`--${k} must be an integer >= 1, got ${a[k]}`);
    return v;
  }) as [number, number, number, number, number];
  const vocab = Number(info.text.vocab_size ?? 262144);
  const window = Number(info.text.sliding_window ?? 0);
  if (shared + suffix <= window) throw new UsageError(`the prompt (${shared + suffix} tokens) must be longer than the sliding window (${window})`);
  let tokenizer;
  try {
    tokenizer = await loadServedTokenizer(typeof a.tokenizer === "string" ? a.tokenizer : a.model);
  } catch {
    tokenizer = await loadServedTokenizer(join(REPO_ROOT, ".cache", "tokenizer-fixture"));
  }
  const { loaded, model } = loadGenerationModel(a.model);
  const bm = { ...batchModel(loaded), maxPositions: undefined };
  // deterministic token ids inside the vocabulary, away from the special ids at its start
  const ids = (seed: number, n: number) => Array.from({ length: n }, (_, i) => 100 + ((seed * 7919 + i * 104729) % (vocab - 200)));
  const prefix = [2, ...ids(1, shared - 1)];
  const request = (k: number) => [...prefix, ...ids(1000 + k, suffix)];
  const make = (snapshots: number) => {
    const reuse = new PrefixReuse({ size: 10, bytes: null, snapshots });
    return { reuse, engine: new Engine(model, bm, tokenizer, { prefillStepSize: step, prefillBatchSize: 8, completionBatchSize: 32, recordSchedule: null, prefix: reuse }) };
  };
  const arms = { plain: make(0), snap: make(64) };
  const rows: { pair: number; order: string; plain: Served; snap: Served }[] = [];
  let differ = 0;
  try {
    // warm-up: the first request of each fills its caches (and its compiled kernels)
    const warm = { plain: await serve(arms.plain.engine, request(0), maxTokens), snap: await serve(arms.snap.engine, request(0), maxTokens) };
    process.stderr.write(`warm-up: ttft ${warm.plain.ttftMs.toFixed(0)} / ${warm.snap.ttftMs.toFixed(0)} ms\n`);
    for (let p = 1; p <= pairs; p++) {
      const order: ("plain" | "snap")[] = p % 2 ? ["plain", "snap"] : ["snap", "plain"];
      const got: Partial<Record<"plain" | "snap", Served>> = {};
      for (const arm of order) got[arm] = await serve(arms[arm].engine, request(p), maxTokens);
      const [x, y] = [got.plain!, got.snap!];
      const same = x.tokens.length === y.tokens.length && x.tokens.every((t, i) => t === y.tokens[i] && Object.is(x.logprobs[i], y.logprobs[i]));
      if (!same) differ++;
      rows.push({ pair: p, order: order.join(" then "), plain: x, snap: y });
      process.stderr.write(`pair ${p} (${order.join(" then ")}): ttft ${x.ttftMs.toFixed(0)} ms (cached ${x.cached}) vs ${y.ttftMs.toFixed(0)} ms (cached ${y.cached}), same ${same}\n`);
    }
    const stats = { plain: arms.plain.reuse.stats(), snap: arms.snap.reuse.stats() };
    const mp = median(rows.map((r) => r.plain.ttftMs));
    const ms = median(rows.map((r) => r.snap.ttftMs));
    const what = `${info.text.num_hidden_layers} layers, hidden ${info.text.hidden_size}, sliding window ${window}, vocabulary ${vocab}${quantBits(a.model)}`;
    const md = [
      `- **date**: ${new Date().toISOString()}`,
      `- **machine**: ${cpus()[0]?.model.split(" ").slice(0, 2).join(" ") ?? "?"}, ${cpus().length} cores, ${Math.round(totalmem() / 2 ** 30)} GiB, ${process.platform}-${process.arch}; device ${dev.device}; load avg ${loadavg()[0]!.toFixed(1)} at the end`,
      `- **model**: ${what}`,
      `- **requests**: shared prefix ${shared} tokens + ${suffix} distinct tokens (prompt ${shared + suffix}), prefill step ${step}, greedy, ${maxTokens} tokens; one warm-up request per engine, then ${pairs} pairs alternating which engine goes first`,
      "",
      "| pair | order | TTFT mlx-lm reuse (ms) | cached | TTFT snapshots (ms) | cached | saved | same tokens and logprobs |",
      "|---|---|---|---|---|---|---|---|",
      ...rows.map((r) => `| ${r.pair} | ${r.order.replace("plain", "mlx-lm").replace("snap", "snapshots")} | ${r.plain.ttftMs.toFixed(0)} | ${r.plain.cached} | ${r.snap.ttftMs.toFixed(0)} | ${r.snap.cached} | ${(r.plain.ttftMs / r.snap.ttftMs).toFixed(1)}x | ${r.plain.tokens.every((t, i) => t === r.snap.tokens[i] && Object.is(r.plain.logprobs[i], r.snap.logprobs[i])) ? "yes" : "NO"} |`),
      "",
      `Median TTFT: **${mp.toFixed(0)} ms** without snapshots (mlx-lm's reuse finds nothing), **${ms.toFixed(0)} ms** with them (**${(mp / ms).toFixed(1)}x**). Snapshot engine: ${stats.snap.snapshotsTaken} snapshots taken, ${stats.snap.snapshotHits} hits, ${stats.snap.snapshotBytes} bytes kept; LRU hits ${stats.plain.lruHits} (mlx-lm reuse) / ${stats.snap.lruHits} (snapshots engine).`,
    ].join("\n");
    process.stdout.write(`${md}\n`);
    if (typeof a.out === "string") writeFileSync(a.out, JSON.stringify({ rows: rows.map((r) => ({ pair: r.pair, order: r.order, plain: { ...r.plain }, snap: { ...r.snap } })), stats, medians: { plain: mp, snap: ms }, differ }, null, 1));
  } finally {
    arms.plain.engine.close();
    arms.snap.engine.close();
    mx.clearCache();
  }
  if (differ > 0) {
    process.stderr.write(`prefix_ttft: ${differ} pair(s) differ between the engines\n`);
    return 1;
  }
  return 0;
}

if (import.meta.main) runMain(main);
