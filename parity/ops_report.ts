// `npm run parity:ops [-- op]`: the op-level parity report, forward and gradient (vjp). Prints the
// coverage table and exits 0 only if every exposed op is parity-tested (every differentiable one
// also for its vjp) and every case is bit-exact or unsupported on the backend by both sides with
// the same MLX error.
import * as mx from "@mlx-bun/mlx";
import { CASES, exposedOps, NOT_OPS } from "../oracle/ops/cases.ts";
import { type IsolatedRun, runCasesIsolated, runSharded } from "../oracle/ops/isolated.ts";
import { type CaseResult, coverage, groupUnsupported } from "../oracle/ops/runner.ts";
import { NOT_DIFFERENTIABLE, runVjpCasesIsolated, vjpCases, vjpCoverage } from "../oracle/ops/vjp_runner.ts";
import { type FlagSpec, helpText, parseArgs, runMain, UsageError } from "./args.ts";

export const FLAGS: FlagSpec[] = [
  { name: "table", kind: "string", valueName: "forward|vjp", help: "one of the two tables only (both by default; two processes can run one each)" },
  { name: "jobs", kind: "string", valueName: "N", help: "run the cases in N interleaved shards at once, each in its own worker processes (default 1)" },
  { name: "help", kind: "bool", help: "show this help" },
];

type Table = "forward" | "vjp";

/** `[op]` (one op's cases only), --table and --help; anything else, or an op without cases, is a UsageError. */
export function opsReportArgs(argv: readonly string[]): { only: string | undefined; tables: Table[]; jobs: number } | null {
  const flags: string[] = [];
  const positional: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const x = argv[i]!;
    if (!x.startsWith("--")) positional.push(x);
    else {
      flags.push(x);
      if ((x === "--table" || x === "--jobs") && i + 1 < argv.length) flags.push(argv[++i]!);
    }
  }
  const a = parseArgs(flags, FLAGS);
  if (a.help) return null;
  if (positional.length > 1) throw new UsageError(`give at most one op name, got ${positional.length}: ${positional.join(" ")}`);
  const only = positional[0];
  if (only !== undefined && !CASES.some((c) => c.op === only || c.oracle === only)) throw new UsageError(`no op parity case for '${only}' (ops look like add, fast.rope, quantized_matmul)`);
  const t = a.table as string | undefined;
  if (t !== undefined && t !== "forward" && t !== "vjp") throw new UsageError(`--table takes forward or vjp, got '${t}'`);
  const j = a.jobs as string | undefined;
  const jobs = j === undefined ? 1 : Number(j);
  if (!/^[1-9][0-9]*$/.test(j ?? "1")) throw new UsageError(`--jobs takes a whole number ≥ 1, got '${j}'`);
  return { only, tables: t ? [t] : ["forward", "vjp"], jobs };
}

async function main(argv: string[]): Promise<number> {
  const parsed = opsReportArgs(argv);
  if (parsed === null) {
    process.stdout.write(helpText("npm run parity:ops -- [op] [--table forward|vjp] [--jobs N]", "The op-level parity table alone (every case, or one op's cases).", FLAGS));
    return 0;
  }
  const t0 = performance.now();
  mx.applyDeviceEnv();
  const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
  const only = parsed.only;
  const cases = !parsed.tables.includes("forward") ? [] : only ? CASES.filter((c) => c.op === only || c.oracle === only) : CASES;
  const gradCases = !parsed.tables.includes("vjp") ? [] : vjpCases().filter((c) => !only || c.op === only || c.oracle === only);
  // progress on stderr as the cases come back (a GPU's first uses of kernels compile for a long
  // time): every tenth of the table, and each case that is not bit-exact at once
  const progress = (label: string, n: number) => {
    let next = 0.1;
    return (r: CaseResult, done: number) => {
      if (r.status !== "exact") process.stderr.write(`  ${label}${r.status}: ${r.id}${r.detail ? `: ${r.detail}` : ""}\n`);
      if (done / n >= next || done === n) {
        process.stderr.write(`[${label || "ops "}] ${done}/${n} cases (${((performance.now() - t0) / 1000).toFixed(0)} s)\n`);
        while (done / n >= next) next += 0.1;
      }
    };
  };
  const fwdOn = parsed.tables.includes("forward");
  const vjpOn = parsed.tables.includes("vjp");
  const none: IsolatedRun = { results: [], workers: 0, poisoners: [] };
  const jobs = parsed.jobs;
  const run = fwdOn ? await runSharded(cases, jobs, (s, on) => runCasesIsolated(s, on), progress("", cases.length)) : none;
  const gradRun = vjpOn ? await runSharded(gradCases, jobs, (s, on) => runVjpCasesIsolated(s, on), progress("vjp ", gradCases.length)) : none;
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
  const fwdRows: [string, string][] = [
    ["ops exposed", String(cov.exposed.length)],
    ["ops parity-tested", `${cov.tested.length} (${pct(cov.tested.length, cov.exposed.length)})`],
    ["cases", String(cov.cases)],
    ["bit-exact cases", `${cov.bitExact} (${pct(cov.bitExact, cov.cases)})`],
    [`unsupported on ${mx.backend()}`, String(cov.unsupported.length)],
    ["at MLX bugs (counted apart)", String(cov.mlxBugs.length)],
    ["failed", String(cov.failures.length)],
  ];
  const vjpRows: [string, string][] = [
    ["differentiable ops", `${gradCov.exposed.length} (${Object.keys(NOT_DIFFERENTIABLE).length} not: PARITY_VERBOSE=1 lists why)`],
    ["ops vjp-tested", `${gradCov.tested.length} (${pct(gradCov.tested.length, gradCov.exposed.length)})`],
    ["vjp cases", String(gradCov.cases)],
    ["bit-exact vjp cases", `${gradCov.bitExact} (${pct(gradCov.bitExact, gradCov.cases)})`],
    [`vjp unsupported on ${mx.backend()}`, String(gradCov.unsupported.length)],
    ["vjp at MLX bugs", String(gradCov.mlxBugs.length)],
    ["vjp failed", String(gradCov.failures.length)],
  ];
  const rows = [...(fwdOn ? fwdRows : []), ...(vjpOn ? vjpRows : [])];
  const w = Math.max(...rows.map(([k]) => k.length));
  console.log(`\nOp-level parity: @mlx-bun/mlx vs Python MLX (${mx.backend()} backend, device ${mx.defaultDevice()}; ${run.workers + gradRun.workers} worker processes)`);
  console.log("-".repeat(w + 24));
  for (const [k, v] of rows) console.log(`${k.padEnd(w)}  ${v}`);
  console.log("-".repeat(w + 24));
  if (process.env.PARITY_VERBOSE) for (const [op, e] of [...perOp].sort()) console.log(`  ${op.padEnd(34)} ${e.ok}/${e.n}`);
  if (process.env.PARITY_VERBOSE) for (const [op, why] of Object.entries(NOT_DIFFERENTIABLE)) console.log(`  not differentiable: ${op.padEnd(22)} ${why}`);
  if (!only && fwdOn && cov.untested.length) console.log(`untested ops: ${cov.untested.join(", ")}`);
  if (!only && vjpOn && gradCov.untested.length) console.log(`differentiable ops without vjp cases: ${gradCov.untested.join(", ")}`);
  for (const [label, c, r] of [["", cov, run], ["vjp ", gradCov, gradRun]] as const) {
    for (const [msg, ids] of groupUnsupported(c.unsupported)) console.log(`${label}unsupported on ${mx.backend()} (${ids.length}): ${msg}\n     ${ids.join(", ")}`);
    for (const b of c.mlxBugs) console.log(`${label}${b.id} diverges at MLX bug ${b.mlxBug!.id} (${b.mlxBug!.reproducer})\n     ${b.detail}`);
    for (const f of c.failures) console.log(`FAIL ${label}${f.id}\n     ${f.detail}`);
    for (const p of r.poisoners) console.log(`${label}${p.id} left a sticky error behind (binding: ${p.ts ?? "ok"}; oracle: ${p.py ?? "ok"}); the rest ran in fresh processes`);
  }
  console.log(`(${((performance.now() - t0) / 1000).toFixed(1)} s)`);
  const failed = cov.failures.length + gradCov.failures.length;
  // unsupported cases and those at MLX bugs are reported above, not failures
  const ok = !only && (!fwdOn || (cov.untested.length === 0 && cov.cases > 0)) && (!vjpOn || (gradCov.untested.length === 0 && gradCov.cases > 0)) && failed === 0;
  return only ? (failed === 0 ? 0 : 1) : ok ? 0 : 1;
}

if (import.meta.main) runMain(main);
