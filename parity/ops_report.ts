// `npm run parity:ops`: the op-level parity report. Prints the coverage table and exits 0
// only if every exposed op is parity-tested and every case is bit-exact or unsupported on the
// backend by both sides with the same MLX error.
import * as mx from "@mlx-bun/mlx";
import { CASES, exposedOps, NOT_OPS } from "../oracle/ops/cases.ts";
import { runCasesIsolated } from "../oracle/ops/isolated.ts";
import { coverage, groupUnsupported } from "../oracle/ops/runner.ts";

const t0 = performance.now();
mx.applyDeviceEnv();
const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
const only = process.argv[2];
const cases = only ? CASES.filter((c) => c.op === only || c.oracle === only) : CASES;
const run = await runCasesIsolated(cases);
const results = run.results;
const cov = coverage(exposed, cases, results);

const perOp = new Map<string, { n: number; ok: number }>();
for (const r of results) {
  const e = perOp.get(r.op) ?? { n: 0, ok: 0 };
  e.n++;
  if (r.ok) e.ok++;
  perOp.set(r.op, e);
}
const pct = (a: number, b: number) => (b === 0 ? "-" : `${((100 * a) / b).toFixed(1)}%`);
const rows: [string, string][] = [
  ["ops exposed", String(cov.exposed.length)],
  ["ops parity-tested", `${cov.tested.length} (${pct(cov.tested.length, cov.exposed.length)})`],
  ["cases", String(cov.cases)],
  ["bit-exact cases", `${cov.bitExact} (${pct(cov.bitExact, cov.cases)})`],
  [`unsupported on ${mx.backend()}`, String(cov.unsupported.length)],
  ["failed", String(cov.failures.length)],
];
const w = Math.max(...rows.map(([k]) => k.length));
console.log(`\nOp-level parity: @mlx-bun/mlx vs Python MLX (${mx.backend()} backend, device ${mx.defaultDevice()}; ${run.workers} worker process${run.workers === 1 ? "" : "es"})`);
console.log("-".repeat(w + 24));
for (const [k, v] of rows) console.log(`${k.padEnd(w)}  ${v}`);
console.log("-".repeat(w + 24));
if (process.env.PARITY_VERBOSE) for (const [op, e] of [...perOp].sort()) console.log(`  ${op.padEnd(34)} ${e.ok}/${e.n}`);
if (!only && cov.untested.length) console.log(`untested ops: ${cov.untested.join(", ")}`);
for (const [msg, ids] of groupUnsupported(cov.unsupported)) console.log(`unsupported on ${mx.backend()} (${ids.length}): ${msg}\n     ${ids.join(", ")}`);
for (const f of cov.failures) console.log(`FAIL ${f.id}\n     ${f.detail}`);
for (const p of run.poisoners) console.log(`${p.id} left a sticky error behind (binding: ${p.ts ?? "ok"}; oracle: ${p.py ?? "ok"}); the rest ran in fresh processes`);
console.log(`(${((performance.now() - t0) / 1000).toFixed(1)} s)`);
const ok = !only && cov.untested.length === 0 && cov.failures.length === 0 && cov.cases > 0; // unsupported cases are reported above, not failures
process.exit(only ? (cov.failures.length === 0 ? 0 : 1) : ok ? 0 : 1);
