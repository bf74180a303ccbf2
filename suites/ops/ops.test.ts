// Op-level parity: every exposed binding op against Python MLX, byte for byte, in worker
// processes of their own (oracle/ops/isolated.ts). The case table is shared with `npm run
// parity`. A case both sides reject with the same MLX error is "unsupported on <backend>":
// reported, never counted as bit-exact, and on the CPU backend not expected at all.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as mx from "@mlx-bun/mlx";
import { CASES, exposedOps, NOT_OPS } from "../../oracle/ops/cases.ts";
import { runCasesIsolated } from "../../oracle/ops/isolated.ts";
import { type CaseResult, coverage, groupUnsupported } from "../../oracle/ops/runner.ts";
import { limit } from "../../tests/time_limit.ts";

let results: CaseResult[] = [];
let poisoners: string[] = [];
const byOp = new Map<string, CaseResult[]>();
const backend = mx.backend();

beforeAll(async () => {
  const run = await runCasesIsolated(CASES);
  results = run.results;
  poisoners = run.poisoners.map((p) => p.id);
  for (const r of results) byOp.set(r.op, [...(byOp.get(r.op) ?? []), r]);
}, limit(900_000));

afterAll(() => {
  const cov = coverage(exposedOps().filter((o) => !(o in NOT_OPS)), CASES, results);
  console.log(`ops parity (${backend} backend, ${mx.defaultDevice()}): ${cov.tested.length}/${cov.exposed.length} ops, ${cov.bitExact}/${cov.cases} cases bit-exact, ${cov.unsupported.length} unsupported, ${cov.mlxBugs.length} at MLX bugs, ${cov.failures.length} failed`);
  for (const [msg, ids] of groupUnsupported(cov.unsupported)) console.log(`  unsupported on ${backend} (${ids.length}): ${msg}: ${ids.join(", ")}`);
  for (const b of cov.mlxBugs) console.log(`  diverges at MLX bug ${b.mlxBug!.id} (${b.mlxBug!.reproducer}): ${b.id}: ${b.detail}`);
  if (poisoners.length) console.log(`  left a sticky error behind (processes restarted): ${poisoners.join(", ")}`);
});

describe("op parity with Python MLX", () => {
  it("covers every exposed op", () => {
    const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
    const tested = new Set(CASES.map((c) => c.op));
    expect(exposed.filter((o) => !tested.has(o))).toEqual([]);
    // and tests nothing that is not exposed (a renamed export would otherwise go unnoticed)
    expect([...tested].filter((o) => !exposed.includes(o) && o !== "scalar")).toEqual([]);
  });

  it("gives every case one result", () => {
    expect(results.length).toBe(CASES.length);
    expect(results.every((r) => r !== undefined)).toBe(true);
  });

  it.skipIf(backend !== "cpu")("runs every case on the CPU backend (none unsupported there)", () => {
    expect(results.filter((r) => r.status === "unsupported").map((r) => `${r.id}: ${r.detail}`)).toEqual([]);
  });

  const ops = [...new Set(CASES.map((c) => c.op))].sort();
  it.each(ops)("%s is bit-exact (or unsupported on this backend by both sides, or on a path of MLX's own proven broken here)", (op) => {
    const rs = byOp.get(op) ?? [];
    expect(rs.length).toBeGreaterThan(0);
    const bad = rs.filter((r) => r.status === "fail").map((r) => `${r.id}: ${r.detail}`);
    expect(bad).toEqual([]);
  });
});
