// The text side of `npm run serve` against mlx-lm 0.32.2's own code, in one Python process:
//  - serve/text_state.ts = mlx_lm/generate.py's TextStateMachine and StopSequences: 300 random
//    text machines (thinking-style transitions between "normal" and "reasoning", stop words as
//    self-transitions, over a small alphabet so that markers overlap and partial matches are held
//    back) fed random chunks, ending with flush or discard, every split's segments, the held-back
//    text and the final state compared exactly; 300 random stop-sequence automata over token ids,
//    every advance() compared; and the fixed case of make_text_state_machine for Gemma 4's markers;
//  - serve/tokenizer.ts = mlx-lm's TokenizerWrapper (mlx_lm.utils.load_tokenizer, with
//    config.json's eos_token_id, as mlx_lm.server loads it) on the tokenizer fixture's real
//    262,144-piece Gemma tokenizer: the streaming detokenizer on 150 random token sequences mixing
//    byte-fallback pieces (valid and broken UTF-8, split across tokens), word pieces, "▁" alone,
//    special tokens and random ids, every add_token's last_segment and the finalize's compared
//    exactly (mlx-lm picks its SPMStreamingDetokenizer without the leading-space trim for this
//    decoder); convert_ids_to_tokens on those ids, eos_token_ids, the thinking markers (none
//    here); encode with and without special tokens; the chat template's text
//    (apply_chat_template, add_generation_prompt, tokenize=False) on a few conversations.
import { beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";
import { makeTextStateMachine, StopSequences, TextStateMachine } from "../../serve/text_state.ts";
import { loadServedTokenizer, type ServedTokenizer } from "../../serve/tokenizer.ts";

const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");
const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");

const PY = `
import json, sys
from pathlib import Path
from mlx_lm.generate import TextStateMachine, StopSequences
from mlx_lm.utils import load_tokenizer, load_config
case = json.load(sys.stdin)
machines = []
for m in case["machines"]:
    if m["kind"] == "text":
        sm = TextStateMachine({k: [tuple(e) for e in v] for k, v in m["transitions"].items()})
        st = sm.make_state(m["initial"])
        steps = []
        for chunk in m["chunks"]:
            st, segs = TextStateMachine.split(st, chunk)
            steps.append([list(s) for s in segs])
        if m["end"] == "flush":
            st, flushed, name = TextStateMachine.flush(st)
            steps.append([[name, flushed]])
        else:
            st, name = TextStateMachine.discard(st)
            steps.append([[name, ""]])
        machines.append(steps)
    else:
        matcher = StopSequences([tuple(s) for s in m["sequences"]]).matcher()
        machines.append([matcher.advance(t) for t in m["tokens"]])
path = Path(case["dir"])
tok = load_tokenizer(path, eos_token_ids=load_config(path).get("eos_token_id"))
out = {"machines": machines, "eos": sorted(tok.eos_token_ids), "think": tok.think_start, "detok": [], "pieces": {}, "encode": [], "chat": []}
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

/** A small deterministic PRNG (mulberry32), so that a failure reproduces. */
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

type TextCase = { kind: "text"; transitions: Record<string, [string, string][]>; initial: string; chunks: string[]; end: "flush" | "discard" };
type StopCase = { kind: "stop"; sequences: number[][]; tokens: number[] };

function cases(n: number, seed: number): (TextCase | StopCase)[] {
  const r = rng(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  const word = (alphabet: string, min: number, max: number) => Array.from({ length: min + Math.floor(r() * (max - min + 1)) }, () => pick([...alphabet])).join("");
  const out: (TextCase | StopCase)[] = [];
  for (let i = 0; i < n; i++) {
    const alphabet = "ab<>/é😀";
    const transitions: Record<string, [string, string][]> = {};
    if (r() < 0.7) {
      transitions.normal = [[word(alphabet, 1, 4), "reasoning"]];
      transitions.reasoning = [[word(alphabet, 1, 4), "normal"]];
    }
    const stops = Array.from({ length: Math.floor(r() * 3) }, () => word(alphabet, 1, 3));
    for (const name of new Set([...Object.keys(transitions), "normal"])) for (const w of stops) (transitions[name] ??= []).push([w, name]);
    const chunks = Array.from({ length: 1 + Math.floor(r() * 8) }, () => word(alphabet, 0, 5));
    out.push({ kind: "text", transitions, initial: transitions.reasoning && r() < 0.3 ? "reasoning" : "normal", chunks, end: r() < 0.5 ? "flush" : "discard" });
    const sequences = Array.from({ length: Math.floor(r() * 4) }, () => Array.from({ length: Math.floor(r() * 4) }, () => Math.floor(r() * 4)));
    out.push({ kind: "stop", sequences, tokens: Array.from({ length: 20 }, () => Math.floor(r() * 4)) });
  }
  return out;
}

function runTs(c: TextCase | StopCase): unknown {
  if (c.kind === "stop") {
    const m = new StopSequences(c.sequences).matcher();
    return c.tokens.map((t) => m.advance(t));
  }
  const sm = new TextStateMachine(c.transitions);
  let st = sm.start(c.initial);
  const steps: [string, string][][] = [];
  for (const chunk of c.chunks) {
    let segs: [string, string][];
    [st, segs] = sm.split(st, chunk);
    steps.push(segs);
  }
  if (c.end === "flush") {
    let flushed: string;
    [st, flushed] = sm.flush(st);
    steps.push([[st.name, flushed]]);
  } else {
    st = sm.discard(st);
    steps.push([[st.name, ""]]);
  }
  return steps;
}

function tokenizerInputs(vocab: Record<string, number>) {
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
  return { sequences, texts, chats };
}

type Want = { machines: unknown[]; eos: number[]; think: string | null; detok: string[][]; pieces: Record<string, string>; encode: [number[], number[]][]; chat: string[] };

const machines = cases(300, 28);
let tok: ServedTokenizer;
let inputs: ReturnType<typeof tokenizerInputs>;
let want: Want;

beforeAll(async () => {
  await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, limit(60_000));
  tok = await loadServedTokenizer(DIR);
  inputs = tokenizerInputs((JSON.parse(readFileSync(join(DIR, "tokenizer.json"), "utf8")) as { model: { vocab: Record<string, number> } }).model.vocab);
  const py = spawnSync(PYTHON, ["-c", PY], { cwd: REPO_ROOT, input: JSON.stringify({ dir: DIR, machines, ...inputs }), encoding: "utf8", maxBuffer: 64 << 20 });
  if (py.status !== 0) throw new Error(`mlx-lm's side failed (exit ${py.status}):\n${py.stderr.slice(-2000)}`);
  want = JSON.parse(py.stdout) as Want;
}, limit(120_000));

describe("serve/text_state.ts = mlx-lm's TextStateMachine and StopSequences", () => {
  it("300 random text machines and 300 random stop automata: every step equal", () => {
    expect(want.machines).toHaveLength(machines.length);
    let compared = 0;
    let held = 0;
    let switched = 0;
    machines.forEach((c, i) => {
      const got = runTs(c);
      expect([i, got]).toEqual([i, want.machines[i]]);
      compared++;
      if (c.kind === "text") {
        const steps = got as [string, string][][];
        if (steps.some((segs) => segs.length > 1)) switched++;
        if (c.end === "flush" && steps.at(-1)![0]![1] !== "") held++;
      }
    });
    expect(compared).toBe(600);
    // the cases reach what they are for: state switches, and text held back then flushed
    expect(switched).toBeGreaterThan(30);
    expect(held).toBeGreaterThan(10);
  });

  it("make_text_state_machine for Gemma 4's thinking markers, with a stop word", () => {
    const sm = makeTextStateMachine({ start: "<|channel>thought", end: "<channel|>" }, ["STOP"]);
    let st = sm.start("normal");
    const seen: [string, string][] = [];
    for (const chunk of ["Hi <|chan", "nel>thought\nthinking", " hard<channel|>The answer", " is 4.ST", "OP ignored"]) {
      let segs: [string, string][];
      [st, segs] = sm.split(st, chunk);
      seen.push(...segs.filter(([, t]) => t !== ""));
    }
    expect(seen).toEqual([
      ["normal", "Hi "],
      ["reasoning", "\nthinking"],
      ["reasoning", " hard"],
      ["normal", "The answer"],
      ["normal", " is 4."],
      ["normal", " ignored"],
    ]);
  });
});

describe("serve/tokenizer.ts = mlx-lm's TokenizerWrapper on the fixture's tokenizer", () => {
  it("streaming detokenizer (byte-fallback pieces included), pieces, eos ids, encode, chat template text", () => {
    const { sequences, texts, chats } = inputs;
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
  });
});
