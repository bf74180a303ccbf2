// Prompt-cache files (model/cache/prompt_cache.ts) interoperate with mlx-lm both ways, on every
// cache type a Gemma 4 model makes (KVCache; RotatingKVCache before and after its window wraps),
// dense / E2B-like / MoE, float32 and bfloat16 (oracle/speculative.ts promptCacheInterop):
//   - TS cachePrompt's caches equal mlx_lm.cache_prompt's, byte for byte;
//   - mlx-lm loads the TS file, continues, and matches its continuation from its own file
//     (tokens, logprob bytes), with the same loaded buffers;
//   - TS loads mlx-lm's file (and its own) and continues bit-exactly, caches included.
// Then the bad inputs: a truncated file, a file of another model, a file that is no cache.
import { afterAll, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { checkPromptCacheFits, loadPromptCache, PromptCacheError, savePromptCache, cachePrompt, canTrimPromptCache, trimPromptCache } from "../../model/cache/prompt_cache.ts";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { ModelPool, promptCacheInterop, type PromptCacheResult } from "../../oracle/speculative.ts";
import { limit } from "../../tests/time_limit.ts";

const CK = join(REPO_ROOT, ".cache", "checkpoints");
const pool = new ModelPool();
const tmp = mkdtempSync(join(tmpdir(), "pc-test-"));
afterAll(() => {
  pool.dispose();
  rmSync(tmp, { recursive: true, force: true });
});
const prompt = (P: number) => Array.from({ length: P }, (_, i) => (i * 37 + 11) % 256);

const results: PromptCacheResult[] = [];
afterAll(() => {
  const t = results.reduce((s, r) => s + r.written.tensors + r.tsFileInMlxLm.tensors + r.mlxLmFileInTs.tensors + r.tsFileInTs.tensors, 0);
  console.log(`[prompt cache] ${results.length} checkpoints x prompts, ${t} tensors bit-exact across TS and mlx-lm files`);
});

describe("prompt-cache files interoperate with mlx-lm both ways", () => {
  const cases = [
    { ckpt: "c1_dense/f32", P: 5, rotated: false },
    { ckpt: "c1_dense/f32", P: 20, rotated: true },
    { ckpt: "c3_e2b/bf16", P: 20, rotated: true },
    { ckpt: "c5_moe/f32", P: 12, rotated: true },
  ];
  for (const c of cases) {
    it(`${c.ckpt}, prompt ${c.P}${c.rotated ? " (sliding window wrapped)" : ""}`, async () => {
      const r = await promptCacheInterop(await sharedOracle(), pool, { checkpoint: join(CK, c.ckpt), prompt: prompt(c.P), suffix: [7, 8, 9], maxTokens: 6 });
      results.push(r);
      expect(new Set(r.types)).toEqual(new Set(["KVCache", "RotatingKVCache"]));
      expect(r.rotated).toBe(c.rotated);
      for (const t of [r.written, r.tsFileInMlxLm, r.mlxLmFileInTs, r.tsFileInTs]) {
        expect(t.first).toBeNull();
        expect(t.tensors).toBeGreaterThan(0);
      }
    }, limit(120_000));
  }
});

describe("prompt-cache files: trim and bad input", () => {
  const model = () => pool.generation(join(CK, "c1_dense", "f32"));
  function written(name: string, P: number): string {
    const m = model();
    const cache = m.makeCache();
    try {
      cachePrompt(m, prompt(P), cache);
      const file = join(tmp, `${name}.safetensors`);
      savePromptCache(file, cache, { model: "c1" });
      return file;
    } finally {
      for (const c of cache) c.dispose();
    }
  }

  it("trim_prompt_cache is all-or-nothing, as mlx-lm's", () => {
    const inside = loadPromptCache(written("in", 5)).cache;
    const past = loadPromptCache(written("past", 20)).cache;
    try {
      expect(canTrimPromptCache(inside)).toBe(true);
      expect(trimPromptCache(inside, 2)).toBe(2);
      expect(inside.map((c) => c.offset)).toEqual(inside.map(() => 3));
      expect(canTrimPromptCache(past)).toBe(false);
      expect(trimPromptCache(past, 2)).toBe(0);
      expect(past.map((c) => c.offset)).toEqual(past.map(() => 20));
    } finally {
      for (const c of [...inside, ...past]) c.dispose();
    }
  });

  it("a truncated file is one clear error", () => {
    const file = written("trunc", 5);
    const bytes = readFileSync(file);
    for (const n of [4, 100, bytes.length - 37]) {
      const cut = join(tmp, `cut-${n}.safetensors`);
      writeFileSync(cut, bytes.subarray(0, n));
      expect(() => loadPromptCache(cut)).toThrow(PromptCacheError);
      expect(() => loadPromptCache(cut)).toThrow(/cut-\d+\.safetensors: not a readable safetensors file/);
    }
  });

  it("a file of another model, or no cache at all, is one clear error", () => {
    const file = written("other", 5);
    const { cache } = loadPromptCache(file);
    const e2b = pool.model(join(CK, "c3_e2b", "f32")).text;
    const fresh = e2b.makeCache();
    try {
      const shapes = fresh.map((_, i) => ({ heads: e2b.layers[i]!.self_attn.n_kv_heads, headDim: e2b.layers[i]!.self_attn.head_dim }));
      expect(() => checkPromptCacheFits(file, cache, fresh, shapes)).toThrow(/holds 6 layer caches, but this model makes 4: the file was written for another model/);
    } finally {
      for (const c of [...cache, ...fresh]) c.dispose();
    }
    expect(() => loadPromptCache(join(CK, "c1_dense", "f32", "model.safetensors"))).toThrow(/not a prompt-cache file/);
    expect(() => loadPromptCache(join(tmp, "missing.safetensors"))).toThrow(/no such prompt-cache file/);
  });
});
