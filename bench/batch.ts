// `npm run bench:batch`: batched decode throughput, TS (model/generate_batch.ts) against mlx-lm's
// batch_generate on the same libmlx (CPU), for batch sizes 1, 4 and 8 on the tiny fixtures.
//
// Every row alternates the sides (TS, mlx-lm, TS, mlx-lm, ...) after one warm-up each. Both sides
// report their own BatchStats: generation tok/s = generated tokens (all sequences) / (wall time -
// prompt time), as mlx-lm's `[batch_generate] Generation` line. The batch is B prompts of the same
// length, greedy, no EOS, so every sequence generates max_tokens tokens; the generated tokens of
// the two sides are compared too. Results: bench/BATCH.md and bench/batch_results.json.
import * as mx from "@mlx-bun/mlx";
import { renameSync, writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { join } from "node:path";
import { helpText, parseArgs, UsageError, type FlagSpec } from "../parity/args.ts";
import { batchGenerate, batchModel } from "../model/generate_batch.ts";
import { loadModel } from "../model/gemma4/index.ts";
import { PyWorker } from "./py_worker.ts";

const ROOT = join(import.meta.dir, "..");

export const FLAGS: FlagSpec[] = [
  { name: "pairs", kind: "int", help: "measured TS/mlx-lm pairs per row (after one warm-up each)", default: 5 },
  { name: "batch-sizes", kind: "string", valueName: "list", help: "comma-separated batch sizes", default: "1,4,8" },
  { name: "prompt-tokens", kind: "int", help: "tokens per prompt", default: 32 },
  { name: "max-tokens", kind: "int", help: "tokens generated per sequence", default: 64 },
  { name: "help", kind: "bool", help: "show this help" },
];

const FIXTURES: [string, string, string][] = [
  ["tiny-dense", "c1_dense/bf16", "fixture C1 (dense, 6 layers, H=64), bfloat16"],
  ["tiny-e2b", "c3_e2b/q4g32", "fixture C3 (E2B-like, PLE + KV sharing), 4-bit g32"],
  ["tiny-moe", "c5_moe/q4g32", "fixture C5 (MoE, k_eq_v), 4-bit g32"],
];

interface Sample {
  generation_tps: number;
  peak_memory: number;
  tokens: number[][];
}


/** B prompts of fixed pseudo-random ids (an LCG per prompt), the same on both sides. */
function prompts(B: number, n: number, vocab: number): number[][] {
  return Array.from({ length: B }, (_, b) => {
    let s = 12345 + 7919 * b;
    return Array.from({ length: n }, () => {
      s = (s * 1103515245 + 12345) % 2147483648;
      return 2 + (s % (vocab - 2));
    });
  });
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const span = (xs: number[], d: number) => `${median(xs).toFixed(d)} (${Math.min(...xs).toFixed(d)}–${Math.max(...xs).toFixed(d)})`;

interface Row {
  workload: string;
  batch: number;
  ts: number[];
  mlxLm: number[];
  ratios: number[];
  sameTokens: boolean;
}

/** Every check before work starts (the fuzz command table calls it); null for --help. */
export function benchBatchPlan(argv: readonly string[]): { pairs: number; sizes: number[]; plen: number; maxTokens: number } | null {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  const pairs = Number(a.pairs);
  const sizes = String(a["batch-sizes"]).split(",").map(Number);
  if (pairs < 1 || sizes.some((b) => !Number.isInteger(b) || b < 1 || b > 256)) throw new UsageError("--pairs and --batch-sizes need positive integers (batch sizes up to 256)");
  const [plen, maxTokens] = [Number(a["prompt-tokens"]), Number(a["max-tokens"])];
  if (plen < 2 || maxTokens < 2) throw new UsageError("--prompt-tokens and --max-tokens must be at least 2");
  if (plen + maxTokens > 4096) throw new UsageError("--prompt-tokens plus --max-tokens exceeds the fixtures' max_position_embeddings (4096)");
  return { pairs, sizes, plen, maxTokens };
}

async function main(): Promise<void> {
  const plan = benchBatchPlan(process.argv.slice(2));
  if (plan === null) {
    process.stdout.write(helpText("npm run bench:batch -- [options]", "Batched decode throughput, TS vs mlx-lm's batch_generate, alternating the sides.", FLAGS));
    return;
  }
  const { pairs, sizes, plen, maxTokens } = plan;
  const py = new PyWorker("batch_worker.py", "mlx-lm batch worker");
  const rows: Row[] = [];
  const started = new Date().toISOString();
  const noEos = { eosTokenIds: [], decode: () => "" };
  try {
    for (const [name, id] of FIXTURES) {
      const dir = join(ROOT, ".cache", "checkpoints", id);
      await py.call({ cmd: "load", path: dir });
      const loaded = loadModel(dir);
      const m = batchModel(loaded);
      const run = async (side: "ts" | "py", ps: number[][]): Promise<Sample> => {
        if (side === "py") return py.call<Sample>({ cmd: "batch", prompts: ps, max_tokens: maxTokens, prefill_step_size: 2048 });
        mx.clearCache();
        mx.resetPeakMemory();
        const r = batchGenerate(m, noEos, ps, { maxTokens });
        return { generation_tps: r.stats.generationTps, peak_memory: mx.getPeakMemory(), tokens: r.tokenIds };
      };
      for (const B of sizes) {
        const ps = prompts(B, plen, loaded.text.args.vocab_size);
        await run("ts", ps);
        await run("py", ps);
        const ts: Sample[] = [];
        const pys: Sample[] = [];
        for (let i = 0; i < pairs; i++) {
          console.error(`[bench:batch] ${name}: batch ${B}, pair ${i + 1}/${pairs}`);
          ts.push(await run("ts", ps));
          pys.push(await run("py", ps));
        }
        const t = ts.map((s) => s.generation_tps);
        const p = pys.map((s) => s.generation_tps);
        rows.push({ workload: name, batch: B, ts: t, mlxLm: p, ratios: t.map((x, i) => x / p[i]!), sameTokens: JSON.stringify(ts[0]!.tokens) === JSON.stringify(pys[0]!.tokens) });
      }
      loaded.model.dispose();
      mx.clearCache();
    }
  } finally {
    py.close();
  }
  const meta = {
    date: started,
    machine: `${cpus()[0]?.model ?? "unknown CPU"}, ${cpus().length} cores, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, ${process.platform}-${process.arch}`,
    versions: `libmlx ${mx.version()}, bun ${Bun.version}`,
    workload: `${plen}-token prompts, ${maxTokens} generated tokens per sequence, greedy, no EOS, CPU; ${pairs} pairs per row`,
  };
  const out = ["# Batched decode: TypeScript (Bun) vs mlx-lm's batch_generate on the same libmlx", ""];
  for (const [k, v] of Object.entries(meta)) out.push(`- **${k}**: ${v}`);
  out.push("", "Generation tok/s is each side's own BatchStats (generated tokens of all sequences / (wall - prompt time)), as mlx-lm's `[batch_generate] Generation` line. Pairs alternate the sides after one warm-up each; ratio = TS / mlx-lm per pair (higher is better).", "");
  out.push("| workload | batch | TS tok/s median (min–max) | mlx-lm tok/s median (min–max) | ratio TS/mlx-lm median (min–max) | per-pair ratios | same tokens |", "|---|---|---|---|---|---|---|");
  for (const r of rows) out.push(`| ${r.workload} | ${r.batch} | ${span(r.ts, 1)} | ${span(r.mlxLm, 1)} | **${median(r.ratios).toFixed(3)}** (${Math.min(...r.ratios).toFixed(3)}–${Math.max(...r.ratios).toFixed(3)}) | ${r.ratios.map((x) => x.toFixed(2)).join(" ")} | ${r.sameTokens ? "yes" : "**no**"} |`);
  out.push("", "Workloads: " + FIXTURES.map(([n, , what]) => `**${n}** ${what}`).join("; ") + ".", "");
  const md = out.join("\n");
  for (const [f, text] of [["batch_results.json", `${JSON.stringify({ meta, rows }, null, 2)}\n`], ["BATCH.md", md]] as const) {
    writeFileSync(join(ROOT, "bench", `${f}.tmp`), text);
    renameSync(join(ROOT, "bench", `${f}.tmp`), join(ROOT, "bench", f));
  }
  process.stdout.write(md);
}

if (import.meta.main) {
  main().catch((e) => {
    console.error(e instanceof UsageError ? `error: ${e.message}` : e);
    process.exit(e instanceof UsageError ? 2 : 1);
  });
}
