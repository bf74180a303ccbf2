// The llama.cpp side of a dump, in a child process of its own: llama.cpp aborts the whole process
// on a failed GGML_ASSERT (it does on c6_sink's KV-sharing layout), so the caller
// (engine.ts runCalls) spawns this file and turns such an abort into one error message.
//
//   bun engines/llama_cpp/engine_run.ts JOB.json
// JOB.json: { gguf, vocab, contextSize, calls: [[ids...] | null], out } (null: the greedy token of
// the previous call's last position). Writes <out>.f32 (every call's L x V log-probabilities,
// float32, in order) and <out>.json ({ greedy: number[][] per call per position,
// samplerAgreesWithArgmax }). Exit 0, or 1 with a message on stderr.
import { readFileSync, writeFileSync } from "node:fs";
import { evaluateCall, openEngine } from "./engine.ts";

interface Job {
  gguf: string;
  vocab: number;
  contextSize: number;
  calls: (number[] | null)[];
  out: string;
}

function argmax(row: Float32Array): number {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i;
  return best;
}

async function main(): Promise<number> {
  const job = JSON.parse(readFileSync(process.argv[2]!, "utf8")) as Job;
  const engine = await openEngine(job.gguf, job.contextSize);
  const chunks: Float32Array[] = [];
  const greedy: number[][] = [];
  let agrees = true;
  try {
    let prev = -1;
    for (const call of job.calls) {
      const tokens = call ?? [prev];
      const r = await evaluateCall(engine.sequence, tokens, job.vocab);
      for (let i = 0; i < tokens.length; i++) if (r.greedy[i] !== argmax(r.logprobs.subarray(i * job.vocab, (i + 1) * job.vocab))) agrees = false;
      chunks.push(r.logprobs);
      greedy.push(r.greedy);
      prev = r.greedy.at(-1)!;
    }
  } finally {
    await engine.close();
  }
  const all = new Float32Array(chunks.reduce((n, c) => n + c.length, 0));
  let o = 0;
  for (const c of chunks) {
    all.set(c, o);
    o += c.length;
  }
  writeFileSync(`${job.out}.f32`, new Uint8Array(all.buffer));
  writeFileSync(`${job.out}.json`, JSON.stringify({ greedy, samplerAgreesWithArgmax: agrees, buildType: engine.buildType }));
  return 0;
}

if (import.meta.main) {
  main().then(
    (code) => process.exit(code),
    (e) => {
      process.stderr.write(`${(e as Error).message}\n`);
      process.exit(1);
    },
  );
}
