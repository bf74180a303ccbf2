// `npm run conform` (parity/conform_cli.ts) on the c1_dense bfloat16 fixture against mlx-lm's
// live capture: one forward of 6 tokens at level 2, and a generate_step schedule (6 prompt tokens
// in chunks of 4, 2 decode steps) at level 0:
//   - the TS port's dump (engines/ts_port/dump.ts) conforms, bit-exact (exit 0);
//   - the same dump with every float tensor converted to float32 (the same values, another dtype:
//     no bit comparison is possible) conforms on its values (exit 0);
//   - that copy under --strict diverges at its first float tensor (exit 1), --json prints the report;
//   - planted defects in that float32 copy, found by the METRIC verdict alone (the oracle's taps
//     are bfloat16, the dump's float32, so no byte comparison exists): layer 3's output scaled by
//     1.01 is reported first outside the floor at layer 3; layer 1's rope_q with the two halves of
//     its head axis swapped at layer 1; the run exits 1 (DIVERGES against a measured floor,
//     "floor not measured" against the placeholder);
//   - a dump whose step-1 logits prefer another token (and whose tokens follow them) is named at
//     step1/logits, the first differing greedy step is 1, and the calls after it are not compared;
//   - the streamed capture with `only` writes just the named taps;
//   - bad input exits 2 in a real process: a dump of another checkpoint, a missing --checkpoint;
//     an oracle that cannot start exits 3 (no verdict).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { readDump, writeDump } from "../../oracle/conform/dump.ts";
import { isFloatDtype, rawFromFloat64, type RawTensor, toFloat64 } from "../../oracle/conform/metrics.ts";
import { loadNoiseFloor } from "../../oracle/conform/verdict.ts";
import { tsDump } from "../../engines/ts_port/dump.ts";
import { main } from "../../parity/conform_cli.ts";
import type { ConformReport } from "../../parity/conform_report.ts";
import { limit } from "../../tests/time_limit.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "bf16");
const OTHER = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");
const tmp = mkdtempSync(join(tmpdir(), "conform-cli-"));
const exact = join(tmp, "ts_bf16");
const asF32 = join(tmp, "ts_f32");
const gen0 = join(tmp, "ts_gen_l0");

/** A copy of a dump with every float tensor in float32 (`edit` may change a tensor's float64 values first). */
function copyAsFloat32(src: string, dst: string, edit: (name: string, v: Float64Array, t: RawTensor) => Float64Array = (_n, v) => v): void {
  const d = readDump(src);
  const tensors = new Map<string, RawTensor>();
  for (const name of d.manifest.tensors) {
    const t = d.tensors.read(name);
    tensors.set(name, isFloatDtype(t.dtype) ? rawFromFloat64(edit(name, toFloat64(t), t), t.shape, "float32") : t);
  }
  const { files: _f, tensors: _t, ...rest } = d.manifest;
  writeDump(dst, { ...rest, engine: { ...rest.engine, dtype: "float32" } }, tensors);
}

async function run(dump: string, out: string): Promise<{ code: number; rep: ConformReport }> {
  const oracle = await sharedOracle();
  const code = await main(["--dump", dump, "--checkpoint", CKPT, "--out", out], { oracle, write: () => {} });
  return { code, rep: JSON.parse(readFileSync(join(out, "conform.json"), "utf8")) };
}

beforeAll(async () => {
  await tsDump({ checkpoint: CKPT, prompt: [2, 5, 9, 4, 7, 11], schedule: { kind: "forward" }, level: 2, out: exact });
  await tsDump({ checkpoint: CKPT, prompt: [2, 5, 9, 4, 7, 11], schedule: { kind: "generate", prefill_step_size: 4, max_tokens: 2 }, level: 0, out: gen0 });
  copyAsFloat32(exact, asF32);
}, limit(60_000));

afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe("npm run conform", () => {
  it("the TS port's bf16 dump conforms bit-exact (exit 0)", async () => {
    const { code, rep } = await run(exact, join(tmp, "r0"));
    expect(rep.verdict.headline).toBe("CONFORMS (every tensor bit-exact)");
    expect(code).toBe(0);
    expect(rep.compared).toBeGreaterThan(100);
    expect(rep.bitExact).toBe(rep.compared);
    expect(rep.logits!.top1).toBe(1);
  }, limit(60_000));

  it("its float32 copy conforms on its values, with no byte comparison possible (exit 0)", async () => {
    const { code, rep } = await run(asF32, join(tmp, "r1"));
    expect(rep.verdict.status).toBe("CONFORMS");
    expect(code).toBe(0);
    expect(rep.exact).toBe(rep.compared);
    expect(rep.kinds.every((k) => k.outside === 0 && (k.maxRelL2 ?? 0) === 0)).toBe(true);
    const floats = rep.tensors.filter((t) => t.engineDtype === "float32");
    expect(floats.length).toBeGreaterThan(100);
    for (const t of floats) expect(t.mismatches, t.name).toBeNull();
    expect(floats.every((t) => t.metrics?.relL2 === 0)).toBe(true);
  }, limit(60_000));

  it("--strict wants mlx-lm's bytes: the float32 copy diverges (exit 1); --json prints the report", async () => {
    const oracle = await sharedOracle();
    let printed = "";
    const code = await main(["--dump", asF32, "--checkpoint", CKPT, "--out", join(tmp, "rs"), "--strict", "--json"], { oracle, write: (s) => void (printed += s) });
    expect(code).toBe(1);
    const rep = JSON.parse(printed) as ConformReport;
    expect(rep.verdict.status).toBe("DIVERGES");
    expect(rep.verdict.strict).toBe(true);
    expect(rep.verdict.headline).toMatch(/^DIVERGES at embed_tokens: not bit-exact \(--strict\)$/);
    expect(rep).toEqual(JSON.parse(readFileSync(join(tmp, "rs", "conform.json"), "utf8")));
  }, limit(60_000));

  const floor = loadNoiseFloor();
  const planted = [
    { what: "layer 3's output scaled by 1.01", layer: 3, tensor: "layers.3/output", edit: (v: Float64Array) => v.map((x) => x * 1.01) },
    {
      what: "layer 1's rope_q with its head axis halves swapped",
      layer: 1,
      tensor: "layers.1/self_attn/rope_q",
      edit: (v: Float64Array, t: RawTensor) => {
        const D = t.shape[t.shape.length - 1]!;
        return v.map((_x, i) => v[i - (i % D) + (((i % D) + D / 2) % D)]!);
      },
    },
  ];
  for (const p of planted) {
    it(`a planted defect, ${p.what}, is named at layer ${p.layer} by the metric verdict (exit 1)`, async () => {
      const dir = join(tmp, `planted-${p.layer}`);
      let edited = 0;
      copyAsFloat32(exact, dir, (name, v, t) => (name === p.tensor ? (edited++, p.edit(v, t)) : v));
      expect(edited).toBe(1);
      const { code, rep } = await run(dir, join(tmp, `rp-${p.layer}`));
      expect(code).toBe(1);
      expect(rep.verdict.status).toBe(floor.status === "measured" ? "DIVERGES" : "FLOOR_NOT_MEASURED");
      expect(rep.verdict.firstOutside).toBe(p.tensor);
      expect(rep.verdict.firstLayerOutside).toBe(p.layer);
      const hit = rep.tensors.find((t) => t.name === p.tensor)!;
      // no byte comparison was made (float32 against mlx-lm's bfloat16): the metrics caught it
      expect(hit.mismatches).toBeNull();
      expect(hit.within).toBe(false);
      expect(hit.metrics!.relL2).toBeGreaterThan(hit.floorRelL2);
      // the per-kind summary counts the one tensor outside under its kind
      expect(rep.kinds.filter((k) => k.outside > 0).map((k) => [k.kind, k.outside])).toEqual([[p.tensor.replace(/^layers\.\d+\//, ""), 1]]);
      // every layer before it stays within the floor
      for (const l of rep.layers) if (l.layer !== null && l.layer < p.layer) expect(l.within, `layer ${l.layer}`).toBe(true);
    }, limit(60_000));
  }

  it("a greedy token that differs at step 1: named there, later calls not compared (exit 1)", async () => {
    const src = readDump(gen0);
    const gen = [...src.manifest.generated!];
    const tensors = new Map<string, RawTensor>();
    for (const name of src.manifest.tensors) {
      let t = src.tensors.read(name);
      if (name === "step1/logits") {
        // the runner-up takes the lead by 1 logit
        const v = toFloat64(t);
        const order = Array.from(v.keys()).sort((i, j) => v[j]! - v[i]!);
        v[order[1]!] = v[order[0]!]! + 1;
        gen[1] = order[1]!;
        t = rawFromFloat64(v, t.shape, "float32");
      } else if (name === "step1/token") {
        const data = new Uint8Array(t.data);
        new DataView(data.buffer).setUint32(0, gen[1]!, true);
        t = { ...t, data };
      }
      tensors.set(name, t);
    }
    const { files: _f, tensors: _t, ...rest } = src.manifest;
    const dir = join(tmp, "tokdiff");
    writeDump(dir, { ...rest, generated: gen }, tensors);
    const { code, rep } = await run(dir, join(tmp, "rt"));
    expect(code).toBe(1);
    expect(rep.verdict.firstTokenDiff).toBe(1);
    expect(rep.verdict.firstOutside).toBe("step1/logits");
    expect(rep.tokens!.engine[1]).not.toBe(rep.tokens!.oracle[1]);
    const later = src.manifest.tensors.filter((n) => n.startsWith("step2/")).length + Object.keys(src.manifest.mask_kinds ?? {}).filter((n) => n.startsWith("step2/")).length;
    expect(later).toBeGreaterThan(0);
    expect(rep.notCompared.length).toBe(later);
    expect(rep.tensors.some((t) => t.call === "step2")).toBe(false);
    expect(rep.logits!.top1).toBeLessThan(1);
  }, limit(60_000));

  it("the streamed capture it asks for writes only the taps named in `only`", async () => {
    const oracle = await sharedOracle();
    const want = ["logits", "layers.2/output", "mask/full_attention"];
    const cap = await oracle.request<{ taps: { name: string; npy?: string }[] }>("capture", { checkpoint: CKPT, scenario: { id: "conform-only", kind: "forward", tokens: [[2, 5, 9, 4, 7, 11]] }, mode: "full", only: want, stream: true });
    expect(cap.taps.length).toBeGreaterThan(100); // every name is still listed
    const written = cap.taps.filter((t) => t.npy);
    for (const t of written) rmSync(t.npy!, { force: true });
    // the full-attention mask of a 6-token forward is mlx-lm's "causal" kind: no array to write
    expect(written.map((t) => t.name).sort()).toEqual(["layers.2/output", "logits"]);
  }, limit(30_000));

  it("bad input exits 2 with one line naming the problem; a failed oracle 3", () => {
    const cli = (args: string[]) => spawnSync(process.execPath, [join(REPO_ROOT, "parity", "conform_cli.ts"), ...args], { encoding: "utf8", cwd: REPO_ROOT });
    const other = cli(["--dump", exact, "--checkpoint", OTHER, "--out", join(tmp, "r2")]);
    expect(other.status).toBe(2);
    expect(other.stderr).toMatch(/^error: manifest\.json: checkpoint\.files\["(config\.json|model\.safetensors)"\].*a dump of another checkpoint\n$/);
    const noCkpt = cli(["--dump", exact]);
    expect(noCkpt.status).toBe(2);
    expect(noCkpt.stderr).toMatch(/--checkpoint <dir> is required/);
    // an oracle that cannot start is no verdict: exit 3, as npm run parity
    const noOracle = spawnSync(process.execPath, [join(REPO_ROOT, "parity", "conform_cli.ts"), "--dump", exact, "--checkpoint", CKPT, "--out", join(tmp, "r3")], { encoding: "utf8", cwd: REPO_ROOT, env: { ...process.env, ORACLE_PYTHON: join(tmp, "no-venv", "bin", "python") } });
    expect(noOracle.status).toBe(3);
    expect(noOracle.stderr).toMatch(/^error: the oracle failed, no verdict \(exit 3\): python interpreter not found/);
  }, limit(30_000));
});
