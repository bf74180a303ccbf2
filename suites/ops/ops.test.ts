// Op-level parity: every exposed binding op against Python MLX through the shared oracle
// process, byte for byte. The case table is shared with `npm run parity` (report.ts).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sharedOracle } from "../../oracle/client.ts";
import { CASES, exposedOps, NOT_OPS } from "../../oracle/ops/cases.ts";
import { type CaseResult, coverage, runCases } from "../../oracle/ops/runner.ts";

let results: CaseResult[] = [];
const byOp = new Map<string, CaseResult[]>();

beforeAll(async () => {
  const oracle = await sharedOracle();
  results = await runCases(CASES, oracle);
  for (const r of results) byOp.set(r.op, [...(byOp.get(r.op) ?? []), r]);
}, 600_000);

afterAll(() => {
  const cov = coverage(exposedOps().filter((o) => !(o in NOT_OPS)), CASES, results);
  console.log(`ops parity: ${cov.tested.length}/${cov.exposed.length} ops, ${cov.bitExact}/${cov.cases} cases bit-exact`);
});

describe("op parity with Python MLX", () => {
  it("covers every exposed op", () => {
    const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
    const tested = new Set(CASES.map((c) => c.op));
    expect(exposed.filter((o) => !tested.has(o))).toEqual([]);
    // and tests nothing that is not exposed (a renamed export would otherwise go unnoticed)
    expect([...tested].filter((o) => !exposed.includes(o) && o !== "scalar")).toEqual([]);
  });

  const ops = [...new Set(CASES.map((c) => c.op))].sort();
  it.each(ops)("%s is bit-exact", (op) => {
    const rs = byOp.get(op) ?? [];
    expect(rs.length).toBeGreaterThan(0);
    const bad = rs.filter((r) => !r.ok).map((r) => `${r.id}: ${r.detail}`);
    expect(bad).toEqual([]);
  });
});
