// The fuzz worker: a child process that feeds inputs to their targets, one at a time, so that an
// input that aborts the process (a C++ exception escaping, a segfault) or hangs it is observed by
// the parent (runner.ts) and counted, instead of ending the test run.
//
// Protocol: the parent writes one JSON line per input {id, target, input}; the worker answers one
// line "\x01FUZZ {id, verdict, detail?}" per input, after a first "\x01FUZZ {ready}" line.
// Verdicts: "ok" (accepted), "clear" (one clear error), "unclear" (another error), "leak"
// (native handles left live after the input).
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { REPO_ROOT } from "../../oracle/client.ts";
import { decodeInput, type FuzzContext, MARK } from "./target.ts";
import { TARGETS } from "./targets.ts";

const byName = new Map(TARGETS.map((t) => [t.name, t]));
const base = mkdtempSync(join(tmpdir(), "fuzz-worker-"));
const send = (o: object) => process.stdout.write(`${MARK}${JSON.stringify(o)}\n`);

async function one(id: number, name: string, input: unknown): Promise<void> {
  const t = byName.get(name);
  if (!t) {
    send({ id, verdict: "unclear", detail: `unknown target ${name}` });
    return;
  }
  const scratch = join(base, String(id));
  mkdirSync(scratch);
  const ctx: FuzzContext = { scratch, root: REPO_ROOT };
  const before = mx.liveHandles();
  let verdict: string;
  let detail: string | undefined;
  try {
    await t.run(input, ctx);
    verdict = "ok";
  } catch (e) {
    const why = t.judge(e, input, ctx);
    verdict = why === null ? "clear" : "unclear";
    detail = why ?? (e as Error).message?.split("\n")[0];
  }
  const leaked = mx.liveHandles() - before;
  if (leaked > 0) {
    verdict = "leak";
    detail = `${leaked} native handle(s) left live${detail ? ` (after: ${detail})` : ""}`;
  }
  rmSync(scratch, { recursive: true, force: true });
  send({ id, verdict, detail });
}

send({ ready: true, pid: process.pid, scratch: base });
let buf = "";
let chain = Promise.resolve();
process.stdin.on("data", (chunk: Buffer) => {
  buf += chunk.toString("utf8");
  let nl: number;
  while ((nl = buf.indexOf("\n")) >= 0) {
    const line = buf.slice(0, nl);
    buf = buf.slice(nl + 1);
    if (!line.trim()) continue;
    const msg = decodeInput(line) as { id: number; target: string; input: unknown };
    chain = chain.then(() => one(msg.id, msg.target, msg.input));
  }
});
process.stdin.on("end", () => {
  void chain.then(() => {
    rmSync(base, { recursive: true, force: true });
    process.exit(0);
  });
});
