// serve/text_state.ts against mlx-lm 0.32.2's own TextStateMachine and StopSequences
// (mlx_lm/generate.py), run in one Python process on the same cases: 300 random text machines
// (thinking-style transitions between "normal" and "reasoning", stop words as self-transitions,
// over a small alphabet so that markers overlap and partial matches are held back) fed random
// chunks, ending with flush or discard; every split's segments, the held-back text and the final
// state are compared exactly. And 300 random stop-sequence automata over token ids, every
// advance() compared. Also the fixed case of make_text_state_machine for Gemma 4's markers.
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";
import { makeTextStateMachine, StopSequences, TextStateMachine } from "../../serve/text_state.ts";

const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");

const PY = `
import json, sys
from mlx_lm.generate import TextStateMachine, StopSequences
out = []
for case in json.load(sys.stdin):
    if case["kind"] == "text":
        sm = TextStateMachine({k: [tuple(e) for e in v] for k, v in case["transitions"].items()})
        st = sm.make_state(case["initial"])
        steps = []
        for chunk in case["chunks"]:
            st, segs = TextStateMachine.split(st, chunk)
            steps.append([list(s) for s in segs])
        if case["end"] == "flush":
            st, flushed, name = TextStateMachine.flush(st)
            steps.append([[name, flushed]])
        else:
            st, name = TextStateMachine.discard(st)
            steps.append([[name, ""]])
        out.append(steps)
    else:
        m = StopSequences([tuple(s) for s in case["sequences"]]).matcher()
        out.append([m.advance(t) for t in case["tokens"]])
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

describe("serve/text_state.ts = mlx-lm's TextStateMachine and StopSequences", () => {
  it("300 random text machines and 300 random stop automata: every step equal", () => {
    const all = cases(300, 28);
    const py = spawnSync(PYTHON, ["-c", PY], { cwd: REPO_ROOT, input: JSON.stringify(all), encoding: "utf8", maxBuffer: 64 << 20 });
    expect(py.status, py.stderr).toBe(0);
    const want = JSON.parse(py.stdout) as unknown[];
    expect(want).toHaveLength(all.length);
    let compared = 0;
    let held = 0;
    let switched = 0;
    all.forEach((c, i) => {
      const got = runTs(c);
      expect([i, got]).toEqual([i, want[i]]);
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
  }, limit(60_000));

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
