// `npm run generate` with --draft-model / --prompt-cache-file and `npm run cache-prompt`: the
// output equals plain greedy decoding, the stats line reports the acceptance rate, and every bad
// input is one clear error (no stack trace): a draft with another vocabulary or tokenizer, a
// prompt-cache file of another model or truncated, --num-draft-tokens 0.
import { afterAll, describe, expect, it } from "vitest";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { limit } from "../../tests/time_limit.ts";
import { CK, expectClean, generate, ids, runFace as run, SP } from "./helpers.ts";

const C1 = join(CK, "c1_dense", "f32");
const tmp = mkdtempSync(join(tmpdir(), "spec-faces-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));


/** A copy of a checkpoint (weights linked) with a tokenizer.json of the given vocabulary. */
function withTokenizer(src: string, name: string, vocab: Record<string, number>): string {
  const d = join(tmp, name);
  mkdirSync(d);
  writeFileSync(join(d, "config.json"), readFileSync(join(src, "config.json")));
  symlinkSync(join(src, "model.safetensors"), join(d, "model.safetensors"));
  writeFileSync(join(d, "tokenizer.json"), JSON.stringify({ version: "1.0", model: { type: "WordLevel", vocab, unk_token: "a" }, added_tokens: [] }));
  return d;
}

const TOKENS = ["--tokens", "11,48,85,122,159,196", "--max-tokens", "10"];

// per-test limits: bun ignores a describe's timeout option (its default, 5 s, applied on the H200)
describe("npm run generate: speculative decoding and prompt-cache files", () => {
  it("--draft-model (a draft checkpoint, then an MTP drafter) prints greedy's tokens and the acceptance rate", () => {
    const plain = generate(["--model", C1, ...TOKENS]);
    expect(plain.code).toBe(0);
    for (const draft of [join(SP, "c1_dense_draft"), join(SP, "c1_dense_assistant")]) {
      const r = generate(["--model", C1, ...TOKENS, "--draft-model", draft, "--num-draft-tokens", "2"]);
      expect(r.code).toBe(0);
      expect(ids(r.stdout)).toBe(ids(plain.stdout));
      expect(r.stdout).toMatch(/Speculative decoding: \d+\.\d\d accepted tokens\/round \(\d+\.\d\d accepted drafts\/round, \d+\.\d% of drafted, avg draft \d+\.\d\d\) over \d+ rounds/);
    }
  }, limit(120_000));

  it("cache-prompt writes a file that generate continues from (the tokens of the one-shot prompt)", () => {
    const file = join(tmp, "c1.safetensors");
    const made = run("cache_prompt_cli.ts", ["--model", C1, "--tokens", "11,48,85,122,159,196,233,14,51,88", "--prompt-cache-file", file]);
    expect(made.code).toBe(0);
    const cont = generate(["--model", C1, "--prompt-cache-file", file, "--tokens", "7,8", "--max-tokens", "6"]);
    const whole = generate(["--model", C1, "--tokens", "11,48,85,122,159,196,233,14,51,88,7,8", "--max-tokens", "6"]);
    expect(cont.code).toBe(0);
    // the same tokens (the cached and the one-shot prefill differ in the rotating layout only)
    expect(ids(cont.stdout)).toBe(ids(whole.stdout));
    // without --model, the model the file was written for
    expect(ids(generate(["--prompt-cache-file", file, "--tokens", "7,8", "--max-tokens", "6"]).stdout)).toBe(ids(cont.stdout));
  }, limit(120_000));

  it("--num-draft-tokens 0 is a usage error", () => {
    expectClean(generate(["--model", C1, ...TOKENS, "--draft-model", join(SP, "c1_dense_draft"), "--num-draft-tokens", "0"]), 2, /error: --num-draft-tokens must be at least 1, got 0/);
  }, limit(120_000));

  it("a draft model with another vocabulary is one clear error", () => {
    expectClean(generate(["--model", C1, ...TOKENS, "--draft-model", join(SP, "c1_dense_vocab128")]), 2, /error: the draft model's vocabulary \(128 tokens, .*\) differs from the target's \(256\)/);
  }, limit(120_000));

  it("a draft model with another tokenizer is one clear error", () => {
    const v = Object.fromEntries(Array.from({ length: 256 }, (_, i) => [`t${i}`, i]));
    const target = withTokenizer(C1, "target-tok", v);
    const draft = withTokenizer(join(SP, "c1_dense_draft"), "draft-tok", { ...v, t0: 1, t1: 0 });
    expectClean(generate(["--model", target, ...TOKENS, "--draft-model", draft]), 2, /error: the draft model's tokenizer.json \(.*draft-tok\) maps tokens to other ids than the target's/);
  }, limit(120_000));

  // bad input: exit 2, as for a checkpoint the loader refuses (parity/args.ts isInputError)
  it("a prompt-cache file of another model, or a truncated one, is one clear error", () => {
    const file = join(tmp, "c3.safetensors");
    expect(run("cache_prompt_cli.ts", ["--model", join(CK, "c3_e2b", "f32"), "--tokens", "1,2,3", "--prompt-cache-file", file]).code).toBe(0);
    expectClean(generate(["--model", C1, "--prompt-cache-file", file, ...TOKENS]), 2, /error: .*c3\.safetensors \[0\.model\]: was written for the model .*c3_e2b\/f32, not .*c1_dense\/f32/);
    const cut = join(tmp, "cut.safetensors");
    writeFileSync(cut, readFileSync(file).subarray(0, 200));
    expectClean(generate(["--model", C1, "--prompt-cache-file", cut, ...TOKENS]), 2, /error: .*cut\.safetensors: not a readable safetensors file \(truncated or corrupt\?\)/);
  }, limit(120_000));
});
