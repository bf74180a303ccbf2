// `npm run parity:ops [-- op]`: the op-level parity report, forward and gradient (vjp). Prints the
// coverage table and exits 0 only if every exposed op is parity-tested (every differentiable one
// also for its vjp) and every case is bit-exact or unsupported on the backend by both sides with
// the same MLX error.
import * as mx from "@mlx-bun/mlx";
import { CASES, exposedOps, NOT_OPS } from "../oracle/ops/cases.ts";
import { runCasesIsolated } from "../oracle/ops/isolated.ts";
import { coverage, groupUnsupported } from "../oracle/ops/runner.ts";
import { NOT_DIFFERENTIABLE, runVjpCasesIsolated, vjpCases, vjpCoverage } from "../oracle/ops/vjp_runner.ts";
import { type FlagSpec, helpText, parseArgs, runMain, UsageError } from "./args.ts";

export const FLAGS: FlagSpec[] = [{ name: "help", kind: "bool", help: "show this help" }];

/** `[op]` (one op's cases only) and --help; anything else, or an op without cases, is a UsageError. */
export function opsReportArgs(argv: readonly string[]): { only: string | undefined } | null {
  const positional = argv.filter((x) => !x.startsWith("--"));
  if (parseArgs(argv.filter((x) => x.startsWith("--")), FLAGS).help) return null;
  if (positional.length > 1) throw new UsageError(`give at most one op name, got ${positional.length}: ${positional.join(" ")}`);
  const only = positional[0];
  if (only !== undefined && !CASES.some((c) => c.op === only || c.oracle === only)) throw new UsageError(`no op parity case for '${only}' (ops look like add, fast.rope, quantized_matmul)`);
  return { only };
}

async function main(argv: string[]): Promise<number> {
  const parsed = opsReportArgs(argv);
  if (parsed === null) {
    process.stdout.write(helpText("npm run parity:ops -- [op]", "The op-level parity table alone (every case, or one op's cases).", FLAGS));
    return 0;
  }
  const t0 = performance.now();
  mx.applyDeviceEnv();
  const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
  const only = parsed.only;
  const cases = only ? CASES.filter((c) => c.op === only || c.oracle === only) : CASES;
  const gradCases = vjpCases().filter((c) => !only || c.op === only || c.oracle === only);
  const run = await runCasesIsolated(cases);
  const gradRun = await runVjpCasesIsolated(gradCases);
  const results = run.results;
  const cov = coverage(exposed, cases, results);
  const gradCov = vjpCoverage(exposed, gradCases, gradRun.results);

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
    ["at MLX bugs (counted apart)", String(cov.mlxBugs.length)],
    ["failed", String(cov.failures.length)],
    ["differentiable ops", `${gradCov.exposed.length} (${Object.keys(NOT_DIFFERENTIABLE).length} not: PARITY_VERBOSE=1 lists why)`],
    ["ops vjp-tested", `${gradCov.tested.length} (${pct(gradCov.tested.length, gradCov.exposed.length)})`],
    ["vjp cases", String(gradCov.cases)],
    ["bit-exact vjp cases", `${gradCov.bitExact} (${pct(gradCov.bitExact, gradCov.cases)})`],
    [`vjp unsupported on ${mx.backend()}`, String(gradCov.unsupported.length)],
    ["vjp at MLX bugs", String(gradCov.mlxBugs.length)],
    ["vjp failed", String(gradCov.failures.length)],
  ];
  const w = Math.max(...rows.map(([k]) => k.length));
  console.log(`\nOp-level parity: @mlx-bun/mlx vs Python MLX (${mx.backend()} backend, device ${mx.defaultDevice()}; ${run.workers + gradRun.workers} worker processes)`);
  console.log("-".repeat(w + 24));
  for (const [k, v] of rows) console.log(`${k.padEnd(w)}  ${v}`);
  console.log("-".repeat(w + 24));
  if (process.env.PARITY_VERBOSE) for (const [op, e] of [...perOp].sort()) console.log(`  ${op.padEnd(34)} ${e.ok}/${e.n}`);
  if (process.env.PARITY_VERBOSE) for (const [op, why] of Object.entries(NOT_DIFFERENTIABLE)) console.log(`  not differentiable: ${op.padEnd(22)} ${why}`);
  if (!only && cov.untested.length) console.log(`untested ops: ${cov.untested.join(", ")}`);
  if (!only && gradCov.untested.length) console.log(`differentiable ops without vjp cases: ${gradCov.untested.join(", ")}`);
  for (const [label, c, r] of [["", cov, run], ["vjp ", gradCov, gradRun]] as const) {
    for (const [msg, ids] of groupUnsupported(c.unsupported)) console.log(`${label}unsupported on ${mx.backend()} (${ids.length}): ${msg}\n     ${ids.join(", ")}`);
    for (const b of c.mlxBugs) console.log(`${label}${b.id} diverges at MLX bug ${b.mlxBug!.id} (${b.mlxBug!.reproducer})\n     ${b.detail}`);
    for (const f of c.failures) console.log(`FAIL ${label}${f.id}\n     ${f.detail}`);
    for (const p of r.poisoners) console.log(`${label}${p.id} left a sticky error behind (binding: ${p.ts ?? "ok"}; oracle: ${p.py ?? "ok"}); the rest ran in fresh processes`);
  }
  console.log(`(${((performance.now() - t0) / 1000).toFixed(1)} s)`);
  const failed = cov.failures.length + gradCov.failures.length;
  const ok = !only && cov.untested.length === 0 && gradCov.untested.length === 0 && failed === 0 && cov.cases > 0; // unsupported cases are reported above, not failures
  return only ? (failed === 0 ? 0 : 1) : ok ? 0 : 1;
}

if (import.meta.main) runMain(main);
