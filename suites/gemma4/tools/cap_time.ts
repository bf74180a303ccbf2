// Ad-hoc: time live captures (full vs logits mode) to budget the parity suite.
import { OracleClient } from "../../../oracle/client.ts";
const o = await OracleClient.start();
for (const mode of ["full", "logits", "full"] as const) {
  for (const [c, s] of [["c1_dense/f32", "fwd_L5"], ["c3_e2b/bf16", "fwd_L13"], ["c5_moe/q4g32", "fwd_L40"]] as const) {
    await o.capture(c, s, { mode });
    const t = performance.now();
    for (let i = 0; i < 3; i++) await o.capture(c, s, { mode });
    console.log(mode, c, s, ((performance.now() - t) / 3).toFixed(0), "ms");
  }
}
await o.close();
