// The server's generation: one request at a time, through the port's generate_step
// (model/generate.ts), with the stopping and per-token text of mlx_lm.server's sequential path
// (ResponseGenerator._serve_single over stream_generate) and of its batched path's loop, which
// agree: a token ends the request with "length" when it is the max_tokens-th, and with "stop"
// (which wins) when it completes an EOS id or a stop word's token sequence. The text of a
// token is the streaming detokenizer's new segment (after finalize on "length"); on "stop" it is
// not used (mlx_lm.server drops it).
//
// Requests wait their turn in a FIFO lock; a cancelled request (client gone) leaves the queue
// or stops after its current token, freeing the lock. Between tokens the loop yields to the
// event loop so that streamed chunks go out and disconnects are seen.
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type GenerateModel, generateStep } from "../model/generate.ts";
import { makeSampler, type Sampler, type SamplerOptions } from "../model/sample.ts";
import type { StopSequences } from "./text_state.ts";
import type { ServedTokenizer } from "./tokenizer.ts";

export interface TopToken {
  id: number;
  token: string;
  logprob: number;
}

/** One generated token as mlx_lm.server's Response carries it. */
export interface TokenResponse {
  text: string;
  token: number;
  logprob: number;
  finishReason: "stop" | "length" | null;
  /** _format_top_logprobs: the first top_n of argpartition(-logprobs, top_n - 1), in that (unsorted) order. */
  topTokens: TopToken[];
}

export interface EngineRequest {
  prompt: readonly number[];
  maxTokens: number;
  sampler: SamplerOptions;
  seed: number | null;
  topLogprobs: number;
  stop: StopSequences;
  /** Checked before the request starts and after every token. */
  cancelled: () => boolean;
}

/** A FIFO mutex: generation runs one request at a time. */
class Lock {
  private tail: Promise<void> = Promise.resolve();
  acquire(): Promise<() => void> {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const prev = this.tail;
    this.tail = prev.then(() => held);
    return prev.then(() => release);
  }
}

const tick = () => new Promise<void>((r) => setImmediate(r));

function valueAt(row: MlxArray, id: number): number {
  using one = mx.slice(row, [id], [id + 1]);
  return one.item() as number;
}

/** _format_top_logprobs(logprobs, top_n, tokenizer). */
function topTokens(row: MlxArray, n: number, tok: ServedTokenizer): TopToken[] {
  if (n <= 0) return [];
  using neg = mx.negative(row);
  using part = mx.argpartition(neg, n - 1, -1);
  using first = mx.slice(part, [0], [n]);
  using vals = mx.take(row, first);
  const ids = first.toNumbers();
  const lps = vals.toNumbers();
  return ids.map((id, i) => ({ id, token: tok.piece(id), logprob: lps[i]! }));
}

/** Compiled samplers kept across requests (mx.compile traces once per parameter set, as Python's module-level compiled filters do). */
const SAMPLER_CACHE_SIZE = 16;

export class Engine {
  private readonly lock = new Lock();
  private readonly samplers = new Map<string, Sampler>();

  constructor(
    private readonly model: GenerateModel,
    private readonly tokenizer: ServedTokenizer,
    private readonly prefillStepSize: number,
  ) {}

  private sampler(o: SamplerOptions): Sampler {
    const key = JSON.stringify([o.temp, o.topP, o.minP, o.topK]);
    let s = this.samplers.get(key);
    if (s) {
      this.samplers.delete(key); // most recently used last
    } else {
      s = makeSampler(o);
      if (this.samplers.size >= SAMPLER_CACHE_SIZE) {
        const [oldest, old] = this.samplers.entries().next().value!;
        this.samplers.delete(oldest);
        old.dispose?.();
      }
    }
    this.samplers.set(key, s);
    return s;
  }

  /** The request's tokens, in order; ends after the finishing token or on cancellation. */
  async *run(req: EngineRequest): AsyncGenerator<TokenResponse> {
    const release = await this.lock.acquire();
    let steps: AsyncGenerator<{ token: number; logprobs: MlxArray; n: number }> | null = null;
    try {
      if (req.cancelled()) return;
      steps = generateStep(this.model, req.prompt, {
        maxTokens: req.maxTokens,
        sampler: this.sampler(req.sampler),
        prefillStepSize: this.prefillStepSize,
        ...(req.seed !== null ? { seed: req.seed } : {}),
      });
      const matcher = req.stop.matcher();
      const detok = this.tokenizer.newDetokenizer();
      for await (const g of steps) {
        let finishReason: TokenResponse["finishReason"] = null;
        if (g.n + 1 >= req.maxTokens) finishReason = "length";
        if (matcher.advance(g.token)) finishReason = "stop";
        let text = "";
        if (finishReason !== "stop") {
          detok.addToken(g.token);
          if (finishReason === "length") detok.finalize();
          text = detok.lastSegment();
        }
        yield { text, token: g.token, logprob: valueAt(g.logprobs, g.token), finishReason, topTokens: topTokens(g.logprobs, req.topLogprobs, this.tokenizer) };
        if (finishReason !== null) return;
        await tick();
        if (req.cancelled()) return;
      }
    } finally {
      await steps?.return(undefined);
      release();
    }
  }
}
