// Headless Chromium from the system (Debian's `chromium`), driven by playwright-core.
// Playwright's own browser download is never used.
import { existsSync } from "node:fs";

const CANDIDATES = [process.env.CHROMIUM_PATH, "/usr/bin/chromium", "/usr/bin/chromium-browser", "/Applications/Chromium.app/Contents/MacOS/Chromium", "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome"];

export function findChromium(): string | null {
  for (const c of CANDIDATES) if (c && existsSync(c)) return c;
  return null;
}

// The flags keep Chromium off the network: this machine reaches nothing but package registries.
export const CHROMIUM_ARGS = [
  "--headless=new",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-dev-shm-usage",
];
