// llama.cpp's CPU GELU against the exact tanh GELU (the reproducer of engines/RESULTS.md's
// llama.cpp section): builds engines/llama_cpp/gelu_repro.c with the system C compiler against
// node-llama-cpp's own ggml libraries (ensureTool) and prints its JSON lines.
//
//   CONFORM_ENGINES=llama_cpp bun engines/llama_cpp/gelu_repro.ts
// Exit 0; 2 when node-llama-cpp is not installed or no C compiler is found (the message says so).
import { spawnSync } from "node:child_process";
import { backendDir, ensureConverter, ensureInstalled, ensureTool, EngineUsageError, optedIn } from "./engine.ts";

function main(): number {
  try {
    const version = ensureInstalled(optedIn() || process.argv.includes("--install"));
    const tool = ensureTool("gelu_repro", ensureConverter(version));
    const r = spawnSync(tool, [backendDir()], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    if (r.status !== 0) {
      process.stderr.write(`gelu_repro failed: ${r.stderr || r.error?.message}\n`);
      return 1;
    }
    process.stdout.write(r.stdout);
    return 0;
  } catch (e) {
    process.stderr.write(`${(e as Error).message}\n`);
    return e instanceof EngineUsageError ? 2 : 1;
  }
}

if (import.meta.main) process.exit(main());
