// Integrity of the committed goldens: every file hashed against the manifest, the index and the
// .npz agree, and the TS tap expansion reproduces the order the Python capture recorded.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../../oracle/client.ts";
import { type BackendMeasurement, GOLDEN_DIR, goldenFilesDigest, goldenRule, loadGolden, type Manifest, readIndex, readManifest, readZipStored, sha256 } from "../../oracle/golden.ts";
import { callPrefix, expandMediaTaps, expandTaps, mediaTapConfig, mmCallShape, tapConfig } from "../../oracle/taps.ts";
import { mmFixtureConfig, mmScenario, scenarioMedia } from "../../oracle/mm_fixtures.ts";

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
    for (const k of ["os", "cpu_model", "backend", "mlx_backend", "device", "compiler", "machine"]) expect(m.fingerprint).toHaveProperty(k);
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
  const versions = { mlx: "0.32.4" };
  const cpu = { os: "Linux", mlx_backend: "cpu", device: "cpu" };
  const cuda = { os: "Linux", mlx_backend: "cuda", device: "gpu" };
  const meas = { measured: "2026-12-01T10:00:00Z", backend: "cuda", device: "gpu", versions, golden_files: "x", per_dtype: { float32: { taps: 9, taps_differing: 3, max_ulp: 12, max_abs: 1e-6 }, int32: { taps: 2, taps_differing: 0, max_ulp: -1, max_abs: 0 } } } as unknown as BackendMeasurement;
  const m = (backends?: Record<string, BackendMeasurement>) => ({ versions, fingerprint: cpu, cross_platform: { ulp_budget: { float32: 64 }, note: "", ...(backends ? { backends } : {}) } }) as unknown as Manifest;

  it("is bit-exact on the recording fingerprint", () => {
    expect(goldenRule(m(), { versions, fingerprint: { ...cpu } })).toEqual({ mode: "exact" });
  });
  it("uses a backend's measured maximum there, and says so", () => {
    const r = goldenRule(m({ cuda: meas }), { versions, fingerprint: cuda });
    expect(r).toMatchObject({ mode: "budget", measured: true, budget: { float32: 12, int32: 0 } });
    expect(r.mode === "budget" && r.what).toMatch(/recorded on cpu compared within the cuda distance measured 2026-12-01/);
  });
  it("takes an integer dtype's measured max |d| as its budget (no ULP there), and no non-finite one", () => {
    const withInts = { ...meas, per_dtype: { ...meas.per_dtype, uint32: { taps: 4, taps_differing: 2, max_ulp: 0, max_abs: 191 }, bfloat16: { taps: 3, taps_differing: 3, max_ulp: 900, max_abs: null } } } as unknown as BackendMeasurement;
    const r = goldenRule(m({ cuda: withInts }), { versions, fingerprint: cuda });
    expect(r).toMatchObject({ mode: "budget", budget: { float32: 12, int32: 0, uint32: 191, bfloat16: 900 } });
  });
  it("does not compare on another backend without a measurement there, and says so", () => {
    const r = goldenRule(m({ cuda: meas }), { versions, fingerprint: { ...cpu, os: "Darwin", mlx_backend: "metal" } });
    expect(r).toMatchObject({ mode: "none" });
    expect(r.mode === "none" && r.what).toMatch(/not compared on metal: the manifest has no distance measured there/);
    // a measurement made with other versions does not count
    expect(goldenRule(m({ cuda: meas }), { versions: { mlx: "0.33.0" }, fingerprint: cuda })).toMatchObject({ mode: "none" });
  });
  it("uses the unmeasured starting budget on another machine of the recording backend, and says so", () => {
    const r = goldenRule(m({ cuda: meas }), { versions, fingerprint: { ...cpu, os: "Linux-other" } });
    expect(r).toMatchObject({ mode: "budget", measured: false, budget: { float32: 64 } });
    expect(r.mode === "budget" && r.what).toMatch(/unmeasured starting budget/);
  });
  it("identifies a golden set by its files", () => {
    const files = { "b.npz": { sha256: "2", bytes: 1 }, "a.npz": { sha256: "1", bytes: 1 } };
    expect(goldenFilesDigest(files)).toBe(sha256(new TextEncoder().encode("a.npz:1\nb.npz:2\n")));
  });
});
