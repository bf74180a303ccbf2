// Tap digests: the TS half of oracle/python/golden_io.py's call_digests (form "tap-sha256-v1").
// A logits-only multimodal golden stores a few taps by value and, for every tap it recorded, a
// digest, so a suite can check every tap bit for bit without the golden storing it.
//
// One tap's digest: sha256 of
//   "gemma4-parity tap v1\n" + kind + "\n" + name + "\n"
//   + array: dtype + "\n" + shape joined by "," + "\n" + ("python_int\n" when meta.python_int is
//     true: the value was a Python int / JS number) + its raw bytes (C order, little-endian,
//     bfloat16 as its uint16 bit patterns, bool one byte per element: what toBytes gives)
//   + str (mask "causal"): value + "\n"
// (the text UTF-8; name with its call prefix, "step3/logits"; meta other than python_int is not
// covered). Per call: sha256 of its taps' 32-byte digests concatenated in order (full strength),
// and the first 6 bytes of each tap's digest, base64, 8 characters a tap (to name the first tap
// that differs; a difference those 48 bits miss still fails on the call's hash).

import { createHash } from "node:crypto";

export const DIGEST_FORM = "tap-sha256-v1";
const SHORT_BYTES = 6;
const SHORT_CHARS = 8; // base64 of 6 bytes

export interface CallDigest {
  /** The call's tap-name prefix ("embed/", "prefill0/", "step3/", "" for a single forward). */
  call: string;
  taps: number;
  sha256: string;
  /** SHORT_CHARS base64 characters per tap, in order. */
  short: string;
}

export interface ScenarioDigests {
  form: string;
  calls: CallDigest[];
}

/** What a digest covers of a tap (TapData of the suites and the oracle's records both fit). */
export interface DigestableTap {
  name: string;
  kind: "array" | "none" | "str";
  dtype?: string;
  shape?: number[];
  data?: Uint8Array;
  value?: string;
  meta?: Record<string, unknown>;
}

const enc = new TextEncoder();

/** sha256 of one tap's canonical form (the header above). */
export function tapDigest(t: DigestableTap): Buffer {
  let head = `gemma4-parity tap v1\n${t.kind}\n${t.name}\n`;
  if (t.kind === "array") {
    if (!t.data) throw new Error(`tap ${t.name}: no data to digest`);
    head += `${t.dtype}\n${(t.shape ?? []).join(",")}\n`;
    if (t.meta?.python_int === true) head += "python_int\n";
  } else if (t.kind === "str") {
    head += `${t.value}\n`;
  }
  const h = createHash("sha256").update(enc.encode(head));
  if (t.kind === "array") h.update(t.data!);
  return h.digest();
}

/** The first tap whose digest differs (or the list's length), in execution order. */
export interface DigestMismatch {
  /** Position in execution order (= taps whose digests matched before it). */
  index: number;
  /** The TS tap there ("" when TS has none there). */
  name: string;
  call: string;
  reason: "digest" | "call" | "missing" | "extra";
  detail: string;
}

export interface DigestVerdict {
  ok: boolean;
  /** Taps whose digests matched (all of them when ok). */
  matched: number;
  first?: DigestMismatch;
}

function describe(t: DigestableTap): string {
  if (t.kind === "none") return "None";
  if (t.kind === "str") return JSON.stringify(t.value);
  return `${t.dtype}[${(t.shape ?? []).join(",")}]`;
}

/**
 * Walks `taps` (every tap TS computed, in execution order, the inputs it was fed included: the
 * golden recorded those too) against the stored digests; stops at the first tap whose digest
 * differs. A digest list that covers no tap is refused (nothing compared is not a pass).
 */
export function checkDigests(taps: readonly DigestableTap[], d: ScenarioDigests): DigestVerdict {
  if (d.form !== DIGEST_FORM) throw new Error(`digest form ${JSON.stringify(d.form)}: this code reads ${DIGEST_FORM}`);
  const total = d.calls.reduce((a, c) => a + c.taps, 0);
  if (total === 0) return { ok: false, matched: 0, first: { index: 0, name: "", call: "", reason: "missing", detail: "the golden holds no tap digest: nothing was compared" } };
  let i = 0;
  for (const c of d.calls) {
    if (c.short.length !== c.taps * SHORT_CHARS) throw new Error(`call ${c.call}: ${c.short.length} digest characters for ${c.taps} taps`);
    const chain = createHash("sha256");
    for (let k = 0; k < c.taps; k++, i++) {
      const t = taps[i];
      if (!t) return { ok: false, matched: i, first: { index: i, name: "", call: c.call, reason: "missing", detail: `TS stopped after ${i} taps; the golden recorded ${total}` } };
      const full = tapDigest(t);
      const mine = full.subarray(0, SHORT_BYTES).toString("base64");
      const want = c.short.slice(k * SHORT_CHARS, (k + 1) * SHORT_CHARS);
      if (mine !== want) {
        const nameNote = t.name.startsWith(c.call) ? "" : ` (the golden's call ${JSON.stringify(c.call)} has another tap here: a name or order difference)`;
        return {
          ok: false,
          matched: i,
          first: { index: i, name: t.name, call: c.call, reason: "digest", detail: `TS ${describe(t)} digest ${mine}… differs from the golden's ${want}…${nameNote}` },
        };
      }
      chain.update(full);
    }
    const got = chain.digest("hex");
    if (got !== c.sha256) {
      return { ok: false, matched: i - c.taps, first: { index: i - c.taps, name: c.call, call: c.call, reason: "call", detail: `every tap's short digest matches but the call's sha256 ${got} is not the golden's ${c.sha256}` } };
    }
  }
  if (taps.length > total) return { ok: false, matched: total, first: { index: total, name: taps[total]!.name, call: "", reason: "extra", detail: `TS emitted ${taps.length} taps; the golden recorded ${total}` } };
  return { ok: true, matched: total };
}

export function formatDigestVerdict(label: string, v: DigestVerdict): string {
  if (v.ok) return `${label}: ${v.matched} tap digests equal`;
  const f = v.first!;
  return `${label}: first tap whose digest differs #${f.index} "${f.name}" (${f.reason}, call ${JSON.stringify(f.call)}): ${f.detail} [${f.index} taps equal before it]`;
}
