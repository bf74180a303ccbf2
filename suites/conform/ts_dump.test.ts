// The TS port's conformance dump (engines/ts_port/dump.ts) at level 2 against a live mlx-lm
// capture of the same run (the oracle's `capture` request), byte for byte: every oracle tap of
// every call must be in the dump with the same dtype, shape and bytes (masks: the same kind, or
// the same boolean array), and the dump must hold nothing else. Two f32 fixtures (dense, and
// E2B-like with PLE and KV sharing) × a forward and a generate_step schedule. The dump also
// passes validateDump against its checkpoint, and the tensors compared are counted against the
// tap scheme (oracle/taps.ts) per call. TS_DUMP_FIXTURES=all runs every text checkpoint
// variant (68 runs, all equal on 2026-12-02: engines/ts_port/README.md has the table).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type OracleClient, REPO_ROOT, type ScenarioSpec, sharedOracle } from "../../oracle/client.ts";
import { callTaps, type DumpSchedule, validateDump } from "../../oracle/conform/dump.ts";
import { tsDump } from "../../engines/ts_port/dump.ts";
import { limit } from "../../tests/time_limit.ts";

let oracle: OracleClient;
let tmp: string;
beforeAll(async () => {
  oracle = await sharedOracle();
  tmp = mkdtempSync(join(tmpdir(), "ts-dump-"));
}, limit(120_000));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

// Default: two f32 fixtures. TS_DUMP_FIXTURES=all: every text checkpoint variant in
// .cache/checkpoints (c*/*: every layout, dtype and quantization); or a comma-separated list.
function fixtures(): string[] {
  const env = process.env.TS_DUMP_FIXTURES;
  if (!env) return ["c1_dense/f32", "c3_e2b/f32"];
  if (env !== "all") return env.split(",").filter(Boolean);
  const root = join(REPO_ROOT, ".cache", "checkpoints");
  return readdirSync(root)
    .filter((f) => /^c\d/.test(f))
    .sort()
    .flatMap((f) => readdirSync(join(root, f)).sort().map((v) => `${f}/${v}`))
    .filter((id) => existsSync(join(root, id, "config.json")));
}
const FIXTURES = fixtures();
// 10 tokens: past the fixtures' sliding window of 8, so the forward's sliding mask is an array.
const PROMPT = [2, 17, 93, 4, 250, 31, 8, 77, 120, 5];
const SCHEDULES: DumpSchedule[] = [{ kind: "forward" }, { kind: "generate", prefill_step_size: 4, max_tokens: 3 }];

function scenarioOf(s: DumpSchedule): ScenarioSpec {
  return s.kind === "forward"
    ? { id: "ts-dump-forward", kind: "forward", tokens: [PROMPT] }
    : { id: "ts-dump-generate", kind: "generate", prompt: PROMPT, prefill_step_size: s.prefill_step_size, max_tokens: s.max_tokens };
}

const bytesEqual = (a: Uint8Array, b: Uint8Array) => a.length === b.length && Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.length), Buffer.from(b.buffer, b.byteOffset, b.length)) === 0;

describe("TS port dump = mlx-lm capture, byte for byte (level 2)", () => {
  for (const fixture of FIXTURES) {
    for (const schedule of SCHEDULES) {
      it(`${fixture} ${schedule.kind}`, async () => {
        const ckpt = join(REPO_ROOT, ".cache", "checkpoints", fixture);
        const out = join(tmp, `${fixture.replace("/", "_")}_${schedule.kind}`);
        const capture = oracle.capture(fixture, scenarioOf(schedule), { mode: "full" });
        await tsDump({ checkpoint: ckpt, prompt: PROMPT, schedule, level: 2, out });
        const dump = validateDump(out, ckpt);
        expect(dump.level).toBe(2);
        const cap = await capture;

        let compared = 0;
        const mismatches: string[] = [];
        for (const t of cap.taps) {
          if (t.kind === "array") {
            if (!dump.tensors.has(t.name)) {
              mismatches.push(`${t.name}: absent from the dump`);
              continue;
            }
            const mine = dump.tensors.read(t.name);
            const theirs = t.array!;
            if (mine.dtype !== theirs.dtype || mine.shape.join() !== theirs.shape.join() || !bytesEqual(mine.data, theirs.data)) {
              mismatches.push(`${t.name}: dump ${mine.dtype}[${mine.shape}] vs oracle ${theirs.dtype}[${theirs.shape}]${mine.dtype === theirs.dtype ? " (bytes differ)" : ""}`);
            }
          } else {
            const want = t.kind === "none" ? "none" : t.value;
            const got = dump.tensors.maskKind(t.name);
            if (got !== want) mismatches.push(`${t.name}: dump mask kind ${got} vs oracle ${want}`);
          }
          compared++;
        }
        expect(mismatches).toEqual([]);
        // Nothing in the dump that the oracle did not record.
        const dumped = dump.tensors.names.length + Object.keys(dump.manifest.mask_kinds ?? {}).length;
        expect(dumped).toBe(cap.taps.length);
        // Every tap name of every call of the schedule was compared.
        const tapNames = dump.calls.reduce((n, c) => n + callTaps(dump.config, c).length, 0);
        expect(compared).toBe(tapNames);
        expect(dump.manifest.generated ?? []).toEqual(cap.meta.generated ?? []);
        const arrays = cap.taps.filter((t) => t.kind === "array").length;
        console.log(`[ts_dump] ${fixture} ${schedule.kind}: ${compared} taps equal (${arrays} tensors byte for byte, ${compared - arrays} mask kinds) over ${dump.calls.length} calls`);
      }, limit(60_000));
    }
  }
});

describe("engines/ts_port/dump.ts command line", () => {
  const cli = (args: string[]) => spawnSync(process.execPath, [join(REPO_ROOT, "engines", "ts_port", "dump.ts"), ...args], { encoding: "utf8", cwd: REPO_ROOT });

  it("writes a level-1 forward dump (exit 0) that validates", () => {
    const ckpt = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");
    const out = join(tmp, "cli-forward");
    const r = cli(["--checkpoint", ckpt, "--prompt", "2,5,9", "--forward", "--level", "1", "--out", out]);
    expect([r.status, r.stderr]).toEqual([0, ""]);
    const v = validateDump(out, ckpt);
    expect([v.level, v.tensors.names.length]).toEqual([1, 1 + 1 + 6 + 1]); // logits, embed_scaled, 6 layer outputs, norm
  }, limit(30_000));

  it("bad usage and a missing checkpoint exit 2 with one message", () => {
    const cases: [string[], RegExp][] = [
      [["--prompt", "2,x", "--forward", "--level", "1", "--out", join(tmp, "x"), "--checkpoint", tmp], /--prompt must be comma-separated token ids/],
      [["--prompt", "2,5", "--level", "3", "--forward", "--out", join(tmp, "x"), "--checkpoint", tmp], /--level must be 0, 1 or 2/],
      [["--prompt", "2,5", "--level", "1", "--max-tokens", "2", "--out", join(tmp, "x"), "--checkpoint", tmp], /--prefill-step-size is required/],
      [["--prompt", "2,5", "--level", "1", "--forward", "--out", join(tmp, "x"), "--checkpoint", join(tmp, "none")], /not a checkpoint folder/],
    ];
    let ran = 0;
    for (const [args, message] of cases) {
      const r = cli(args);
      expect(r.status).toBe(2);
      expect(r.stderr).toMatch(message);
      ran++;
    }
    expect(ran).toBe(cases.length);
  }, limit(30_000));
});
