// Gradient parity of the ops: every differentiable exposed op's mx.vjp against Python's, byte for
// byte, on the forward case table's inputs with seeded cotangents (oracle/ops/vjp_runner.ts).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sharedOracle } from "../../oracle/client.ts";
import { CASES, exposedOps, NOT_OPS } from "../../oracle/ops/cases.ts";
import type { CaseResult } from "../../oracle/ops/runner.ts";
import { NOT_DIFFERENTIABLE, runVjpCases, vjpCases, vjpCoverage } from "../../oracle/ops/vjp_runner.ts";

const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
const cases = vjpCases();
let results: CaseResult[] = [];
const byOp = new Map<string, CaseResult[]>();

beforeAll(async () => {
  const oracle = await sharedOracle();
  results = await runVjpCases(cases, oracle);
  for (const r of results) byOp.set(r.op, [...(byOp.get(r.op) ?? []), r]);
}, 600_000);

afterAll(() => {
  const cov = vjpCoverage(exposed, cases, results);
  console.log(
    `vjp parity: ${cov.tested.length}/${cov.exposed.length} differentiable ops, ${cov.bitExact}/${cov.cases} cases bit-exact; ` +
      `${Object.keys(NOT_DIFFERENTIABLE).length} ops not differentiable`,
  );
});

describe("vjp parity with Python MLX", () => {
  it("covers every differentiable exposed op; the others are listed with a reason", () => {
    const cov = vjpCoverage(exposed, cases, []);
    expect(cov.untested).toEqual([]);
    // the list names exposed ops only, and none of them has a gradient case
    expect(Object.keys(NOT_DIFFERENTIABLE).filter((o) => !exposed.includes(o))).toEqual([]);
    expect(cases.filter((c) => c.op in NOT_DIFFERENTIABLE)).toEqual([]);
  });

  it("derives its cases from the forward table: same ids and inputs, cotangents appended", () => {
    const fwd = new Map(CASES.map((c) => [c.id, c]));
    for (const c of cases) {
      const f = fwd.get(c.forward)!;
      expect(c.id).toBe(f.id);
      expect(c.inputs.slice(0, f.inputs.length)).toEqual(f.inputs);
      expect(c.inputs.length).toBeGreaterThan(f.inputs.length);
      expect(c.diff.length).toBeGreaterThan(0);
    }
  });

  const ops = [...new Set(cases.map((c) => c.op))].sort();
  it.each(ops)("%s: vjp bit-exact", (op) => {
    const rs = byOp.get(op) ?? [];
    expect(rs.length).toBeGreaterThan(0);
    expect(rs.filter((r) => !r.ok).map((r) => `${r.id}: ${r.detail}`)).toEqual([]);
  });
});
