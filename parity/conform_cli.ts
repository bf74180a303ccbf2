// `npm run conform -- --dump DIR --checkpoint DIR`: checks any Gemma 4 implementation's dump
// (oracle/conform/FORMAT.md) against mlx-lm, tensor by tensor. The dump is validated against the
// checkpoint the engine loaded (oracle/conform/dump.ts), mlx-lm runs the dump's prompt and
// schedule through the oracle's streamed capture request (only the taps the dump holds are
// written), and every tensor is compared: the bit-exact count where the dtypes agree, the
// distribution metrics always (oracle/conform/metrics.ts), judged against the noise floor per tap
// kind (oracle/conform/verdict.ts). Conventions of other engines that are not differences are
// compared as such: a mask given as a kind ("causal") against an array, the MoE router's top-k
// order (oracle/conform/tensor_compare.ts), logprobs in place of logits (by KL). Reports: terminal table, <out>/conform.json, conform.md,
// conform.html. Exit 0 conforms, 1 diverges (or the floor is not measured), 2 bad usage or input,
// 3 the oracle failed (as npm run parity).
import { existsSync, mkdirSync, unlinkSync, writeFileSync } from "node:fs";
import { isAbsolute, join, resolve } from "node:path";
import { closeSharedOracle, expectReply, OracleClient, OracleError, REPO_ROOT, type ScenarioSpec } from "../oracle/client.ts";
import { DumpError, splitName, type ValidDump, validateDump } from "../oracle/conform/dump.ts";
import { firstDifferingStep } from "../oracle/conform/metrics.ts";
import { compareMask, compareTensor, isIdentityOrder, reorderTopK, type TensorComparison, type TopkOrder, TOPK_KINDS, topkPermutation } from "../oracle/conform/tensor_compare.ts";
import { DEFAULT_FLOOR_PATH, exitCodeOf, judge, loadNoiseFloor, type NoiseFloor, NoiseFloorError } from "../oracle/conform/verdict.ts";
import type { RawTensor } from "../oracle/tensor_diff.ts";
import { type FlagSpec, helpText, parseArgs, runMain, UsageError } from "./args.ts";
import { CONFORM_SCHEMA, type ConformReport, kindSummaries, logitSummary, renderHtml, renderMarkdown, renderText, tensorRows } from "./conform_report.ts";
import { parseTapName } from "./engine.ts";
import { ProgressBar } from "./progress.ts";
import { conformServer } from "./conform_server.ts";

export const FLAGS: FlagSpec[] = [
  { name: "dump", kind: "string", valueName: "dir", help: "the engine's dump folder (format: oracle/conform/FORMAT.md)" },
  { name: "checkpoint", kind: "string", valueName: "dir|id", help: "the checkpoint folder the engine loaded (its files' sha256 must be the dump's; a fixture id such as c1_dense/f32 names one of .cache/checkpoints); mlx-lm loads it too" },
  { name: "out", kind: "string", valueName: "dir", help: "where the reports go", default: "report" },
  { name: "floor", kind: "string", valueName: "file", help: "the noise floor (default: oracle/conform/noise_floor.json)" },
  { name: "strict", kind: "bool", help: "only bit-exact tensors pass (the bar for an engine on the same libmlx, e.g. this project's TS port)" },
  { name: "json", kind: "bool", help: "print the JSON report on stdout instead of the table" },
  { name: "verbose", kind: "bool", help: "stack traces on errors" },
  { name: "help", kind: "bool", help: "show this help" },
];

const FOOTER = `
Verdict: a tensor is within the floor when its relative L2 error (and, on logits, the largest
per-row KL) is at most the noise floor's value for its tap kind; the first tensor and layer
outside it are named. A run whose every value equals mlx-lm's conforms without a floor; any
other run is called CONFORMS only against a measured floor (a placeholder floor gives
"floor not measured", exit 1).

Server mode: npm run conform -- --server URL --checkpoint DIR --tokens IDS checks an
OpenAI-compatible /v1/completions endpoint instead of a dump (--server URL --help: its flags).

Reports: <out>/conform.json, <out>/conform.md, <out>/conform.html (per-layer error plot).
Exit status: 0 conforms, 1 diverges or the floor is not measured, 2 bad usage or a bad dump,
3 the oracle failed (mlx-lm raised or its process died: no verdict).

Example:
  bun engines/ts_port/dump.ts --checkpoint ckpt --prompt 2,5,9,4 --prefill-step-size 2 --max-tokens 4 --level 1 --out dump
  npm run conform -- --dump dump --checkpoint ckpt
`;

const USAGE = "npm run conform -- --dump <dir> --checkpoint <dir> [options]";

export interface ConformOptions {
  dump: string;
  checkpoint: string;
  floorFile?: string;
  strict?: boolean;
  progress?: boolean;
}

/** The oracle's tap a dump tensor is compared with: its own name, or logits for a logprobs the oracle has not. */
function oracleNameFor(name: string, oracleNames: ReadonlySet<string>): string {
  if (oracleNames.has(name)) return name;
  const { prefix, tap } = splitName(name);
  return tap === "logprobs" ? `${prefix}logits` : name;
}

function scenarioOf(d: ValidDump): ScenarioSpec {
  const m = d.manifest;
  if (m.schedule.kind === "forward") return { id: "conform", kind: "forward", tokens: [m.prompt] };
  return { id: "conform", kind: "generate", prompt: m.prompt, prefill_step_size: m.schedule.prefill_step_size, max_tokens: m.schedule.max_tokens };
}

/** One tap of a streamed capture: an array's .npy file (read and deleted at its turn), or a mask kind. */
interface WireTap {
  name: string;
  kind: "array" | "none" | "str";
  dtype?: string;
  value?: string;
  npy?: string;
}

/**
 * mlx-lm's capture of the dump's schedule, streamed: the server writes each tap the dump holds to
 * its .npy as it records it (and no other), so neither side holds a whole capture of a real-size
 * model in memory (the comparison reads one tap at a time). Returns every tap name in execution
 * order and the tokens.
 */
async function captureStreamed(oracle: OracleClient, checkpoint: string, scenario: ScenarioSpec, only: readonly string[]): Promise<{ generated: number[]; taps: WireTap[] }> {
  // `only` with `stream`: mlx-lm writes just these taps' data (every name is still listed, in order)
  const cap = await oracle.request<{ meta: { generated?: number[] }; taps: WireTap[] }>("capture", { checkpoint, scenario, mode: "full", only, stream: true }, 1_800_000);
  expectReply("capture", cap, { meta: "object", taps: "array" });
  const bad = cap.taps.find((t) => t === null || typeof t !== "object" || typeof t.name !== "string");
  if (bad !== undefined) throw new OracleError(`malformed reply from oracle to capture: tap ${JSON.stringify(bad)?.slice(0, 200)}`, "capture");
  return { generated: cap.meta.generated ?? [], taps: cap.taps };
}

/** Runs the comparison; returns the report (the caller writes it). */
export async function conform(oracle: OracleClient, opts: ConformOptions, validated?: ValidDump): Promise<ConformReport> {
  const floor = loadNoiseFloor(opts.floorFile ?? DEFAULT_FLOOR_PATH);
  // (hashing a real checkpoint takes seconds: a dump validated already is not validated again)
  const dump = validated ?? validateDump(opts.dump, opts.checkpoint);
  const m = dump.manifest;
  const names = [...m.tensors, ...Object.keys(m.mask_kinds ?? {})];

  // Ask for the dump's names plus the logits a logprobs may stand for.
  const want = new Set<string>();
  for (const n of names) {
    want.add(n);
    const { prefix, tap } = splitName(n);
    if (tap === "logprobs") want.add(`${prefix}logits`);
  }
  const bar = opts.progress ? new ProgressBar("conform") : null;
  bar?.update(0, "mlx-lm capture");
  const cap = await captureStreamed(oracle, resolve(opts.checkpoint), scenarioOf(dump), [...want]);
  try {
    return compareCapture(oracle, opts, dump, floor, cap, want, names, bar);
  } finally {
    // every .npy not read (a tap the dump does not hold, or after an error) is deleted
    for (const t of cap.taps) if (t.npy && existsSync(t.npy)) unlinkSync(t.npy);
  }
}

function compareCapture(oracle: OracleClient, opts: ConformOptions, dump: ValidDump, floor: NoiseFloor, cap: { generated: number[]; taps: WireTap[] }, want: ReadonlySet<string>, names: string[], bar: ProgressBar | null): ConformReport {
  const m = dump.manifest;
  const byName = new Map(cap.taps.filter((t) => want.has(t.name)).map((t) => [t.name, t]));
  const order = cap.taps.map((t) => t.name);
  const oracleNames = new Set(order);

  // Generations: calls after the first differing greedy token are fed different tokens on the two sides.
  const oracleTokens = cap.generated;
  const engineTokens = m.generated ?? [];
  const tokenDiff = m.schedule.kind === "generate" ? firstDifferingStep(engineTokens, oracleTokens) : null;
  const notComparable = (name: string) => {
    const s = /^step(\d+)\//.exec(name);
    return tokenDiff !== null && s !== null && Number(s[1]) > tokenDiff;
  };

  const position = new Map(order.map((n, i) => [n, i]));
  const dumpNames = names.filter((n) => !notComparable(n));
  const notCompared = names.filter(notComparable).map((name) => ({ name, reason: `calls after step ${tokenDiff}, where the greedy tokens differ, are fed different tokens on the two sides` }));
  // Execution order: the oracle's tap order (a logprobs sits where the logits it stands for does).
  const pos = (n: string) => position.get(oracleNameFor(n, oracleNames)) ?? Number.MAX_SAFE_INTEGER;
  dumpNames.sort((a, b) => pos(a) - pos(b) || (a < b ? -1 : 1));

  const comparisons: TensorComparison[] = [];
  let k = 0;
  let lastCall = "";
  /** Per call and MoE layer, the engine's top-k order mapped onto mlx-lm's, token by token, and the tokens whose expert sets differ. */
  const topkOrder = new Map<string, TopkOrder>();
  for (const name of dumpNames) {
    const where = parseTapName(name);
    const oName = oracleNameFor(name, oracleNames);
    const ref = byName.get(oName);
    // one progress line per call (the comparison itself is quick next to mlx-lm's capture)
    if (bar && where.call !== lastCall) bar.update(k / dumpNames.length, `comparing ${where.call}`);
    lastCall = where.call;
    k++;
    if (!ref) throw new Error(`mlx-lm recorded no tap "${oName}" for this schedule (the dump validated; the oracle's tap list disagrees)`);
    const theirs = (): RawTensor => {
      if (!ref.npy) throw new Error(`mlx-lm did not store tap "${oName}"`);
      // kept on read (a logits file may serve a logprobs too); deleted with the rest at the end
      const rec = oracle.readArray({ npy: ref.npy, dtype: ref.dtype! }, true);
      return { dtype: rec.dtype, shape: rec.shape, data: rec.data };
    };
    const maskKind = dump.tensors.maskKind(name);
    if (maskKind !== undefined || ref.kind !== "array") {
      // A mask given as a kind ("causal" / "none") on either side.
      const oracleMask = ref.kind === "none" ? "none" : ref.kind === "str" && ref.value === "causal" ? "causal" : ref.kind === "array" ? theirs() : null;
      if (oracleMask === null) throw new Error(`mlx-lm's tap "${oName}" is the string ${JSON.stringify(ref.value)}, not a mask kind this comparison knows`);
      comparisons.push(compareMask(name, where, maskKind ?? dump.tensors.read(name), oName, oracleMask));
      continue;
    }
    const expected = theirs();
    let actual = dump.tensors.read(name);
    let reordered = false;
    let topkRowsDiffering = 0;
    if (TOPK_KINDS.has(where.kind) && where.layer !== null && !opts.strict) {
      // the router's top-k order is unspecified (argpartition): the engine's is put into mlx-lm's,
      // token by token, on the tokens whose expert sets agree (not under --strict, whose bar is
      // mlx-lm's bytes, order included)
      const key = `${where.call}|${where.layer}`;
      if (where.kind === "router/indices") {
        const order = topkPermutation(actual, expected);
        if (order) topkOrder.set(key, order);
      }
      const order = topkOrder.get(key);
      if (order && actual.shape.length >= 3) {
        topkRowsDiffering = order.differingRows.length;
        if (!isIdentityOrder(order.perm, expected.shape[2] ?? 1)) {
          actual = reorderTopK(actual, order.perm);
          reordered = true;
        }
      }
    }
    const cmp = compareTensor(name, where, actual, oName, expected);
    // reordered bytes equal to mlx-lm's are equal values, not the engine's bytes: not "bit-exact"
    comparisons.push({ ...cmp, ...(reordered ? { reordered, bitExact: false } : {}), ...(topkRowsDiffering ? { topkRowsDiffering } : {}) });
  }
  const verdict = judge(comparisons, floor, { strict: opts.strict, firstTokenDiff: tokenDiff });
  bar?.done(verdict.headline);
  const first = verdict.firstOutside;
  const rows = tensorRows(comparisons, verdict.tensors);
  return {
    schema: CONFORM_SCHEMA,
    createdAt: new Date().toISOString(),
    versions: { ...(oracle.versions ?? {}), bun: Bun.version, platform: `${process.platform}-${process.arch}` },
    dump: { dir: opts.dump, engine: { ...m.engine }, checkpoint: opts.checkpoint, promptLength: m.prompt.length, schedule: { ...m.schedule }, level: m.level, tensors: names.length },
    floor: { file: opts.floorFile ?? "oracle/conform/noise_floor.json", status: floor.status, measured: floor.measured },
    verdict: { status: verdict.status, headline: verdict.headline, strict: verdict.strict, firstOutside: first ? first.name : null, firstLayerOutside: verdict.firstLayerOutside, firstTokenDiff: tokenDiff },
    tokens: m.schedule.kind === "generate" ? { engine: engineTokens, oracle: oracleTokens } : null,
    notCompared,
    compared: comparisons.length,
    bitExact: comparisons.filter((c) => c.bitExact).length,
    exact: comparisons.filter((c) => c.exact).length,
    reordered: comparisons.filter((c) => c.reordered).length,
    logits: logitSummary(comparisons),
    layers: verdict.layers,
    kinds: kindSummaries(rows),
    tensors: rows,
  };
}

export function writeReports(rep: ConformReport, out: string): string[] {
  mkdirSync(out, { recursive: true });
  const files = [join(out, "conform.json"), join(out, "conform.md"), join(out, "conform.html")];
  writeFileSync(files[0]!, `${JSON.stringify(rep, (_k, v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v))}\n`);
  writeFileSync(files[1]!, renderMarkdown(rep));
  writeFileSync(files[2]!, renderHtml(rep));
  return files;
}

/** A checkpoint folder, or a fixture id ("c1_dense/f32") of the checkpoint cache npm run setup fills. */
function checkpointDir(ref: string): string {
  if (existsSync(join(ref, "config.json"))) return ref;
  const fixture = join(REPO_ROOT, ".cache", "checkpoints", ref);
  return !isAbsolute(ref) && existsSync(join(fixture, "config.json")) ? fixture : ref;
}

/** Bad input the command reports with exit code 2: a bad dump or floor file, besides bad usage. */
function isBadInput(e: unknown): boolean {
  return e instanceof DumpError || e instanceof NoiseFloorError || e instanceof UsageError;
}

/** The command; `oracle`: an oracle already running (tests), else one is started and closed here. */
export async function main(argv: string[], deps: { oracle?: OracleClient; write?: (s: string) => void } = {}): Promise<number> {
  const write = deps.write ?? ((s: string) => process.stdout.write(s));
  // --server URL: the server mode (parity/conform_server.ts, its own flags) instead of a dump.
  if (argv.some((x) => x === "--server" || x.startsWith("--server="))) {
    try {
      return await conformServer(argv, { ...(deps.oracle ? { oracle: deps.oracle } : {}), out: write });
    } finally {
      if (!deps.oracle) await closeSharedOracle();
    }
  }
  const a = parseArgs(argv, FLAGS);
  if (a.help) {
    write(helpText(USAGE, "Checks an engine's conformance dump against mlx-lm, tensor by tensor.", FLAGS, FOOTER));
    return 0;
  }
  if (typeof a.dump !== "string") throw new UsageError("--dump <dir> is required, unless --server <url> (see --help)");
  if (typeof a.checkpoint !== "string") throw new UsageError("--checkpoint <dir> is required: the checkpoint folder the engine loaded (see --help)");
  const opts: ConformOptions = { dump: a.dump, checkpoint: checkpointDir(a.checkpoint), floorFile: a.floor as string | undefined, strict: a.strict === true, progress: a.json !== true && deps.write === undefined };
  // Validate the dump and the floor before starting mlx-lm: bad input answers at once.
  const dump = validateDump(opts.dump, opts.checkpoint);
  loadNoiseFloor(opts.floorFile ?? DEFAULT_FLOOR_PATH);
  const oracle = deps.oracle ?? (await OracleClient.start());
  let rep: ConformReport;
  try {
    rep = await conform(oracle, opts, dump);
  } finally {
    if (!deps.oracle) await oracle.close();
  }
  const files = writeReports(rep, a.out as string);
  if (a.json) write(`${JSON.stringify(rep, (_k, v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v))}\n`);
  else write(`${renderText(rep)}\nreports: ${files.join(", ")}\n`);
  return exitCodeOf(rep.verdict);
}

/** Exit 3, as npm run parity: the oracle failed (mlx-lm raised or its process died), so there is no verdict. */
export const ORACLE_FAILED = 3;

function errorMessage(err: Error): string {
  const msg = err.message.split("\n--- python traceback ---")[0];
  if (err instanceof OracleError) return `error: the oracle failed, no verdict (exit ${ORACLE_FAILED}): ${msg}\n(run with --verbose for the Python traceback)\n`;
  return `error: ${msg}\n`;
}

if (import.meta.main) {
  // A bad dump or floor file is bad input (exit 2), as bad usage is; an oracle failure exit 3.
  runMain(main, errorMessage, (err) => (err instanceof OracleError ? ORACLE_FAILED : isBadInput(err) ? 2 : undefined));
}
