// The prompt-cache flags of `npm run serve`: --prompt-cache-bytes read as mlx-lm 0.32.2's
// _parse_size reads it (mlx_lm.utils, called live in the project's venv on the same strings: the
// sizes equal, and where Python raises, this server refuses the flag with a usage error), bad
// values refused before the weights load (exit 2, one line);
// and --prompt-cache-snapshots reaching the engine over HTTP: a second completion sharing 32 of
// its 38 tokens with the first (prefill step 16) reports cached_tokens 32 and GET
// /v1/prompt_cache counts one snapshot hit (the bits of such a response: prefix_snapshots.test.ts).
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { UsageError } from "../../parity/args.ts";
import { limit } from "../../tests/time_limit.ts";
import { parseSize } from "../../serve/cli.ts";
import { freePort, startServerProcess } from "./processes.ts";

const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
const DIR = join(REPO_ROOT, ".cache", "tokenizer-fixture");
const SOURCE = join(REPO_ROOT, "node_modules", "@lenml", "tokenizer-gemma3", "models");

describe("prompt-cache flags", () => {
  it("--prompt-cache-bytes = mlx-lm's _parse_size on the same strings", () => {
    const inputs = ["10", "0", "500M", "500MB", "4GB", "4G", "1.5G", "2 gb", "0.1M", "100mb", "7.25GB", "x", "4XB", "", "1K", "12.5"];
    const py = spawnSync(PYTHON, ["-c", "import json,sys\nfrom mlx_lm.utils import _parse_size\nout=[]\nfor x in json.loads(sys.argv[1]):\n    try: out.append(_parse_size(x))\n    except Exception as e: out.append(None)\nprint(json.dumps(out))", JSON.stringify(inputs)], { cwd: REPO_ROOT, encoding: "utf8" });
    expect(py.status).toBe(0);
    const want = JSON.parse(py.stdout) as (number | null)[];
    expect(want).toHaveLength(inputs.length);
    let compared = 0;
    inputs.forEach((x, i) => {
      let got: number | null;
      try {
        got = parseSize(x);
      } catch (e) {
        expect(e).toBeInstanceOf(UsageError);
        got = null;
      }
      expect([x, got]).toEqual([x, want[i]]);
      compared++;
    });
    expect(compared).toBe(inputs.length);
    // both kinds occur
    expect(want.filter((w) => w === null).length).toBeGreaterThan(0);
    expect(want.filter((w) => w !== null).length).toBeGreaterThan(0);
  }, limit(20_000));

  it("a bad --prompt-cache-bytes, --prompt-cache-size or --prompt-cache-snapshots: one line, exit 2 (before the weights load)", async () => {
    // the flags are checked after the checkpoint is found: the fixture must exist (built by the oracle only when missing)
    if (!existsSync(join(DIR, "model.safetensors"))) await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, limit(60_000));
    for (const [args, want] of [
      [["--prompt-cache-snapshots", "-2"], /^error: --prompt-cache-snapshots must be an integer >= 0, got -2/],
      [["--prompt-cache-bytes", "4XB"], /^error: --prompt-cache-bytes: '4XB' is not a size/],
      [["--prompt-cache-size", "-1"], /^error: --prompt-cache-size must be an integer >= 0, got -1/],
    ] as [string[], RegExp][]) {
      const r = spawnSync(process.execPath, ["run", "serve/cli.ts", "--model", DIR, "--port", "0", ...args], { cwd: REPO_ROOT, encoding: "utf8", timeout: limit(20_000) });
      expect([args.join(" "), r.status]).toEqual([args.join(" "), 2]);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
      expect(r.stderr.trim()).toMatch(want);
    }
  }, limit(100_000));

  it("--prompt-cache-snapshots over HTTP: the snapshot hit reported in usage and counted", async () => {
    if (!existsSync(join(DIR, "model.safetensors"))) await (await sharedOracle()).request("make_checkpoints", { tokenizer_from: SOURCE, out: DIR }, limit(60_000));
    const port = await freePort();
    const server = await startServerProcess("npm run serve (snapshots)", process.execPath, ["run", "serve/cli.ts", "--model", DIR, "--port", String(port), "--prompt-cache-snapshots", "16", "--prefill-step-size", "16", "--log-level", "WARNING"], port, limit(60_000));
    try {
      const base = "The long story of the sea and the old sailor, told again and again by the fire at night while the wind blew over the harbour and the boats rocked slowly";
      const cached: number[] = [];
      for (const tail of [" until morning came.", " until the sun rose."]) {
        const r = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: base + tail, max_tokens: 4 }) });
        expect(r.status).toBe(200);
        cached.push(((await r.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } }).usage.prompt_tokens_details.cached_tokens);
      }
      // the first (37 tokens) is prefilled in chunks ending at 16 and 32 (then 36, its segment end, to the LRU cache); the second shares at least 32 tokens with it
      expect(cached).toEqual([0, 32]);
      const stats = (await (await fetch(`${server.url}/v1/prompt_cache`)).json()) as { snapshotHits: number; lruHits: number; snapshotsTaken: number };
      expect([stats.snapshotHits, stats.lruHits, stats.snapshotsTaken]).toEqual([1, 0, 2]);
    } finally {
      await server.stop();
    }
  }, limit(90_000));
});
