// Speculative decoding with a draft model (model/generate_speculative.ts) against mlx-lm's
// speculative_generate_step and against plain greedy generate_step, on the dense, E2B-like and
// MoE fixtures (oracle/speculative.ts speculativeParity):
//   - inside every cache's window (the *_w64 copies): bit-exact with mlx-lm: tokens, logprobs,
//     from_draft flags, and the target's and the draft's caches after the run;
//   - at every length, past the window too: bit-exact with plain greedy decoding (tokens and
//     logprobs), where mlx-lm's own output leaves greedy (shown by mlxlm_divergence.py below).
// SPEC_FULL=1 runs a larger grid (prompt lengths x draft lengths).
import { afterAll, describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { join } from "node:path";
import { ROWS_INVARIANT } from "./rows.ts";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { ModelPool, type SpeculativeResult, speculativeParity } from "../../oracle/speculative.ts";
import { limit } from "../../tests/time_limit.ts";

const CK = join(REPO_ROOT, ".cache", "checkpoints");
const SP = join(CK, "speculative");
const FULL = process.env.SPEC_FULL === "1";
const pool = new ModelPool();
afterAll(() => pool.dispose());

const prompt = (P: number, salt = 0) => Array.from({ length: P }, (_, i) => (i * 37 + 11 + salt * 101) % 256);

const FIXTURES = [
  { kind: "dense", fx: "c1_dense" },
  { kind: "E2B-like", fx: "c3_e2b" },
  { kind: "MoE", fx: "c5_moe" },
];

interface Case {
  label: string;
  target: string;
  draft: string;
  P: number;
  k: number;
  N: number;
}

function cases(fx: string): Case[] {
  const inside = (P: number, k: number, N: number): Case => ({ label: `inside the window: P=${P} k=${k} N=${N}`, target: join(SP, `${fx}_w64`), draft: join(SP, `${fx}_w64_draft`), P, k, N });
  const past = (P: number, k: number, N: number): Case => ({ label: `window 8: P=${P} k=${k} N=${N}`, target: join(CK, fx, "f32"), draft: join(SP, `${fx}_draft`), P, k, N });
  if (!FULL) return [inside(5, 3, 12), past(9, 2, 12)];
  const out: Case[] = [];
  for (const k of [1, 2, 3, 5]) {
    for (const P of [1, 5, 12]) out.push(inside(P, k, 24));
    for (const P of [1, 3, 7, 8, 9, 20]) out.push(past(P, k, 24));
  }
  return out;
}


const results: SpeculativeResult[] = [];
afterAll(() => {
  const inside = results.filter((r) => r.inWindow);
  const past = results.filter((r) => !r.inWindow);
  const diverged = past.filter((r) => r.oracleVsGreedy.token !== null).length;
  console.log(
    `[speculative] ${results.length} runs: ${inside.length} inside the window bit-exact vs mlx-lm (${inside.reduce((s, r) => s + (r.vsOracle?.tensors ?? 0), 0)} tensors), ` +
      `${results.length} bit-exact vs greedy (${results.reduce((s, r) => s + r.vsGreedy.tensors, 0)} logprob tensors); ` +
      `accepted ${results.reduce((s, r) => s + r.accepted, 0)}/${results.reduce((s, r) => s + r.drafted, 0)} drafts; ` +
      `mlx-lm left greedy in ${diverged}/${past.length} runs past the window`,
  );
});

describe("speculative decoding with a draft model", () => {
  for (const { kind, fx } of FIXTURES) {
    describe(`${kind} (${fx})`, () => {
      for (const c of cases(fx)) {
        it(c.label, async () => {
          const oracle = await sharedOracle();
          const r = await speculativeParity(oracle, pool, { target: c.target, draft: c.draft, prompt: prompt(c.P, c.k), numDraftTokens: c.k, maxTokens: c.N });
          results.push(r);
          if (r.inWindow) expect(r.vsOracle?.first ?? null).toBeNull();
          if (!ROWS_INVARIANT) {
            console.log(`[speculative] ${mx.backend()}: ${c.label}: vs greedy ${r.vsGreedy.first ? `${r.vsGreedy.first.where}: ${r.vsGreedy.first.detail}` : "bit-exact"} (rows not invariant on this backend)`);
            return;
          }
          expect(r.vsGreedy.first).toBeNull();
          expect(r.vsGreedy.tensors).toBe(c.N);
          // mlx-lm is right here: its output is greedy's too
          if (r.inWindow) expect(r.oracleVsGreedy).toEqual({ token: null, logprobs: null });
        }, limit(120_000));
      }
    });
  }

  it("the fixtures give rounds with accepted and with rejected drafts", () => {
    for (const r of results) expect(r.drafted).toBeGreaterThan(0);
    expect(results.some((r) => r.accepted > 0)).toBe(true);
    expect(results.some((r) => r.accepted < r.drafted)).toBe(true);
  });
});

describe("mlx-lm's speculative_generate_step past the window (suites/speculative/mlxlm_divergence.py)", () => {
  it("inside the window it equals greedy; once a window fills, trim is a no-op and the output leaves greedy", () => {
    const run = (cs: object[]) => {
      const p = Bun.spawnSync([join(REPO_ROOT, ".venv", "bin", "python"), "-I", join(REPO_ROOT, "suites", "speculative", "mlxlm_divergence.py")], { stdin: Buffer.from(JSON.stringify({ cases: cs })), stdout: "pipe", stderr: "pipe" });
      if (p.exitCode !== 0) throw new Error(`mlxlm_divergence.py failed: ${p.stderr.toString()}`);
      return JSON.parse(p.stdout.toString()).cases as { window: number; first_token_diff: number | null; first_logprobs_diff: number | null; trim: { can_trim: boolean; trimmed_of_3: number; offsets: number[]; offsets_after: number[] } }[];
    };
    const P = [11, 48, 85, 122, 159];
    const [inside, past] = run([
      { target: join(SP, "c1_dense_w64"), draft: join(SP, "c1_dense_w64_draft"), prompt: P, num_draft_tokens: 3, max_tokens: 10 },
      { target: join(CK, "c1_dense", "f32"), draft: join(SP, "c1_dense_draft"), prompt: P, num_draft_tokens: 3, max_tokens: 10 },
    ]);
    if (ROWS_INVARIANT) {
      expect(inside!.first_token_diff).toBeNull();
      expect(inside!.first_logprobs_diff).toBeNull();
    } else console.log(`[mlx-lm divergence] ${mx.backend()}: inside the window mlx-lm's speculative output already differs from its greedy at logprobs ${inside!.first_logprobs_diff}, token ${inside!.first_token_diff}`);
    expect(inside!.trim.can_trim).toBe(true);
    // window 8, prompt 5: the divergence exists, and the rewind that should have prevented it does nothing
    expect(past!.window).toBe(8);
    expect(past!.first_token_diff).not.toBeNull();
    expect(past!.trim.can_trim).toBe(false);
    expect(past!.trim.trimmed_of_3).toBe(0);
    expect(past!.trim.offsets_after).toEqual(past!.trim.offsets);
    console.log(`[mlx-lm divergence] window ${past!.window}, prompt 5, k=3: first token differing from greedy ${past!.first_token_diff}, first logprobs ${past!.first_logprobs_diff}; trim_prompt_cache(3) trimmed ${past!.trim.trimmed_of_3} (offsets ${past!.trim.offsets.join(",")})`);
  }, limit(120_000));
});
