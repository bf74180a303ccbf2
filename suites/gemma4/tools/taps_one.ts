// Ad-hoc: compare every tap of one (checkpoint, scenario) against the live oracle.
//   bun suites/gemma4/tools/taps_one.ts c1_dense/f32 fwd_L5
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { OracleClient, REPO_ROOT } from "../../../oracle/client.ts";
import { loadModel } from "../../../model/gemma4/index.ts";
import { compareTapLists, formatVerdict, fromOracle, TapCollector } from "../tap_compare.ts";

const [ckpt, scn] = process.argv.slice(2) as [string, string];
const scenarios = JSON.parse(readFileSync(join(REPO_ROOT, "fixtures/scenarios.json"), "utf8")).scenarios as { id: string; tokens?: number[][] }[];
const s = scenarios.find((x) => x.id === scn)!;
const oracle = await OracleClient.start();
let t = performance.now();
const cap = await oracle.capture(ckpt, scn);
console.log("capture", (performance.now() - t).toFixed(0), "ms", cap.taps.length, "taps");
t = performance.now();
const { model } = loadModel(join(REPO_ROOT, ".cache/checkpoints", ckpt));
const col = new TapCollector();
using x = mx.array(s.tokens!.flat(), [s.tokens!.length, s.tokens![0]!.length], "int32");
using logits = model.call(x, { taps: col.sink });
console.log("ts", (performance.now() - t).toFixed(0), "ms", col.taps.length, "taps");
console.log(formatVerdict(`${ckpt} ${scn}`, compareTapLists(col.taps, cap.taps.map(fromOracle))));
await oracle.close();
