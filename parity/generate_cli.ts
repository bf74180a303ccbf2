// `npm run generate -- --model <dir> --prompt "..."`: streams text from the TS model alone and
// ends with mlx_lm.generate's statistics (prompt and generation tok/s, peak memory).
import { resolve } from "node:path";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { generate } from "../model/generate.ts";
import { loadGenerationModel } from "../model/runtime.ts";
import { type FlagSpec, helpText, parseArgs, UsageError } from "./args.ts";
import { checkPromptLength, inspectCheckpoint, resolvePrompt } from "./inputs.ts";
import { BATCH_FLAGS, isBatch, runBatch } from "./generate_batch.ts";

const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "a local Gemma 4 checkpoint (required)" },
  { name: "prompt", kind: "string", valueName: "text", help: "prompt text, tokenized with the checkpoint's tokenizer.json (repeat for a batch)", repeat: true },
  { name: "chat", kind: "bool", help: "apply the checkpoint's chat template to --prompt" },
  { name: "tokens", kind: "string", valueName: "1,2,3", help: "prompt token ids instead of --prompt (output is printed as ids; repeat for a batch)", repeat: true },
  { name: "max-tokens", kind: "int", valueName: "N", help: "tokens to generate", default: 100 },
  { name: "temp", kind: "number", valueName: "T", help: "sampling temperature (0 = greedy)", default: 0 },
  { name: "top-p", kind: "number", valueName: "P", help: "nucleus sampling threshold (0 = off)", default: 0 },
  { name: "top-k", kind: "int", valueName: "K", help: "top-k sampling (0 = off)", default: 0 },
  { name: "min-p", kind: "number", valueName: "P", help: "min-p sampling (0 = off)", default: 0 },
  { name: "seed", kind: "int", valueName: "S", help: "random seed (mx.random.seed)" },
  { name: "prefill-step-size", kind: "int", valueName: "N", help: "prefill chunk size", default: 2048 },
  ...BATCH_FLAGS,
  { name: "verbose", kind: "bool", help: "stack traces on errors" },
  { name: "help", kind: "bool", help: "show this help" },
];

interface Detokenizer {
  decode(ids: number[], opts?: { skip_special_tokens?: boolean }): string;
}

async function loadTokenizer(dir: string): Promise<Detokenizer | null> {
  const p = join(dir, "tokenizer.json");
  if (!existsSync(p)) return null;
  const cfgPath = join(dir, "tokenizer_config.json");
  const { Tokenizer } = await import("@huggingface/tokenizers");
  return new Tokenizer(JSON.parse(readFileSync(p, "utf8")), existsSync(cfgPath) ? JSON.parse(readFileSync(cfgPath, "utf8")) : {});
}

function eosIds(dir: string, info: Record<string, unknown>): number[] {
  const ids = new Set<number>();
  const add = (v: unknown) => {
    if (typeof v === "number") ids.add(v);
    else if (Array.isArray(v)) for (const x of v) if (typeof x === "number") ids.add(x);
  };
  add(info.eos_token_id);
  const gen = join(dir, "generation_config.json");
  if (existsSync(gen)) add((JSON.parse(readFileSync(gen, "utf8")) as Record<string, unknown>).eos_token_id);
  return [...ids];
}

async function main(argv: string[]): Promise<number> {
  const a = parseArgs(argv, FLAGS);
  if (a.help) {
    process.stdout.write(
      helpText(
        "npm run generate -- --model <dir> (--prompt \"text\" | --tokens 1,2,3) [options]",
        "Generates text with the TypeScript Gemma 4 model (mlx-lm's generate_step, no oracle). Several --prompt / --tokens, or --prompt-file, run a batch (mlx-lm's batch_generate).",
        FLAGS,
      ),
    );
    return 0;
  }
  if (a.model === undefined) throw new UsageError("--model <dir> is required (see --help)");
  const dir = resolve(String(a.model));
  const info = inspectCheckpoint(dir);
  if (isBatch(a)) {
    const rootCfg = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    return runBatch(dir, a, info, { loadTokenizer, eosIds: (d) => eosIds(d, { ...info.text, ...rootCfg }) });
  }
  for (const k of ["prompt", "tokens"]) if (Array.isArray(a[k])) a[k] = (a[k] as string[])[0];
  const prompt = await resolvePrompt(dir, a);
  const maxTokens = Number(a["max-tokens"]);
  if (maxTokens < 1) throw new UsageError("--max-tokens must be at least 1");
  const temp = Number(a.temp);
  if (temp < 0) throw new UsageError("--temp must be >= 0");
  checkPromptLength(prompt, maxTokens, info);

  const tokenizer = typeof a.prompt === "string" ? await loadTokenizer(dir) : null;
  const { model } = loadGenerationModel(dir);
  const rootCfg = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  const eos = eosIds(dir, { ...info.text, ...rootCfg });

  mx.resetPeakMemory();
  const out: number[] = [];
  let printed = "";
  let tic = performance.now();
  let promptTps = 0;
  let n = 0;
  const opts = {
    maxTokens,
    prefillStepSize: Number(a["prefill-step-size"]),
    eosTokenIds: eos,
    samplerOptions: { temp, topP: Number(a["top-p"]), topK: Number(a["top-k"]), minP: Number(a["min-p"]) },
    seed: typeof a.seed === "number" ? a.seed : undefined,
  };
  process.stdout.write("==========\n");
  for await (const t of generate(model, prompt, opts)) {
    if (t.n === 0) {
      promptTps = prompt.length / ((performance.now() - tic) / 1000);
      tic = performance.now();
    }
    n = t.n;
    if (t.finishReason === "stop") break;
    out.push(t.token);
    if (tokenizer) {
      // Print the newly completed text (decoding the whole sequence keeps multi-byte pieces intact).
      const text = tokenizer.decode(out, { skip_special_tokens: true });
      if (text.startsWith(printed)) process.stdout.write(text.slice(printed.length));
      printed = text;
    } else process.stdout.write(`${t.token} `);
  }
  const genTps = (n + 1) / ((performance.now() - tic) / 1000);
  process.stdout.write("\n==========\n");
  process.stdout.write(`Prompt: ${prompt.length} tokens, ${promptTps.toFixed(3)} tokens-per-sec\n`);
  process.stdout.write(`Generation: ${n + 1} tokens, ${genTps.toFixed(3)} tokens-per-sec\n`);
  process.stdout.write(`Peak memory: ${(mx.getPeakMemory() / 1e9).toFixed(3)} GB\n`);
  return 0;
}

const verbose = process.argv.includes("--verbose");
main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (e: unknown) => {
    const err = e as Error;
    if (verbose) console.error(err);
    else process.stderr.write(`error: ${err.message}\n`);
    process.exit(err instanceof UsageError ? 2 : 1);
  },
);
