// Tool calls as mlx_lm.server 0.32.2 serves them for Gemma 4 (mlx_lm/tool_parsers/gemma4.py,
// ToolCallFormatter and handle_completion in mlx_lm/server.py, make_text_state_machine and
// _infer_tool_parser in mlx-lm):
//  - the parser is inferred from the chat template: a template naming both "<|tool_call>" and
//    "<tool_call|>" selects mlx-lm's gemma4 parser (tokenizer_config.json's tool_parser_type
//    overrides the inference). Templates that select another of mlx-lm's parsers are refused at
//    start (only gemma4's is ported); a template naming none has no tool calling, as in mlx-lm;
//  - the text state machine gains a "tool" state: "<|tool_call>" enters it from "normal" (and from
//    "reasoning"), "<tool_call|>" leaves it; the text inside is collected, not shown, whether or
//    not the request passed `tools` (mlx-lm decides by the tokenizer, not the request);
//  - each collected text is parsed: every `call:NAME{...}` in it (balanced braces; <|"|>...<|"|>
//    string literals are opaque), its arguments turned into JSON (strings re-quoted, bare keys
//    right after "{" or "," quoted) and read with Python's json rules; a text that does not parse
//    is dropped with a warning, as mlx-lm drops it;
//  - each call is returned as {"function": {"name", "arguments": json.dumps(args,
//    ensure_ascii=False)}, "type": "function", "id": uuid4} (plus "index", counted over the
//    response, when streaming); finish_reason "stop" becomes "tool_calls" once a call was made.
// One known difference: Python's `\w` (the regex module, Unicode) is matched here by letters,
// marks, digits and connector punctuation (\p{L}\p{M}\p{N}\p{Pc}); names outside that class
// (rare code points that Python counts as word characters) may be read differently.
import { PyFloat, pyFloatRepr, pyStringLiteral } from "../model/pyjson.ts";
import type { Out } from "./json.ts";
import { TextStateMachine } from "./text_state.ts";

export const GEMMA4_TOOL_CALL_START = "<|tool_call>";
export const GEMMA4_TOOL_CALL_END = "<tool_call|>";
const STR_DELIM = '<|"|>';

export interface ToolCalling {
  parser: "gemma4";
  start: string;
  end: string;
}

export class ToolParserError extends Error {
  override readonly name = "ToolParserError";
}

/** _infer_tool_parser's template checks, in its order (the name each one selects). */
const TEMPLATE_MARKERS: [string, (t: string) => boolean][] = [
  ["minimax_m2", (t) => t.includes("<minimax:tool_call>")],
  ["gemma4", (t) => t.includes(GEMMA4_TOOL_CALL_START) && t.includes(GEMMA4_TOOL_CALL_END)],
  ["function_gemma", (t) => t.includes("<start_function_call>")],
  ["longcat", (t) => t.includes("<longcat_tool_call>")],
  ["glm47", (t) => t.includes("<arg_key>")],
  ["pythonic", (t) => t.includes("<|tool_list_start|>") || t.includes("<|tool_call_start|>")],
  ["qwen3_coder", (t) => t.includes("<tool_call>\\n<function=") || t.includes("<tool_call>\n<function=")],
  ["kimi_k2", (t) => t.includes("<|tool_calls_section_begin|>")],
  ["minicpm5", (t) => t.includes('<function name="') && t.includes('<param name="')],
  ["mistral", (t) => t.includes("[TOOL_CALLS]")],
  ["muse_spark", (t) => t.includes("<atem:function_calls>")],
  ["json_tools", (t) => t.includes("<tool_call>") && t.includes("tool_call.name")],
];

/** The checkpoint's tool calling as mlx-lm's tokenizer loader decides it; throws ToolParserError for a parser not ported. */
export function toolCallingFor(tok: { chatTemplate?: string | null; toolParserType?: string | null }): ToolCalling | null {
  let name = tok.toolParserType ?? null;
  if (name === null && typeof tok.chatTemplate === "string") name = TEMPLATE_MARKERS.find(([, test]) => test(tok.chatTemplate!))?.[0] ?? null;
  // (mlx-lm's vocabulary fallback selects kimi_k3 or pythonic, whose markers Gemma 4's vocabulary does not have)
  if (name === null) return null;
  if (name !== "gemma4") throw new ToolParserError(`the checkpoint selects mlx-lm's '${name}' tool parser; this server ports only 'gemma4' (Gemma 4's)`);
  return { parser: "gemma4", start: GEMMA4_TOOL_CALL_START, end: GEMMA4_TOOL_CALL_END };
}

/** make_text_state_machine with thinking, tool-call transitions and stop words (no response formats: Gemma 4 has none). */
export function makeServedTextStateMachine(thinking: { start: string; end: string } | null, tool: ToolCalling | null, stopWords: readonly string[]): TextStateMachine {
  const t: Record<string, [string, string][]> = {};
  if (thinking) {
    t.normal = [[thinking.start, "reasoning"]];
    t.reasoning = [[thinking.end, "normal"]];
  }
  if (tool) {
    (t.normal ??= []).push([tool.start, "tool"]);
    if (thinking) t.reasoning!.push([tool.start, "tool"]);
    t.tool = [[tool.end, "normal"]];
  }
  if (stopWords.length > 0) {
    for (const name of new Set([...Object.keys(t), "normal"])) {
      t[name] ??= [];
      for (const w of stopWords) t[name].push([w, name]);
    }
  }
  return new TextStateMachine(t);
}

// ---- the gemma4 parser

const WORD = /[\p{L}\p{M}\p{N}\p{Pc}]/u;
const isNameChar = (c: string) => c === "-" || WORD.test(c);

/** The end (exclusive) of the balanced group opening at text[i] === "{", or -1 (the regex's recursive group). */
function balancedEnd(text: string, i: number): number {
  let depth = 0;
  while (i < text.length) {
    if (text.startsWith(STR_DELIM, i)) {
      // a string literal must close; one that does not ends the match attempt
      const close = text.indexOf(STR_DELIM, i + STR_DELIM.length);
      if (close < 0) return -1;
      i = close + STR_DELIM.length;
      continue;
    }
    const c = text[i]!;
    if (c === "{") depth++;
    else if (c === "}") {
      depth--;
      if (depth === 0) return i + 1;
    }
    i++;
  }
  return -1;
}

/** _tool_call_regex.finditer: [name, args text] for each `call:NAME{...}`, scanning left to right. */
export function findGemma4Calls(text: string): [string, string][] {
  const out: [string, string][] = [];
  let from = 0;
  for (;;) {
    const at = text.indexOf("call:", from);
    if (at < 0) return out;
    let j = at + 5;
    // code points, not UTF-16 units: \w is tested on whole characters
    while (j < text.length) {
      const cp = String.fromCodePoint(text.codePointAt(j)!);
      if (!isNameChar(cp)) break;
      j += cp.length;
    }
    if (j > at + 5 && text[j] === "{") {
      const end = balancedEnd(text, j);
      if (end > 0) {
        out.push([text.slice(at + 5, j), text.slice(j, end)]);
        from = end;
        continue;
      }
    }
    from = at + 1;
  }
}

/** _gemma4_args_to_json. */
export function gemma4ArgsToJson(args: string): string {
  const strings: string[] = [];
  let text = "";
  let i = 0;
  // re.sub(r'<\|"\|>(.*?)<\|"\|>', capture, DOTALL): left to right, non-overlapping, lazy
  while (i < args.length) {
    const open = args.indexOf(STR_DELIM, i);
    if (open < 0) break;
    const close = args.indexOf(STR_DELIM, open + STR_DELIM.length);
    if (close < 0) break;
    strings.push(args.slice(open + STR_DELIM.length, close));
    text += `${args.slice(i, open)}\x00${strings.length - 1}\x00`;
    i = close + STR_DELIM.length;
  }
  text += args.slice(i);
  // re.sub(r"(?<=[{,])(\w+):", r'"\1":'): a run of word characters right after "{" or "," and before ":"
  let keyed = "";
  let k = 0;
  const cps = Array.from(text);
  while (k < cps.length) {
    const c = cps[k]!;
    keyed += c;
    k++;
    if (c !== "{" && c !== ",") continue;
    let e = k;
    while (e < cps.length && WORD.test(cps[e]!)) e++;
    if (e > k && cps[e] === ":") {
      keyed += `"${cps.slice(k, e).join("")}":`;
      k = e + 1;
    }
  }
  for (let n = 0; n < strings.length; n++) keyed = keyed.replaceAll(`\x00${n}\x00`, () => pyStringLiteral(strings[n]!));
  return keyed;
}

// ---- Python's json.loads and json.dumps(ensure_ascii=False), with object key order kept

/** A parsed JSON value; objects keep Python's dict order (first insertion, last value). */
export type PyValue = null | boolean | { int: string } | PyFloat | string | PyValue[] | Map<string, PyValue>;

export class PyJsonError extends Error {
  override readonly name = "JSONDecodeError";
}

/** json.loads (strict): Python ints kept as their digits, floats as PyFloat, NaN/Infinity accepted. */
export function pyLoads(text: string): PyValue {
  let i = 0;
  const fail = (what: string): never => {
    throw new PyJsonError(`${what}: char ${i}`);
  };
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i]!)) i++;
  };
  const str = (): string => {
    i++; // the opening quote
    let s = "";
    for (;;) {
      if (i >= text.length) fail("Unterminated string starting at");
      const c = text[i]!;
      if (c === '"') {
        i++;
        return s;
      }
      if (c === "\\") {
        const e = text[i + 1];
        const simple: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };
        if (e !== undefined && e in simple) {
          s += simple[e];
          i += 2;
        } else if (e === "u" && /^[0-9a-fA-F]{4}$/.test(text.slice(i + 2, i + 6))) {
          s += String.fromCharCode(Number.parseInt(text.slice(i + 2, i + 6), 16));
          i += 6;
        } else fail("Invalid \\escape");
        continue;
      }
      if (c.charCodeAt(0) < 0x20) fail("Invalid control character at");
      s += c;
      i++;
    }
  };
  const value = (): PyValue => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const m = new Map<string, PyValue>();
      ws();
      if (text[i] === "}") {
        i++;
        return m;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("Expecting property name enclosed in double quotes");
        const k = str();
        ws();
        if (text[i] !== ":") fail("Expecting ':' delimiter");
        i++;
        m.set(k, value());
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "}") {
          i++;
          return m;
        }
        fail("Expecting ',' delimiter");
      }
    }
    if (c === "[") {
      i++;
      const a: PyValue[] = [];
      ws();
      if (text[i] === "]") {
        i++;
        return a;
      }
      for (;;) {
        a.push(value());
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "]") {
          i++;
          return a;
        }
        fail("Expecting ',' delimiter");
      }
    }
    if (c === '"') return str();
    for (const [lit, v] of [["null", null], ["true", true], ["false", false], ["NaN", new PyFloat(Number.NaN)], ["Infinity", new PyFloat(Infinity)], ["-Infinity", new PyFloat(-Infinity)]] as const) {
      if (text.startsWith(lit, i)) {
        i += lit.length;
        return v;
      }
    }
    const m = /^-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?/.exec(text.slice(i));
    if (!m) fail("Expecting value");
    i += m![0].length;
    if (m![1] === undefined && m![2] === undefined) return { int: m![0].replace(/^-0$/, "0") };
    return new PyFloat(Number(m![0]));
  };
  const v = value();
  ws();
  if (i !== text.length) fail("Extra data");
  return v;
}

/** json.dumps(v, ensure_ascii=False). */
export function pyDumpsUnicode(v: PyValue): string {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (v instanceof PyFloat) return pyFloatRepr(v.value);
  if (typeof v === "string") return pyStringLiteral(v, false);
  if (Array.isArray(v)) return `[${v.map(pyDumpsUnicode).join(", ")}]`;
  if (v instanceof Map) return `{${[...v].map(([k, x]) => `${pyDumpsUnicode(k)}: ${pyDumpsUnicode(x)}`).join(", ")}}`;
  return v.int;
}

/** parse_tool_call (gemma4): one {name, arguments} per call; throws when there is none or its arguments do not parse. */
export function parseGemma4ToolCall(text: string): { name: string; arguments: PyValue }[] {
  const calls = findGemma4Calls(text);
  if (calls.length === 0) throw new ToolParserError("No function provided.");
  return calls.map(([name, args]) => ({ name, arguments: pyLoads(gemma4ArgsToJson(args)) }));
}

/** ToolCallFormatter: the collected tool texts of one response, formatted (indexes counted across the response when streaming). */
export class ToolCallFormatter {
  private idx = 0;
  constructor(
    private readonly streaming: boolean,
    private readonly warn: (line: string) => void,
    private readonly newId: () => string = () => crypto.randomUUID(),
  ) {}
  format(toolTexts: readonly string[]): Out[] {
    const out: Out[] = [];
    for (const t of toolTexts) {
      let parsed: { name: string; arguments: PyValue }[];
      try {
        parsed = parseGemma4ToolCall(t);
      } catch (e) {
        if (!(e instanceof ToolParserError || e instanceof PyJsonError)) throw e;
        this.warn(`warning: Failed to parse tool call (${e.name === "ToolParserError" ? "ValueError" : e.name}: ${e.message}) — tool text was likely truncated mid-generation.`);
        continue;
      }
      for (const p of parsed) {
        const call: { [k: string]: Out } = { function: { name: p.name, arguments: pyDumpsUnicode(p.arguments) }, type: "function", id: this.newId() };
        if (this.streaming) call.index = this.idx++;
        out.push(call);
      }
    }
    return out;
  }
}
