// Gradient parity of the ops: every differentiable exposed op's mx.vjp against Python's, byte for
// byte, on the forward case table's inputs with seeded cotangents (oracle/ops/vjp_runner.ts), in
// worker processes as the forward table runs (oracle/ops/isolated.ts). A case both sides reject
// with the same MLX error is "unsupported on <backend>": reported, and on the CPU not expected.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { CASES, exposedOps, NOT_OPS } from "../../oracle/ops/cases.ts";
import { type CaseResult, groupUnsupported } from "../../oracle/ops/runner.ts";
import { NOT_DIFFERENTIABLE, runVjpCasesIsolated, vjpCases, vjpCoverage } from "../../oracle/ops/vjp_runner.ts";
import { limit } from "../../tests/time_limit.ts";

const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
const cases = vjpCases();
const backend = mx.backend();
let results: CaseResult[] = [];
let poisoners: string[] = [];
const byOp = new Map<string, CaseResult[]>();

beforeAll(async () => {
  const run = await runVjpCasesIsolated(cases);
  results = run.results;
  poisoners = run.poisoners.map((p) => p.id);
  for (const r of results) byOp.set(r.op, [...(byOp.get(r.op) ?? []), r]);
}, limit(900_000));

afterAll(() => {
  const cov = vjpCoverage(exposed, cases, results);
  console.log(
    `vjp parity (${backend} backend, ${mx.defaultDevice()}): ${cov.tested.length}/${cov.exposed.length} differentiable ops, ` +
      `${cov.bitExact}/${cov.cases} cases bit-exact, ${cov.unsupported.length} unsupported, ${cov.failures.length} failed; ` +
      `${Object.keys(NOT_DIFFERENTIABLE).length} ops not differentiable`,
  );
  for (const [msg, ids] of groupUnsupported(cov.unsupported)) console.log(`  unsupported on ${backend} (${ids.length}): ${msg}: ${ids.join(", ")}`);
  if (poisoners.length) console.log(`  left a sticky error behind (processes restarted): ${poisoners.join(", ")}`);
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

  it("gives every case one result", () => {
    expect(results.length).toBe(cases.length);
    expect(results.every((r) => r !== undefined)).toBe(true);
  });

  it.skipIf(backend !== "cpu")("runs every case on the CPU backend (none unsupported there)", () => {
    expect(results.filter((r) => r.status === "unsupported").map((r) => `${r.id}: ${r.detail}`)).toEqual([]);
  });

  const ops = [...new Set(cases.map((c) => c.op))].sort();
  it.each(ops)("%s: vjp bit-exact (or unsupported on this backend by both sides)", (op) => {
    const rs = byOp.get(op) ?? [];
    expect(rs.length).toBeGreaterThan(0);
    expect(rs.filter((r) => r.status === "fail").map((r) => `${r.id}: ${r.detail}`)).toEqual([]);
  });
});
