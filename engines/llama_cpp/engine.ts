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
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
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
  const llama = await nlc.getLlama({ gpu: false, build: "never", logLevel: nlc.LlamaLogLevel.error ?? "error" });
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
