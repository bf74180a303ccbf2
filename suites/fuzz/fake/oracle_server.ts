// A fake oracle server for the fuzz suite (run with bun): it speaks the JSON-lines protocol of
// oracle/python/server.py, but answers each request the way FAKE_ORACLE (a JSON spec) says:
// malformed lines, replies with missing or mistyped fields, .npy files that are short, garbage,
// of another dtype or absent, silence, or death half-way through a line.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import type { FakeOracleSpec, FakeValue } from "../inputs/oracle.ts";
import { toNpy } from "../../../oracle/npy.ts";

const spec = JSON.parse(process.env.FAKE_ORACLE ?? "{}") as FakeOracleSpec;
const dir = process.env.FAKE_ORACLE_DIR!;
let seq = 0;
const out = (s: string) => process.stdout.write(s);

function npy(v: { dtype: string; shape: number[]; data: string }): Record<string, unknown> {
  const p = join(dir, `out-${seq++}.npy`);
  const n = v.shape.reduce((a, b) => a * b, 1);
  const size = { float32: 4, int32: 4, uint32: 4, bfloat16: 2, bool: 1 }[v.dtype] ?? 4;
  const stored = v.data === "wrong-dtype" ? "int8" : v.dtype === "bfloat16" ? "uint16" : v.dtype;
  const bytes = toNpy({ dtype: stored as "float32", shape: v.shape, data: new Uint8Array(v.data === "wrong-dtype" ? n : n * size) });
  if (v.data === "ok" || v.data === "wrong-dtype") writeFileSync(p, bytes);
  else if (v.data === "short") writeFileSync(p, bytes.subarray(0, Math.max(0, bytes.length - 3)));
  else if (v.data === "garbage") writeFileSync(p, "this is not an npy file");
  return { npy: p, dtype: v.dtype, shape: v.data === "bad-shape" ? [...v.shape, 7] : v.shape };
}

function build(v: FakeValue): unknown {
  if (v !== null && typeof v === "object" && !Array.isArray(v)) {
    const { $npy, ...rest } = v as Record<string, FakeValue>;
    const built = Object.fromEntries(Object.entries(rest).map(([k, x]) => [k, build(x)]));
    return $npy === undefined ? built : { ...built, ...npy($npy as { dtype: string; shape: number[]; data: string }) };
  }
  if (Array.isArray(v)) return v.map(build);
  return v;
}

if (spec.ready === "ok") out(`${JSON.stringify({ event: "ready", pid: process.pid, versions: {}, tmpdir: dir })}\n`);
else if (spec.ready === "garbage") out("ready? maybe\n");
else if (spec.ready === "exit") process.exit(3);
else if (spec.ready === "other-event") out(`${JSON.stringify({ event: "starting" })}\n`);
// "none": never ready

let buf = "";
process.stdin.on("data", (c: Buffer) => {
  buf += c.toString();
  let nl: number;
  while ((nl = buf.indexOf("\n")) >= 0) {
    const req = JSON.parse(buf.slice(0, nl)) as { id: number; cmd: string };
    buf = buf.slice(nl + 1);
    if (req.cmd === "shutdown") {
      out(`${JSON.stringify({ id: req.id, ok: true })}\n`);
      process.exit(0);
    }
    const r = spec.reply;
    if ("raw" in r) out(`${r.raw}\n`);
    else if ("partial" in r) {
      out(r.partial);
      process.exit(1);
    } else if ("exit" in r) process.exit(r.exit);
    else if ("kill" in r) process.kill(process.pid, "SIGKILL");
    else if ("silent" in r) continue;
    else if ("error" in r) out(`${JSON.stringify({ id: req.id, ok: false, error: r.error })}\n`);
    else out(`${JSON.stringify({ id: r.id === undefined ? req.id : r.id, ok: r.ok ?? true, ...(build(r.fields) as object) })}\n`);
  }
});
