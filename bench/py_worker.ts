// The mlx-lm side of a benchmark: a Python worker (bench/python/<script>) reading one JSON request
// per line and answering one JSON line ({ok, error?, ...}), in the project's venv.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { join } from "node:path";
import { REPO_ROOT } from "../oracle/client.ts";

export const PY = join(REPO_ROOT, ".venv", "bin", "python");

export class PyWorker {
  private proc;
  private lines;

  /** `script`: a file of bench/python/; `name`: how errors call it (e.g. "mlx-lm bench worker"). */
  constructor(script: string, private readonly name: string) {
    this.proc = spawn(PY, [join(REPO_ROOT, "bench", "python", script)], { cwd: REPO_ROOT, stdio: ["pipe", "pipe", "inherit"] });
    this.lines = createInterface({ input: this.proc.stdout! })[Symbol.asyncIterator]();
  }

  async call<T>(req: Record<string, unknown>): Promise<T> {
    this.proc.stdin!.write(`${JSON.stringify(req)}\n`);
    const { value, done } = await this.lines.next();
    if (done) throw new Error(`the ${this.name} exited`);
    const r = JSON.parse(value as string) as { ok: boolean; error?: string } & T;
    if (!r.ok) throw new Error(`${this.name}: ${r.error}`);
    return r;
  }

  close(): void {
    this.proc.stdin!.end(`${JSON.stringify({ cmd: "quit" })}\n`);
  }
}
