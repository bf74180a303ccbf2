// Oracle replies: the real client (oracle/client.ts) talking to a fake server
// (fake/oracle_server.ts) that answers one command badly: a malformed JSON line, a reply with a
// wrong id or missing/mistyped fields, an array file that is short, garbage, of another dtype or
// shape, or missing, silence past the timeout, or a process that dies mid-reply or never starts.
import { join } from "node:path";
import fc from "fast-check";
import { OracleClient } from "../../../oracle/client.ts";
import type { NpyRecord } from "../../../oracle/npy.ts";
import { value } from "./config.ts";
import type { Json } from "./safetensors.ts";

export type FakeValue = Json | FakeValue[] | { [k: string]: FakeValue };
export type FakeReply =
  | { raw: string }
  | { partial: string }
  | { exit: number }
  | { kill: true }
  | { silent: true }
  | { error: Json }
  | { fields: FakeValue; id?: Json; ok?: Json };
export interface FakeOracleSpec {
  ready: "ok" | "none" | "garbage" | "exit" | "other-event";
  command: keyof typeof CALLS;
  reply: FakeReply;
}

const f32: NpyRecord = { dtype: "float32", shape: [2], data: new Uint8Array(8) };
/** Each command as its callers use it. */
const CALLS = {
  ping: (o: OracleClient) => o.ping(),
  op: (o: OracleClient) => o.op("add", [f32, { scalar: 1, kind: "float" }]),
  forward: (o: OracleClient) => o.forward("c1_dense/f32", [[1, 2]]),
  generate: (o: OracleClient) => o.generate("c1_dense/f32", [1, 2], { maxTokens: 2 }),
  capture: (o: OracleClient) => o.capture("c1_dense/f32", "fwd_L13"),
  cacheOps: (o: OracleClient) => o.cacheOps([{ op: "new", type: "KVCache" }, { op: "size" }]),
  makeMask: (o: OracleClient) => o.makeMask({ N: 3 }),
};

const npy = fc.record({
  dtype: fc.constantFrom("float32", "int32", "bfloat16", "bool"),
  shape: fc.array(fc.integer({ min: 0, max: 3 }), { maxLength: 3 }),
  data: fc.constantFrom("ok", "ok", "short", "garbage", "missing", "wrong-dtype", "bad-shape"),
}).map(($npy): { $npy: FakeValue } => ({ $npy }));
const leaf: fc.Arbitrary<FakeValue> = fc.oneof({ weight: 3, arbitrary: npy }, { weight: 2, arbitrary: value }, { weight: 1, arbitrary: fc.array(npy, { maxLength: 2 }) });

/** A well-formed reply of each command, from which the fuzz removes or replaces fields. */
const GOOD: Record<string, fc.Arbitrary<Record<string, FakeValue>>> = {
  ping: fc.constant({ pong: true, pid: 1, versions: {} }),
  op: fc.array(npy, { maxLength: 3 }).map((outputs) => ({ outputs })),
  forward: npy.map((logits) => ({ logits })),
  generate: fc.record({ tokens: fc.array(fc.integer({ min: 0, max: 9 }), { maxLength: 3 }), logprobs: fc.array(npy, { maxLength: 2 }), cache: fc.constant([]) }),
  capture: fc.record({
    meta: fc.constant({ scenario: "x", kind: "forward", mode: "full" }),
    calls: fc.constant([]),
    taps: fc.array(fc.oneof(npy.map((n): FakeValue => ({ name: "embed_tokens", kind: "array", ...n })), fc.constant({ name: "mask/full_attention", kind: "none" }), value), { maxLength: 3 }),
  }) as fc.Arbitrary<Record<string, FakeValue>>,
  cacheOps: fc.constant({ results: [{ op: "new", meta: null }, { op: "size", value: 0, meta: null }] }),
  makeMask: fc.oneof(fc.constant({ mask: { kind: "causal" } }), npy.map((n): Record<string, FakeValue> => ({ mask: { kind: "array", ...n } })), fc.constant({ mask: { kind: "sliding" } })),
};

function mutated(good: fc.Arbitrary<Record<string, FakeValue>>): fc.Arbitrary<FakeReply> {
  return fc.oneof(
    { weight: 3, arbitrary: good.map((fields): FakeReply => ({ fields })) },
    { weight: 4, arbitrary: fc.tuple(good, fc.constantFrom("outputs", "logits", "tokens", "logprobs", "taps", "meta", "calls", "results", "mask", "pong"), fc.option(leaf)).map(([g, k, v]): FakeReply => {
      const fields = { ...g };
      if (v === null) delete fields[k];
      else fields[k] = v;
      return { fields };
    }) },
    { weight: 1, arbitrary: fc.tuple(good, fc.constantFrom<Json>(999999, "1", null, -1)).map(([fields, id]): FakeReply => ({ fields, id })) },
    { weight: 1, arbitrary: fc.tuple(good, fc.constantFrom<Json>(false, null, "yes", 1)).map(([fields, ok]): FakeReply => ({ fields, ok })) },
  );
}

export function arbOracle(): fc.Arbitrary<FakeOracleSpec> {
  const command = fc.constantFrom(...(Object.keys(CALLS) as (keyof typeof CALLS)[]));
  return command.chain((c) =>
    fc.record({
      ready: fc.oneof({ weight: 12, arbitrary: fc.constant("ok" as const) }, { weight: 1, arbitrary: fc.constantFrom("none" as const, "garbage" as const, "exit" as const, "other-event" as const) }),
      command: fc.constant(c),
      reply: fc.oneof(
        { weight: 8, arbitrary: mutated(GOOD[c]!) },
        { weight: 2, arbitrary: fc.constantFrom<FakeReply>({ raw: "not json" }, { raw: "[1,2]" }, { raw: '{"id": 1' }, { raw: "" }, { raw: '"just a string"' }, { raw: "\u0000\u0001" }) },
        { weight: 1, arbitrary: fc.constantFrom<FakeReply>({ partial: '{"id": 1, "ok": tr' }, { exit: 0 }, { exit: 139 }, { kill: true }, { silent: true }) },
        { weight: 1, arbitrary: fc.oneof(value, fc.record({ type: value, message: value, traceback: value }, { requiredKeys: [] })).map((error): FakeReply => ({ error })) },
      ),
    }),
  );
}

/** Starts the client against the fake, runs the one command, and closes the client. */
export async function runOracle(spec: FakeOracleSpec, root: string, scratch: string): Promise<void> {
  const o = await OracleClient.start({
    python: process.execPath,
    script: join(root, "suites", "fuzz", "fake", "oracle_server.ts"),
    env: { FAKE_ORACLE: JSON.stringify(spec), FAKE_ORACLE_DIR: scratch, PATH: process.env.PATH ?? "" },
    startTimeoutMs: 2_000,
    requestTimeoutMs: 1_000,
  });
  try {
    await CALLS[spec.command](o);
  } finally {
    await o.close(2_000);
  }
}
