// engines/RESULTS.md, the checked-in results page: it opens with the summary table (engines ×
// fixtures c1-c6 × float32/bfloat16 × level × verdict) before any engine's section, and that
// table is the one engines/summary_md.ts renders from the checked-in results files (so no cell
// is typed by hand). Reads files only: no engine, no oracle.
import { describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import { RESULTS_MD } from "../../engines/llama_cpp/results_md.ts";
import { SUMMARY_END, SUMMARY_FIXTURES, SUMMARY_START, summaryFromFiles } from "../../engines/summary_md.ts";

const md = readFileSync(RESULTS_MD, "utf8");

describe("engines/RESULTS.md summary table", () => {
  it("comes before the first engine section and holds the table rendered from the results files", () => {
    const a = md.indexOf(SUMMARY_START);
    const b = md.indexOf(SUMMARY_END);
    expect(a).toBeGreaterThan(0);
    expect(b).toBeGreaterThan(a);
    expect(a).toBeLessThan(md.indexOf("## llama.cpp"));
    expect(md.slice(a, b + SUMMARY_END.length)).toBe(summaryFromFiles());
  });

  it("has one column per fixture c1-c6 and a float32 and a bfloat16 row for each engine that ran both", () => {
    const table = summaryFromFiles().split("\n").filter((l) => l.startsWith("| "));
    const header = table[0]!.split(" | ");
    expect(header.length).toBe(2 + SUMMARY_FIXTURES.length);
    expect(SUMMARY_FIXTURES.map((f) => f.id)).toEqual(["c1_dense", "c2_keqv", "c3_e2b", "c4_e4b", "c5_moe", "c6_sink"]);
    const rows = table.slice(1).map((l) => l.split(" | "));
    const engines = ["TS port", "transformers", "llama.cpp"];
    for (const e of engines) {
      const mine = rows.filter((r) => r[0]!.includes(e));
      expect(mine.some((r) => r[1]!.startsWith("float32")), e).toBe(true);
      expect(mine.some((r) => r[1]!.startsWith("bfloat16")), e).toBe(true);
    }
    // every cell names a level or why there is none
    let cells = 0;
    for (const r of rows) {
      for (const c of r.slice(2)) {
        expect(c, r[0]).toMatch(/^(L[012] |\*\*aborted\*\*|converter refused|load refused|no bf16 variant|not run|refused: )/);
        cells++;
      }
    }
    expect(cells).toBe(rows.length * SUMMARY_FIXTURES.length);
  });
});
