// Helper of compile.test.ts (run as its own process with a fresh TMPDIR): builds mlx-lm's
// compiled gemma4 helpers with the binding's compile() and prints the kernel libraries it loaded
// and those in its kernel cache.
import { existsSync, readdirSync, readFileSync, realpathSync } from "node:fs";
import { basename, join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";

const { pyFloat } = mx;
// nn.gelu_approx: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
const geluApprox = mx.compile(
  (x: MlxArray) =>
    mx.multiply(mx.multiply(x, 0.5), mx.add(mx.tanh(mx.multiply(mx.add(x, mx.multiply(mx.power(x, 3), 0.044715)), Math.sqrt(2 / Math.PI))), 1)),
  { shapeless: true },
);
const geglu = mx.compile((gate: MlxArray, x: MlxArray) => mx.multiply(geluApprox(gate) as MlxArray, x), { shapeless: true });
const softcap = 30.0;
const logitSoftcap = mx.compile((x: MlxArray) => mx.multiply(mx.tanh(mx.divide(x, pyFloat(softcap))), pyFloat(softcap)), { shapeless: true });
const completeSquare = mx.compile(
  (x2: MlxArray, y2: MlxArray, xy: MlxArray) => mx.subtract(mx.add(x2, mx.expandDims(y2, -1)), mx.multiply(xy, 2)),
  { shapeless: true },
);

for (const dt of ["float32", "bfloat16"] as const) {
  using f = mx.reshape(mx.arange(0, 12, 1, "float32"), [3, 4]);
  using c = mx.astype(f, dt);
  using x = mx.divide(c, 7);
  using col = mx.take(x, mx.array([0], [], "int32"), 1);
  const outs = [geluApprox(x), geglu(x, x), logitSoftcap(x), completeSquare(x, col, x)] as MlxArray[];
  mx.evaluate(outs);
  for (const o of outs) o.dispose();
}
const cpu = join(process.env.TMPDIR!, "mlx", mx.version(), "cpu");
// What this process ran: the kernel libraries it has mapped (MLX dlopens each fused kernel it
// uses and keeps it loaded), read from /proc/self/maps on Linux; null elsewhere (the test then
// starts from an empty cache, where every file in it was written by this run). The cache's
// listing alone would not do: the test seeds it with the pinned files, so a binding that no
// longer compiled or fused would leave it unchanged.
let mapped: string[] | null = null;
if (existsSync("/proc/self/maps")) {
  const prefix = `${realpathSync(cpu)}/`;
  const files = readFileSync("/proc/self/maps", "utf8").split("\n").map((l) => l.slice(l.indexOf("/"))).filter((f) => f.startsWith(prefix));
  mapped = [...new Set(files.map((f) => basename(f)))].sort();
}
console.log(JSON.stringify({ mapped, listed: readdirSync(cpu).filter((f) => f.startsWith("lib")).sort() }));
