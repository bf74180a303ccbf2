// The floors of the project: mlx/ (binding) < model/ < oracle/ < the faces (parity/, bench/,
// engines/, serve/). A library folder never imports a face, a face never imports test code (suites/,
// tests/), and no module imports itself back through others (no import cycle).
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
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

/** The repository paths a file imports (relative specifiers only). */
function importsOf(file: string): string[] {
  const text = readFileSync(file, "utf8");
  return [...text.matchAll(SPEC)].map((m) => m[1]!).filter((s) => s.startsWith(".")).map((s) => relative(REPO_ROOT, resolve(file, "..", s)));
}

/** Of a library file's imports (`from`: mlx/, model/, oracle/), those that reach a face folder (no exception: reference:export's face moved to parity/, issue 25). */
function upward(from: string, targets: readonly string[]): string[] {
  return targets.filter((t) => /^(parity|bench|engines|serve)\//.test(t)).map((t) => `${from} imports ${t}`);
}
const upwardImports = (file: string): string[] => upward(relative(REPO_ROOT, file), importsOf(file));

/** Every import cycle among `files` (Tarjan's strongly connected components of more than one file, or a file importing itself). */
function importCycles(files: string[]): string[][] {
  const graph = new Map(files.map((f) => [relative(REPO_ROOT, f), importsOf(f)]));
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const cycles: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const comp: string[] = [];
      for (let w = stack.pop()!; ; w = stack.pop()!) {
        onStack.delete(w);
        comp.push(w);
        if (w === v) break;
      }
      if (comp.length > 1 || (graph.get(v) ?? []).includes(v)) cycles.push(comp.sort());
    }
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return cycles;
}

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
    const files = ["parity", "bench", "serve"].flatMap((d) => sources(join(REPO_ROOT, d)));
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

  it("no file in mlx/, model/ or oracle/ imports parity/, bench/, engines/ or serve/", () => {
    const files = ["mlx", "model", "oracle"].flatMap((d) => sources(join(REPO_ROOT, d)));
    expect(files.length).toBeGreaterThan(50);
    expect(files.flatMap(upwardImports)).toEqual([]);
  });

  it("no file in engines/ imports parity/, suites/ or tests/ (parity/ may run an engine adapter, not the other way round)", () => {
    const files = sources(join(REPO_ROOT, "engines"));
    expect(files.length).toBeGreaterThan(10);
    const bad = files.flatMap((f) => importsOf(f).filter((t) => /^(parity|suites|tests)\//.test(t)).map((t) => `${relative(REPO_ROOT, f)} imports ${t}`));
    expect(bad).toEqual([]);
  });

  it("the floor check sees an upward import", () => {
    const probe = join(REPO_ROOT, "model", "gemma4", "probe.ts");
    const text = `import { x } from "../../parity/args.ts";\nimport { y } from "../../engines/z.ts";\nimport { z } from "../../oracle/client.ts";`;
    const targets = [...text.matchAll(SPEC)].map((m) => relative(REPO_ROOT, resolve(probe, "..", m[1]!)));
    expect(upward("model/gemma4/probe.ts", targets)).toEqual(["model/gemma4/probe.ts imports parity/args.ts", "model/gemma4/probe.ts imports engines/z.ts"]);
    // the file that once held reference:export's face is held to the rule like any other
    expect(upward("oracle/reference_export.ts", ["parity/args.ts", "oracle/client.ts"])).toEqual(["oracle/reference_export.ts imports parity/args.ts"]);
  });

  it("no import cycle in mlx/, model/, oracle/, parity/ or bench/ (model/gemma4/mutations.ts and model/tuner/mutations.ts once imported each other)", () => {
    const files = ["mlx", "model", "oracle", "parity", "bench", "serve"].flatMap((d) => sources(join(REPO_ROOT, d)));
    expect(importCycles(files)).toEqual([]);
  });

  it("the cycle check sees a cycle", () => {
    const dir = mkdtempSync(join(tmpdir(), "layout-"));
    try {
      writeFileSync(join(dir, "a.ts"), `import { b } from "./b.ts";\n`);
      writeFileSync(join(dir, "b.ts"), `import { c } from "./c.ts";\n`);
      writeFileSync(join(dir, "c.ts"), `export { a } from "./a.ts";\n`);
      writeFileSync(join(dir, "d.ts"), `import { a } from "./a.ts";\n`);
      expect(importCycles(["a", "b", "c", "d"].map((n) => join(dir, `${n}.ts`))).map((c) => c.map((f) => f.split("/").pop()))).toEqual([["a.ts", "b.ts", "c.ts"]]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
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
