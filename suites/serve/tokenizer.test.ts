// serve/tokenizer.ts against mlx-lm 0.32.2's tokenizer wrapper (mlx_lm.tokenizer_utils.load, as
// mlx_lm.server loads it with config.json's eos_token_id) on the tokenizer fixture's real
// 262,144-piece Gemma tokenizer, in one Python process:
//  - the streaming detokenizer: 150 random token sequences mixing byte-fallback pieces (valid and
//    broken UTF-8, split across tokens), word pieces, "▁" alone, special tokens and random ids;
//    every add_token's last_segment and the finalize's are compared exactly (mlx-lm picks its
//    SPMStreamingDetokenizer without the leading-space trim for this decoder);
//  - convert_ids_to_tokens on those ids, eos_token_ids, the thinking markers (none here);
//  - encode with and without special tokens, and the chat template's text (apply_chat_template,
//    add_generation_prompt, tokenize=False) on a few conversations.
import { beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";
import { loadServedTokenizer, type ServedTokenizer } from "../../serve/tokenizer.ts";

const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");

const PY = `
import json, sys
from pathlib import Path
from mlx_lm.utils import load_tokenizer, load_config
case = json.load(sys.stdin)
path = Path(case["dir"])
tok = load_tokenizer(path, eos_token_ids=load_config(path).get("eos_token_id"))
out = {"eos": sorted(tok.eos_token_ids), "think": tok.think_start, "detok": [], "pieces": {}, "encode": [], "chat": []}
for seq in case["sequences"]:
    d = tok.detokenizer
    segs = []
    for t in seq:
        d.add_token(t)
        segs.append(d.last_segment)
    d.finalize()
    segs.append(d.last_segment)
    out["detok"].append(segs)
    for t, p in zip(seq, tok.convert_ids_to_tokens(seq)):
        out["pieces"][str(t)] = p
for text in case["texts"]:
    out["encode"].append([tok.encode(text), tok.encode(text, add_special_tokens=False)])
for messages in case["chats"]:
    out["chat"].append(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
json.dump(out, sys.stdout)
`;

function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

let tok: ServedTokenizer;
let vocab: Record<string, number>;

beforeAll(async () => {
  await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, limit(60_000));
  tok = await loadServedTokenizer(DIR);
  vocab = (JSON.parse(readFileSync(join(DIR, "tokenizer.json"), "utf8")) as { model: { vocab: Record<string, number> } }).model.vocab;
}, limit(120_000));

describe("serve/tokenizer.ts = mlx-lm's TokenizerWrapper on the fixture's tokenizer", () => {
  it("streaming detokenizer (byte-fallback pieces included), pieces, eos ids, encode, chat template text", () => {
    const r = rng(15);
    const id = (p: string) => {
      const v = vocab[p];
      if (v === undefined) throw new Error(`no piece ${p}`);
      return v;
    };
    const bytes = Array.from({ length: 256 }, (_, b) => id(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`));
    const utf8 = (s: string) => [...new TextEncoder().encode(s)].map((b) => bytes[b]!);
    const words = ["▁the", "▁", "ing", "▁quick", "<eos>", "<end_of_turn>", "<start_of_turn>", "<bos>"].map(id);
    const sequences: number[][] = [];
    for (let i = 0; i < 150; i++) {
      const seq: number[] = [];
      const n = 1 + Math.floor(r() * 12);
      for (let k = 0; k < n; k++) {
        const what = r();
        if (what < 0.3) seq.push(...utf8(["ぁ", "é", "😀", "\n", "a b"][Math.floor(r() * 5)]!)); // whole characters as bytes
        else if (what < 0.45) seq.push(bytes[0x80 + Math.floor(r() * 0x80)]!); // a stray continuation or lead byte
        else if (what < 0.75) seq.push(words[Math.floor(r() * words.length)]!);
        else seq.push(Math.floor(r() * 262144));
      }
      sequences.push(seq);
    }
    const texts = ["Hello world", " leading space", "日本語のテキスト 😀\nnew line", "<start_of_turn>user\nhi<end_of_turn>", ""];
    const chats = [
      [{ role: "user", content: "Hi there" }],
      [{ role: "system", content: "Be terse." }, { role: "user", content: "Name a river." }],
      [{ role: "user", content: "a" }, { role: "assistant", content: "b" }, { role: "user", content: "c" }],
    ];
    const py = spawnSync(PYTHON, ["-c", PY], { cwd: REPO_ROOT, input: JSON.stringify({ dir: DIR, sequences, texts, chats }), encoding: "utf8", maxBuffer: 64 << 20 });
    expect(py.status, py.stderr.slice(-2000)).toBe(0);
    const want = JSON.parse(py.stdout) as { eos: number[]; think: string | null; detok: string[][]; pieces: Record<string, string>; encode: [number[], number[]][]; chat: string[] };

    expect([...tok.eosTokenIds].sort((a, b) => a - b)).toEqual(want.eos);
    expect(tok.thinking?.start ?? null).toBe(want.think);
    let compared = 0;
    let heldBack = 0;
    sequences.forEach((seq, i) => {
      const d = tok.newDetokenizer();
      const segs: string[] = [];
      for (const t of seq) {
        d.addToken(t);
        segs.push(d.lastSegment());
      }
      d.finalize();
      segs.push(d.lastSegment());
      expect([i, seq, segs]).toEqual([i, seq, want.detok[i]]);
      if (segs.slice(0, -1).some((s) => s === "")) heldBack++;
      compared++;
    });
    expect(compared).toBe(150);
    expect(heldBack).toBeGreaterThan(20); // partial characters were held back and released later
    for (const [t, p] of Object.entries(want.pieces)) expect([t, tok.piece(Number(t))]).toEqual([t, p]);
    expect(Object.keys(want.pieces).length).toBeGreaterThan(200);
    texts.forEach((t, i) => expect([t, tok.encode(t, true), tok.encode(t, false)]).toEqual([t, ...want.encode[i]!]));
    chats.forEach((c, i) => expect(tok.renderChat(c, {})).toBe(want.chat[i]!));
  }, limit(90_000));
});
