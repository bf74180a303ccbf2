// The schedule `npm run serve -- --record-schedule FILE` writes (serve/engine.ts) and its check
// against oracle/python/serve_replay.py's replay through mlx-lm: per request that ended (a
// `leave` of a batched sequence, or a `single` seeded request), the token ids, each token's
// logprob and each step's logprobs-row sha256 must be equal, element for element.
export interface ScheduleEvent {
  event: "open" | "insert" | "remove" | "leave" | "close" | "single";
  session?: number;
  step?: number;
  uid?: number;
  request?: number;
  /** The response id the server gave the request. */
  tag?: string | null;
  prompt?: number[];
  reason?: string;
  tokens?: number[];
  logprobs?: number[];
  logprobs_sha256?: string[];
}

export interface ReplayOutput {
  requests: Record<string, { tokens: number[]; logprobs: number[]; logprobs_sha256: string[]; reason: string | null }>;
  sessions: number;
  calls: number;
}

export function readSchedule(text: string): ScheduleEvent[] {
  return text
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as ScheduleEvent);
}

/** Every ended request against the replay; mismatches name the request and the first differing step. */
export function checkReplay(events: readonly ScheduleEvent[], replay: ReplayOutput): { checked: number; tokens: number; sessions: number; mismatches: string[] } {
  const mismatches: string[] = [];
  let checked = 0;
  let tokens = 0;
  for (const e of events) {
    if (e.event !== "leave" && e.event !== "single") continue;
    checked++;
    const r = replay.requests[String(e.request)];
    if (!r) {
      mismatches.push(`request ${e.request}: not in the replay`);
      continue;
    }
    const served = e.tokens!;
    tokens += served.length;
    // a removed (cancelled) sequence: both sides stop at the same next() call, so the counts agree too
    const n = served.length;
    if (r.tokens.length !== n) mismatches.push(`request ${e.request} (${e.reason}): the server generated ${n} tokens, mlx-lm ${r.tokens.length} (${r.reason})`);
    for (let i = 0; i < Math.min(n, r.tokens.length); i++) {
      if (r.tokens[i] !== served[i] || !Object.is(r.logprobs[i], e.logprobs![i]) || r.logprobs_sha256[i] !== e.logprobs_sha256![i]) {
        mismatches.push(`request ${e.request} (${e.event}), token ${i}: server ${served[i]} ${e.logprobs![i]} ${e.logprobs_sha256![i]!.slice(0, 12)}, mlx-lm ${r.tokens[i]} ${r.logprobs[i]} ${r.logprobs_sha256[i]!.slice(0, 12)}`);
        break;
      }
    }
    if (e.reason !== "cancelled" && e.event === "leave" && r.reason !== e.reason) mismatches.push(`request ${e.request}: finish reason ${e.reason}, mlx-lm's ${r.reason}`);
  }
  return { checked, tokens, sessions: replay.sessions, mismatches };
}
