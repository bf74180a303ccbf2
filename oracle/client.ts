// TS client of the live oracle (oracle/python/server.py): one long-lived Python process,
// JSON lines on stdio with request ids, arrays as .npy files in the server's per-run temp dir.
// Independent of the mlx binding: arrays are plain { dtype, shape, data } records.

import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { execa, type ResultPromise } from "execa";
import { type DtypeName, isDtypeName, type NpyRecord, parseNpy, toNpy } from "./npy.ts";

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const DEFAULT_PYTHON = join(REPO_ROOT, ".venv", "bin", "python");
export const SERVER_SCRIPT = join(REPO_ROOT, "oracle", "python", "server.py");

export interface OracleOptions {
  /** Interpreter (default: the repo's .venv/bin/python, never a pyenv shim). */
  python?: string;
  /** Server script (default oracle/python/server.py); tests point this at fakes. */
  script?: string;
  /** Extra server arguments (e.g. ["--checkpoints", dir]). */
  args?: string[];
  env?: Record<string, string>;
  /** Time allowed for the "ready" line (default 60 s). */
  startTimeoutMs?: number;
  /** Default per-request timeout (default 300 s). The process is killed when one expires. */
  requestTimeoutMs?: number;
  /** Receives each stderr line (default: kept only as a tail for error messages; ORACLE_VERBOSE=1 echoes). */
  onStderr?: (line: string) => void;
}

/** Any oracle failure. Python exceptions carry their type and traceback. */
export class OracleError extends Error {
  override name = "OracleError";
  constructor(
    message: string,
    readonly command?: string,
    readonly pythonType?: string,
    readonly pythonTraceback?: string,
    /** The Python exception's own message (for a failed command). */
    readonly pythonMessage?: string,
  ) {
    super(message);
  }
}

/** A .npy file reference on the wire. */
export interface NpyRef {
  npy: string;
  dtype: string;
  shape?: number[];
}
export type OpInput = NpyRecord | { scalar: number | boolean; kind: "int" | "float" | "bool" };

/** One synthetic layout for mmMasks (fields as the server's mm_masks command reads them). */
export interface MmMaskCase {
  layer_types: string[];
  window: number;
  bidirectional: string | null;
  B: number;
  N: number;
  /** mm_token_type_ids rows (null: none given). */
  types: number[][] | null;
  /** The caches' offset (null: no cache). */
  offset: number | null;
}

export interface MaskResult {
  kind: "none" | "causal" | "array";
  array?: NpyRecord;
}

export interface TapRecord {
  name: string;
  kind: "array" | "none" | "str";
  dtype?: string;
  shape?: number[];
  stored?: boolean;
  value?: string;
  meta?: Record<string, unknown>;
  /** The tensor, when stored (mode "full", or the logits-mode subset). */
  array?: NpyRecord;
}

export interface CallRecord {
  prefix: string;
  kind: "forward" | "prefill" | "step";
  index: number;
  batch: number;
  length: number;
  tokens: number[][];
  offset_before: number;
  cache_after: Record<string, unknown>[];
  taps: number;
}

/** One cache's contents: its dtype and the sha256 of its key and value buffers' raw bytes (null: empty). */
export interface CacheSha256 {
  dtype: string | null;
  keys: string | null;
  values: string | null;
}

export interface CaptureResult {
  meta: { scenario: string; kind: string; mode: string; generated?: number[]; prefill_chunks?: number[] };
  calls: CallRecord[];
  /** Every tap in execution order. */
  taps: TapRecord[];
}

export interface ScenarioSpec {
  id: string;
  kind: "forward" | "generate";
  tokens?: number[][];
  prompt?: number[];
  prefill_step_size?: number;
  max_tokens?: number;
}

export type CacheOp =
  | { op: "new"; cache?: string; type: "KVCache" | "RotatingKVCache"; max_size?: number; keep?: number; offset?: number }
  | { op: "update_and_fetch"; cache?: string; keys: NpyRecord; values: NpyRecord }
  | { op: "make_mask"; cache?: string; N: number; window_size?: number | null; return_array?: boolean }
  | { op: "trim"; cache?: string; n: number }
  | { op: "size" | "is_trimmable" | "empty" | "state"; cache?: string }
  | { op: "from_state"; cache?: string; to: string };

export interface CacheOpResult {
  op: string;
  keys?: NpyRecord;
  values?: NpyRecord;
  mask?: MaskResult;
  trimmed?: number;
  value?: number | boolean;
  state?: (NpyRecord | number | null)[];
  meta: Record<string, unknown> | null;
}

interface Pending {
  cmd: string;
  resolve: (v: Record<string, unknown>) => void;
  reject: (e: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

/**
 * The oracle's package versions with a package it does not have (null from Python: mlx-vlm or
 * mlx-audio on a machine staged for text only) written "not installed", so every report can print
 * them (a null here once crashed the HTML report on the H200 after its verdict).
 */
export function installedVersions(v: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries((v ?? {}) as Record<string, unknown>)) out[k] = x === null || x === undefined ? "not installed" : String(x);
  return out;
}

export class OracleClient {
  private proc: ResultPromise | undefined;
  private pending = new Map<number, Pending>();
  private nextId = 1;
  private buf = "";
  private stderrTail: string[] = [];
  private dead: OracleError | undefined;
  private ready: { pid: number; tmpdir: string; versions: Record<string, string> } | undefined;
  private inputDir: string;
  private inputSeq = 0;
  private readonly opts: OracleOptions;

  private constructor(opts: OracleOptions) {
    this.opts = opts;
    this.inputDir = mkdtempSync(join(tmpdir(), "oracle-in-"));
  }

  /** Spawn the server and wait for its "ready" line. */
  static async start(opts: OracleOptions = {}): Promise<OracleClient> {
    const c = new OracleClient(opts);
    await c.spawn();
    return c;
  }

  get pid(): number | undefined {
    return this.ready?.pid;
  }
  get serverTmpdir(): string | undefined {
    return this.ready?.tmpdir;
  }
  get versions(): Record<string, string> | undefined {
    return this.ready?.versions;
  }
  get alive(): boolean {
    return this.proc !== undefined && this.dead === undefined;
  }

  private spawn(): Promise<void> {
    // ORACLE_PYTHON: another interpreter for every oracle process (default: the repo's .venv).
    const python = this.opts.python ?? (process.env.ORACLE_PYTHON || DEFAULT_PYTHON);
    const script = this.opts.script ?? SERVER_SCRIPT;
    if (!existsSync(python)) {
      return Promise.reject(new OracleError(`python interpreter not found: ${python} (run npm run setup)`));
    }
    const proc = execa(python, [script, ...(this.opts.args ?? [])], {
      cwd: REPO_ROOT,
      env: { PYTHONUNBUFFERED: "1", ...this.opts.env },
      stdin: "pipe",
      stdout: "pipe",
      stderr: "pipe",
      buffer: false,
      reject: false,
      cleanup: true,
      encoding: "utf8",
    });
    this.proc = proc;
    const echo = process.env.ORACLE_VERBOSE === "1";
    let errBuf = "";
    proc.stderr?.on("data", (chunk: Buffer | string) => {
      errBuf += chunk.toString();
      let nl: number;
      while ((nl = errBuf.indexOf("\n")) >= 0) {
        const line = errBuf.slice(0, nl);
        errBuf = errBuf.slice(nl + 1);
        this.stderrTail.push(line);
        if (this.stderrTail.length > 40) this.stderrTail.shift();
        this.opts.onStderr?.(line);
        if (echo) process.stderr.write(`[oracle] ${line}\n`);
      }
    });
    proc.stdin?.on("error", () => {}); // EPIPE after a crash surfaces through the exit handler
    return new Promise<void>((resolveReady, rejectReady) => {
      const startTimer = setTimeout(() => {
        const e = new OracleError(
          `oracle did not become ready within ${this.opts.startTimeoutMs ?? 60000} ms${this.tail()}`,
        );
        this.fail(e);
        rejectReady(e);
      }, this.opts.startTimeoutMs ?? 60000);
      proc.stdout?.on("data", (chunk: Buffer | string) => {
        this.buf += chunk.toString();
        let nl: number;
        while ((nl = this.buf.indexOf("\n")) >= 0) {
          const line = this.buf.slice(0, nl).trim();
          this.buf = this.buf.slice(nl + 1);
          if (line.length === 0) continue;
          let msg: Record<string, unknown>;
          try {
            const parsed: unknown = JSON.parse(line);
            if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("not an object");
            msg = parsed as Record<string, unknown>;
          } catch {
            const e = new OracleError(`malformed reply from oracle (not a JSON object): ${line.slice(0, 200)}`);
            clearTimeout(startTimer);
            this.fail(e);
            rejectReady(e);
            return;
          }
          if (this.ready === undefined) {
            if (msg.event !== "ready") {
              const e = new OracleError(`oracle sent ${line.slice(0, 200)} before its ready line`);
              clearTimeout(startTimer);
              this.fail(e);
              rejectReady(e);
              return;
            }
            this.ready = {
              pid: Number(msg.pid),
              tmpdir: String(msg.tmpdir),
              versions: installedVersions(msg.versions),
            };
            clearTimeout(startTimer);
            resolveReady();
            continue;
          }
          this.dispatch(msg, line);
        }
      });
      void proc.then((res) => {
        clearTimeout(startTimer);
        const how = res.signal ? `signal ${res.signal}` : `code ${res.exitCode}`;
        const e = new OracleError(`oracle process exited (${how})${this.tail()}`);
        if (this.ready === undefined) rejectReady(e);
        this.fail(e);
      });
    });
  }

  private tail(): string {
    const t = this.stderrTail.slice(-15).join("\n").trim();
    return t ? `\n--- oracle stderr (tail) ---\n${t}` : "";
  }

  private dispatch(msg: Record<string, unknown>, line: string): void {
    const id = msg.id;
    const p = typeof id === "number" ? this.pending.get(id) : undefined;
    if (p === undefined) {
      this.fail(new OracleError(`oracle reply with unknown id ${JSON.stringify(id)}: ${line.slice(0, 200)}`));
      return;
    }
    this.pending.delete(id as number);
    clearTimeout(p.timer);
    if (msg.ok === true) {
      p.resolve(msg);
    } else if (msg.ok === false && typeof msg.error === "object" && msg.error !== null) {
      const err = msg.error as { type?: string; message?: string; traceback?: string };
      p.reject(
        new OracleError(
          `oracle ${p.cmd} failed: ${err.type}: ${err.message}\n--- python traceback ---\n${err.traceback ?? ""}`,
          p.cmd,
          err.type,
          err.traceback,
          err.message,
        ),
      );
    } else {
      this.fail(new OracleError(`malformed reply from oracle (no ok/error): ${line.slice(0, 200)}`));
      p.reject(new OracleError(`malformed reply from oracle for ${p.cmd}: ${line.slice(0, 200)}`, p.cmd));
    }
  }

  /** Mark the client dead, reject everything pending, kill the process. */
  private fail(e: OracleError): void {
    if (this.dead === undefined) this.dead = e;
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      this.pending.delete(id);
      p.reject(new OracleError(`${e.message}\n(while running "${p.cmd}")`, p.cmd));
    }
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGKILL");
  }

  /** Send one command; resolves with the reply object (minus id/ok). */
  request<T = Record<string, unknown>>(cmd: string, fields: Record<string, unknown> = {}, timeoutMs?: number): Promise<T> {
    if (this.dead) return Promise.reject(new OracleError(`oracle is not running: ${this.dead.message}`, cmd));
    if (!this.proc?.stdin) return Promise.reject(new OracleError("oracle not started", cmd));
    const id = this.nextId++;
    const ms = timeoutMs ?? this.opts.requestTimeoutMs ?? 300_000;
    return new Promise<T>((resolveReq, rejectReq) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        rejectReq(new OracleError(`oracle request "${cmd}" (id ${id}) timed out after ${ms} ms; the process was killed`, cmd));
        this.fail(new OracleError(`oracle killed after "${cmd}" timed out`));
      }, ms);
      this.pending.set(id, {
        cmd,
        timer,
        resolve: (v) => {
          const { id: _id, ok: _ok, ...rest } = v;
          resolveReq(rest as T);
        },
        reject: rejectReq,
      });
      this.proc?.stdin?.write(`${JSON.stringify({ ...fields, id, cmd })}\n`);
    });
  }

  /**
   * Resolves once the requests issued so far are on their way to the oracle. Bun writes to a
   * child's stdin pipe on the next event-loop turn, not when request() returns, so a request
   * followed by synchronous TS work (a forward, a decode loop: microtask awaits do not count)
   * would reach the oracle only after that work. Awaiting this in between lets the two run at
   * the same time, each on its own core.
   */
  sent(): Promise<void> {
    return new Promise((resolve) => setImmediate(resolve));
  }

  // ---------------------------------------------------------------- arrays

  /** Write a record as an input .npy (client-side temp dir). */
  private writeInput(rec: NpyRecord): { npy: string; dtype: string } {
    const p = join(this.inputDir, `in-${this.inputSeq++}.npy`);
    writeFileSync(p, toNpy(rec));
    return { npy: p, dtype: rec.dtype };
  }

  /** Read (and delete) a server output .npy; a missing or unreadable one is an OracleError. */
  readArray(ref: NpyRef, keep = false): NpyRecord {
    if (ref === null || typeof ref !== "object" || typeof ref.npy !== "string" || typeof ref.dtype !== "string") {
      throw new OracleError(`malformed array reference from the oracle: ${JSON.stringify(ref)?.slice(0, 200)}`);
    }
    let rec: NpyRecord;
    try {
      rec = parseNpy(new Uint8Array(readFileSync(ref.npy)), ref.dtype);
    } catch (e) {
      throw new OracleError(`unreadable array from the oracle (${ref.npy}): ${(e as Error).message}`);
    }
    if (ref.shape !== undefined && JSON.stringify(ref.shape) !== JSON.stringify(rec.shape)) {
      throw new OracleError(`array from the oracle (${ref.npy}) has shape [${rec.shape}], its reply says [${ref.shape}]`);
    }
    if (!keep) rmSync(ref.npy, { force: true });
    return rec;
  }

  private readMask(m: { kind: string } & Partial<NpyRef>): MaskResult {
    const kind = m.kind as MaskResult["kind"];
    return m.npy ? { kind, array: this.readArray(m as NpyRef) } : { kind };
  }

  // ---------------------------------------------------------------- commands

  ping(): Promise<{ pong: boolean; pid: number; versions: Record<string, string> }> {
    return this.request("ping");
  }

  fingerprint(): Promise<{ versions: Record<string, string>; fingerprint: Record<string, unknown> }> {
    return this.request("fingerprint");
  }

  /** One op through oracle/python/ops_table.py run_op(name, inputs, params). */
  async op(name: string, inputs: OpInput[], params: Record<string, unknown> = {}): Promise<NpyRecord[]> {
    const wire = inputs.map((x) => ("data" in x ? this.writeInput(x) : { scalar: x.scalar, kind: x.kind }));
    try {
      const r = await this.request<{ outputs: NpyRef[] }>("op", { name, inputs: wire, params });
      expectReply("op", r, { outputs: "array" });
      return r.outputs.map((o) => this.readArray(o));
    } finally {
      for (const w of wire) if ("npy" in w) rmSync(w.npy, { force: true });
    }
  }

  /** Single forward without cache: logits (B,L,V). `checkpoint`: matrix id ("c1_dense/f32") or a dir. */
  async forward(checkpoint: string, tokens: number[][]): Promise<NpyRecord> {
    const r = await this.request<{ logits: NpyRef }>("forward", { checkpoint, tokens });
    expectReply("forward", r, { logits: "object" });
    return this.readArray(r.logits);
  }

  /**
   * Plain mlx_lm generate_step, greedy: yielded tokens and per-step logprobs, cache state at the
   * end (`cache`: scalars and buffer shapes; `cacheSha256`: each layer's key and value bytes).
   */
  async generate(
    checkpoint: string,
    prompt: number[],
    opts: { prefillStepSize?: number; maxTokens?: number } = {},
  ): Promise<{ tokens: number[]; logprobs: NpyRecord[]; cache: Record<string, unknown>[]; cacheSha256: CacheSha256[] }> {
    const r = await this.request<{ tokens: number[]; logprobs: NpyRef[]; cache: Record<string, unknown>[]; cache_sha256: CacheSha256[] }>("generate", {
      checkpoint,
      prompt,
      prefill_step_size: opts.prefillStepSize ?? 2048,
      max_tokens: opts.maxTokens ?? 20,
    });
    expectReply("generate", r, { tokens: "array", logprobs: "array", cache: "array", cache_sha256: "array" });
    if (!r.tokens.every((t) => Number.isSafeInteger(t))) throw new OracleError(`malformed reply from oracle to generate: tokens ${JSON.stringify(r.tokens).slice(0, 200)}`, "generate");
    return { tokens: r.tokens, logprobs: r.logprobs.map((x) => this.readArray(x)), cache: r.cache, cacheSha256: r.cache_sha256 };
  }

  /** Every tap of a scenario (id from fixtures/scenarios.json, or an inline spec). `only`: name globs to ship. */
  async capture(
    checkpoint: string,
    scenario: string | ScenarioSpec,
    opts: { mode?: "full" | "logits"; only?: string[] } = {},
  ): Promise<CaptureResult> {
    const r = await this.request<{ meta: CaptureResult["meta"]; calls: CallRecord[]; taps: (TapRecord & Partial<NpyRef>)[] }>(
      "capture",
      { checkpoint, scenario, mode: opts.mode ?? "full", only: opts.only ?? null },
    );
    expectReply("capture", r, { meta: "object", calls: "array", taps: "array" });
    const taps = r.taps.map((t) => {
      if (t === null || typeof t !== "object" || typeof t.name !== "string") throw new OracleError(`malformed reply from oracle to capture: tap ${JSON.stringify(t)?.slice(0, 200)}`, "capture");
      const { npy, ...rest } = t;
      return npy ? { ...rest, array: this.readArray({ npy, dtype: String(t.dtype) }) } : rest;
    });
    return { meta: r.meta, calls: r.calls, taps };
  }

  /** A sequence of KVCache / RotatingKVCache calls; every output and the cache state after each. */
  async cacheOps(ops: CacheOp[]): Promise<CacheOpResult[]> {
    const written: string[] = [];
    const wire = ops.map((o) => {
      if (o.op !== "update_and_fetch") return o;
      const k = this.writeInput(o.keys);
      const v = this.writeInput(o.values);
      written.push(k.npy, v.npy);
      return { ...o, keys: k, values: v };
    });
    try {
      const r = await this.request<{ results: Record<string, unknown>[] }>("cache_ops", { ops: wire });
      expectReply("cache_ops", r, { results: "array" });
      return r.results.map((x) => {
        if (x === null || typeof x !== "object") throw new OracleError(`malformed reply from oracle to cache_ops: ${JSON.stringify(x)?.slice(0, 200)}`, "cache_ops");
        const out: CacheOpResult = { op: String(x.op), meta: (x.meta as Record<string, unknown>) ?? null };
        if (x.keys) out.keys = this.readArray(x.keys as NpyRef);
        if (x.values) out.values = this.readArray(x.values as NpyRef);
        if (x.mask) out.mask = this.readMask(x.mask as { kind: string });
        if (typeof x.trimmed === "number") out.trimmed = x.trimmed;
        if (x.value !== undefined) out.value = x.value as number | boolean;
        if (Array.isArray(x.state)) {
          out.state = x.state.map((s: unknown) =>
            s !== null && typeof s === "object" ? this.readArray(s as NpyRef) : (s as number | null),
          );
        }
        return out;
      });
    } finally {
      for (const p of written) rmSync(p, { force: true });
    }
  }

  /**
   * mlx_lm.models.base.create_attention_mask(h (length N), cache, window_size, return_array), with an
   * optional cache {type, offset, max_size, keep, idx}; or create_causal_mask(N, offset, window_size).
   */
  async makeMask(args: {
    N: number;
    fn?: "create_attention_mask" | "create_causal_mask";
    offset?: number;
    window_size?: number | null;
    return_array?: boolean;
    cache?: { type: "KVCache" | "RotatingKVCache"; offset?: number; max_size?: number; keep?: number; idx?: number } | null;
  }): Promise<MaskResult> {
    const r = await this.request<{ mask: { kind: string } & Partial<NpyRef> }>("make_mask", args);
    expectReply("make_mask", r, { mask: "object" });
    if (!["none", "causal", "array"].includes(r.mask.kind)) throw new OracleError(`malformed reply from oracle to make_mask: mask kind ${JSON.stringify(r.mask.kind)}`, "make_mask");
    return this.readMask(r.mask);
  }

  /**
   * mlx-vlm's Gemma4TextModel._make_masks on synthetic layouts (the media mask property suite):
   * per case, the mask of the first layer of each layer type.
   */
  async mmMasks(cases: MmMaskCase[]): Promise<Record<string, MaskResult>[]> {
    const r = await this.request<{ results: Record<string, { kind: string } & Partial<NpyRef>>[] }>("mm_masks", { cases });
    return r.results.map((res) => Object.fromEntries(Object.entries(res).map(([k, m]) => [k, this.readMask(m)])));
  }

  /**
   * nn.value_and_grad on a fresh copy of the checkpoint's model after the module `steps`
   * (freeze/unfreeze/train/eval), with loss = (model(tokens) * weights).sum(): the loss and the
   * gradients by parameter path, in tree_flatten order. `checkpointLayers`: under mlx-lm's
   * grad_checkpoint.
   */
  async moduleGrad(
    checkpoint: string,
    tokens: number[][],
    weights: NpyRecord,
    { steps = [], checkpointLayers = false }: { steps?: object[]; checkpointLayers?: boolean } = {},
  ): Promise<{ loss: NpyRecord; grads: [string, NpyRecord][] }> {
    const w = this.writeInput(weights);
    try {
      const r = await this.request<{ loss: NpyRef; grads: (NpyRef & { path: string })[] }>("module_grad", {
        checkpoint,
        tokens,
        weights: w,
        steps,
        checkpoint_layers: checkpointLayers,
      });
      return { loss: this.readArray(r.loss), grads: r.grads.map((g) => [g.path, this.readArray(g)]) };
    } finally {
      rmSync(w.npy, { force: true });
    }
  }

  /**
   * mlx.optimizers over a parameter tree given flat ([path, array], tree_unflatten'ed):
   * `optimizer` {name, args} (Python keyword arguments; a learning_rate may be a schedule spec),
   * one gradient list per step. Per step: the parameters and the optimizer state, flattened.
   */
  async optimizerSteps(
    optimizer: { name: string; args: Record<string, unknown> },
    params: readonly (readonly [string, NpyRecord])[],
    grads: readonly (readonly (readonly [string, NpyRecord])[])[],
  ): Promise<{ params: [string, NpyRecord][]; state: [string, NpyRecord][] }[]> {
    const written: string[] = [];
    const wire = (items: readonly (readonly [string, NpyRecord])[]) =>
      items.map(([path, rec]) => {
        const w = this.writeInput(rec);
        written.push(w.npy);
        return { path, ...w };
      });
    try {
      type Flat = (NpyRef & { path: string })[];
      const r = await this.request<{ steps: { params: Flat; state: Flat }[] }>("optimizer", { optimizer, params: wire(params), grads: grads.map(wire) });
      const read = (f: Flat): [string, NpyRecord][] => f.map((x) => [x.path, this.readArray(x)]);
      return r.steps.map((st) => ({ params: read(st.params), state: read(st.state) }));
    } finally {
      for (const p of written) rmSync(p, { force: true });
    }
  }

  /**
   * `n` training steps on a fresh model (loss = (model(tokens) * weights).sum(), nn.value_and_grad,
   * optimizer.update), eager or under mx.compile with the trainer's captured state: the losses,
   * the trainable parameters and the optimizer state at the end (flat, tree order).
   */
  async trainSteps(args: {
    checkpoint: string;
    tokens: number[][];
    weights: NpyRecord;
    optimizer: { name: string; args: Record<string, unknown> };
    n: number;
    compiled: boolean;
    steps?: object[];
  }): Promise<{ losses: NpyRecord[]; params: [string, NpyRecord][]; state: [string, NpyRecord][] }> {
    const w = this.writeInput(args.weights);
    try {
      type Flat = (NpyRef & { path: string })[];
      const r = await this.request<{ losses: NpyRef[]; params: Flat; state: Flat }>("train_steps", { ...args, weights: w, steps: args.steps ?? [] });
      const read = (f: Flat): [string, NpyRecord][] => f.map((x) => [x.path, this.readArray(x)]);
      return { losses: r.losses.map((l) => this.readArray(l)), params: read(r.params), state: read(r.state) };
    } finally {
      rmSync(w.npy, { force: true });
    }
  }

  /** Ask the server to exit; waits for the process (kills it after `graceMs`). */
  async close(graceMs = 5000): Promise<void> {
    const proc = this.proc;
    if (proc && !this.dead) {
      try {
        await this.request("shutdown", {}, graceMs);
      } catch {
        /* already dying: fall through to kill */
      }
    }
    if (proc) {
      const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
      await proc;
      clearTimeout(timer);
    }
    this.dead ??= new OracleError("oracle closed");
    rmSync(this.inputDir, { recursive: true, force: true });
  }

  /** Kill the process without a shutdown request (tests of crash handling). */
  kill(signal: NodeJS.Signals = "SIGKILL"): void {
    this.proc?.kill(signal);
  }
}

/** A reply's fields must have the types the command's result is read with. */
export function expectReply(cmd: string, r: unknown, fields: Record<string, "array" | "object">): void {
  for (const [k, kind] of Object.entries(fields)) {
    const v = (r as Record<string, unknown>)[k];
    const ok = kind === "array" ? Array.isArray(v) : v !== null && typeof v === "object" && !Array.isArray(v);
    if (!ok) throw new OracleError(`malformed reply from oracle to ${cmd}: ${k} should be an ${kind}, got ${JSON.stringify(v)?.slice(0, 200) ?? "nothing"}`, cmd);
  }
}

export function dtypeOf(s: string): DtypeName {
  if (!isDtypeName(s)) throw new OracleError(`unknown dtype ${s}`);
  return s;
}

// ------------------------------------------------------------------ shared instance

let shared: Promise<OracleClient> | undefined;

/**
 * The one oracle process of this test run: started on first use, shared by every test file in
 * the same `bun test` process, closed when the process exits. Restarted if it died.
 */
export async function sharedOracle(opts: OracleOptions = {}): Promise<OracleClient> {
  if (shared) {
    const c = await shared.catch(() => undefined);
    if (c?.alive) return c;
  }
  shared = OracleClient.start(opts);
  const c = await shared;
  const onExit = () => c.kill();
  process.once("exit", onExit);
  return c;
}

/** Close the shared instance now (optional: process exit also ends it). */
export async function closeSharedOracle(): Promise<void> {
  const c = shared && (await shared.catch(() => undefined));
  shared = undefined;
  await c?.close();
}
