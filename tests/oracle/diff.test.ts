// The regen diff: identical trees say "no changes"; a 1-ULP change in one tensor is reported with
// its element count, largest |d| and ULP distance; removed entries and taps are listed.
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { GOLDEN_DIR, type Manifest, readManifest, readZipStored } from "../../oracle/golden.ts";
import { compareTensors, diffGoldens } from "../../oracle/golden_diff.ts";
import { globMatch, buildPlan, groupUnits } from "../../oracle/golden_regen.ts";

const root = mkdtempSync(join(tmpdir(), "oracle-diff-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const ENTRY = "c1_dense/f32/fwd_L13";

/** A one-entry golden tree copied from the real one. */
function tree(name: string): { dir: string; manifest: Manifest } {
  const m = readManifest() as Manifest;
  const e = m.entries[ENTRY];
  if (!e) throw new Error(`${ENTRY} missing from golden/manifest.json`);
  const dir = join(root, name);
  for (const f of [e.npz, e.index]) {
    mkdirSync(dirname(join(dir, f)), { recursive: true });
    copyFileSync(join(GOLDEN_DIR, f), join(dir, f));
  }
  const manifest: Manifest = {
    ...m,
    entries: { [ENTRY]: e },
    files: { [e.npz]: m.files[e.npz] as Manifest["files"][string], [e.index]: m.files[e.index] as Manifest["files"][string] },
  };
  return { dir, manifest };
}

describe("golden diff", () => {
  it("reports no changes for identical trees", () => {
    const a = tree("same-a");
    const b = tree("same-b");
    expect(diffGoldens(a.manifest, b.manifest, a.dir, b.dir)).toEqual(["no changes"]);
  });

  it("reports a 1-ULP change in one tensor with abs and ULP size", () => {
    const a = tree("ulp-a");
    const b = tree("ulp-b");
    const e = b.manifest.entries[ENTRY] as NonNullable<Manifest["entries"][string]>;
    const path = join(b.dir, e.npz);
    const buf = new Uint8Array(readFileSync(path));
    const npy = readZipStored(buf).get("layers.3/mlp/geglu.npy");
    expect(npy).toBeDefined();
    const at = (npy as Uint8Array).byteOffset + 128 + 4 * 17; // element 17 of the float32 data (128-byte npy header)
    const before = buf[at] as number;
    buf[at] = before ^ 1; // flip the lowest mantissa bit: exactly 1 ULP
    writeFileSync(path, buf);
    b.manifest.files[e.npz] = { sha256: "changed", bytes: buf.length };
    const report = diffGoldens(a.manifest, b.manifest, a.dir, b.dir).join("\n");
    expect(report).toContain(`~ ${e.npz}`);
    expect(report).toMatch(/~ layers\.3\/mlp\/geglu \(float32\): 1\/1664 elements, max \|d\| [0-9.e+-]+, max 1 ulp/);
    expect(report).not.toContain("layers.2/mlp/geglu");
  });

  it("lists removed entries, files and taps", () => {
    const a = tree("rm-a");
    const b: Manifest = { ...a.manifest, entries: {}, files: {} };
    const report = diffGoldens(a.manifest, b, a.dir, a.dir).join("\n");
    expect(report).toContain(`- entry ${ENTRY} (full)`);
    expect(report).toContain(`- file ${ENTRY}.npz`);
  });

  it("compares tensors exactly (ULP on bf16, shape changes flagged)", () => {
    const x = { dtype: "bfloat16" as const, shape: [2], data: new Uint8Array([0x80, 0x3f, 0x00, 0x40]) };
    const y = { dtype: "bfloat16" as const, shape: [2], data: new Uint8Array([0x82, 0x3f, 0x00, 0x40]) };
    expect(compareTensors("t", x, y)).toMatchObject({ changed: 1, total: 2, maxUlp: 2 });
    expect(compareTensors("t", x, { ...y, shape: [1, 2] }).note).toContain("shape/dtype");
  });

  it("plan globs: '*' spans '/', '!' negates; logits-only scenarios of a checkpoint share one file", () => {
    expect(globMatch("c1_dense/*", "c1_dense/f32/gen_P9_S5")).toBe(true);
    expect(globMatch("*/fwd_L13", "c5_moe/q4g32/fwd_L13")).toBe(true);
    expect(globMatch("!*/f32", "c5_moe/f32")).toBe(false);
    const items = buildPlan(
      { full: [{ checkpoints: ["a/f32"], scenarios: ["fwd_L13"] }], logits: [{ checkpoints: ["*"], scenarios: ["*"] }] },
      [
        { id: "a/f32", moe: false },
        { id: "m/f32", moe: true },
      ],
      [
        { id: "fwd_L13", applies_to: "all" },
        { id: "gen_X", applies_to: "all" },
        { id: "fwd_L40", applies_to: "moe" },
      ],
    );
    expect(items.map((p) => `${p.mode} ${p.id}`)).toEqual([
      "full a/f32/fwd_L13",
      "logits a/f32/gen_X",
      "logits m/f32/fwd_L13",
      "logits m/f32/gen_X",
      "logits m/f32/fwd_L40",
    ]);
    expect(groupUnits(items).map((u) => `${u.key}:${u.items.length}`)).toEqual(["a/f32/fwd_L13:1", "a/f32/logits:1", "m/f32/logits:3"]);
  });
});
