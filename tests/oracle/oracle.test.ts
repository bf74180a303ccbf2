// The live oracle against itself and the goldens: capturing does not perturb mlx-lm, the TS tap
// expansion matches what is recorded, caches/masks behave as mlx-lm's, and a regenerated golden
// holds the live oracle's bits (and, where the goldens apply, the manifest's bytes).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { REPO_ROOT, type ScenarioSpec, sharedOracle } from "../../oracle/client.ts";
import { goldenRule, readIndex, readManifest, readNpzTaps, sha256 } from "../../oracle/golden.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { callPrefix, expandTaps, tapConfig } from "../../oracle/taps.ts";

const SLOW = 120_000;
const scenarios = (JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "scenarios.json"), "utf8")) as { scenarios: ScenarioSpec[] }).scenarios;
const dir = mkdtempSync(join(tmpdir(), "oracle-live-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const bytesEqual = (a: NpyRecord | undefined, b: NpyRecord | undefined) =>
  a !== undefined && b !== undefined && a.dtype === b.dtype && Buffer.compare(Buffer.from(a.data), Buffer.from(b.data)) === 0;

function f32(shape: number[], f: (i: number) => number): NpyRecord {
  const n = shape.reduce((a, b) => a * b, 1);
  return { dtype: "float32", shape, data: new Uint8Array(Float32Array.from({ length: n }, (_, i) => f(i)).buffer) };
}

describe("live oracle", () => {
  it("capturing taps does not change mlx-lm's numbers (generate and forward, bf16)", async () => {
    const o = await sharedOracle();
    const scn = scenarios.find((s) => s.id === "gen_P9_S5") as ScenarioSpec;
    const plain = await o.generate("c3_e2b/bf16", scn.prompt as number[], { prefillStepSize: 5, maxTokens: 20 });
    const cap = await o.capture("c3_e2b/bf16", "gen_P9_S5", { only: ["step*/logprobs", "step*/logits"] });
    expect(cap.meta.generated).toEqual(plain.tokens);
    expect(cap.meta.prefill_chunks).toEqual([5, 3]);
    plain.logprobs.forEach((lp, n) => {
      const t = cap.taps.find((x) => x.name === `step${n}/logprobs`);
      expect(t?.shape).toEqual([1, 256]);
      expect(bytesEqual(lp, t?.array && { ...t.array, dtype: lp.dtype })).toBe(true);
    });
    const fwdScn = scenarios.find((s) => s.id === "fwd_L13") as ScenarioSpec;
    const logits = await o.forward("c3_e2b/bf16", fwdScn.tokens as number[][]);
    const fwd = await o.capture("c3_e2b/bf16", "fwd_L13", { only: ["logits"] });
    expect(bytesEqual(logits, fwd.taps.find((t) => t.name === "logits")?.array)).toBe(true);
  }, SLOW);

  it("recorded tap names and order equal the TS expansion (MoE sorted+unsorted, shared KV, PLE, defaults)", async () => {
    const o = await sharedOracle();
    for (const [ck, sc] of [
      ["c6_sink/f32", "gen_P40_S36"],
      ["c7_defaults/f32", "gen_P9_S5"],
      ["c2_keqv/q8g64", "fwd_B2_L8"],
    ] as const) {
      const cap = await o.capture(ck, sc, { mode: "logits" });
      const cfg = tapConfig(JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "configs", `${ck.split("/")[0]}.json`), "utf8")));
      const want = cap.calls.flatMap((c) =>
        expandTaps(cfg, { batch: c.batch, length: c.length, cache: c.kind !== "forward", step: c.kind === "step" }).map(
          (n) => callPrefix(c.kind, c.index) + n,
        ),
      );
      expect({ ck, names: cap.taps.map((t) => t.name) }).toEqual({ ck, names: want });
    }
  }, SLOW);

  it("shared layers attend with their source layer's cache outputs; masks are None/causal/array as mlx-lm builds them", async () => {
    const o = await sharedOracle();
    const cap = await o.capture("c3_e2b/f32", "gen_P21_S8", { mode: "logits" }); // chunks 8, 8, 4
    const sdpa = (n: string) => cap.taps.find((t) => t.name === n)?.meta as Record<string, unknown>;
    // C3: layers 4..7 share; sliding source 2, full source 3
    expect(sdpa("prefill0/layers.5/self_attn/sdpa").k).toBe("layers.2/self_attn/cache_keys");
    expect(sdpa("prefill0/layers.7/self_attn/sdpa").v).toBe("layers.3/self_attn/cache_values");
    const mask = (n: string) => cap.taps.find((t) => t.name === n);
    expect(mask("prefill0/mask/sliding_attention")?.value).toBe("causal"); // 0 + 8 <= W
    expect(mask("prefill1/mask/sliding_attention")).toMatchObject({ kind: "array", shape: [8, 15] }); // min(W-1, 8) + 8 > W
    expect(mask("prefill1/mask/full_attention")?.value).toBe("causal");
    expect(mask("step0/mask/sliding_attention")?.kind).toBe("none"); // N == 1
    expect(cap.calls.map((c) => c.offset_before)).toEqual([0, 8, 16, ...Array.from({ length: 21 }, (_, n) => 20 + n)]);
  }, SLOW);

  it("cache_ops reproduce RotatingKVCache retention (W=8, feed 10,1,1,1,3) and KVCache growth", async () => {
    const o = await sharedOracle();
    const kv = (S: number, base: number) => f32([1, 1, S, 2], (i) => base + Math.floor(i / 2));
    let pos = 0;
    const ops = [{ op: "new" as const, type: "RotatingKVCache" as const, max_size: 8 }];
    const feeds = [10, 1, 1, 1, 3];
    const all = [...ops, ...feeds.map((S) => { const r = { op: "update_and_fetch" as const, keys: kv(S, pos), values: kv(S, pos) }; pos += S; return r; })];
    const res = await o.cacheOps(all);
    expect(res.slice(1).map((r) => r.keys?.shape[2])).toEqual([10, 8, 8, 8, 10]);
    expect(res.at(-1)?.meta).toMatchObject({ type: "RotatingKVCache", offset: 16, max_size: 8, idx: 10 });
    const last = new Float32Array((res.at(-1)?.keys as NpyRecord).data.slice().buffer);
    expect(Array.from(last.filter((_, i) => i % 2 === 0))).toEqual([6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
    const grow = await o.cacheOps([
      { op: "new", type: "KVCache" },
      { op: "update_and_fetch", keys: kv(300, 0), values: kv(300, 0) },
      { op: "update_and_fetch", keys: kv(1, 300), values: kv(1, 300) },
      { op: "make_mask", N: 3 },
      { op: "trim", n: 2 },
      { op: "is_trimmable" },
    ]);
    expect(grow[1]?.meta).toMatchObject({ offset: 300, keys_shape: [1, 1, 512, 2] });
    expect(grow[2]?.keys?.shape).toEqual([1, 1, 301, 2]);
    expect(grow[3]?.mask?.kind).toBe("causal");
    expect(grow[4]?.trimmed).toBe(2);
    expect(grow[5]?.value).toBe(true);
  }, SLOW);

  it("make_mask returns mlx-lm's windowed bool mask for a rotating cache", async () => {
    const o = await sharedOracle();
    expect((await o.makeMask({ N: 1 })).kind).toBe("none");
    expect((await o.makeMask({ N: 4, cache: { type: "KVCache", offset: 9 } })).kind).toBe("causal");
    const m = await o.makeMask({ N: 3, window_size: 8, cache: { type: "RotatingKVCache", max_size: 8, offset: 20 } });
    expect(m.kind).toBe("array");
    expect(m.array?.shape).toEqual([3, 10]); // o' = min(W-1, 20) = 7
    const rows = Array.from(m.array?.data ?? []);
    // query i (absolute 7+i) sees keys j with 7+i-8 < j <= 7+i
    const want = [0, 1, 2].flatMap((i) => Array.from({ length: 10 }, (_, j) => (j <= 7 + i && j > i - 1 ? 1 : 0)));
    expect(rows).toEqual(want);
  }, SLOW);

  // Asserted on every machine: the regenerated golden holds exactly what the live oracle computes
  // here (every stored tap, bit for bit, in order) and its index lists the manifest's taps; where
  // the goldens apply (oracle/golden.ts goldenRule: fingerprint and versions equal the
  // manifest's) the checkpoint and golden files are also the manifest's bytes.
  it("regenerating a checkpoint and one golden: the live oracle's bits, and the manifest's sha256 where the goldens apply", async () => {
    const m = readManifest();
    expect(m).toBeDefined();
    const man = m as NonNullable<typeof m>;
    const o = await sharedOracle();
    const rule = goldenRule(man, await o.fingerprint());
    const id = "c1_dense/q4g32";
    const r = await o.request<{ index: { checkpoints: Record<string, { files: Record<string, string> }> } }>("make_checkpoints", {
      only: [id],
      out: join(dir, "ck"),
      force: true,
    });
    const files = r.index.checkpoints[id]?.files;
    expect(Object.keys(files ?? {}).length).toBeGreaterThan(0);
    const entry = man.entries[`${id}/fwd_L5`];
    expect(entry?.mode).toBe("full");
    const g = await o.request<{ npz_sha256: string; index_sha256: string }>("golden", {
      checkpoint: id,
      items: [{ scenario: "fwd_L5", mode: "full" }],
      prefix: false,
      npz: join(dir, "g.npz"),
      index: join(dir, "g.json"),
    });
    expect(sha256(new Uint8Array(readFileSync(join(dir, "g.npz"))))).toBe(g.npz_sha256);
    const index = readIndex("g.json", dir);
    const stored = readNpzTaps(join(dir, "g.npz"), index);
    const live = await o.capture(id, "fwd_L5", { mode: "full" });
    const liveStored = live.taps.filter((t) => t.array);
    expect(index.taps.map((t) => t.name)).toEqual(live.taps.map((t) => t.name));
    expect([...stored.keys()]).toEqual(liveStored.map((t) => t.name));
    let same = 0;
    for (const t of liveStored) if (bytesEqual(stored.get(t.name), t.array)) same++;
    expect(same).toBe(entry?.stored);
    if (rule.mode === "exact") {
      expect(files).toEqual(man.checkpoints[id]?.files);
      expect(g.npz_sha256).toBe(man.files[entry?.npz as string]?.sha256);
      expect(g.index_sha256).toBe(man.files[entry?.index as string]?.sha256);
    } else {
      console.log(`[oracle regeneration] live oracle bits asserted; the manifest's sha256 not: ${rule.what}`);
    }
  }, SLOW);
});
