// `npm run fuse -- --model DIR --adapter-path DIR --save-path OUT [--dequantize]`: mlx_lm.fuse
// with the TS port (model/fuse.ts): every adapter layer fused into its base layer (re-quantized
// for a quantized base unless --dequantize), saved as mlx-lm saves a model.

import { existsSync } from "node:fs";
import { ConfigError } from "../model/gemma4/config.ts";
import { WeightsError } from "../model/gemma4/weights.ts";
import { fuse } from "../model/fuse.ts";
import { AdapterError } from "../model/tuner/utils.ts";
import { type FlagSpec, helpText, type Parsed, parseArgs, runMain, UsageError } from "./args.ts";

export const FLAGS: FlagSpec[] = [
  { name: "model", kind: "string", valueName: "dir", help: "the local model directory", default: "mlx_model" },
  { name: "save-path", kind: "string", valueName: "dir", help: "the path to save the fused model", default: "fused_model" },
  { name: "adapter-path", kind: "string", valueName: "dir", help: "path to the trained adapter weights and config", default: "adapters" },
  { name: "dequantize", kind: "bool", help: "generate a dequantized model" },
  { name: "upload-repo", kind: "string", valueName: "repo", help: "not supported here (mlx_lm.fuse uploads to the Hugging Face hub)" },
  { name: "export-gguf", kind: "bool", help: "not supported here (mlx_lm.fuse exports llama/mistral/mixtral only)" },
  { name: "gguf-path", kind: "string", valueName: "file", help: "not supported here (see --export-gguf)" },
  { name: "trust-remote-code", kind: "bool", help: "accepted for mlx_lm.fuse compatibility (no remote code runs here)" },
  { name: "verbose", kind: "bool", help: "stack traces on errors" },
  { name: "help", kind: "bool", help: "show this help" },
];

/** Every check of the command line before any work starts (null for --help). */
export function fusePlan(argv: readonly string[]): Parsed | null {
  const a = parseArgs(argv, FLAGS);
  if (a.help) return null;
  if (a["upload-repo"] !== undefined) throw new UsageError("--upload-repo is not supported by this command");
  if (a["export-gguf"] || a["gguf-path"] !== undefined) throw new UsageError("--export-gguf is not supported for Gemma 4 (mlx_lm.fuse exports llama, mistral and mixtral only)");
  if (!existsSync(String(a.model))) throw new UsageError(`--model: no such directory: ${String(a.model)}`);
  return a;
}

async function main(argv: string[]): Promise<number> {
  const a = fusePlan(argv);
  if (a === null) {
    process.stdout.write(helpText("npm run fuse -- --model <dir> --adapter-path <dir> --save-path <dir> [--dequantize]", "Fuses fine-tuned adapters into the base model (mlx_lm.fuse's flags and files).", FLAGS));
    return 0;
  }
  const model = String(a.model);
  process.stdout.write("Loading pretrained model\n");
  const fused = fuse({ model, adapter_path: String(a["adapter-path"]), save_path: String(a["save-path"]), dequantize: a.dequantize === true });
  fused.dispose();
  if (a.dequantize) process.stdout.write("Dequantizing model\n");
  process.stdout.write(`Saved the fused model to ${String(a["save-path"])}\n`);
  return 0;
}

// a problem with the checkpoint, adapters or data is bad input: exit 2, as a usage error
const INPUT_ERRORS = [AdapterError, ConfigError, WeightsError];
if (import.meta.main) runMain((argv) =>
  main(argv).catch((e: unknown) => {
    throw INPUT_ERRORS.some((c) => e instanceof c) ? new UsageError((e as Error).message, { cause: e }) : e;
  }),
);
