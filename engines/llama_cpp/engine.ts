// Conformance engine "llama.cpp", through the npm package node-llama-cpp (pinned in this folder's
// package.json; prebuilt Linux/macOS CPU binaries, never built here). Everything heavy is on
// demand and git-ignored:
//   - node-llama-cpp into engines/llama_cpp/node_modules (`npm ci` in this folder; ~730 MB, its
//     optional CUDA/Vulkan binaries come along), only when the caller allows the install;
//   - llama.cpp's HF->GGUF converter, cloned from the git bundle shipped inside the package
//     (llama/gitRelease.bundle: the llama.cpp the binaries were built from), into
//     .cache/llama_cpp/llama.cpp-<version>;
//   - the converter's Python (torch, transformers, gguf, ...) is the reference venv
//     (.venv-reference, ensureVenv in oracle/reference_export.ts);
//   - prepared checkpoint copies and GGUF files under .cache/llama_cpp/.
// Nothing here is imported by the default test path: node-llama-cpp is loaded with a dynamic
// import, typed by the few members used below.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

export const ENGINE = "llama.cpp";
/** The folder of this adapter (its package.json pins node-llama-cpp). */
export const HERE = dirname(fileURLToPath(import.meta.url));
export const REPO = resolve(HERE, "..", "..");
export const WORK = join(REPO, ".cache", "llama_cpp");
const PREPARE = join(HERE, "prepare_checkpoint.py");

/** Bad usage or input: exit 2 from the command. */
export class EngineUsageError extends Error {
  override readonly name = "EngineUsageError";
}

/** The converter refused a checkpoint (its last error line kept verbatim). */
export class ConversionRefused extends Error {
  override readonly name = "ConversionRefused";
  constructor(
    readonly checkpoint: string,
    readonly refusal: string,
  ) {
    super(`llama.cpp's converter refused ${checkpoint}: ${refusal}`);
  }
}

const log = (m: string) => process.stderr.write(`[llama.cpp] ${m}\n`);

/** The node-llama-cpp version pinned in package.json (exact). */
export function pinnedVersion(): string {
  const pkg = JSON.parse(readFileSync(join(HERE, "package.json"), "utf8")) as { dependencies: Record<string, string> };
  const v = pkg.dependencies["node-llama-cpp"];
  if (!v || !/^\d+\.\d+\.\d+$/.test(v)) throw new Error(`engines/llama_cpp/package.json: node-llama-cpp must be pinned to an exact version, got ${v}`);
  return v;
}

const PACKAGE_DIR = join(HERE, "node_modules", "node-llama-cpp");

/** The installed node-llama-cpp version, or null. */
export function installedVersion(): string | null {
  const p = join(PACKAGE_DIR, "package.json");
  return existsSync(p) ? (JSON.parse(readFileSync(p, "utf8")) as { version: string }).version : null;
}

/** The opt-in: CONFORM_ENGINES (comma-separated) names llama_cpp. */
export function optedIn(env: Record<string, string | undefined> = process.env): boolean {
  return (env.CONFORM_ENGINES ?? "").split(",").map((s) => s.trim()).includes("llama_cpp");
}

function run(cmd: string, args: string[], what: string, cwd = REPO): { stdout: string; stderr: string } {
  const r = spawnSync(cmd, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 26 });
  if (r.error || r.status !== 0) {
    const tail = `${r.stderr ?? ""}`.trim().split("\n").slice(-6).join("\n");
    throw new Error(`${what} failed (${r.error?.message ?? `exit ${r.status}`})${tail ? `:\n${tail}` : ""}`);
  }
  return { stdout: r.stdout, stderr: r.stderr };
}

/** node-llama-cpp at the pinned version, installed now when `allowInstall` (else a usage error saying how). */
export function ensureInstalled(allowInstall: boolean): string {
  const want = pinnedVersion();
  if (installedVersion() === want) return want;
  if (!allowInstall)
    throw new EngineUsageError(
      `node-llama-cpp ${want} is not installed in engines/llama_cpp (an on-demand install of ~730 MB): rerun with --install or CONFORM_ENGINES=llama_cpp`,
    );
  log(`installing node-llama-cpp ${want} into engines/llama_cpp/node_modules (npm ci; ~730 MB, once)`);
  run("npm", ["ci", "--no-audit", "--no-fund"], "npm ci in engines/llama_cpp", HERE);
  const got = installedVersion();
  if (got !== want) throw new Error(`npm ci installed node-llama-cpp ${got}, package.json pins ${want}`);
  return want;
}

/** llama.cpp's sources as the package ships them (its converter), cloned once per package version. */
export function ensureConverter(version: string): string {
  const dir = join(WORK, `llama.cpp-${version}`);
  if (existsSync(join(dir, "convert_hf_to_gguf.py"))) return dir;
  const bundle = join(PACKAGE_DIR, "llama", "gitRelease.bundle");
  if (!existsSync(bundle)) throw new Error(`node-llama-cpp ${version} ships no llama/gitRelease.bundle: cannot find llama.cpp's converter`);
  mkdirSync(WORK, { recursive: true });
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  log(`cloning llama.cpp's sources from node-llama-cpp's git bundle into ${dir}`);
  run("git", ["clone", "-q", bundle, tmp], "git clone of node-llama-cpp's llama.cpp bundle");
  renameSync(tmp, dir);
  return dir;
}

/** The llama.cpp release the package binds (llama/llama.cpp.info.json). */
export function llamaCppRelease(): string {
  const p = join(PACKAGE_DIR, "llama", "llama.cpp.info.json");
  return existsSync(p) ? String((JSON.parse(readFileSync(p, "utf8")) as { tag?: string }).tag ?? "unknown") : "unknown";
}

export interface Prepared {
  /** The checkpoint copy the GGUF was made from (the dump's manifest hashes its files). */
  dir: string;
  gguf: string;
  /** sha256 of config.json and *.safetensors of `dir`. */
  files: Record<string, string>;
  /** Safetensors files rewritten from mlx-lm's MoE layout to HF's (same values, other bytes). */
  rewrittenMoeLayout: string[];
}

/**
 * A converter-ready copy of `checkpointDir` (engines/llama_cpp/prepare_checkpoint.py) and its
 * float32 GGUF (`convert_hf_to_gguf.py --outtype f32`), both cached under .cache/llama_cpp/ by
 * `name`; remade when the source's files change. Throws ConversionRefused with the converter's
 * message when it refuses the checkpoint.
 */
export function prepareAndConvert(python: string, converterDir: string, checkpointDir: string, name: string): Prepared {
  const safe = name.replace(/[^A-Za-z0-9_.-]+/g, "_");
  const dir = join(WORK, "prepared", safe);
  const gguf = join(WORK, "gguf", `${safe}.f32.gguf`);
  const stampPath = join(WORK, "gguf", `${safe}.stamp.json`);
  mkdirSync(dirname(gguf), { recursive: true });
  rmSync(dir, { recursive: true, force: true });
  const prep = JSON.parse(run(python, [PREPARE, checkpointDir, dir], `preparing ${name} for the converter`).stdout.trim().split("\n").pop()!) as {
    files: Record<string, string>;
    rewritten_moe_layout: string[];
  };
  const stamp = JSON.stringify({ files: prep.files, converter: converterDir });
  if (existsSync(gguf) && existsSync(stampPath) && readFileSync(stampPath, "utf8") === stamp) {
    return { dir, gguf, files: prep.files, rewrittenMoeLayout: prep.rewritten_moe_layout };
  }
  rmSync(gguf, { force: true });
  const tmp = `${gguf}.tmp-${process.pid}`;
  const r = spawnSync(python, [join(converterDir, "convert_hf_to_gguf.py"), dir, "--outtype", "f32", "--outfile", tmp], {
    cwd: REPO,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
    maxBuffer: 1 << 26,
  });
  if (r.error || r.status !== 0) {
    rmSync(tmp, { force: true });
    throw new ConversionRefused(name, converterRefusal(`${r.stderr ?? ""}`));
  }
  renameSync(tmp, gguf);
  writeFileSync(stampPath, stamp);
  return { dir, gguf, files: prep.files, rewrittenMoeLayout: prep.rewritten_moe_layout };
}

/** The converter's own words: the Python exception line, with the failing source line for a bare assert. */
export function converterRefusal(stderr: string): string {
  const lines = stderr.trim().split("\n").filter((l) => l.trim() !== "");
  const last = lines.at(-1)?.trim() ?? "(no message)";
  if (/^AssertionError$/.test(last)) {
    const src = lines.slice(0, -1).reverse().find((l) => /^\s*assert /.test(l));
    const where = lines.slice(0, -1).reverse().find((l) => /File ".*", line \d+/.test(l));
    const file = where?.match(/File ".*?([^/]+\/[^/]+)", line (\d+)/);
    return `AssertionError${file ? ` at ${file[1]}:${file[2]}` : ""}${src ? `: ${src.trim()}` : ""}`;
  }
  return last;
}

// ------------------------------------------------------------------ node-llama-cpp, as used here

/** The members of node-llama-cpp's API this adapter calls (its own .d.ts has the full types). */
export interface LlamaSequence {
  controlledEvaluate(
    input: Array<number | [number, { generateNext?: { probabilities?: boolean; token?: boolean; options?: { temperature?: number } } }]>,
  ): Promise<Array<undefined | { next: { token?: number | null; probabilities?: Map<number, number> } }>>;
  clearHistory(): Promise<void>;
}
interface LlamaContext {
  getSequence(): LlamaSequence;
  dispose(): Promise<void>;
}
interface LlamaModel {
  createContext(o: Record<string, unknown>): Promise<LlamaContext>;
  readonly fileInfo: { metadata: { general: { architecture?: string } } };
  dispose(): Promise<void>;
}
interface Llama {
  readonly buildType: string;
  readonly gpu: string | false;
  loadModel(o: { modelPath: string; gpuLayers?: number | "auto" }): Promise<LlamaModel>;
  dispose(): Promise<void>;
}
interface NodeLlamaCpp {
  getLlama(o: Record<string, unknown>): Promise<Llama>;
  LlamaLogLevel: Record<string, string>;
}

export async function loadNodeLlamaCpp(): Promise<NodeLlamaCpp> {
  const entry = join(PACKAGE_DIR, "dist", "index.js");
  if (!existsSync(entry)) throw new EngineUsageError("node-llama-cpp is not installed (rerun with --install)");
  return (await import(pathToFileURL(entry).href)) as NodeLlamaCpp;
}

/** An open model and one context: prebuilt CPU binaries, float32 KV cache, one sequence. */
export interface OpenEngine {
  sequence: LlamaSequence;
  buildType: string;
  close(): Promise<void>;
}

/**
 * Opens a GGUF on the CPU with the prebuilt binaries (`build: "never"`: never compiles), a float32
 * KV cache (the request only takes effect with flash attention off) and one thread (the
 * reductions then run in one fixed order).
 */
export async function openEngine(gguf: string, contextSize: number): Promise<OpenEngine> {
  const nlc = await loadNodeLlamaCpp();
  // llama.cpp's own error lines go to stderr: node-llama-cpp's exceptions say only "Failed to load model"
  const llama = await nlc.getLlama({
    gpu: false,
    build: "never",
    logLevel: nlc.LlamaLogLevel.error ?? "error",
    logger: (level: string, message: string) => {
      if (level === "error" || level === "fatal") process.stderr.write(`llama.cpp: ${message.trimEnd()}\n`);
    },
  });
  if (llama.gpu !== false) throw new Error(`node-llama-cpp opened a GPU backend (${llama.gpu}) though gpu: false was asked`);
  const model = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });
  const ctx = await model.createContext({
    contextSize: Math.max(32, contextSize),
    batchSize: Math.max(32, contextSize),
    sequences: 1,
    threads: 1,
    flashAttention: false,
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
    // keep every position of sliding-window layers: the schedule never evicts, as mlx-lm's
    swaFullCache: true,
  });
  return {
    sequence: ctx.getSequence(),
    buildType: llama.buildType,
    close: async () => {
      await ctx.dispose();
      await model.dispose();
      await llama.dispose();
    },
  };
}

/**
 * One model call: feeds `tokens` after what the sequence already holds, asking for the next-token
 * distribution at every position with the greedy sampler (temperature 0). node-llama-cpp returns
 * it as a Map over the whole vocabulary (token -> probability), computed in float32 from the raw
 * logits: softmax(logits - max) (llama/addon/AddonContext.cpp, sampleToken). Returns log(p) as
 * float32 rows (L x V) and the greedy token of each position.
 */
export async function evaluateCall(seq: LlamaSequence, tokens: number[], vocab: number): Promise<{ logprobs: Float32Array; greedy: number[] }> {
  const out = await seq.controlledEvaluate(tokens.map((t) => [t, { generateNext: { probabilities: true, token: true, options: { temperature: 0 } } }]));
  const L = tokens.length;
  const logprobs = new Float32Array(L * vocab);
  const greedy: number[] = [];
  for (let i = 0; i < L; i++) {
    const next = out[i]?.next;
    const probs = next?.probabilities;
    if (!probs) throw new Error(`node-llama-cpp returned no probabilities for position ${i}`);
    if (probs.size !== vocab) throw new Error(`node-llama-cpp returned ${probs.size} probabilities at position ${i}, the vocabulary has ${vocab} (a sparse list: the dump needs every token)`);
    for (const [tok, p] of probs) {
      if (!Number.isInteger(tok) || tok < 0 || tok >= vocab) throw new Error(`node-llama-cpp returned token ${tok} outside the vocabulary`);
      logprobs[i * vocab + tok] = Math.log(p);
    }
    if (typeof next.token !== "number") throw new Error(`node-llama-cpp returned no greedy token at position ${i}`);
    greedy.push(next.token);
  }
  return { logprobs, greedy };
}

// ------------------------------------------------------------------ child processes

/** llama.cpp failed: it ended its process (a failed GGML_ASSERT aborts) or refused to load the GGUF; its own message. */
export class EngineAborted extends Error {
  override readonly name = "EngineAborted";
  constructor(readonly engineMessage: string) {
    super(`llama.cpp failed: ${engineMessage}`);
  }
  /** An abort of the process (GGML_ASSERT), not a refusal to load. */
  get isAbort(): boolean {
    return /GGML_ASSERT|GGML_ABORT|SIGABRT|terminate called/.test(this.engineMessage);
  }
}

/** The line of a crashed llama.cpp's stderr that says why (its GGML_ASSERT), else its last line. */
export function abortMessage(stderr: string): string {
  const lines = stderr.split("\n").map((l) => l.trim()).filter(Boolean);
  const assert = lines.find((l) => /GGML_ASSERT|GGML_ABORT|terminate called/.test(l));
  const loadError = lines.find((l) => /error loading model:/.test(l))?.replace(/^.*?error loading model: /, "error loading model: ");
  // the path of the machine the binaries were built on says nothing to a reader: keep src/... on
  return (assert ?? loadError ?? lines.at(-1) ?? "(no message)").replace(/^.*?\/llama\.cpp\/(src|ggml)\//, "$1/").replace(/\s+/g, " ");
}

let jobSeq = 0;

/**
 * The schedule's calls on node-llama-cpp (engine_run.ts, in a child process): per call the L x V
 * log-probabilities and the greedy token of every position. `null` feeds the previous call's
 * greedy token. Throws EngineAborted when llama.cpp kills the process.
 */
export function runCalls(gguf: string, vocab: number, calls: (number[] | null)[]): { logprobs: Float32Array[]; greedy: number[][]; samplerAgreesWithArgmax: boolean; buildType: string } {
  mkdirSync(join(WORK, "jobs"), { recursive: true });
  const base = join(WORK, "jobs", `run-${process.pid}-${jobSeq++}`);
  const contextSize = calls.reduce((n, c) => n + (c?.length ?? 1), 0);
  writeFileSync(`${base}.job.json`, JSON.stringify({ gguf, vocab, contextSize, calls, out: base }));
  try {
    const r = spawnSync(process.execPath, [join(HERE, "engine_run.ts"), `${base}.job.json`], { cwd: REPO, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 26 });
    if (r.error) throw new Error(`running engine_run.ts: ${r.error.message}`);
    if (r.status !== 0) throw new EngineAborted(abortMessage(`${r.stderr ?? ""}`) + (r.signal ? ` (${r.signal})` : ""));
    const meta = JSON.parse(readFileSync(`${base}.json`, "utf8")) as { greedy: number[][]; samplerAgreesWithArgmax: boolean; buildType: string };
    const bytes = readFileSync(`${base}.f32`);
    const all = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    const logprobs: Float32Array[] = [];
    let o = 0;
    for (const g of meta.greedy) {
      logprobs.push(all.subarray(o, o + g.length * vocab));
      o += g.length * vocab;
    }
    return { logprobs, greedy: meta.greedy, samplerAgreesWithArgmax: meta.samplerAgreesWithArgmax, buildType: meta.buildType };
  } finally {
    for (const ext of [".job.json", ".json", ".f32"]) rmSync(`${base}${ext}`, { force: true });
  }
}

// ------------------------------------------------------------------ level 1: llama_taps (C API)

const BACKEND_DIR_CANDIDATES = ["linux-x64", "linux-arm64", "mac-arm64-metal", "mac-x64"];

/** The folder of the package's prebuilt libllama and ggml backends for this platform. */
export function backendDir(): string {
  for (const p of BACKEND_DIR_CANDIDATES) {
    const d = join(HERE, "node_modules", "@node-llama-cpp", p, "bins", p);
    if (existsSync(d)) return d;
  }
  throw new EngineUsageError("no prebuilt llama.cpp binaries of node-llama-cpp for this platform (engines/llama_cpp/node_modules/@node-llama-cpp/*/bins)");
}

function libName(dir: string, stem: string): string {
  const f = readdirSync(dir).find((n) => n.startsWith(`${stem}.`) && (n.endsWith(".so") || n.endsWith(".dylib")));
  if (!f) throw new Error(`${dir}: no ${stem} library`);
  return f;
}

/** engines/llama_cpp/<name>.c compiled with the system C compiler against the package's libraries (cached). */
export function ensureTool(name: "llama_taps" | "gelu_repro", converterDir: string): string {
  const bins = backendDir();
  const out = join(WORK, `${name}-${basename(converterDir)}`);
  const src = join(HERE, `${name}.c`);
  const stamp = `${out}.sha256`;
  const want = createHash("sha256").update(readFileSync(src)).update(bins).digest("hex");
  if (existsSync(out) && existsSync(stamp) && readFileSync(stamp, "utf8") === want) return out;
  const cc = process.env.CC ?? "cc";
  const libs = [libName(bins, "libllama"), libName(bins, "libggml"), libName(bins, "libggml-base")].filter((l, i) => name === "llama_taps" || i > 0);
  const args = ["-O2", "-std=c11", src, `-I${join(converterDir, "include")}`, `-I${join(converterDir, "ggml", "include")}`, `-L${bins}`, ...libs.map((l) => `-l:${l}`), "-lm", `-Wl,-rpath,${bins}`, "-o", out];
  const r = spawnSync(cc, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  if (r.error || r.status !== 0)
    throw new EngineUsageError(`level 1 needs a C compiler to build engines/llama_cpp/${name}.c against node-llama-cpp's libllama (${cc}: ${r.error?.message ?? `${r.stderr}`.trim().split("\n").slice(-3).join(" ")})`);
  writeFileSync(stamp, want);
  return out;
}

export interface TapsCall {
  logits: Float32Array;
  /** llama.cpp's callback names (inp_scaled, l_out-<i>, result_norm) -> L x H float32 values. */
  taps: Map<string, Float32Array>;
  greedy: number;
}

/** The schedule's calls through llama_taps (raw logits and the residual stream per call). */
export function runTaps(tool: string, gguf: string, vocab: number, calls: (number[] | null)[]): TapsCall[] {
  const dir = join(WORK, "jobs", `taps-${process.pid}-${jobSeq++}`);
  mkdirSync(dir, { recursive: true });
  try {
    const r = spawnSync(tool, [gguf, backendDir(), dir, ...calls.map((c) => (c === null ? "G" : c.join(",")))], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 26 });
    if (r.error) throw new Error(`running llama_taps: ${r.error.message}`);
    if (r.status !== 0) throw new EngineAborted(abortMessage(`${r.stderr ?? ""}`) + (r.signal ? ` (${r.signal})` : ""));
    const lines = r.stdout.trim().split("\n").map((l) => JSON.parse(l) as { call?: number; name?: string; ne?: number[]; greedy?: number[] });
    const greedy = lines.find((l) => l.greedy)?.greedy ?? [];
    const out: TapsCall[] = calls.map((_, k) => ({ logits: new Float32Array(0), taps: new Map(), greedy: greedy[k] ?? -1 }));
    for (const l of lines) {
      if (l.call === undefined || !l.name || !l.ne) continue;
      const bytes = readFileSync(join(dir, `c${l.call}.${l.name}.f32`));
      const values = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
      if (values.length !== l.ne.reduce((a, b) => a * b, 1)) throw new Error(`llama_taps: ${l.name} of call ${l.call} holds ${values.length} values, its shape ${l.ne}`);
      if (l.name === "logits") out[l.call]!.logits = values;
      else out[l.call]!.taps.set(l.name, values);
    }
    for (const [k, c] of out.entries()) if (c.logits.length !== (calls[k]?.length ?? 1) * vocab) throw new Error(`llama_taps: call ${k} returned ${c.logits.length} logits`);
    return out;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
