// One op-parity worker process: the binding (this process) and its own oracle process run the
// cases named on stdin ({"ids": [...]}) and print one JSON line per result. After a case that is
// not exact, both processes are probed with a trivial op; if either can no longer run one (a
// sticky GPU error, e.g. CUDA's "misaligned address"), the worker names the case that left it
// behind and exits, and the parent (isolated.ts) starts a fresh pair for the rest.
//   {"result": CaseResult}          one per case, in case order
//   {"poisoned": {"id", "ts", "py"}} the case after which a probe failed (ts/py: that side's error or null)
//   {"done": true}
// stdin may name the table: {"ids", "table": "vjp"} runs the gradient cases of vjp_runner.ts.
import * as mx from "@mlx-bun/mlx";
import { OracleClient } from "../client.ts";
import { CASES } from "./cases.ts";
import type { CaseTable } from "./isolated.ts";
import { type CaseResult, runCases } from "./runner.ts";
import { vjpCases } from "./vjp_runner.ts";

const say = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);

/** Runs a trivial op on each side; returns each side's error message, or null if it worked. */
async function probe(oracle: OracleClient): Promise<{ ts: string | null; py: string | null }> {
  let ts: string | null = null;
  try {
    using a = mx.array([1, 2, 3], [3], "float32");
    using b = mx.add(a, a);
    mx.evaluate([b]);
    if (b.toNumbers().join() !== "2,4,6") ts = `probe computed ${b.toNumbers()}`;
  } catch (e) {
    ts = (e as Error).message;
  }
  let py: string | null = null;
  try {
    const data = new Uint8Array(new Float32Array([1, 2, 3]).buffer);
    const [out] = await oracle.op("add", [{ dtype: "float32", shape: [3], data }, { dtype: "float32", shape: [3], data }], {});
    const got = [...new Float32Array(out!.data.slice().buffer)];
    if (got.join() !== "2,4,6") py = `probe computed ${got}`;
  } catch (e) {
    py = (e as Error).message.split("\n")[0]!;
  }
  return { ts, py };
}

async function main(): Promise<void> {
  mx.applyDeviceEnv();
  const { ids, table = "ops" } = JSON.parse(await Bun.stdin.text()) as { ids: string[]; table?: CaseTable };
  const byId = new Map((table === "vjp" ? vjpCases() : CASES).map((c) => [c.id, c]));
  let todo = ids.map((id) => {
    const c = byId.get(id);
    if (!c) throw new Error(`unknown op case ${id}`);
    return c;
  });
  const oracle = await OracleClient.start();
  try {
    while (todo.length) {
      const results: CaseResult[] = await runCases(todo, oracle, { stopAfterFailure: true });
      const firstBad = results.findIndex((r) => r.status !== "exact");
      if (firstBad < 0) {
        for (const r of results) say({ result: r });
        todo = todo.slice(results.length);
        continue;
      }
      const health = await probe(oracle);
      if (health.ts !== null || health.py !== null) {
        // Results after the culprit ran in a poisoned process: the next worker runs them again.
        for (const r of results.slice(0, firstBad + 1)) say({ result: r });
        say({ poisoned: { id: results[firstBad]!.id, ...health } });
        process.exit(3);
      }
      for (const r of results) say({ result: r });
      todo = todo.slice(results.length);
    }
    say({ done: true });
  } finally {
    await oracle.close();
  }
}

await main();
