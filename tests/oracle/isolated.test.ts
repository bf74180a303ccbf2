// The op runner's verdicts (exact / unsupported / fail) and its process isolation: a case that
// poisons its worker is named, and a fresh worker runs the rest.
import { describe, expect, it } from "vitest";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import type { OpCase } from "../../oracle/ops/cases.ts";
import { runCasesIsolated, runSharded } from "../../oracle/ops/isolated.ts";
import { groupUnsupported, runCases } from "../../oracle/ops/runner.ts";

const A = (xs: unknown[]) => xs[0] as mx.MlxArray;
const arr = { shape: [2, 3], dtype: "float32" as const };

describe("op runner verdicts", () => {
  it("calls a case both sides reject with the same MLX error unsupported, and anything else a failure", async () => {
    const oracle = await sharedOracle();
    const cases: OpCase[] = [
      { id: "reshape/ok", op: "reshape", oracle: "reshape", inputs: [arr], params: { shape: [3, 2] }, run: (xs, p) => mx.reshape(A(xs), p.shape as number[]) },
      { id: "reshape/same-error", op: "reshape", oracle: "reshape", inputs: [arr], params: { shape: [7] }, run: (xs, p) => mx.reshape(A(xs), p.shape as number[]) },
      { id: "reshape/other-error", op: "reshape", oracle: "reshape", inputs: [arr], params: { shape: [7] }, run: () => { throw new mx.MlxError("reshape", "a different message"); } },
      { id: "reshape/one-side", op: "reshape", oracle: "reshape", inputs: [arr], params: { shape: [7] }, run: (xs) => mx.reshape(A(xs), [6]) },
      { id: "reshape/bytes", op: "reshape", oracle: "reshape", inputs: [arr], params: { shape: [3, 2] }, run: (xs) => mx.add(mx.reshape(A(xs), [3, 2]), 1) },
    ];
    const rs = await runCases(cases, oracle);
    expect(rs.map((r) => r.status)).toEqual(["exact", "unsupported", "fail", "fail", "fail"]);
    expect(rs[1]!.detail).toMatch(/Cannot reshape array of size 6 into shape \(7\)/);
    expect(rs[4]!.detail).toMatch(/bytes differ/);
    expect(groupUnsupported(rs.filter((r) => r.status === "unsupported"))).toEqual([[rs[1]!.detail, ["reshape/same-error"]]]);
    // stopAfterFailure ends the list at (or shortly after) the first case that is not exact
    const stopped = await runCases(cases, oracle, { stopAfterFailure: true, window: 1 });
    expect(stopped.map((r) => r.id)).toEqual(["reshape/ok", "reshape/same-error"]);
  });

  it("still sends a case whose operands the binding refuses to the oracle, so that both sides' errors are compared", async () => {
    const oracle = await sharedOracle();
    // a transpose view with an axis out of range: the binding refuses it while making the operands
    const bad: OpCase = { id: "reshape/bad-view", op: "reshape", oracle: "reshape", inputs: [{ ...arr, view: { transpose: [0, 5] } }], params: { shape: [6] }, run: (xs, p) => mx.reshape(A(xs), p.shape as number[]) };
    const [r] = await runCases([bad], oracle);
    // both sides raise MLX's own message for it: unsupported, as a float64 cotangent on a GPU is
    expect(r!.status).toBe("unsupported");
    expect(r!.detail).toMatch(/transpose/i);
  });
});

describe("op runner isolation", () => {
  const fake = join(REPO_ROOT, "tests", "oracle", "testdata", "fake_op_worker.ts");
  const ids = (xs: string[]) => xs.map((id) => ({ id, op: "fake" }));

  it("names the case that poisons a worker and runs the rest in a fresh one", async () => {
    const run = await runCasesIsolated(ids(["a", "b", "poison-1", "c", "poison-2", "d"]), () => {}, fake);
    expect(run.workers).toBe(3);
    expect(run.poisoners.map((p) => p.id)).toEqual(["poison-1", "poison-2"]);
    expect(run.results.map((r) => `${r.id}:${r.status}${r.sticky ? ":sticky" : ""}`)).toEqual(["a:exact", "b:exact", "poison-1:unsupported:sticky", "c:exact", "poison-2:unsupported:sticky", "d:exact"]);
    expect(run.results[2]!.detail).toMatch(/sticky error in the binding \(misaligned address\)/);
  });

  it("fails the case a worker dies on without a word, and goes on", async () => {
    const seen: string[] = [];
    const run = await runCasesIsolated(ids(["a", "crash", "b"]), (r) => seen.push(r.id), fake);
    expect(run.results.map((r) => `${r.id}:${r.status}`)).toEqual(["a:exact", "crash:fail", "b:exact"]);
    expect(run.results[1]!.detail).toMatch(/worker process died on this case \(exit 7\)/);
    expect(seen.sort()).toEqual(["a", "b", "crash"]);
  });

  it("runs interleaved shards at once and merges them in the cases' order, a poisoner restarting its own shard only", async () => {
    const cases = ids(["a", "poison-1", "b", "c", "poison-2", "d", "e"]);
    const shardIds: string[][] = [];
    let done = 0;
    const run = await runSharded(cases, 3, (s, on) => (shardIds.push(s.map((c) => c.id)), runCasesIsolated(s, on, fake)), (_, n) => (done = n));
    expect(shardIds.sort()).toEqual([["a", "c", "e"], ["b", "d"], ["poison-1", "poison-2"]]);
    expect(run.results.map((r) => `${r.id}:${r.status}`)).toEqual(["a:exact", "poison-1:unsupported", "b:exact", "c:exact", "poison-2:unsupported", "d:exact", "e:exact"]);
    expect(run.poisoners.map((p) => p.id).sort()).toEqual(["poison-1", "poison-2"]);
    expect(run.workers).toBe(4); // 3 shards + one restart after poison-1 (poison-2 ends its shard)
    expect(done).toBe(7);
  });
});
