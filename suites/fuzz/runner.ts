// The fuzz runner (parent side): draws each target's inputs with fast-check from the property
// harness's per-name seed, feeds them to a worker process (worker.ts) one at a time, and counts
// what happened to each. A worker that dies on an input is an abort, one that does not answer
// within the target's limit is a hang (killed); either way the input is recorded and a fresh
// worker takes the next one, so one crash never ends the run.
import { type ChildProcess, spawn } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { seedFor } from "../properties/harness.ts";
import { encodeInput, type FuzzTarget, MARK } from "./target.ts";
import { limit } from "../../tests/time_limit.ts";

export type Verdict = "ok" | "clear" | "unclear" | "leak" | "abort" | "hang";

export interface Finding {
  target: string;
  index: number;
  seed: number;
  verdict: Verdict;
  detail: string;
  input: unknown;
}

export interface Tally {
  inputs: number;
  ok: number;
  clear: number;
  unclear: number;
  leak: number;
  abort: number;
  hang: number;
  perTarget: Record<string, Partial<Record<Verdict, number>>>;
  findings: Finding[];
  /** Every input's verdict, in order. */
  verdicts: Verdict[];
  seconds: number;
}

/** The one-line summary the soak prints. */
export function summaryLine(t: Tally): string {
  return `fuzz: ${t.inputs} inputs, ${t.clear} clear errors, ${t.abort} aborts, ${t.hang} hangs` +
    ` (${t.ok} accepted, ${t.unclear} unclear errors, ${t.leak} leaks; ${t.seconds.toFixed(1)} s)`;
}

/** Inputs of one target: a deterministic sample from its seed (PROPERTY_SEED varies it, as for properties). */
export function inputsOf(t: FuzzTarget, n: number): { seed: number; inputs: unknown[] } {
  const seed = seedFor(`fuzz/${t.name}`);
  return { seed, inputs: n > 0 ? fc.sample(t.arbitrary(), { seed, numRuns: n }) : [] };
}

interface Reply {
  id?: number;
  verdict?: Verdict;
  detail?: string;
  ready?: boolean;
  scratch?: string;
}

/** One worker process; `ask` resolves with its verdict, or abort/hang. */
class Worker {
  private proc: ChildProcess;
  private buf = "";
  private waiting: ((r: Reply) => void) | null = null;
  private exited: string | null = null;
  private stderr: string[] = [];
  private scratch: string | null = null;
  readonly ready: Promise<void>;

  constructor(root: string) {
    this.proc = spawn(process.execPath, [join(root, "suites", "fuzz", "worker.ts")], { cwd: root, stdio: ["pipe", "pipe", "pipe"] });
    let readyResolve!: () => void;
    let readyReject!: (e: Error) => void;
    this.ready = new Promise((res, rej) => ((readyResolve = res), (readyReject = rej)));
    this.proc.stdout!.on("data", (c: Buffer) => {
      this.buf += c.toString("utf8");
      let nl: number;
      while ((nl = this.buf.indexOf("\n")) >= 0) {
        const line = this.buf.slice(0, nl);
        this.buf = this.buf.slice(nl + 1);
        if (!line.startsWith(MARK)) continue;
        const r = JSON.parse(line.slice(MARK.length)) as Reply;
        if (r.ready) {
          this.scratch = r.scratch ?? null;
          readyResolve();
        } else this.waiting?.(r);
      }
    });
    this.proc.stderr!.on("data", (c: Buffer) => {
      this.stderr.push(c.toString("utf8"));
      if (this.stderr.length > 50) this.stderr.shift();
    });
    this.proc.stdin!.on("error", () => {});
    this.proc.on("exit", (code, signal) => {
      this.exited = signal ? `signal ${signal}` : `exit code ${code}`;
      readyReject(new Error(`fuzz worker died before it was ready (${this.exited}): ${this.stderrTail()}`));
      this.waiting?.({ verdict: "abort", detail: `worker died (${this.exited}): ${this.stderrTail()}` });
    });
  }

  stderrTail(): string {
    return this.stderr.join("").trim().split("\n").slice(-6).join(" | ").slice(0, 600);
  }

  ask(id: number, target: string, input: unknown, timeoutMs: number): Promise<Reply> {
    if (this.exited) return Promise.resolve({ verdict: "abort", detail: `worker already dead (${this.exited})` });
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiting = null;
        this.kill();
        resolve({ verdict: "hang", detail: `no answer within ${timeoutMs} ms` });
      }, timeoutMs);
      this.waiting = (r) => {
        clearTimeout(timer);
        this.waiting = null;
        resolve(r);
      };
      this.proc.stdin!.write(`${encodeInput({ id, target, input })}\n`);
    });
  }

  get dead(): boolean {
    return this.exited !== null;
  }

  kill(): void {
    if (!this.exited) this.proc.kill("SIGKILL");
    if (this.scratch) rmSync(this.scratch, { recursive: true, force: true });
  }

  async close(): Promise<void> {
    if (this.exited) return this.kill();
    const done = new Promise<void>((res) => this.proc.once("exit", () => res()));
    this.proc.stdin!.end();
    const t = setTimeout(() => this.kill(), 10_000);
    await done;
    clearTimeout(t);
  }
}

export interface RunOptions {
  root: string;
  targets: readonly FuzzTarget[];
  /** Inputs per target: its `sample` times `scale` (at least 1). */
  scale: number;
  /** Called after every input (progress). */
  onInput?: (done: number, total: number) => void;
}

export async function runFuzz(o: RunOptions): Promise<Tally> {
  return runPlan(o.root, o.targets.map((t) => ({ t, ...inputsOf(t, Math.max(1, Math.ceil(t.sample * o.scale))) })), o.onInput);
}

/** Fixed inputs (regression cases), each for the target it names, in a worker process as above. */
export function runInputs(root: string, targets: readonly FuzzTarget[], list: readonly { target: string; input: unknown }[]): Promise<Tally> {
  return runPlan(
    root,
    list.map(({ target, input }) => {
      const t = targets.find((x) => x.name === target);
      if (!t) throw new Error(`no fuzz target ${target}`);
      return { t, seed: 0, inputs: [input] };
    }),
  );
}

async function runPlan(root: string, plan: { t: FuzzTarget; seed: number; inputs: unknown[] }[], onInput?: (done: number, total: number) => void): Promise<Tally> {
  const t0 = performance.now();
  const o = { root, onInput };
  const total = plan.reduce((s, p) => s + p.inputs.length, 0);
  const tally: Tally = { inputs: 0, ok: 0, clear: 0, unclear: 0, leak: 0, abort: 0, hang: 0, perTarget: {}, findings: [], verdicts: [], seconds: 0 };
  let worker = new Worker(o.root);
  await worker.ready;
  let id = 0;
  try {
    for (const { t, seed, inputs } of plan) {
      const per: Partial<Record<Verdict, number>> = (tally.perTarget[t.name] ??= {});
      for (const [index, input] of inputs.entries()) {
        if (worker.dead) {
          worker.kill();
          worker = new Worker(o.root);
          await worker.ready;
        }
        const r = await worker.ask(id++, t.name, input, limit(t.timeoutMs ?? 20_000));
        const v = r.verdict ?? "unclear";
        tally.inputs++;
        tally[v]++;
        tally.verdicts.push(v);
        per[v] = (per[v] ?? 0) + 1;
        if (v !== "ok" && v !== "clear") tally.findings.push({ target: t.name, index, seed, verdict: v, detail: r.detail ?? "", input });
        o.onInput?.(tally.inputs, total);
      }
    }
  } finally {
    await worker.close();
  }
  tally.seconds = (performance.now() - t0) / 1000;
  return tally;
}
