// A preload for `npm run serve` under the load test (suites/serve/load.test.ts starts the server
// with `bun run --preload serve/load/memory_probe.ts serve/cli.ts ...`): once a second it appends
// one JSON line to the file named by SERVE_MEMORY_PROBE with what the process holds: resident
// memory, the JS heap, MLX's active and cached bytes (its allocator's own counters), the number
// of live MLX array handles of the binding, and the batch's size. The batch size is read after
// every BatchGenerator.next() call (a wrapper that only reads `generationBatch.length`), so the
// test can end its warm-up when the batch first held its full size. Nothing the server computes
// changes: the wrapper calls the original next() and returns what it returns. When the server
// is idle (no next() call since the last sample, an empty batch) the probe runs a full garbage
// collection before sampling.
import { appendFileSync, readFileSync, writeFileSync } from "node:fs";
import { heapStats } from "bun:jsc";
import * as mx from "@mlx-bun/mlx";
import { BatchGenerator } from "../../model/generate_batch.ts";

const out = process.env.SERVE_MEMORY_PROBE;
if (out) {
  writeFileSync(out, "");
  let batch = 0;
  let maxBatch = 0;
  let steps = 0;
  const next = BatchGenerator.prototype.next;
  BatchGenerator.prototype.next = function (this: BatchGenerator) {
    const r = next.call(this);
    // the generation batch after this step (sequences decoding together)
    batch = (this as unknown as { generationBatch: { length: number } }).generationBatch.length;
    maxBatch = Math.max(maxBatch, batch);
    steps += 1;
    return r;
  };
  // resident memory and its kinds (anonymous: heap and malloc; file: mapped files such as libraries and weights)
  const status = () => {
    const text = readFileSync("/proc/self/status", "utf8");
    const kib = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(text)?.[1] ?? Number.NaN);
    return { rssKiB: kib("VmRSS"), anonKiB: kib("RssAnon"), fileKiB: kib("RssFile"), threads: Number(/Threads:\s+(\d+)/.exec(text)?.[1] ?? Number.NaN) };
  };
  const t0 = performance.now();
  let lastSteps = -1;
  const sample = () => {
    // idle since the last sample (no next() call): a full collection first, so that the heap
    // figures of idle samples count live objects, not garbage a later collection would free
    const idle = steps === lastSteps && batch === 0;
    if (idle) Bun.gc(true);
    lastSteps = steps;
    const h = heapStats();
    appendFileSync(
      out,
      `${JSON.stringify({
        t: (performance.now() - t0) / 1000,
        ...status(),
        heapBytes: h.heapSize,
        heapObjects: h.objectCount,
        // memory the JS heap owns outside itself (ArrayBuffer stores: e.g. a logprobs row copied out to be hashed for the schedule)
        extraBytes: h.extraMemorySize,
        mlxActive: mx.getActiveMemory(),
        mlxCache: mx.getCacheMemory(),
        handles: mx.liveHandles(),
        batch,
        maxBatch,
        steps,
        idle,
        // live objects by type, on idle samples only (after the collection): what a leak would grow
        ...(idle ? { types: h.objectTypeCounts } : {}),
      })}\n`,
    );
  };
  setInterval(sample, 1000).unref();
}
