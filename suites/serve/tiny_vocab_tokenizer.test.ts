// The bench's tiny-vocab tokenizer (bench/serve_tiny_vocab.py: a 1,024-piece byte-fallback BPE in
// the Gemma layout, built seeded in .cache/bench/) as serve/tokenizer.ts loads it, against
// mlx-lm 0.32.2's TokenizerWrapper on the same files (mlx_lm.utils.load_tokenizer with config.json's
// eos_token_id, as mlx_lm.server loads it), in one Python process. Compared exactly: the streaming
// detokenizer mlx-lm picks (its class name: SPM, no leading-space trim) and, on 40 seeded random
// id sequences over the whole vocabulary (byte pieces that split UTF-8 across tokens, merged
// pieces, specials), every add_token's last_segment and the finalize's; encode of a few texts
// (accents, an emoji, newlines, repeated spaces) with and without the special tokens;
// eos_token_ids; the chat template's text for one conversation. So that bench/SERVE.md's
// tiny-vocab row serves one tokenizer on both sides.
import { beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { loadServedTokenizer, type ServedTokenizer } from "../../serve/tokenizer.ts";

const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
const FIXTURE = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const DIR = join(REPO_ROOT, ".cache", "bench", "tiny-vocab");
const TEXTS = ["Request a-1: the river runs past the mill", "héllo wörld 😀 zebra", "  two  spaces\nnew line\n", "<start_of_turn>user"];
const SEQUENCES = 40;

const PY = `
import json, sys
from pathlib import Path
from mlx_lm.utils import load_tokenizer, load_config
case = json.load(sys.stdin)
path = Path(case["dir"])
tok = load_tokenizer(path, eos_token_ids=load_config(path).get("eos_token_id"))
out = {"detokenizer": type(tok.detokenizer).__name__, "eos": sorted(tok.eos_token_ids), "detok": [], "encode": []}
for seq in case["sequences"]:
    d = tok.detokenizer
    segs = []
    for t in seq:
        d.add_token(t)
        segs.append(d.last_segment)
    d.finalize()
    segs.append(d.last_segment)
    out["detok"].append(segs)
for t in case["texts"]:
    out["encode"].append([tok.encode(t), tok.encode(t, add_special_tokens=False)])
out["chat"] = tok.apply_chat_template(case["chat"], add_generation_prompt=True, tokenize=False)
print(json.dumps(out))
`;

/** A seeded generator (mulberry32), so the sequences are the same on every run. */
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
let py: { detokenizer: string; eos: number[]; detok: string[][]; encode: number[][][]; chat: string };
const chat = [{ role: "user", content: "hi there" }, { role: "assistant", content: "the mill" }, { role: "user", content: "and the bridge?" }];
const next = rng(7);
const sequences = Array.from({ length: SEQUENCES }, () => Array.from({ length: 4 + Math.floor(next() * 20) }, () => Math.floor(next() * 1024)));

beforeAll(async () => {
  for (const args of [
    ["oracle/python/make_checkpoints.py", "--tokenizer-from", SOURCE, "--out", FIXTURE],
    ["bench/serve_tiny_vocab.py", "--out", DIR, "--vocab", "1024", "--template-from", join(FIXTURE, "tokenizer_config.json")],
  ]) {
    const r = spawnSync(PYTHON, args, { cwd: REPO_ROOT, encoding: "utf8" });
    if (r.status !== 0) throw new Error(`${args[0]} failed: ${r.stderr}`);
  }
  tok = await loadServedTokenizer(DIR);
  const r = spawnSync(PYTHON, ["-c", PY], { cwd: REPO_ROOT, encoding: "utf8", input: JSON.stringify({ dir: DIR, sequences, texts: TEXTS, chat }), maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`mlx-lm side failed: ${r.stderr}`);
  py = JSON.parse(r.stdout);
}, 60_000);

describe("tiny-vocab tokenizer: serve/tokenizer.ts = mlx-lm's TokenizerWrapper", () => {
  it("picks the SPM detokenizer and the same eos ids", () => {
    expect(py.detokenizer).toBe("SPMStreamingDetokenizer");
    expect([...tok.eosTokenIds].sort((a, b) => a - b)).toEqual(py.eos);
  });

  it("streams every random sequence's segments as mlx-lm does", () => {
    let ran = 0;
    sequences.forEach((seq, i) => {
      const d = tok.newDetokenizer();
      const segs: string[] = [];
      for (const t of seq) {
        d.addToken(t);
        segs.push(d.lastSegment());
      }
      d.finalize();
      segs.push(d.lastSegment());
      expect(segs).toEqual(py.detok[i]!);
      ran++;
    });
    expect(ran).toBe(SEQUENCES);
  });

  it("encodes and renders the chat template as mlx-lm does", () => {
    TEXTS.forEach((t, i) => expect([tok.encode(t, true), tok.encode(t, false)]).toEqual(py.encode[i]!));
    expect(py.encode.length).toBe(TEXTS.length);
    expect(tok.renderChat(chat, {})).toBe(py.chat);
  });
});
