// The one test-only switch every mutation list shares (model/gemma4/mutations.ts: the model's
// and the media towers' port bugs; model/tuner/mutations.ts: the trainer's). Each list names its
// bugs and types its own wrappers; both stand on this module, never on each other. Production
// code never adds to the set, so every check is a failed Set lookup.

const active = new Set<string>();

/** True when the named bug is switched on (tests only). */
export function switchedOn(name: string): boolean {
  return active.size !== 0 && active.has(name);
}

/** Runs fn with exactly one bug switched on (tests only). */
export function withSwitch<T>(name: string, fn: () => T): T {
  active.clear();
  active.add(name);
  try {
    return fn();
  } finally {
    active.clear();
  }
}

/** withSwitch for an async fn: the bug stays on until its promise settles. */
export async function withSwitchAsync<T>(name: string, fn: () => T | Promise<T>): Promise<T> {
  active.clear();
  active.add(name);
  try {
    return await fn();
  } finally {
    active.clear();
  }
}
