// The `mtp` bench workload: decode tok/s with the gemma4_assistant MTP drafter against plain
// decoding, TS and the oracle side by side (TS MTP vs mlx-vlm 0.7.10's MTP, TS plain vs mlx-lm's
// generate_step), alternating the sides pair by pair as every bench row; plus each side's MTP /
// plain speedup, the acceptance rate and the tokens per verify forward. With random drafter
// weights acceptance is low, so MTP mostly pays its drafting cost here; the rows measure the
// machinery (and run unchanged on another backend).
import * as mx from "@mlx-bun/mlx";
import type { GenerateModel } from "../model/generate.ts";
import { generate } from "../model/generate.ts";
import type { LoadedModel } from "../model/gemma4/index.ts";
import { loadAssistant } from "../model/speculative/drafters/gemma4_assistant/gemma4_assistant.ts";
import { mtpGenerateStep } from "../model/speculative/mtp.ts";

export interface MtpSample {
  prompt_tps: number;
  generation_tps: number | null;
  tokens: number[];
  rounds?: number;
  accepted?: number;
  drafted?: number;
}

interface Worker {
  call<T>(req: Record<string, unknown>): Promise<T>;
}

/** mlx-lm's stream_generate timing over any token stream: prompt clock to the first token, then (n + 1) / time. */
async function timed(tokens: AsyncIterable<{ token: number }>, promptLen: number): Promise<MtpSample> {
  mx.clearCache();
  mx.resetPeakMemory();
  const out: number[] = [];
  let tic = performance.now();
  let promptSeconds = 0;
  for await (const t of tokens) {
    if (out.length === 0) {
      promptSeconds = (performance.now() - tic) / 1000;
      tic = performance.now();
    }
    out.push(t.token);
  }
  const s = (performance.now() - tic) / 1000;
  return { prompt_tps: promptLen / promptSeconds, generation_tps: s > 0 ? out.length / s : null, tokens: out };
}

export interface MtpMeasurement {
  /** tok/s per pair: [TS, oracle] for MTP and for plain decoding. */
  mtp: [number[], number[]];
  plain: [number[], number[]];
  notes: string[];
}

/** Runs `pairs` alternating pairs of each of the four decodes (after one warm-up each). */
export async function measureMtp(target: string, drafter: string, loaded: LoadedModel, model: GenerateModel, py: Worker, prompt: number[], maxTokens: number, pairs: number): Promise<MtpMeasurement> {
  const draft = loadAssistant(drafter);
  let rounds = 0;
  let accepted = 0;
  let drafted = 0;
  const tsMtp = () =>
    timed(
      mtpGenerateStep(loaded.text, draft, prompt, {
        maxTokens,
        onRound: (r) => {
          rounds++;
          accepted += r.accepted;
          drafted += r.drafted.length;
        },
      }),
      prompt.length,
    );
  const tsPlain = () => timed(generate(model, prompt, { maxTokens }), prompt.length);
  const pyMtp = () => py.call<MtpSample>({ cmd: "mtp_generate", target, drafter, prompt, max_tokens: maxTokens });
  const pyPlain = () => py.call<MtpSample>({ cmd: "generate", prompt, max_tokens: maxTokens, prefill_step_size: 2048 });
  const m: MtpMeasurement = { mtp: [[], []], plain: [[], []], notes: [] };
  try {
    await tsMtp();
    await pyMtp();
    await tsPlain();
    await pyPlain();
    let last: MtpSample | null = null;
    let lastTs: MtpSample | null = null;
    for (let i = 0; i < pairs; i++) {
      console.error(`[bench] mtp: pair ${i + 1}/${pairs}`);
      rounds = accepted = drafted = 0;
      lastTs = await tsMtp();
      m.mtp[0].push(lastTs.generation_tps ?? 0);
      last = await pyMtp();
      m.mtp[1].push(last.generation_tps ?? 0);
      m.plain[0].push((await tsPlain()).generation_tps ?? 0);
      m.plain[1].push((await pyPlain()).generation_tps ?? 0);
    }
    const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
    const perForward = (n: number, r: number) => (r ? ((n - 1) / r).toFixed(2) : "-");
    m.notes.push(
      `mtp: acceptance ${drafted ? ((100 * accepted) / drafted).toFixed(1) : "0.0"}% of drafted tokens (${accepted}/${drafted}, TS; mlx-vlm ${last?.accepted}/${last?.drafted}), ` +
        `${perForward(lastTs!.tokens.length, rounds)} tokens per verify forward (TS; mlx-vlm ${perForward(last!.tokens.length, last!.rounds ?? 0)}); ` +
        `MTP / plain decode: TS ${(med(m.mtp[0]) / med(m.plain[0])).toFixed(2)}x, mlx-vlm / mlx-lm ${(med(m.mtp[1]) / med(m.plain[1])).toFixed(2)}x` +
        `${lastTs!.tokens.join() === last!.tokens.join() ? "" : " — **the TS and mlx-vlm tokens differ**"}`,
    );
  } finally {
    draft.dispose();
  }
  return m;
}
