// A one-line progress bar on stderr (redrawn in place on a TTY; otherwise, as in a CI log, a line
// at each tenth of the way and at most every 15 s between them).

export class ProgressBar {
  private readonly t0 = performance.now();
  private lastLine = "";
  private readonly tty = process.stderr.isTTY === true;
  private logged = { tenth: -1, at: 0 };

  constructor(private readonly label: string) {}

  /** fraction in [0, 1]; detail e.g. "step 3/21 · layer 4/35". */
  update(fraction: number, detail: string): void {
    const f = Math.max(0, Math.min(1, fraction));
    const elapsed = (performance.now() - this.t0) / 1000;
    const eta = f > 0.02 ? `ETA ${fmtSeconds((elapsed * (1 - f)) / f)}` : "ETA …";
    const width = 24;
    const bar = "█".repeat(Math.round(f * width)).padEnd(width, "░");
    const line = `${this.label} ${bar} ${(f * 100).toFixed(0).padStart(3)}% ${detail} · ${eta}`;
    if (line === this.lastLine) return;
    this.lastLine = line;
    if (this.tty) process.stderr.write(`\r\x1b[2K${line}`);
    else if (!detail.includes("layer") || detail.endsWith(" 1/1")) {
      const tenth = Math.floor(f * 10);
      const now = performance.now();
      if (tenth === this.logged.tenth && now - this.logged.at < 15_000) return;
      this.logged = { tenth, at: now };
      process.stderr.write(`${line}\n`);
    }
  }

  done(summary: string): void {
    const elapsed = (performance.now() - this.t0) / 1000;
    const line = `${this.label} ${summary} (${fmtSeconds(elapsed)})`;
    process.stderr.write(this.tty ? `\r\x1b[2K${line}\n` : `${line}\n`);
  }
}

export function fmtSeconds(s: number): string {
  if (s < 60) return `${s.toFixed(1)}s`;
  return `${Math.floor(s / 60)}m${Math.round(s % 60).toString().padStart(2, "0")}s`;
}
