// Fuzzing every input the project accepts from outside (safetensors files, config.json,
// tokenizer files and chat templates, op arguments, oracle replies, command lines): each input
// must end in one clear error or be accepted, never abort, hang or leak a native handle. Inputs
// run in a worker process (runner.ts), so an abort is counted instead of ending the suite.
//
//   bun test suites/fuzz                      the bounded sample (about 800 inputs, seconds)
//   FUZZ_SOAK=10000 bun test suites/fuzz      the soak (about 10,000 inputs, minutes)
//   PROPERTY_SEED=7 bun test suites/fuzz      other inputs (seeds derive from target names)
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../../oracle/client.ts";
import { regressions } from "./regressions.ts";
import { runFuzz, runInputs, summaryLine } from "./runner.ts";
import { TARGETS } from "./targets.ts";
import { limit } from "../../tests/time_limit.ts";

const soak = Number(process.env.FUZZ_SOAK ?? 0);
const base = TARGETS.reduce((s, t) => s + t.sample, 0);
const scale = soak > 0 ? soak / base : 1;

describe("fuzz: nothing malformed aborts, hangs or leaks", () => {
  it(`${soak > 0 ? `soak of ~${soak}` : `bounded sample of ${base}`} inputs over ${TARGETS.length} targets`, async () => {
    const tally = await runFuzz({ root: REPO_ROOT, targets: TARGETS, scale });
    console.log(summaryLine(tally));
    for (const [name, per] of Object.entries(tally.perTarget)) console.log(`  ${name.padEnd(24)} ${JSON.stringify(per)}`);
    for (const f of tally.findings.slice(0, 10)) {
      console.error(`${f.verdict.toUpperCase()} ${f.target} #${f.index} (seed ${f.seed}): ${f.detail}\n  input: ${JSON.stringify(f.input).slice(0, 1500)}`);
    }
    expect(tally.inputs).toBeGreaterThanOrEqual(soak > 0 ? soak * 0.95 : 500);
    // every target got inputs, and both outcomes occur (the generators reach valid and invalid inputs)
    for (const t of TARGETS) expect(Object.values(tally.perTarget[t.name] ?? {}).reduce((a, b) => a + b, 0), t.name).toBeGreaterThan(0);
    expect(tally.clear).toBeGreaterThan(0);
    expect(tally.ok).toBeGreaterThan(0);
    expect({ abort: tally.abort, hang: tally.hang, leak: tally.leak, unclear: tally.unclear }).toEqual({ abort: 0, hang: 0, leak: 0, unclear: 0 });
  }, limit(soak > 0 ? 3_600_000 : 240_000));

  it("what the fuzz found stays fixed (each regression input gets its verdict, in the worker)", async () => {
    const list = regressions();
    const tally = await runInputs(REPO_ROOT, TARGETS, list);
    const got = list.map((r, i) => ({ was: r.was, expect: r.expect, got: tally.verdicts[i] }));
    for (const f of tally.findings) console.error(`${f.verdict} ${f.target}: ${f.detail}`);
    expect(got.filter((g) => g.got !== g.expect)).toEqual([]);
  }, limit(240_000));
});
