// `npm run generate --draft-model` with the issue-26 drafters: the kind comes from the drafter's
// config (model_type / dflash_config / architectures, as mlx_vlm.generate resolves it): gemma4_dflash and gemma4_dspark drafters
// run the DFlash loop, a gemma4_unified_assistant drafter runs MTP; all print plain greedy decoding's
// tokens and mlx-vlm's statistics line. With --temp / --top-k / --seed all three print plain sampled
// decoding's tokens for the same seed (one key per emitted token in mlx-vlm's DFlash and MTP loops).
// Bad input is one clear error, exit 2: a DFlash drafter for a target of another hidden size, or whose vocabulary
// differs from the target's, a drafter kind this port does not run, --draft-kind other than
// mtp/dflash, a top-k past the vocabulary with a DFlash or an MTP drafter.
import { afterAll, describe, expect, it } from "vitest";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { limit } from "../../tests/time_limit.ts";
import { CK, expectClean, generate, ids, SP } from "./helpers.ts";

const C1 = join(CK, "c1_dense", "f32");
const tmp = mkdtempSync(join(tmpdir(), "dflash-face-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const TOKENS = ["--tokens", "11,48,85", "--max-tokens", "12"];

/** A copy of a drafter directory (weights linked) with config edits. */
function drafterVariant(src: string, name: string, edit: (c: Record<string, unknown>) => void): string {
  const d = join(tmp, name);
  mkdirSync(d);
  const c = JSON.parse(readFileSync(join(src, "config.json"), "utf8"));
  edit(c);
  writeFileSync(join(d, "config.json"), JSON.stringify(c));
  symlinkSync(join(src, "model.safetensors"), join(d, "model.safetensors"));
  return d;
}

describe("npm run generate --draft-model: DFlash and the unified assistant", () => {
  it("gemma4_dflash, gemma4_dspark and gemma4_unified_assistant drafters print greedy's tokens and the statistics line", () => {
    const plain = generate(["--model", C1, ...TOKENS]);
    expect(plain.code).toBe(0);
    for (const draft of [join(SP, "c1_dense_dflash"), join(SP, "c1_dense_dspark"), join(SP, "c1_dense_unified_assistant")]) {
      const r = generate(["--model", C1, ...TOKENS, "--draft-model", draft]);
      expect(r.code).toBe(0);
      expect(ids(r.stdout)).toBe(ids(plain.stdout));
      expect(r.stdout).toMatch(/Speculative decoding: \d+\.\d\d accepted tokens\/round \(\d+\.\d\d accepted drafts\/round, \d+\.\d% of drafted, avg draft \d+\.\d\d\) over \d+ rounds/);
    }
  }, limit(120_000));

  it("--temp/--top-k/--seed: gemma4_dflash, gemma4_dspark and gemma4_unified_assistant print plain sampled decoding's tokens", () => {
    const SAMPLE = ["--temp", "0.3", "--top-k", "3", "--seed", "7"];
    const plain = generate(["--model", C1, ...TOKENS, ...SAMPLE]);
    expect(plain.code).toBe(0);
    const greedy = generate(["--model", C1, ...TOKENS]);
    expect(ids(plain.stdout)).not.toBe(ids(greedy.stdout)); // the seed and temperature did sample
    for (const draft of [join(SP, "c1_dense_dflash"), join(SP, "c1_dense_dspark"), join(SP, "c1_dense_unified_assistant")]) {
      const r = generate(["--model", C1, ...TOKENS, ...SAMPLE, "--draft-model", draft]);
      expect(r.code).toBe(0);
      expect(ids(r.stdout)).toBe(ids(plain.stdout));
    }
  }, limit(120_000));

  it("bad drafters: one clear error each, exit 2", () => {
    // a target of another hidden size (tiny: hidden 32; the drafter reads hidden 64)
    expectClean(generate(["--model", join(SP, "tiny"), "--tokens", "1,2,3", "--max-tokens", "4", "--draft-model", join(SP, "c1_dense_dflash")]), 2, /drafter is for a target of hidden size 64, this target has 32/);
    // a drafter whose vocabulary differs from the target's
    const vocab = drafterVariant(join(SP, "c1_dense_dflash"), "vocab512", (c) => (c.vocab_size = 512));
    expectClean(generate(["--model", C1, ...TOKENS, "--draft-model", vocab]), 2, /drafter's vocabulary \(512\) differs from the target's \(256\)/);
    // a drafter reading a target layer the target does not have
    const layers = drafterVariant(join(SP, "c1_dense_dflash"), "layers", (c) => ((c.dflash_config as Record<string, unknown>).target_layer_ids = [1, 3, 9]));
    expectClean(generate(["--model", C1, ...TOKENS, "--draft-model", layers]), 2, /reads target layer 9, this target has 6 layers/);
    // a drafter kind this port does not run (a DSpark config), and an unknown --draft-kind
    const dspark = drafterVariant(join(SP, "c1_dense_dflash"), "dspark", (c) => ((c.dflash_config as Record<string, unknown>).projector_type = "dspark"));
    expectClean(generate(["--model", C1, ...TOKENS, "--draft-model", dspark]), 2, /is a dspark drafter \(kind dflash\), which this port does not run/);
    expectClean(generate(["--model", C1, ...TOKENS, "--draft-model", join(SP, "c1_dense_dflash"), "--draft-kind", "eagle3"]), 2, /--draft-kind eagle3 is not supported/);
    // sampling options the sampler refuses (top-k past the vocabulary), with each loop
    for (const draft of [join(SP, "c1_dense_dflash"), join(SP, "c1_dense_unified_assistant")]) {
      expectClean(generate(["--model", C1, ...TOKENS, "--temp", "0.5", "--top-k", "300", "--draft-model", draft]), 2, /`top_k` has to be an integer in the \(0, 256\] interval, but is 300/);
    }
  }, limit(120_000));
});
