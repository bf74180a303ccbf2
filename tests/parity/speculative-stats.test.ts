// `npm run generate --draft-model`: the speculative statistics line counts every round, also the
// last one when generation stops on an accepted draft token. c1_dense/f32 drafts for itself (every
// draft accepted), 3 draft tokens per round (mlx_lm's speculative_generate_step: every token comes
// from a round), 7 tokens: round 1 (3 drafts + the target's token), round 2 (k = min(7 - 4, 3) = 3
// drafts, the 7th token its third, accepted, draft). The line once said "over 1 rounds" there: the
// round was reported after its tokens were yielded, and the stream had stopped by then.
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { limit } from "../time_limit.ts";

const C1 = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");

function generate(maxTokens: number): string {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", "generate_cli.ts"), "--model", C1, "--draft-model", C1, "--num-draft-tokens", "3", "--tokens", "11,48,85,122,159,196", "--max-tokens", String(maxTokens)], { cwd: REPO_ROOT, encoding: "utf8", timeout: limit(120_000) });
  expect(r.status, r.stderr).toBe(0);
  return r.stdout;
}

describe("speculative statistics line", () => {
  it("counts the last round when generation stops on an accepted draft", () => {
    // 7 tokens: two rounds of 3 drafts, all 6 accepted
    expect(generate(7)).toContain("Speculative decoding: 4.00 accepted tokens/round (3.00 accepted drafts/round, 100.0% of drafted, avg draft 3.00) over 2 rounds");
    // 5 tokens: round 2 drafts k = min(5 - 4, 3) = 1 token and stops on it
    expect(generate(5)).toContain("Speculative decoding: 3.00 accepted tokens/round (2.00 accepted drafts/round, 100.0% of drafted, avg draft 2.00) over 2 rounds");
    // 4 tokens: stops on round 1's own token (counted before the fix too)
    expect(generate(4)).toContain("Speculative decoding: 4.00 accepted tokens/round (3.00 accepted drafts/round, 100.0% of drafted, avg draft 3.00) over 1 rounds");
  }, limit(120_000));
});
