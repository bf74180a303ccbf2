// The floors of the project: a face (parity/, bench/) stands on the library folders (mlx/,
// model/, oracle/) and never on test code (suites/, tests/).
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { REPO_ROOT } from "../oracle/client.ts";

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return e.name === "node_modules" ? [] : sources(p);
    return /\.(ts|mts|js|mjs)$/.test(e.name) ? [p] : [];
  });
}

// import/export … from "x", import("x"), require("x")
const SPEC = /(?:\bfrom\s*|\bimport\s*\(\s*|\brequire\s*\(\s*|^\s*import\s+)["']([^"']+)["']/gm;

function testImports(file: string): string[] {
  const text = readFileSync(file, "utf8");
  const bad: string[] = [];
  for (const m of text.matchAll(SPEC)) {
    const spec = m[1]!;
    if (!spec.startsWith(".")) continue;
    const target = relative(REPO_ROOT, resolve(file, "..", spec));
    if (/^(suites|tests)\//.test(target)) bad.push(`${relative(REPO_ROOT, file)} imports ${target}`);
  }
  return bad;
}

describe("layout", () => {
  it("no face imports from suites/ or tests/", () => {
    const files = ["parity", "bench"].flatMap((d) => sources(join(REPO_ROOT, d)));
    expect(files.length).toBeGreaterThan(10);
    expect(files.flatMap(testImports)).toEqual([]);
  });

  it("the check sees a bad import", () => {
    // a real face file scans clean, and a synthetic face line with test imports is caught
    const probe = join(REPO_ROOT, "parity", "cli.ts");
    expect(testImports(probe)).toEqual([]);
    const text = `import { x } from "../suites/ops/cases.ts";\nconst y = await import("../tests/z.ts");`;
    const found = [...text.matchAll(SPEC)].map((m) => relative(REPO_ROOT, resolve(probe, "..", m[1]!)));
    expect(found).toEqual(["suites/ops/cases.ts", "tests/z.ts"]);
  });

  it("no tracked file names this checkout's own path", () => {
    const files = spawnSync("git", ["ls-files", "-z"], { cwd: REPO_ROOT, encoding: "utf8" }).stdout.split("\0").filter(Boolean);
    expect(files.length).toBeGreaterThan(100);
    const hits = files.filter((f) => {
      const p = join(REPO_ROOT, f);
      if (statSync(p, { throwIfNoEntry: false })?.isFile() !== true || statSync(p).size > 5_000_000) return false;
      return readFileSync(p, "latin1").includes(REPO_ROOT);
    });
    expect(hits).toEqual([]);
  });
});
