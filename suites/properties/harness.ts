// Shared property-test plumbing: every property is seeded, runs PROPERTY_RUNS cases (default 100,
// the seeded sample npm test can afford in its 8-minute budget; 200 until 2026-12-02, and
// PROPERTY_RUNS=200 or more for a deeper run), and on failure prints its seed, replay path and
// shrunk counterexample.
//
//   PROPERTY_RUNS=5000 bun test suites/properties     # soak
//   PROPERTY_SEED=123 bun test suites/properties      # replay with another base seed
import fc from "fast-check";

export const DEFAULT_RUNS = 100;

export function propertyRuns(min = DEFAULT_RUNS): number {
  const env = Number.parseInt(process.env.PROPERTY_RUNS ?? "", 10);
  return Number.isFinite(env) && env > 0 ? env : min;
}

/** Per-test timeout (ms) that scales with PROPERTY_RUNS. */
export function propertyTimeout(msPer200 = 60_000): number {
  return Math.ceil((msPer200 * Math.max(propertyRuns(), DEFAULT_RUNS)) / DEFAULT_RUNS);
}

/** A stable per-property seed: FNV-1a of the name, xor'd with PROPERTY_SEED when given. */
export function seedFor(name: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  const base = Number.parseInt(process.env.PROPERTY_SEED ?? "", 10);
  return (Number.isFinite(base) ? (h ^ base) >>> 0 : h) | 0;
}

export interface RunStats {
  name: string;
  seed: number;
  runs: number;
  ms: number;
}

export const stats: RunStats[] = [];

/**
 * Runs one property with its seed. On failure the thrown error (fast-check's report: seed, path,
 * shrunk counterexample) is printed with the property's name and re-thrown.
 */
export function checkProperty<Ts extends [unknown, ...unknown[]]>(
  name: string,
  prop: fc.IProperty<Ts> | fc.IAsyncProperty<Ts>,
  opts: { runs?: number; seed?: number } = {},
): void | Promise<void> {
  const seed = opts.seed ?? seedFor(name);
  const runs = opts.runs ?? propertyRuns();
  const t0 = performance.now();
  const params: fc.Parameters<Ts> = { seed, numRuns: runs, endOnFailure: false };
  const done = (): void => void stats.push({ name, seed, runs, ms: performance.now() - t0 });
  const fail = (e: unknown) => {
    const msg = e instanceof Error ? e.message : String(e);
    console.error(
      `\n[property] ${name} FAILED (seed=${seed}, runs=${runs}; the seed is derived from the property name` +
        `${process.env.PROPERTY_SEED ? ` and PROPERTY_SEED=${process.env.PROPERTY_SEED}` : ""}, so a rerun replays it)\n${msg}\n`,
    );
    throw e;
  };
  if ("isAsync" in prop && prop.isAsync()) {
    return (fc.assert(prop as fc.IAsyncProperty<Ts>, params) as Promise<void>).then(done, fail);
  }
  try {
    fc.assert(prop as fc.IProperty<Ts>, params);
    done();
  } catch (e) {
    fail(e);
  }
}
