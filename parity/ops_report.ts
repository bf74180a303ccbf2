// `npm run parity:ops [-- op]`: the op-level parity report. Prints the coverage table and exits 0
// only if every exposed op is parity-tested and every case is bit-exact.
import { CASES, exposedOps, NOT_OPS } from "../oracle/ops/cases.ts";
import { OracleClient } from "../oracle/client.ts";
import { coverage, runCases } from "../oracle/ops/runner.ts";
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
  const exposed = exposedOps().filter((o) => !(o in NOT_OPS));
  const only = parsed.only;
  const cases = only ? CASES.filter((c) => c.op === only || c.oracle === only) : CASES;
  const oracle = await OracleClient.start();
  let results;
  try {
    results = await runCases(cases, oracle);
  } finally {
    await oracle.close();
  }
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
  ];
  const w = Math.max(...rows.map(([k]) => k.length));
  console.log(`\nOp-level parity: @mlx-bun/mlx vs Python MLX (oracle: oracle/python/server.py, pid ${oracle.pid})`);
  console.log("-".repeat(w + 24));
  for (const [k, v] of rows) console.log(`${k.padEnd(w)}  ${v}`);
  console.log("-".repeat(w + 24));
  if (process.env.PARITY_VERBOSE) for (const [op, e] of [...perOp].sort()) console.log(`  ${op.padEnd(34)} ${e.ok}/${e.n}`);
  if (!only && cov.untested.length) console.log(`untested ops: ${cov.untested.join(", ")}`);
  for (const f of cov.failures.slice(0, 40)) console.log(`FAIL ${f.id}\n     ${f.detail}`);
  if (cov.failures.length > 40) console.log(`... and ${cov.failures.length - 40} more failures`);
  console.log(`(${((performance.now() - t0) / 1000).toFixed(1)} s)`);
  const ok = !only && cov.untested.length === 0 && cov.failures.length === 0 && cov.cases > 0;
  return only ? (cov.failures.length === 0 ? 0 : 1) : ok ? 0 : 1;
}

if (import.meta.main) runMain(main);
