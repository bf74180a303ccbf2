// A package the oracle does not have (Python reports its version as null: mlx-vlm and mlx-audio on a
// machine staged for text only, as the H200 was) reaches every report as "not installed". Before
// this, the null crashed the HTML report after the verdict on the H200 (exit 1 where the verdict
// said PASS with known MLX bugs).
import { describe, expect, it } from "vitest";
import { installedVersions } from "../../oracle/client.ts";
import { renderHtml } from "../../parity/html.ts";
import { renderMarkdown } from "../../parity/markdown.ts";
import { type ParityReport, reportVerdict, SCHEMA_ID } from "../../parity/schema.ts";

describe("oracle versions in reports", () => {
  it("a null version is written 'not installed', and the HTML and Markdown reports render it", () => {
    const versions = installedVersions({ mlx: "0.32.4", mlx_vlm: null, mlx_audio: undefined, numpy: "2.4.6" });
    expect(versions).toEqual({ mlx: "0.32.4", mlx_vlm: "not installed", mlx_audio: "not installed", numpy: "2.4.6" });
    const rep: ParityReport = { schema: SCHEMA_ID, createdAt: "2026-12-02T00:00:00Z", versions, budget: { ulp: 0, atol: 0 }, opLevel: null, runs: [], reference: null, verdict: reportVerdict([], null, null, false), ok: true };
    expect(renderHtml(rep)).toContain("<b>mlx_vlm</b> not installed");
    expect(renderMarkdown(rep)).toContain("not installed");
  });
});
