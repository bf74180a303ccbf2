// Protocol and error paths of the oracle client/server: every failure is a clear OracleError, never a hang.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { OracleClient, OracleError, sharedOracle } from "../../oracle/client.ts";
import type { NpyRecord } from "../../oracle/npy.ts";

// Spawning a server imports mlx_lm (and transformers): seconds on a loaded 2-core machine.
const SLOW = 60_000;
const dir = mkdtempSync(join(tmpdir(), "oracle-proto-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A fake server: `body` is Python run for each request line (`req` is the parsed request). */
function fakeServer(name: string, body: string, ready = true): string {
  const p = join(dir, `${name}.py`);
  writeFileSync(
    p,
    [
      "import json, sys",
      ready ? 'print(json.dumps({"event": "ready", "pid": 0, "versions": {}, "tmpdir": "/tmp"}), flush=True)' : "",
      "for line in sys.stdin:",
      "    req = json.loads(line)",
      ...body.split("\n").map((l) => `    ${l}`),
      "    sys.stdout.flush()",
    ].join("\n"),
  );
  return p;
}

function f32(values: number[], shape = [values.length]): NpyRecord {
  return { dtype: "float32", shape, data: new Uint8Array(new Float32Array(values).buffer) };
}

describe("oracle protocol", () => {
  it("answers ping with the pinned versions, and the shared instance is one process", async () => {
    const a = await sharedOracle();
    const b = await sharedOracle();
    expect(a).toBe(b);
    const r = await a.ping();
    expect(r.pong).toBe(true);
    expect(r.pid).toBe(a.pid as number);
    expect(r.versions.mlx).toBe("0.32.4");
    expect(r.versions.mlx_lm).toBe("0.32.2");
  }, SLOW);

  it("an unknown command is an OracleError naming it, and the server keeps serving", async () => {
    const o = await sharedOracle();
    const err = await o.request("no_such_command").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OracleError);
    expect((err as OracleError).pythonType).toBe("LookupError");
    expect((err as Error).message).toContain("unknown command 'no_such_command'");
    expect((await o.ping()).pong).toBe(true);
  }, SLOW);

  it("a Python exception carries its type and traceback", async () => {
    const o = await sharedOracle();
    const err = (await o.forward("/nonexistent/checkpoint", [[1]]).catch((e: unknown) => e)) as OracleError;
    expect(err).toBeInstanceOf(OracleError);
    expect(err.pythonType).toBe("FileNotFoundError");
    expect(err.pythonTraceback).toContain("Traceback (most recent call last)");
    expect(err.pythonTraceback).toContain("server.py");
    expect(err.message).toContain("--- python traceback ---");
  }, SLOW);

  it("a killed process rejects the in-flight request and every later one", async () => {
    const o = await OracleClient.start();
    const pending = o.request("sleep", { seconds: 30 });
    setTimeout(() => o.kill("SIGKILL"), 100);
    const t0 = Date.now();
    const err = (await pending.catch((e: unknown) => e)) as Error;
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(err).toBeInstanceOf(OracleError);
    expect(err.message).toMatch(/oracle process exited \(signal SIGKILL\)/);
    expect(err.message).toContain('while running "sleep"');
    await expect(o.ping()).rejects.toThrow(/oracle is not running/);
    expect(o.alive).toBe(false);
    await o.close();
  }, SLOW);

  it("a request past its timeout is rejected and the stuck process killed", async () => {
    const o = await OracleClient.start();
    const err = (await o.request("sleep", { seconds: 20 }, 300).catch((e: unknown) => e)) as Error;
    expect(err.message).toMatch(/timed out after 300 ms; the process was killed/);
    await expect(o.ping()).rejects.toThrow(/not running/);
    await o.close();
  }, SLOW);

  it("a malformed (non-JSON) reply is a clear error, not a hang", async () => {
    const o = await OracleClient.start({ script: fakeServer("garbage", 'print("this is not json")') });
    await expect(o.ping()).rejects.toThrow(/malformed reply from oracle \(not a JSON object\): this is not json/);
    await o.close();
  });

  it("a reply without ok/error, or with an unknown id, is a clear error", async () => {
    const noOk = await OracleClient.start({ script: fakeServer("nook", 'print(json.dumps({"id": req["id"]}))') });
    await expect(noOk.ping()).rejects.toThrow(/malformed reply from oracle/);
    await noOk.close();
    const badId = await OracleClient.start({ script: fakeServer("badid", 'print(json.dumps({"id": 999999, "ok": True}))') });
    await expect(badId.ping()).rejects.toThrow(/unknown id 999999/);
    await badId.close();
  });

  it("a server that dies before its ready line fails start() with its stderr", async () => {
    const p = join(dir, "crash.py");
    writeFileSync(p, "import sys\nsys.stderr.write('boom: cannot start\\n')\nsys.exit(3)\n");
    const err = (await OracleClient.start({ script: p }).catch((e: unknown) => e)) as Error;
    expect(err).toBeInstanceOf(OracleError);
    expect(err.message).toContain("oracle process exited (code 3)");
    expect(err.message).toContain("boom: cannot start");
  });

  it("a server that never gets ready fails start() after the start timeout", async () => {
    const script = fakeServer("mute", "pass", false);
    await expect(OracleClient.start({ script, startTimeoutMs: 500 })).rejects.toThrow(/did not become ready within 500 ms/);
  });

  it("op runs run_op from the ops table (stub table here), bit-exact through .npy", async () => {
    const stub = join(dir, "stub_ops.py");
    writeFileSync(
      stub,
      [
        "import mlx.core as mx",
        "def run_op(name, inputs, params):",
        "    if name == 'add': return [mx.add(inputs[0], inputs[1])]",
        "    if name == 'identity': return [inputs[0]]",
        "    if name == 'split': return list(mx.split(inputs[0], params['n']))",
        "    raise KeyError(f'unknown op {name!r}')",
      ].join("\n"),
    );
    const o = await OracleClient.start({ env: { ORACLE_OPS_TABLE: stub } });
    try {
      const [sum] = await o.op("add", [f32([1, 2, 3]), { scalar: 0.5, kind: "float" }]);
      expect(sum?.dtype).toBe("float32");
      expect(Array.from(new Float32Array((sum as NpyRecord).data.slice().buffer))).toEqual([1.5, 2.5, 3.5]);
      const bf: NpyRecord = { dtype: "bfloat16", shape: [2, 2], data: new Uint8Array([0x80, 0x3f, 0x01, 0x40, 0xff, 0x7f, 0x00, 0x80]) };
      const [same] = await o.op("identity", [bf]);
      expect(same?.dtype).toBe("bfloat16");
      expect(same?.shape).toEqual([2, 2]);
      expect(Array.from(same?.data ?? [])).toEqual(Array.from(bf.data));
      const parts = await o.op("split", [f32([1, 2, 3, 4])], { n: 2 });
      expect(parts.map((p) => p.shape)).toEqual([[2], [2]]);
      const err = (await o.op("nope", []).catch((e: unknown) => e)) as OracleError;
      expect(err.pythonType).toBe("KeyError");
      expect(err.message).toContain("unknown op 'nope'");
    } finally {
      const pid = o.pid as number;
      await o.close(); // clean shutdown: the process is gone afterwards
      expect(o.alive).toBe(false);
      expect(() => process.kill(pid, 0)).toThrow();
    }
  }, SLOW);
});
