// Integrity of the committed goldens: every file hashed against the manifest, the index and the
// .npz agree, and the TS tap expansion reproduces the order the Python capture recorded; the
// manifest's rule for using them (bit for bit on the recording fingerprint, else live).
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../../oracle/client.ts";
import { CROSS_PLATFORM_NOTE, GOLDEN_DIR, goldenRule, loadGolden, type Manifest, readIndex, readManifest, readZipStored, sha256 } from "../../oracle/golden.ts";
import { callPrefix, expandMediaTaps, expandTaps, mediaTapConfig, mmCallShape, tapConfig } from "../../oracle/taps.ts";
import { mmFixtureConfig, mmScenario, scenarioMedia } from "../../oracle/mm_fixtures.ts";
import { DIGEST_FORM, tapDigest } from "../../oracle/tap_digest.ts";

const manifest = readManifest();

function walk(dir: string): string[] {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? walk(p) : [p];
  });
}

function fixtureConfig(checkpoint: string): Record<string, unknown> {
  const fixture = checkpoint.split("/")[0] as string;
  return JSON.parse(readFileSync(join(REPO_ROOT, "fixtures", "configs", `${fixture}.json`), "utf8")) as Record<string, unknown>;
}

describe("golden integrity", () => {
  it("has a manifest with versions, platform fingerprint and plan", () => {
    expect(manifest).toBeDefined();
    const m = manifest as NonNullable<typeof manifest>;
    expect(m.versions.mlx).toBe("0.32.4");
    expect(m.versions.mlx_lm).toBe("0.32.2");
    expect(m.versions.mlx_vlm).toBe("0.7.10");
    // what decides the bits (oracle/python/server.py fingerprint), and nothing that does not
    expect(Object.keys(m.fingerprint).sort()).toEqual(["compile_enabled", "compiler", "device", "gpu", "libc", "machine", "metal", "mlx_backend", "os"]);
    // no cross-platform budget (it could not fail); goldens apply bit for bit or not at all
    expect(m.cross_platform).toEqual({ note: CROSS_PLATFORM_NOTE });
    expect(m.full_dumps.length).toBeGreaterThan(0);
    expect(m.logits_only.length).toBeGreaterThan(0);
    expect(Object.keys(m.entries).sort()).toEqual([...m.full_dumps, ...m.logits_only].sort());
  });

  it("every golden file matches its sha256 and size, and nothing is unlisted", () => {
    const m = manifest as NonNullable<typeof manifest>;
    const onDisk = walk(GOLDEN_DIR)
      .map((p) => relative(GOLDEN_DIR, p))
      .filter((p) => p !== "manifest.json")
      .sort();
    expect(onDisk).toEqual(Object.keys(m.files).sort());
    for (const [rel, f] of Object.entries(m.files)) {
      const buf = new Uint8Array(readFileSync(join(GOLDEN_DIR, rel)));
      expect({ rel, bytes: buf.length, sha256: sha256(buf) }).toEqual({ rel, bytes: f.bytes, sha256: f.sha256 });
    }
  });

  it("stays within the 40 MB budget and records its own total", () => {
    const m = manifest as NonNullable<typeof manifest>;
    const total = walk(GOLDEN_DIR).reduce((a, p) => a + statSync(p).size, 0);
    expect(total).toBe(m.total_bytes);
    expect(total).toBeLessThanOrEqual(40 * 1000 * 1000);
  });

  it("was made with the current tap scheme (oracle/taps.json)", () => {
    const m = manifest as NonNullable<typeof manifest>;
    expect(sha256(new Uint8Array(readFileSync(join(REPO_ROOT, "oracle", "taps.json"))))).toBe(m.taps_json_sha256);
  });

  it("each entry's npz holds exactly its stored taps, named as in its index", () => {
    const m = manifest as NonNullable<typeof manifest>;
    const zips = new Map<string, Set<string>>();
    for (const [id, e] of Object.entries(m.entries)) {
      let names = zips.get(e.npz);
      if (!names) {
        names = new Set([...readZipStored(new Uint8Array(readFileSync(join(GOLDEN_DIR, e.npz)))).keys()].map((n) => n.replace(/\.npy$/, "")));
        zips.set(e.npz, names);
      }
      const mine = [...names].filter((n) => n.startsWith(e.prefix));
      if (!e.same_as) expect({ id, stored: mine.length }).toEqual({ id, stored: e.stored });
      expect(mine.length).toBeGreaterThan(0);
      const index = readIndex(e.index);
      const sc = index.scenarios.find((s) => s.scenario === e.scenario);
      expect(sc?.mode).toBe(e.mode);
      const indexed = new Set(index.taps.filter((t) => t.name.startsWith(e.prefix) && t.stored !== false).map((t) => t.name));
      for (const n of mine) expect(indexed.has(n)).toBe(true);
    }
  });

  it("the TS tap expansion reproduces the recorded tap order of every full dump", () => {
    const m = manifest as NonNullable<typeof manifest>;
    let checked = 0;
    for (const id of m.full_dumps) {
      const e = m.entries[id];
      if (!e) throw new Error(`full dump ${id} has no entry`);
      const index = readIndex(e.index);
      const sc = index.scenarios[0];
      const mm = e.scenario.startsWith("mm_");
      const cfgJson = mm ? mmFixtureConfig(e.checkpoint.split("/")[0]!) : fixtureConfig(e.checkpoint);
      const cfg = tapConfig(cfgJson);
      const want = (sc?.calls ?? []).flatMap((c) => {
        const call = c as { kind: "embed" | "forward" | "prefill" | "step"; index: number; batch: number; length: number };
        if (call.kind === "embed") return expandMediaTaps(mediaTapConfig(cfgJson), scenarioMedia(mmScenario(e.scenario))).map((n) => `embed/${n}`);
        const pre = callPrefix(call.kind, call.index);
        const shape = mm ? mmCallShape(cfg, { ...call, kind: call.kind }) : { batch: call.batch, length: call.length, cache: call.kind !== "forward", step: call.kind === "step" };
        return expandTaps(cfg, shape).map((n) => pre + n);
      });
      expect({ id, taps: index.taps.map((t) => t.name) }).toEqual({ id, taps: want });
      checked += want.length;
    }
    expect(checked).toBeGreaterThan(1000);
  });

  it("every logits-only multimodal entry holds a digest of each recorded tap, and its stored taps' bytes give those digests", () => {
    const m = manifest as NonNullable<typeof manifest>;
    let entries = 0;
    let storedChecked = 0;
    for (const [id, e] of Object.entries(m.entries)) {
      if (e.mode !== "logits" || !e.scenario.startsWith("mm_")) continue;
      const g = loadGolden(id);
      const d = g.digests;
      expect({ id, form: d?.form }).toEqual({ id, form: DIGEST_FORM });
      // one digest per recorded tap, call by call
      expect({ id, taps: d!.calls.reduce((a, c) => a + c.taps, 0) }).toEqual({ id, taps: e.taps });
      for (const c of d!.calls) expect({ id, call: c.call, chars: c.short.length, sha: /^[0-9a-f]{64}$/.test(c.sha256) }).toEqual({ id, call: c.call, chars: c.taps * 8, sha: true });
      // the TS digest of each stored tap (its golden bytes) is one of its call's digests
      for (const t of g.taps) {
        const rec = g.arrays.get(t.name);
        const call = d!.calls.filter((c) => t.name.startsWith(c.call)).sort((a, b) => b.call.length - a.call.length)[0];
        const short = tapDigest({ name: t.name, kind: "array", dtype: rec?.dtype, shape: rec?.shape, data: rec?.data }).subarray(0, 6).toString("base64");
        const shorts: string[] = call ? (call.short.match(/.{8}/g) ?? []) : [];
        expect({ id, tap: t.name, found: shorts.includes(short) }).toEqual({ id, tap: t.name, found: true });
        storedChecked++;
      }
      entries++;
    }
    expect({ entries, storedChecked }).toEqual({ entries: 41, storedChecked: 268 });
  });

  it("loads an entry as records, bf16 re-tagged from the index", () => {
    const m = manifest as NonNullable<typeof manifest>;
    const bf = Object.keys(m.entries).find((id) => id.startsWith("c3_e2b/bf16/") && m.entries[id]?.mode === "full");
    expect(bf).toBeDefined();
    const g = loadGolden(bf as string);
    const logits = g.arrays.get("logits") ?? g.arrays.get("step0/logits");
    expect(logits?.dtype).toBe("bfloat16");
    expect(g.arrays.get("layers.0/self_attn/offset")?.dtype ?? g.arrays.get("prefill0/layers.0/self_attn/offset")?.dtype).toBe("int32");
    const lo = Object.entries(m.entries).find(([, e]) => e.mode === "logits" && e.checkpoint === "c1_dense/f32" && e.scenario.startsWith("gen_"));
    const gl = loadGolden(lo?.[0] as string);
    expect(gl.arrays.get("step0/logits")?.shape).toEqual([1, 1, 256]);
    expect(gl.scenario.meta.generated).toHaveLength(20);
  });
});

describe("the goldens' cross-platform rule (goldenRule)", () => {
  const versions = { mlx: "0.32.4", mlx_lm: "0.32.2" };
  const cpu = { os: "Linux", libc: "glibc-2.36", machine: "x86_64", mlx_backend: "cpu", device: "cpu", compiler: "g++ 12.2.0" };
  const cuda = { ...cpu, mlx_backend: "cuda", device: "gpu" };
  const m = { versions, fingerprint: cpu, cross_platform: { note: CROSS_PLATFORM_NOTE } } as unknown as Manifest;

  it("is bit-exact on the recording fingerprint and versions", () => {
    expect(goldenRule(m, { versions: { ...versions }, fingerprint: { ...cpu } })).toEqual({ mode: "exact" });
  });
  it("goes live (no budget) on another backend, naming what differs", () => {
    const r = goldenRule(m, { versions, fingerprint: cuda });
    expect(r).toMatchObject({ mode: "live", differs: ['fingerprint.device "cpu" here "gpu"', 'fingerprint.mlx_backend "cpu" here "cuda"'] });
    expect(r.mode === "live" && r.what).toMatch(/^goldens not compared: recorded on another platform \(.*\); compared against the live oracle on this machine instead, bit for bit$/);
  });
  it("goes live on another machine of the same backend (another JIT compiler, libc) and with other versions: no unmeasured budget", () => {
    expect(goldenRule(m, { versions, fingerprint: { ...cpu, compiler: "g++ 13.1.0" } })).toMatchObject({ mode: "live", differs: ['fingerprint.compiler "g++ 12.2.0" here "g++ 13.1.0"'] });
    expect(goldenRule(m, { versions, fingerprint: { ...cpu, libc: "glibc-2.39" } })).toMatchObject({ mode: "live" });
    expect(goldenRule(m, { versions: { ...versions, mlx_lm: "0.33.0" }, fingerprint: cpu })).toMatchObject({ mode: "live", differs: ['versions.mlx_lm "0.32.2" here "0.33.0"'] });
    // a key only one side has differs too (a package installed on one side only)
    expect(goldenRule(m, { versions: { ...versions, mlx_vlm: "0.7.10" }, fingerprint: cpu })).toMatchObject({ mode: "live", differs: ['versions.mlx_vlm null here "0.7.10"'] });
  });
});
