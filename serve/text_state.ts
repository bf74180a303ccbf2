// Stop sequences over token ids and the text state machine over decoded text, as mlx-lm 0.32.2
// runs them for mlx_lm.server (mlx_lm/generate.py: _build_trie, StopSequences,
// TextStateMachine, make_stop_sequences, make_text_state_machine). Both are Aho-Corasick
// automata: a stop sequence ends generation when its last token is sampled; the text machine
// routes decoded text to a state ("normal", "reasoning") and strips the control sequences and
// stop words from it, holding back text that may still be the start of one.
//
// The server builds its machine with serve/tools.ts's makeServedTextStateMachine, which adds the
// tool-call transitions. Not ported: structural markers and chat_template_type response formats
// (no Gemma 4 checkpoint has them).

interface TrieNode<K> {
  next: Map<K, TrieNode<K>>;
  fail: TrieNode<K> | null;
  /** [length of the matched sequence, its index] (propagated along fail links). */
  match: [number, number] | null;
}

function node<K>(): TrieNode<K> {
  return { next: new Map(), fail: null, match: null };
}

/** _build_trie: an Aho-Corasick automaton; an empty sequence never matches. */
function buildTrie<K>(sequences: readonly (readonly K[])[]): TrieNode<K> {
  const root = node<K>();
  sequences.forEach((seq, idx) => {
    let n = root;
    for (const k of seq) {
      let c = n.next.get(k);
      if (!c) n.next.set(k, (c = node<K>()));
      n = c;
    }
    if (n !== root) n.match = [seq.length, idx];
  });
  const queue: TrieNode<K>[] = [];
  for (const c of root.next.values()) {
    c.fail = root;
    queue.push(c);
  }
  while (queue.length > 0) {
    const parent = queue.shift()!;
    for (const [k, child] of parent.next) {
      queue.push(child);
      let f = parent.fail!;
      while (!f.next.has(k) && f !== root) f = f.fail!;
      child.fail = f.next.get(k) ?? root;
      if (child.match === null && child.fail.match !== null) child.match = child.fail.match;
    }
  }
  return root;
}

/** One stream's position in a StopSequences automaton. */
export class StopMatcher {
  private at: TrieNode<number>;
  constructor(private readonly root: TrieNode<number>) {
    this.at = root;
  }
  /** Consumes one token; true when a stop sequence has just completed. */
  advance(token: number): boolean {
    let n = this.at;
    while (!n.next.has(token) && n !== this.root) n = n.fail!;
    n = n.next.get(token) ?? n;
    this.at = n;
    return n.match !== null;
  }
}

export class StopSequences {
  private readonly root: TrieNode<number>;
  /** The token sequences, as given (the batched path hands them to the port's BatchGenerator). */
  readonly sequences: readonly (readonly number[])[];
  constructor(sequences: readonly (readonly number[])[]) {
    this.sequences = sequences.map((s) => [...s]);
    this.root = buildTrie(sequences);
  }
  matcher(): StopMatcher {
    return new StopMatcher(this.root);
  }
}

/** make_stop_sequences: every EOS id alone, then each stop word's ids (encoded without special tokens). */
export function makeStopSequences(eosIds: Iterable<number>, stopWords: readonly string[], encode: (s: string) => number[]): StopSequences {
  return new StopSequences([...[...eosIds].map((t) => [t]), ...stopWords.map(encode)]);
}

type Transitions = Record<string, [string, string][]>;

interface StateEntry {
  trie: TrieNode<string>;
  targets: string[];
}

/** A text machine's runtime state: current state name, automaton node, held-back text (code points). */
export interface TextState {
  name: string;
  at: TrieNode<string>;
  buf: string[];
}

export class TextStateMachine {
  private readonly states = new Map<string, StateEntry>();
  constructor(transitions: Transitions = {}) {
    for (const [src, edges] of Object.entries(transitions)) {
      this.states.set(src, { trie: buildTrie(edges.map(([t]) => Array.from(t))), targets: edges.map(([, d]) => d) });
    }
  }

  private entry(name: string): StateEntry {
    let e = this.states.get(name);
    if (!e) this.states.set(name, (e = { trie: buildTrie<string>([]), targets: [] }));
    return e;
  }

  start(initial = "normal"): TextState {
    return { name: initial, at: this.entry(initial).trie, buf: [] };
  }

  /** split: consumes decoded text; one [state, clean text] per state passed, the last one current. */
  split(state: TextState, text: string): [TextState, [string, string][]] {
    let s = state.name;
    let n = state.at;
    const buf = [...state.buf, ...Array.from(text)];
    let trie = this.entry(s).trie;
    const segments: [string, string][] = [];
    let begin = 0;
    let consumed = 0;
    for (let i = state.buf.length; i < buf.length; i++) {
      const ch = buf[i]!;
      while (!n.next.has(ch) && n !== trie) n = n.fail!;
      n = n.next.get(ch) ?? n;
      if (n.match !== null) {
        segments.push([s, buf.slice(begin, i + 1 - n.match[0]).join("")]);
        begin = consumed = i + 1;
        s = this.entry(s).targets[n.match[1]]!;
        trie = this.entry(s).trie;
        n = trie;
      } else if (n === trie) consumed = i + 1;
    }
    segments.push([s, buf.slice(begin, consumed).join("")]);
    return [{ name: s, at: n, buf: buf.slice(consumed) }, segments];
  }

  /** flush: the held-back text, emitted (finish_reason "length"). */
  flush(state: TextState): [TextState, string] {
    return [{ name: state.name, at: this.entry(state.name).trie, buf: [] }, state.buf.join("")];
  }

  /** discard: the held-back text, dropped (finish_reason "stop"). */
  discard(state: TextState): TextState {
    return { name: state.name, at: this.entry(state.name).trie, buf: [] };
  }
}

/** make_text_state_machine: thinking transitions (when the vocabulary has markers), stop words stripped in every state. */
export function makeTextStateMachine(thinking: { start: string; end: string } | null, stopWords: readonly string[]): TextStateMachine {
  const t: Transitions = {};
  if (thinking) {
    t.normal = [[thinking.start, "reasoning"]];
    t.reasoning = [[thinking.end, "normal"]];
  }
  if (stopWords.length > 0) {
    for (const name of new Set([...Object.keys(t), "normal"])) {
      t[name] ??= [];
      for (const w of stopWords) t[name].push([w, name]);
    }
  }
  return new TextStateMachine(t);
}
