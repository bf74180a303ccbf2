// Is transformers' bfloat16 distance from mlx-lm's bfloat16 rounding, or a difference in the
// computation? (issue 24: every divergence beyond the floor is explained.) The float32 floor
// cannot judge two bfloat16 runs: each rounds every op to 8 bits of mantissa (2^-9 relative). So
// for each bfloat16 grid case it measures, on the level-1 taps (scaled embeddings, every layer's
// output, the final norm, the logits), three relative L2 distances:
//   hf_vs_mlx   = ‖hf_bf16 − mlx_bf16‖ / ‖mlx_bf16‖   (what the conformance verdict sees)
//   hf_vs_x64   = ‖hf_bf16 − x64‖ / ‖x64‖            (x64: transformers in float64 on the same weights)
//   mlx_vs_x64  = ‖mlx_bf16 − x64‖ / ‖x64‖
// Two bfloat16 implementations that both compute the same function differ by about their own
// rounding: hf_vs_mlx ≤ hf_vs_x64 + mlx_vs_x64 with both terms of the same size. A semantic
// difference would put one side far from x64. Writes engines/transformers/bf16_rounding.json.
//
//   CONFORM_ENGINES=1 bun engines/transformers/bf16_rounding.ts
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadConfig } from "../../model/gemma4/index.ts";
import { OracleClient, REPO_ROOT } from "../../oracle/client.ts";
import { rawOf, rawOfNpy } from "../../oracle/compare.ts";
import { toFloat64 } from "../../oracle/conform/metrics.ts";
import { residualTaps } from "../../oracle/conform/dump.ts";
import { tokensFor } from "../../oracle/reference_export.ts";
import { runTransformers } from "./dump.ts";
import { gridCases } from "./grid.ts";

function rel(a: Float64Array, b: Float64Array): number {
  let d = 0;
  let n = 0;
  for (let i = 0; i < a.length; i++) {
    d += (a[i]! - b[i]!) ** 2;
    n += b[i]! ** 2;
  }
  return n > 0 ? Math.sqrt(d / n) : d > 0 ? Infinity : 0;
}

async function main(): Promise<number> {
  if (process.env.CONFORM_ENGINES !== "1") {
    process.stderr.write("runs torch (.venv-reference, installed on demand) for minutes: set CONFORM_ENGINES=1\n");
    return 2;
  }
  const cases = gridCases().filter((c) => c.engine === "transformers" && c.dtype === "bfloat16");
  const oracle = await OracleClient.start({ requestTimeoutMs: 600_000 });
  const rows: Record<string, unknown>[] = [];
  try {
    for (const c of cases) {
      const dir = join(REPO_ROOT, ".cache", "checkpoints", c.checkpoint);
      const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
      const prompt = tokensFor(loadConfig(dir).args.vocab_size, c.seed);
      const taps = [...residualTaps(config), "logits"];
      const hb = runTransformers(dir, prompt, "bfloat16");
      const h64 = runTransformers(dir, prompt, "float64");
      const cap = await oracle.capture(dir, { id: "bf16-rounding", kind: "forward", tokens: [prompt] }, { only: taps });
      const sb = mx.loadSafetensors(join(hb.dir, "tensors.safetensors"));
      const s64 = mx.loadSafetensors(join(h64.dir, "tensors.safetensors"));
      try {
        const theirs = new Map(cap.taps.map((t) => [t.name, t]));
        const per: Record<string, { hf_vs_mlx: number; hf_vs_x64: number; mlx_vs_x64: number }> = {};
        for (const name of taps) {
          const m = theirs.get(name)?.array;
          if (!m) throw new Error(`${c.checkpoint}: mlx-lm stored no ${name}`);
          const mlx = toFloat64(rawOfNpy(m));
          const hf = toFloat64(rawOf(sb.arrays.get(name)!));
          const x64 = new Float64Array(s64.arrays.get(name)!.toBytes().slice().buffer);
          per[name] = { hf_vs_mlx: rel(hf, mlx), hf_vs_x64: rel(hf, x64), mlx_vs_x64: rel(mlx, x64) };
        }
        const worst = (k: "hf_vs_mlx" | "hf_vs_x64" | "mlx_vs_x64") => Math.max(...Object.values(per).map((v) => v[k]));
        const row = { checkpoint: c.checkpoint, oracle_dtype: String(theirs.get("logits")!.dtype), max: { hf_vs_mlx: worst("hf_vs_mlx"), hf_vs_x64: worst("hf_vs_x64"), mlx_vs_x64: worst("mlx_vs_x64") }, taps: per };
        rows.push(row);
        process.stderr.write(`[bf16] ${c.checkpoint} (oracle ${row.oracle_dtype}): max hf-mlx ${row.max.hf_vs_mlx.toExponential(2)}, hf-x64 ${row.max.hf_vs_x64.toExponential(2)}, mlx-x64 ${row.max.mlx_vs_x64.toExponential(2)}\n`);
      } finally {
        for (const a of sb.arrays.values()) a.dispose();
        for (const a of s64.arrays.values()) a.dispose();
        hb.dispose();
        h64.dispose();
      }
    }
  } finally {
    await oracle.close();
  }
  const out = join(REPO_ROOT, "engines", "transformers", "bf16_rounding.json");
  writeFileSync(out, `${JSON.stringify({ what: "transformers bfloat16 vs mlx-lm on the bf16 grid cases; x64 = transformers float64 on the same checkpoint (engines/transformers/bf16_rounding.ts)", when: new Date().toISOString(), rows }, null, 2)}\n`);
  process.stderr.write(`[bf16] wrote ${out}\n`);
  return 0;
}

if (import.meta.main) {
  main().then(
    (c) => process.exit(c),
    (e) => {
      process.stderr.write(`error: ${(e as Error).message}\n`);
      process.exit(1);
    },
  );
}
