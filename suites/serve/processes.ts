// Server processes for the serving tests: a free loopback port, a child process started and
// awaited until its /health answers (its output kept for the error message), and a stop that
// sends SIGTERM, then SIGKILL after 5 s, so that no server outlives its test file.
import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:net";
import { REPO_ROOT } from "../../oracle/client.ts";

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export interface ServerProcess {
  name: string;
  url: string;
  proc: ChildProcess;
  /** The last 20,000 characters of its stdout and stderr. */
  log(): string;
  stop(): Promise<void>;
}

/** Starts `cmd args` (cwd: the repository) and resolves once GET url/health answers 200. */
export async function startServerProcess(name: string, cmd: string, args: string[], port: number, ms: number, env: Record<string, string> = {}): Promise<ServerProcess> {
  const proc = spawn(cmd, args, { cwd: REPO_ROOT, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, PYTHONUNBUFFERED: "1", ...env } });
  let out = "";
  const keep = (b: Buffer) => void (out = (out + b.toString()).slice(-20_000));
  proc.stdout?.on("data", keep);
  proc.stderr?.on("data", keep);
  // a test process that dies leaves no server behind
  const onExit = () => proc.kill("SIGKILL");
  process.once("exit", onExit);
  const url = `http://127.0.0.1:${port}`;
  const sp: ServerProcess = {
    name,
    url,
    proc,
    log: () => out,
    async stop() {
      process.removeListener("exit", onExit);
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
      proc.kill("SIGTERM");
      if (!(await Promise.race([exited.then(() => true), Bun.sleep(5000).then(() => false)]))) {
        proc.kill("SIGKILL");
        await Promise.race([exited, Bun.sleep(5000)]);
      }
    },
  };
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`${name} exited (${proc.exitCode ?? proc.signalCode}) before answering /health:\n${out.slice(-3000)}`);
    const ok = await fetch(`${url}/health`, { signal: AbortSignal.timeout(1000) }).then((r) => r.ok, () => false);
    if (ok) return sp;
    await Bun.sleep(100);
  }
  await sp.stop();
  throw new Error(`${name} did not answer /health within ${ms / 1000} s:\n${out.slice(-3000)}`);
}
