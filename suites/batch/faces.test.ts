// batch_generate and the batch faces: the library's batch_generate against mlx-lm's (EOS tokens
// dropped, per-prompt max_tokens, each token's logprob), `npm run generate` in batch mode against
// mlx-lm's batch_generate, and one clear error for each kind of bad input (an empty batch, a
// prompt longer than the model allows, bad flags), from the library and from the commands.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type OracleClient, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { CacheError, KVCache, RotatingKVCache } from "../../model/cache/index.ts";
import { BatchKVCache, BatchRotatingKVCache } from "../../model/cache/batch.ts";
import { BatchGenerator, batchGenerate, batchModel } from "../../model/generate_batch.ts";
import { GenerateError } from "../../model/generate.ts";
import { CKPT_ROOT, freeModels, model } from "../generation/parity.ts";
import * as mx from "@mlx-bun/mlx";
import { limit } from "../../tests/time_limit.ts";

let oracle: OracleClient;
const tmp = mkdtempSync(join(tmpdir(), "batch-faces-"));
beforeAll(async () => {
  oracle = await sharedOracle();
}, limit(120_000));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
  freeModels();
});

const CK = "c1_dense/f32";
const PROMPTS = [[5, 9, 17, 33, 2], [80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90], [2, 4]];
const stub = (eos: number[]) => ({ eosTokenIds: eos, decode: (ids: number[]) => ids.join(" ") });

interface PyBatch {
  token_ids: number[][];
  logprobs: number[][];
  stats: { prompt_tokens: number; generation_tokens: number };
}

describe("batch_generate vs mlx-lm's", () => {
  it("EOS stops (the EOS token dropped), per-prompt max_tokens, logprobs of the generated tokens", async () => {
    // an EOS that fires: the second token mlx-lm generates for the first prompt without one
    const free = await oracle.request<PyBatch>("batch_generate", { checkpoint: CK, prompts: PROMPTS, max_tokens: 8 });
    const eos = [free.token_ids[0]![1]!];
    const maxTokens = [8, 5, 7];
    const py = await oracle.request<PyBatch>("batch_generate", { checkpoint: CK, prompts: PROMPTS, max_tokens: maxTokens, eos_token_ids: eos, prefill_step_size: 4 });
    const ts = batchGenerate(batchModel(model(CK)), stub(eos), PROMPTS, { maxTokens, prefillStepSize: 4 });
    expect(ts.tokenIds).toEqual(py.token_ids);
    expect(ts.logprobs).toEqual(py.logprobs);
    expect(ts.texts[0]).toBe(py.token_ids[0]!.join(" "));
    expect(ts.stats.promptTokens).toBe(py.stats.prompt_tokens);
    expect(ts.stats.generationTokens).toBe(py.stats.generation_tokens);
    // the stop happened and its token is not in the output
    expect(ts.tokenIds[0]!.length).toBeLessThan(maxTokens[0]!);
    expect(ts.tokenIds.flat()).not.toContain(eos[0]);
  }, limit(60_000));

  it("returnPromptCaches: one caller-owned cache list per prompt, in prompt order", () => {
    const r = batchGenerate(batchModel(model(CK)), stub([]), PROMPTS, { maxTokens: [3, 2, 4], returnPromptCaches: true });
    try {
      expect(r.caches!.map((c) => c[0]!.offset)).toEqual(PROMPTS.map((p, i) => p.length + [3, 2, 4][i]!));
      expect(r.caches![0]![2]).toBeInstanceOf(KVCache);
      expect(r.caches![0]![0]).toBeInstanceOf(RotatingKVCache);
    } finally {
      for (const c of r.caches!.flat()) c.dispose();
    }
  }, limit(60_000));
});

function generateCli(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(join(REPO_ROOT, "node_modules", ".bin", "bun"), ["run", join(REPO_ROOT, "parity", "generate_cli.ts"), ...args], { encoding: "utf8", cwd: REPO_ROOT, timeout: limit(120_000) });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe("npm run generate in batch mode", () => {
  it("repeated --tokens: the completions of mlx-lm's batch_generate, then its statistics lines", async () => {
    const dir = join(CKPT_ROOT, CK);
    const r = generateCli(["--model", dir, ...PROMPTS.flatMap((p) => ["--tokens", p.join(",")]), "--max-tokens", "6", "--prefill-batch-size", "2"]);
    expect(r.stderr).toContain("Finished processing 3/3");
    expect(r.status).toBe(0);
    const py = await oracle.request<PyBatch>("batch_generate", { checkpoint: CK, prompts: PROMPTS, max_tokens: 6, prefill_batch_size: 2 });
    const lines = r.stdout.split("\n").filter((l) => /^\[\d+\] /.test(l));
    expect(lines.map((l) => l.replace(/^\[\d+\] /, "").split(" ").map(Number))).toEqual(py.token_ids);
    expect(r.stdout).toMatch(/\[batch_generate\] Prompt: \d+ tokens, [\d.]+ tokens-per-sec/);
    expect(r.stdout).toMatch(/\[batch_generate\] Generation: 18 tokens, [\d.]+ tokens-per-sec/);
    expect(r.stdout).toMatch(/\[batch_generate\] Peak memory: [\d.]+ GB/);
  }, limit(120_000));

  const dir = join(CKPT_ROOT, CK);
  const cases: [string, string[], RegExp][] = [
    ["an empty prompt file", ["--prompt-file", "EMPTY"], /the batch is empty: .* has no non-empty line/],
    ["a missing prompt file", ["--prompt-file", join(tmp, "nope.txt")], /--prompt-file: no such file/],
    ["text and token prompts mixed", ["--tokens", "1,2", "--tokens", "3", "--prompt", "hi"], /not both/],
    ["an empty --tokens", ["--tokens", "1,2", "--tokens", ","], /--tokens needs comma-separated non-negative integers/],
    ["a prompt longer than the model allows", ["--tokens", "1,2", "--tokens", Array.from({ length: 4095 }, () => "7").join(","), "--max-tokens", "4"], /prompt 2: the prompt \(4095 tokens\) plus 4 decode steps exceeds the model's max_position_embeddings \(4096\)/],
    ["a token outside the vocabulary", ["--tokens", "1,2", "--tokens", "3,999"], /prompt 2: token id 999 is outside the vocabulary/],
    ["--prefill-batch-size 0", ["--tokens", "1,2", "--tokens", "3", "--prefill-batch-size", "0"], /--prefill-batch-size must be at least 1/],
    ["--completion-batch-size without a number", ["--tokens", "1,2", "--tokens", "3", "--completion-batch-size", "many"], /--completion-batch-size needs an integer/],
    ["--chat with token prompts", ["--tokens", "1,2", "--tokens", "3", "--chat"], /--chat needs text prompts/],
  ];
  for (const [what, args, msg] of cases) {
    it(`${what}: exit 2 and one error line`, () => {
      const empty = join(tmp, "empty.txt");
      writeFileSync(empty, "\n  \n");
      const r = generateCli(["--model", dir, ...args.map((x) => (x === "EMPTY" ? empty : x))]);
      expect(r.status).toBe(2);
      const errs = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
      expect(errs.length).toBe(1);
      expect(errs[0]).toMatch(msg);
      expect(r.stdout).toBe("");
    }, limit(60_000));
  }
});

describe("npm run parity -- --mode batch: bad flags", () => {
  const cases: [string[], RegExp][] = [
    [["--mode", "batch", "--prompt", "hi"], /--prompt does not apply to --mode batch/],
    [["--mode", "sideways"], /unknown --mode sideways \(modes: .*batch/],
    [["--mode", "batch", "--scenario", "nope"], /unknown batch scenario nope \(known: straddle_window,/],
    [["--mode", "batch", "--ulp", "2"], /--mode batch compares bit for bit/],
    [["--scenario", "sampled"], /--scenario applies to --mode batch/],
  ];
  for (const [args, msg] of cases) {
    it(`${args.join(" ")}: exit 2 and one error line`, () => {
      const r = spawnSync(join(REPO_ROOT, "node_modules", ".bin", "bun"), ["run", join(REPO_ROOT, "parity", "cli.ts"), ...args], { encoding: "utf8", cwd: REPO_ROOT, timeout: limit(60_000) });
      expect(r.status).toBe(2);
      const errs = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
      expect(errs.length).toBe(1);
      expect(errs[0]).toMatch(msg);
    }, limit(60_000));
  }
});

describe("bad input to the library: one clear error each", () => {
  const m = () => batchModel(model(CK));

  it("an empty batch", () => {
    expect(() => batchGenerate(m(), stub([]), [])).toThrow(new GenerateError("batch_generate needs at least one prompt (mlx-lm returns an empty response for an empty batch)"));
  });

  it("an empty prompt, a non-positive max_tokens, options of the wrong length (and nothing is queued)", () => {
    const g = new BatchGenerator(m());
    try {
      expect(() => g.insert([[1, 2], []])).toThrow(new GenerateError("Sequence 1 has an empty prompt."));
      expect(() => g.insert([[1, 2]], { maxTokens: [0] })).toThrow(new GenerateError("Sequence 0's max_tokens must be > 0."));
      expect(() => g.insert([[1, 2], [3]], { maxTokens: [4] })).toThrow(new GenerateError("Option max_tokens must have one entry per segment: expected 2, got 1."));
      expect(() => g.insert([[1, -2]])).toThrow(/token ids must be non-negative integers/);
      expect(g.next()).toEqual([[], []]);
    } finally {
      g.close();
    }
  });

  it("a prompt longer than the model allows", () => {
    const g = new BatchGenerator(m());
    try {
      expect(() => g.insert([Array.from({ length: 4090 }, () => 3)], { maxTokens: [7] })).toThrow(
        new GenerateError("Sequence 0: its prompt (4090 tokens) plus max_tokens 7 exceeds the model's max_position_embeddings (4096)"),
      );
    } finally {
      g.close();
    }
  });

  it("bad generator options and bad batch-cache calls", () => {
    expect(() => new BatchGenerator(m(), { prefillBatchSize: 0 })).toThrow(new GenerateError("prefillBatchSize must be a positive integer, got 0"));
    const a = new RotatingKVCache(8);
    const b = new RotatingKVCache(4);
    expect(() => BatchRotatingKVCache.merge([a, b])).toThrow(new CacheError("BatchRotatingKVCache.merge", "BatchRotatingKVCache can only merge caches with the same maximum size"));
    const c = new BatchRotatingKVCache(8, [0, 0]);
    try {
      c.prepare({ lengths: [1, 3], rightPadding: [2, 0] });
      using k = mx.zeros([2, 1, 1, 4]);
      expect(() => c.updateAndFetch(k, k)).toThrow(/finalize\(\) should be called before decoding/);
      using k3 = mx.zeros([3, 1, 2, 4]);
      expect(() => c.updateAndFetch(k3, k3)).toThrow(/keys hold 3 sequences, the cache 2/);
      expect(() => c.filter([])).toThrow(/non-empty list of batch indices/);
      expect(() => c.filter([2])).toThrow(/batch index 2 is out of range for a batch of 2/);
      // a filter that would shift more padding than there are columns (mlx-lm: a negative _idx)
      using kv = new BatchKVCache([3, 0]);
      using k1 = mx.zeros([2, 1, 1, 4]);
      kv.updateAndFetch(k1, k1).forEach((a) => a.dispose());
      expect(() => kv.filter([0])).toThrow(new CacheError("BatchKVCache.filter", "the kept sequences' left padding (3) exceeds the 1 columns written: their offsets are negative"));
    } finally {
      c.dispose();
      a.dispose();
      b.dispose();
    }
  });
});

describe("ownership: a batched run leaves no native handle behind", () => {
  it("BatchGenerator (joins, removals, stops, finishes) and batch_generate with returned caches, after close()", () => {
    const m = batchModel(model(CK));
    const run = () => {
      const g = new BatchGenerator(m, { stopTokens: [[7]], prefillStepSize: 4, completionBatchSize: 2, prefillBatchSize: 1 });
      try {
        g.insert(PROMPTS, { maxTokens: [6, 3, 9] });
        for (let i = 0; i < 40; i++) {
          if (i === 3) g.insert([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], { maxTokens: [4] });
          if (i === 6) g.remove([0]);
          const [p, r] = g.next();
          if (i === 5) g.extractCache([1, 3]).forEach((x) => x.cache.forEach((c) => c.dispose()));
          if (p.length === 0 && r.length === 0 && i > 6) break;
        }
      } finally {
        g.close();
      }
      const out = batchGenerate(m, stub([]), PROMPTS, { maxTokens: 4, returnPromptCaches: true });
      for (const c of out.caches!.flat()) c.dispose();
    };
    run(); // warm-up: compiled closures, RoPE tables
    const before = mx.liveHandles();
    run();
    run();
    expect(mx.liveHandles()).toBe(before);
  }, limit(120_000));
});
