// This project's TS port as a conformance engine: runs the model on a checkpoint for a forward or
// a generate_step schedule and writes the dump format (oracle/conform/FORMAT.md) at level 0, 1
// or 2. The tensors are the model's own tap emission (the same sink the parity command reads),
// copied byte for byte; nothing is recomputed for the dump.
//
// CLI: bun engines/ts_port/dump.ts --checkpoint DIR --prompt 2,5,9 [--prefill-step-size 4
//      --max-tokens 6 | --forward] --level 2 --out DIR        (exit 0 ok, 2 bad usage/input)

import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { generateStep } from "../../model/generate.ts";
import { loadModel } from "../../model/gemma4/index.ts";
import type { TapSink, TapValue } from "../../model/gemma4/taps.ts";
import { generationModel, stepTaps } from "../../model/runtime.ts";
import {
  checkpointHashes,
  DumpError,
  type DumpLevel,
  type DumpManifest,
  type DumpSchedule,
  levelTaps,
  type MaskKind,
  scheduleCalls,
  writeDump,
} from "../../oracle/conform/dump.ts";
import type { RawTensor } from "../../oracle/tensor_diff.ts";

export const ENGINE_NAME = "ts_port";

export interface TsDumpOptions {
  checkpoint: string;
  prompt: number[];
  schedule: DumpSchedule;
  level: DumpLevel;
  out: string;
}

/** A tap value as stored: an array's bytes, the no-cache Python int offset as an int32 scalar (as mlx-lm's capture records it), or a mask kind. */
function stored(value: TapValue): RawTensor | MaskKind {
  if (value === null) return "none";
  if (value === "causal") return "causal";
  if (typeof value === "number") {
    const data = new Uint8Array(4);
    new DataView(data.buffer).setInt32(0, value, true);
    return { dtype: "int32", shape: [], data };
  }
  return { dtype: value.dtype, shape: value.shape, data: value.toBytes() };
}

/** Runs the TS model and writes its dump; returns the manifest written. */
export async function tsDump(opts: TsDumpOptions): Promise<DumpManifest> {
  const hashes = checkpointHashes(opts.checkpoint);
  const config = JSON.parse(readFileSync(join(opts.checkpoint, "config.json"), "utf8")) as Record<string, unknown>;
  const wanted = new Set(scheduleCalls(opts.prompt.length, opts.schedule).flatMap((c) => levelTaps(config, c, opts.level).map((t) => c.prefix + t)));
  const tensors = new Map<string, RawTensor>();
  const masks: Record<string, MaskKind> = {};
  const sink: TapSink = (name, value) => {
    if (!wanted.has(name)) return;
    const s = stored(value);
    if (typeof s === "string") masks[name] = s;
    else tensors.set(name, s);
  };

  const loaded = loadModel(opts.checkpoint);
  const generated: number[] = [];
  try {
    if (opts.schedule.kind === "forward") {
      using ids = mx.array(Int32Array.from(opts.prompt), [1, opts.prompt.length], "int32");
      using logits = loaded.model.call(ids, { taps: sink });
      mx.evaluate(logits);
    } else {
      const run = generationModel(loaded, sink);
      const steps = generateStep(run, opts.prompt, { maxTokens: opts.schedule.max_tokens, prefillStepSize: opts.schedule.prefill_step_size, onStep: stepTaps(sink) });
      for await (const t of steps) generated.push(t.token);
    }
  } finally {
    loaded.model.dispose();
  }
  const logits = [...tensors].find(([n]) => n.endsWith("logits"))?.[1];
  return writeDump(
    opts.out,
    {
      engine: { name: ENGINE_NAME, version: `mlx ${mx.version()}`, device: mx.defaultDevice(), dtype: logits?.dtype ?? "unknown" },
      checkpoint: { files: hashes },
      prompt: [...opts.prompt],
      schedule: opts.schedule,
      level: opts.level,
      ...(opts.schedule.kind === "generate" ? { generated } : {}),
      ...(Object.keys(masks).length ? { mask_kinds: masks } : {}),
    },
    tensors,
  );
}

// ------------------------------------------------------------------ CLI

const USAGE = "usage: bun engines/ts_port/dump.ts --checkpoint DIR --prompt 2,5,9 (--forward | --prefill-step-size N --max-tokens N) --level 0|1|2 --out DIR";

class UsageError extends Error {}

function parseArgs(argv: string[]): TsDumpOptions {
  const v = new Map<string, string>();
  let forward = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--forward") forward = true;
    else if (["--checkpoint", "--prompt", "--prefill-step-size", "--max-tokens", "--level", "--out"].includes(a)) {
      const next = argv[++i];
      if (next === undefined) throw new UsageError(`${a} needs a value`);
      v.set(a, next);
    } else throw new UsageError(`unknown argument ${JSON.stringify(a)}`);
  }
  const need = (k: string) => {
    const x = v.get(k);
    if (x === undefined) throw new UsageError(`${k} is required`);
    return x;
  };
  const int = (k: string, min: number) => {
    const s = need(k);
    const n = Number(s);
    if (!/^\d+$/.test(s) || n < min) throw new UsageError(`${k} must be an integer >= ${min}, got ${JSON.stringify(s)}`);
    return n;
  };
  const prompt = need("--prompt").split(",").map((s) => {
    if (!/^\d+$/.test(s.trim())) throw new UsageError(`--prompt must be comma-separated token ids, got ${JSON.stringify(s)}`);
    return Number(s);
  });
  const level = int("--level", 0);
  if (level > 2) throw new UsageError(`--level must be 0, 1 or 2, got ${level}`);
  if (forward && (v.has("--prefill-step-size") || v.has("--max-tokens"))) throw new UsageError("--forward takes no --prefill-step-size / --max-tokens");
  const schedule: DumpSchedule = forward ? { kind: "forward" } : { kind: "generate", prefill_step_size: int("--prefill-step-size", 1), max_tokens: int("--max-tokens", 1) };
  return { checkpoint: need("--checkpoint"), prompt, schedule, level: level as DumpLevel, out: need("--out") };
}

if (import.meta.main) {
  let opts: TsDumpOptions;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`${(e as Error).message}\n${USAGE}`);
    process.exit(2);
  }
  try {
    const m = await tsDump(opts);
    console.log(`wrote ${opts.out}: level ${m.level}, ${m.tensors.length} tensors${m.generated ? `, generated ${m.generated.join(",")}` : ""}`);
  } catch (e) {
    console.error(e instanceof DumpError ? e.message : `ts_port dump failed: ${(e as Error).message}`);
    process.exit(2);
  }
}
