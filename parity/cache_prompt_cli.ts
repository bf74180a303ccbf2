// `npm run cache-prompt -- --model <dir> --prompt "..." --prompt-cache-file F`: mlx_lm.cache_prompt
// for the TS model: the whole prompt through generate_step(max_tokens=0)'s prefill, then the
// caches saved in mlx-lm's prompt-cache format (metadata: model, tokenizer_config), so that
// `npm run generate -- --prompt-cache-file F` or mlx_lm.generate can continue from it.
import { resolve } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { cachePrompt, savePromptCache } from "../model/cache/prompt_cache.ts";
import { loadGenerationModel } from "../model/runtime.ts";
import { checkCheckpoint } from "../model/gemma4/index.ts";
import { type FlagSpec, helpText, parseArgs, runMain, UsageError } from "./args.ts";
import { inspectCheckpoint, parseTokenList, tokenizePrompt } from "./inputs.ts";

export const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "a local Gemma 4 checkpoint (required)" },
  { name: "prompt", kind: "string", valueName: "text", help: "the prompt to cache, tokenized with the checkpoint's tokenizer.json" },
  { name: "tokens", kind: "string", valueName: "1,2,3", help: "prompt token ids instead of --prompt" },
  { name: "prompt-cache-file", kind: "string", valueName: "file", help: "the .safetensors file to write (required)" },
  { name: "prefill-step-size", kind: "int", valueName: "N", help: "prefill chunk size", default: 2048 },
  { name: "verbose", kind: "bool", help: "stack traces on errors" },
  { name: "help", kind: "bool", help: "show this help" },
];

/** Everything checked before the model is loaded (flags, checkpoint without its weights, prompt); null for --help. */
export async function cachePromptPlan(argv: readonly string[]) {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  if (a.model === undefined) throw new UsageError("--model <dir> is required (see --help)");
  if (typeof a["prompt-cache-file"] !== "string") throw new UsageError("--prompt-cache-file <file> is required (see --help)");
  const file = resolve(a["prompt-cache-file"]);
  if (!file.endsWith(".safetensors")) throw new UsageError(`--prompt-cache-file must end in .safetensors, got ${file}`);
  if (Number(a["prefill-step-size"]) < 1) throw new UsageError("--prefill-step-size must be at least 1");
  const dir = resolve(String(a.model));
  inspectCheckpoint(dir);
  if ((a.prompt === undefined) === (a.tokens === undefined)) throw new UsageError('give exactly one of --prompt "text" or --tokens 1,2,3');
  const prompt = typeof a.tokens === "string" ? parseTokenList(a.tokens) : await tokenizePrompt(dir, String(a.prompt), false);
  checkCheckpoint(dir);
  return { a, dir, file, prompt };
}

async function main(argv: string[]): Promise<number> {
  const plan = await cachePromptPlan(argv);
  if (plan === null) {
    process.stdout.write(helpText("npm run cache-prompt -- --model <dir> (--prompt \"text\" | --tokens 1,2,3) --prompt-cache-file F", "Caches a prompt for later generation (mlx_lm.cache_prompt).", FLAGS));
    return 0;
  }
  const { a, dir, file, prompt } = plan;
  const { loaded, model } = loadGenerationModel(dir);
  const cache = model.makeCache();
  try {
    const t0 = performance.now();
    cachePrompt(model, prompt, cache, Number(a["prefill-step-size"]));
    const s = (performance.now() - t0) / 1000;
    process.stdout.write(`Processed ${prompt.length} tokens (${(prompt.length / s).toFixed(2)} tok/s)\n`);
    process.stdout.write(`Peak memory: ${(mx.getPeakMemory() / 1e9).toFixed(3)} GB\nSaving...\n`);
    savePromptCache(file, cache, { model: String(a.model), tokenizer_config: JSON.stringify({ trust_remote_code: false }) });
  } finally {
    for (const c of cache) c.dispose();
    loaded.model.dispose();
  }
  return 0;
}

if (import.meta.main) runMain(main);
