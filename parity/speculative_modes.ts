// `npm run parity -- --mode speculative|mtp`: a decoding mode against its oracle on the fixtures
// (oracle/speculative.ts does the comparing).
//   speculative   draft-model speculative decoding vs mlx-lm's speculative_generate_step inside
//                 every window, and vs plain greedy decoding at every length; mlx-lm's own
//                 divergence from greedy past the window is shown
//   mtp           MTP decoding with gemma4_assistant (and gemma4_unified_assistant) drafters vs
//                 mlx-vlm, round by round, and Gemma4ExactSpeculativeVerifier vs mlx-vlm's
//   dflash        DFlash-loop decoding with gemma4_dflash and gemma4_dspark drafters vs mlx-vlm, round by round
//                 (oracle/speculative_dflash.ts), and vs plain greedy decoding
// Writes <out>/parity-<mode>.json; the verdict is PASS when every comparison is bit-exact.
import { mkdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { type OracleClient, REPO_ROOT } from "../oracle/client.ts";
import { exactVerifyParity, ModelPool, mtpParity, speculativeParity, type TallySummary } from "../oracle/speculative.ts";
import { DrafterPool, dflashParity } from "../oracle/speculative_dflash.ts";
import * as mx from "@mlx-bun/mlx";
import type { Parsed } from "./args.ts";
import { textTable } from "./format.ts";
import { ProgressBar } from "./progress.ts";

const CK = join(REPO_ROOT, ".cache", "checkpoints");
const SP = join(CK, "speculative");
const FIXTURES = [
  ["dense", "c1_dense"],
  ["E2B-like", "c3_e2b"],
  ["MoE", "c5_moe"],
] as const;
const prompt = (P: number) => Array.from({ length: P }, (_, i) => (i * 37 + 11) % 256);

const verdict = (t: TallySummary | null): string => (t === null ? "n/a (past the window)" : t.first ? `DIVERGES at ${t.first.where}: ${t.first.detail}` : `bit-exact (${t.tensors} tensors, ${t.values} values)`);

function selected(a: Parsed): (fx: string) => boolean {
  const only = typeof a.only === "string" ? new RegExp(`^${a.only.split("*").map((s) => s.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`) : null;
  return (fx) => only === null || only.test(fx);
}

function writeReport(a: Parsed, mode: string, rows: unknown[], ok: boolean): string {
  const out = resolve(String(a.out ?? "report"));
  mkdirSync(out, { recursive: true });
  const file = join(out, `parity-${mode}.json`);
  writeFileSync(file, `${JSON.stringify({ mode, createdAt: new Date().toISOString(), ok, rows })}\n`);
  return file;
}

async function speculativeMode(oracle: OracleClient, a: Parsed): Promise<boolean> {
  const pool = new ModelPool();
  const rows: string[][] = [];
  const results = [];
  let ok = true;
  try {
    for (const [kind, fx] of FIXTURES.filter(([, f]) => selected(a)(f))) {
      const cases = [
        { label: "window 64, P=5, k=3", target: join(SP, `${fx}_w64`), draft: join(SP, `${fx}_w64_draft`), P: 5, k: 3 },
        { label: "window 8, P=9, k=2", target: join(CK, fx, "f32"), draft: join(SP, `${fx}_draft`), P: 9, k: 2 },
        { label: "window 8, P=5, k=3", target: join(CK, fx, "f32"), draft: join(SP, `${fx}_draft`), P: 5, k: 3 },
      ];
      for (const c of cases) {
        const bar = new ProgressBar(`[speculative ${fx}]`);
        bar.update(0, c.label);
        const r = await speculativeParity(oracle, pool, { target: c.target, draft: c.draft, prompt: prompt(c.P), numDraftTokens: c.k, maxTokens: 20 });
        ok &&= r.vsGreedy.first === null && (r.vsOracle === null || r.vsOracle.first === null);
        results.push(r);
        const mlx = r.oracleVsGreedy.token === null && r.oracleVsGreedy.logprobs === null ? "greedy" : `leaves greedy at token ${r.oracleVsGreedy.token ?? "-"} (logprobs ${r.oracleVsGreedy.logprobs ?? "-"})`;
        rows.push([kind, c.label, `${r.accepted}/${r.drafted}`, verdict(r.vsOracle), verdict(r.vsGreedy), mlx]);
        bar.done(`${r.vsGreedy.first ? "DIVERGES" : "bit-exact"} vs greedy`);
      }
    }
  } finally {
    pool.dispose();
  }
  process.stdout.write(`\nSpeculative decoding with a draft model (20 tokens per run)\n${textTable(["model", "run", "accepted/drafted", "TS vs mlx-lm", "TS vs greedy", "mlx-lm speculative"], rows)}\n`);
  process.stdout.write(`Report: ${writeReport(a, "speculative", results, ok)}\nVerdict: ${ok ? "PASS" : "FAIL"}\n`);
  return ok;
}

async function mtpMode(oracle: OracleClient, a: Parsed): Promise<boolean> {
  const pool = new ModelPool();
  const rows: string[][] = [];
  const vrows: string[][] = [];
  const results: unknown[] = [];
  let ok = true;
  try {
    const scenarios: { fx: string; drafter: string; P: number; N: number; sampling?: { temp: number; topK?: number; topP?: number; seed: number } }[] = [
      { fx: "c1_dense", drafter: "c1_dense_assistant", P: 3, N: 24 },
      { fx: "c1_dense", drafter: "c1_dense_assistant", P: 12, N: 40 },
      { fx: "c3_e2b", drafter: "c3_e2b_assistant", P: 9, N: 24 },
      { fx: "c3_e2b", drafter: "c3_e2b_assistant_ordered", P: 20, N: 24 },
      { fx: "c5_moe", drafter: "c5_moe_assistant", P: 3, N: 24 },
      { fx: "c1_dense", drafter: "c1_dense_unified_assistant", P: 3, N: 24 },
      // sampled (mlx_vlm.generate --temp --seed): vs greedy reads as vs plain sampled decoding, same seed
      { fx: "c1_dense", drafter: "c1_dense_unified_assistant", P: 3, N: 20, sampling: { temp: 0.1, seed: 3 } },
      { fx: "c3_e2b", drafter: "c3_e2b_assistant_ordered", P: 3, N: 20, sampling: { temp: 0.5, topP: 0.5, seed: 1 } },
    ].filter((s) => selected(a)(s.fx));
    for (const s of scenarios) {
      const bar = new ProgressBar(`[mtp ${s.drafter}]`);
      bar.update(0, `P=${s.P} N=${s.N}`);
      const r = await mtpParity(oracle, pool, { target: join(CK, s.fx, "f32"), drafter: join(SP, s.drafter), prompt: prompt(s.P), maxTokens: s.N, sampling: s.sampling });
      ok &&= r.vsOracle.first === null && r.vsGreedy.first === null;
      results.push(r);
      const samp = s.sampling ? ` temp ${s.sampling.temp}${s.sampling.topK ? ` top-k ${s.sampling.topK}` : ""}${s.sampling.topP ? ` top-p ${s.sampling.topP}` : ""} seed ${s.sampling.seed}` : "";
      rows.push([s.drafter, `P=${s.P} N=${s.N}${samp}`, `${r.rounds} (${r.acceptRounds} with accepts, ${r.rejectRounds} with rejections)`, `${r.accepted}/${r.drafted}`, verdict(r.vsOracle), r.vsGreedy.first ? "DIFFERS" : "equal"]);
      bar.done(r.vsOracle.first ? "DIVERGES" : "bit-exact");
    }
    for (const [, fx] of FIXTURES.filter(([, f]) => selected(a)(f))) {
      for (const [P, K] of [[5, 3], [12, 4]] as const) {
        const r = await exactVerifyParity(oracle, pool, join(CK, fx, "f32"), prompt(P), prompt(K).map((t) => (t * 7 + 3) % 256));
        ok &&= r.vsOracle.first === null;
        results.push({ verifier: fx, P, K, ...r });
        vrows.push([fx, `P=${P} block=${K}`, verdict(r.vsOracle), r.oracleEqualsForward ? "yes" : "no"]);
      }
    }
  } finally {
    pool.dispose();
  }
  process.stdout.write(`\nMTP speculative decoding (gemma4_assistant drafters) vs mlx-vlm 0.7.10, round by round\n${textTable(["drafter", "run", "rounds", "accepted/drafted", "TS vs mlx-vlm", "vs greedy / sampled"], rows)}\n`);
  process.stdout.write(`\nGemma4ExactSpeculativeVerifier vs mlx-vlm's\n${textTable(["model", "run", "TS vs mlx-vlm", "mlx-vlm verifier = its forward"], vrows)}\n`);
  process.stdout.write(`Report: ${writeReport(a, "mtp", results, ok)}\nVerdict: ${ok ? "PASS" : "FAIL"}\n`);
  return ok;
}

async function dflashMode(oracle: OracleClient, a: Parsed): Promise<boolean> {
  const pool = new ModelPool();
  const drafters = new DrafterPool();
  const rows: string[][] = [];
  const results: unknown[] = [];
  let ok = true;
  try {
    const scenarios: { fx: string; P: number; N: number; block?: number; kind?: string; sampling?: { temp: number; topK?: number; topP?: number; seed: number; positioned?: boolean } }[] = [
      { fx: "c1_dense", P: 3, N: 24 },
      { fx: "c1_dense", P: 12, N: 40 },
      { fx: "c1_dense", P: 5, N: 32, block: 8 },
      { fx: "c3_e2b", P: 9, N: 24 },
      { fx: "c5_moe", P: 3, N: 24 },
      { fx: "c1_dense", P: 3, N: 24, kind: "dspark" },
      { fx: "c1_dense", P: 12, N: 24, kind: "dspark" },
      { fx: "c3_e2b", P: 3, N: 24, kind: "dspark" },
      { fx: "c5_moe", P: 9, N: 24, kind: "dspark" },
      // sampled (mlx_vlm.generate --temp --seed): vs greedy reads as vs plain sampled decoding, same seed
      { fx: "c1_dense", P: 3, N: 20, sampling: { temp: 0.1, seed: 3 } },
      { fx: "c1_dense", P: 3, N: 20, sampling: { temp: 0.5, topP: 0.5, seed: 1 } },
      { fx: "c3_e2b", P: 3, N: 20, kind: "dspark", sampling: { temp: 0.3, topK: 3, seed: 7 } },
      // positioned (generate_step(seed=S): mlx-vlm's API and server): vs plain decoding keyed by position
      { fx: "c1_dense", P: 3, N: 20, sampling: { temp: 0.7, seed: 3, positioned: true } },
      { fx: "c5_moe", P: 3, N: 20, kind: "dspark", sampling: { temp: 1.0, topP: 0.9, seed: 7, positioned: true } },
    ].filter((s) => selected(a)(s.fx));
    for (const s of scenarios) {
      const drafterName = `${s.fx}_${s.kind ?? "dflash"}`;
      const bar = new ProgressBar(`[dflash ${drafterName}]`);
      bar.update(0, `P=${s.P} N=${s.N}`);
      const r = await dflashParity(oracle, pool, drafters, { target: join(CK, s.fx, "f32"), drafter: join(SP, drafterName), prompt: prompt(s.P), maxTokens: s.N, draftBlockSize: s.block, sampling: s.sampling });
      // plain greedy is a relation only where block rows equal single-token rows (the CPU backend; suites/speculative/rows.ts)
      ok &&= r.vsOracle.first === null && (mx.defaultDevice() !== "cpu" || r.vsGreedy?.first === null);
      results.push(r);
      const samp = s.sampling ? `${s.sampling.positioned ? " positioned" : ""} temp ${s.sampling.temp}${s.sampling.topK ? ` top-k ${s.sampling.topK}` : ""}${s.sampling.topP ? ` top-p ${s.sampling.topP}` : ""} seed ${s.sampling.seed}` : "";
      rows.push([drafterName, `P=${s.P} N=${s.N}${s.block ? ` block ${s.block}` : ""}${samp}`, `${r.rounds} (${r.acceptRounds} with accepts, ${r.rejectRounds} with rejections)`, `${r.accepted}/${r.drafted}`, verdict(r.vsOracle), r.vsGreedy?.first ? "DIFFERS" : "equal"]);
      bar.done(r.vsOracle.first ? "DIVERGES" : "bit-exact");
    }
  } finally {
    pool.dispose();
    drafters.dispose();
  }
  process.stdout.write(`\nDFlash-loop speculative decoding (gemma4_dflash and gemma4_dspark drafters) vs mlx-vlm 0.7.10, round by round\n${textTable(["drafter", "run", "rounds", "accepted/drafted", "TS vs mlx-vlm", "vs greedy / sampled"], rows)}\n`);
  process.stdout.write(`Report: ${writeReport(a, "dflash", results, ok)}\nVerdict: ${ok ? "PASS" : "FAIL"}\n`);
  return ok;
}

/** The --mode runners of this feature: name → run (true when every comparison is bit-exact). */
export const SPECULATIVE_MODES: Record<string, (oracle: OracleClient, a: Parsed) => Promise<boolean>> = {
  speculative: speculativeMode,
  mtp: mtpMode,
  dflash: dflashMode,
};
