// Op parity in worker processes (worker.ts), so that one MLX bug cannot hide the rest of the
// table: a case that leaves a sticky GPU error behind (every later op in that process fails)
// is reported as the one that poisoned the process, and a fresh binding + oracle pair runs the
// remaining cases. Used by suites/ops/ops.test.ts, `npm run parity` and `npm run parity:ops`.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { REPO_ROOT } from "../client.ts";
import type { OpCase } from "./cases.ts";
import type { CaseResult } from "./runner.ts";


/** The case table a worker looks ids up in: the op table, or vjp_runner.ts's gradient cases. */
export type CaseTable = "ops" | "vjp";

export interface IsolatedRun {
  results: CaseResult[];
  /** Cases after which a worker could no longer run a trivial op, in order. */
  poisoners: { id: string; ts: string | null; py: string | null }[];
  /** Worker processes started. */
  workers: number;
}

interface WorkerEnd {
  results: CaseResult[];
  poisoned?: { id: string; ts: string | null; py: string | null };
  done: boolean;
  stderr: string;
  code: number | null;
}

export const WORKER_SCRIPT = join(REPO_ROOT, "oracle", "ops", "worker.ts");

function runWorker(script: string, ids: string[], table: CaseTable, onResult: (r: CaseResult) => void): Promise<WorkerEnd> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [script], { cwd: REPO_ROOT, stdio: ["pipe", "pipe", "pipe"], env: process.env });
    const end: WorkerEnd = { results: [], done: false, stderr: "", code: null };
    let buf = "";
    let killTimer: ReturnType<typeof setTimeout> | undefined;
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk: string) => {
      buf += chunk;
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        let msg: { result?: CaseResult; poisoned?: WorkerEnd["poisoned"]; done?: boolean };
        try {
          msg = JSON.parse(line);
        } catch {
          continue; // not a protocol line
        }
        if (msg.result) {
          end.results.push(msg.result);
          onResult(msg.result);
        } else if (msg.poisoned) {
          end.poisoned = msg.poisoned;
          // a process with a sticky device error may hang on exit
          killTimer = setTimeout(() => child.kill("SIGKILL"), 15_000);
        } else if (msg.done) end.done = true;
      }
    });
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (c: string) => {
      end.stderr = (end.stderr + c).slice(-4000);
    });
    child.stdin.on("error", () => {});
    child.on("close", (code) => {
      clearTimeout(killTimer);
      end.code = code;
      resolve(end);
    });
    child.stdin.end(JSON.stringify({ ids, table }));
  });
}

/**
 * Runs the cases in worker processes, restarting after a case that poisons one. Every case gets
 * exactly one result: a worker that dies without naming a culprit fails the case it was on.
 * `table`: where the worker finds the cases by id (the op table, or vjp_runner.ts's gradient cases).
 */
export async function runCasesIsolated(
  cases: readonly Pick<OpCase, "id" | "op">[],
  onResult: (r: CaseResult, done: number) => void = () => {},
  script = WORKER_SCRIPT,
  table: CaseTable = "ops",
): Promise<IsolatedRun> {
  const order = new Map(cases.map((c, i) => [c.id, i]));
  const results: CaseResult[] = new Array(cases.length);
  const poisoners: IsolatedRun["poisoners"] = [];
  let done = 0;
  let workers = 0;
  let next = 0; // index of the first case without a result
  while (next < cases.length) {
    workers++;
    const end = await runWorker(script, cases.slice(next).map((c) => c.id), table, (r) => onResult(r, ++done));
    for (const r of end.results) results[order.get(r.id)!] = r;
    if (end.poisoned) {
      const i = order.get(end.poisoned.id)!;
      const sides = [end.poisoned.ts !== null ? `the binding (${end.poisoned.ts})` : null, end.poisoned.py !== null ? `the oracle (${end.poisoned.py})` : null].filter(Boolean).join(" and ");
      results[i] = { ...results[i]!, sticky: true, detail: `${results[i]!.detail ?? ""} [left a sticky error in ${sides}: both processes were restarted]` };
      poisoners.push(end.poisoned);
    }
    while (next < cases.length && results[next] !== undefined) next++;
    if (next < cases.length && !end.poisoned && !end.done) {
      // the worker died on case `next` without a word: fail it and go on after it
      const c = cases[next]!;
      results[next] = { id: c.id, op: c.op, status: "fail", ok: false, detail: `the worker process died on this case (exit ${end.code}): ${end.stderr.trim().split("\n").slice(-3).join(" | ")}` };
      onResult(results[next]!, ++done);
      next++;
    }
    if (end.done && next < cases.length) throw new Error(`op worker finished without results for ${cases.length - next} cases`);
  }
  return { results, poisoners, workers };
}

/**
 * `run` over `jobs` interleaved shards of the cases at once (each shard in its own worker
 * processes), merged back into the cases' order: on a GPU machine one pair of processes mostly
 * waits on NVRTC, so several shards use its idle cores. A sticky error stays inside its shard.
 */
export async function runSharded<C extends Pick<OpCase, "id">>(
  cases: readonly C[],
  jobs: number,
  run: (shard: C[], onResult: (r: CaseResult) => void) => Promise<IsolatedRun>,
  onResult: (r: CaseResult, done: number) => void = () => {},
): Promise<IsolatedRun> {
  if (!Number.isInteger(jobs) || jobs < 1) throw new Error(`jobs must be a whole number ≥ 1, got ${jobs}`);
  let done = 0;
  const shards = Array.from({ length: Math.min(jobs, Math.max(1, cases.length)) }, (_, k) => cases.filter((_, i) => i % jobs === k));
  const runs = await Promise.all(shards.map((s) => run(s, (r) => onResult(r, ++done))));
  const byId = new Map(runs.flatMap((r) => r.results).map((r) => [r.id, r]));
  return {
    results: cases.map((c) => byId.get(c.id)!),
    poisoners: runs.flatMap((r) => r.poisoners),
    workers: runs.reduce((n, r) => n + r.workers, 0),
  };
}
