// A stand-in for oracle/ops/worker.ts that speaks its protocol without running ops, for
// tests/oracle/isolated.test.ts: "poison*" cases report a sticky error, "crash*" cases kill the
// process without a word, every other case is exact.
const { ids } = JSON.parse(await Bun.stdin.text()) as { ids: string[] };
const say = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);
for (const id of ids) {
  if (id.startsWith("crash")) process.exit(7);
  if (id.startsWith("poison")) {
    say({ result: { id, op: "fake", status: "unsupported", ok: false, detail: "misaligned address" } });
    say({ poisoned: { id, ts: "misaligned address", py: null } });
    process.exit(3);
  }
  say({ result: { id, op: "fake", status: "exact", ok: true } });
}
say({ done: true });
export {};
