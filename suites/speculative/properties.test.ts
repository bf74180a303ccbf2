// Seeded properties of speculative decoding and prompt-cache files (fast-check, the shared
// harness of suites/properties: PROPERTY_RUNS cases each, default 200; a failure prints its seed
// and the shrunk counterexample). No oracle: the properties are invariants of the TS code.
//
//   1. speculative greedy ≡ plain greedy: tokens and logprob bytes, for random prompts, sliding
//      windows (the 2-layer `tiny` fixture loaded with another sliding_window) and draft lengths,
//      with a perturbed draft or the model itself as draft;
//   2. save → load is the identity: class, integers and buffer bytes, and the next update returns
//      the same keys/values;
//   3. trim n, then feed the same n tokens again ≡ never trimmed (while the cache is trimmable).
import { afterAll, describe, expect, it } from "vitest";
import fc from "fast-check";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVCache, type KVCacheLike, RotatingKVCache } from "../../model/cache/index.ts";
import { loadPromptCache, savePromptCache } from "../../model/cache/prompt_cache.ts";
import { generateStep, type GenerateModel } from "../../model/generate.ts";
import { speculativeGenerateStep } from "../../model/generate_speculative.ts";
import { type LoadedModel, loadModel } from "../../model/gemma4/index.ts";
import { generationModel } from "../../model/runtime.ts";
import { ROWS_INVARIANT } from "./rows.ts";
import { REPO_ROOT } from "../../oracle/client.ts";
import { checkProperty, propertyTimeout } from "../properties/harness.ts";

const SP = join(REPO_ROOT, ".cache", "checkpoints", "speculative");
const tmp = mkdtempSync(join(tmpdir(), "spec-props-"));
const loaded: LoadedModel[] = [];
afterAll(() => {
  for (const m of loaded) m.model.dispose();
  rmSync(tmp, { recursive: true, force: true });
});

/** The tiny fixture (or its draft) with another sliding_window: same weights, edited config. */
const models = new Map<string, GenerateModel>();
function tinyWithWindow(name: "tiny" | "tiny_draft", window: number): GenerateModel {
  const key = `${name}/${window}`;
  let m = models.get(key);
  if (!m) {
    const dir = join(tmp, `${name}-w${window}`);
    mkdirSync(dir);
    const cfg = JSON.parse(readFileSync(join(SP, name, "config.json"), "utf8"));
    cfg.sliding_window = window;
    writeFileSync(join(dir, "config.json"), JSON.stringify(cfg));
    symlinkSync(join(SP, name, "model.safetensors"), join(dir, "model.safetensors"));
    const l = loadModel(dir);
    loaded.push(l);
    models.set(key, (m = generationModel(l)));
  }
  return m;
}

const hex = (a: MlxArray) => Buffer.from(a.toBytes()).toString("hex");


describe("properties of speculative decoding", () => {
  it.skipIf(!ROWS_INVARIANT)("speculative greedy ≡ plain greedy (tokens and logprob bytes) for random prompts, windows and draft lengths (CPU device: rows invariant)", async () => {
    let rounds = 0;
    let accepted = 0;
    let drafted = 0;
    await checkProperty(
      "spec-greedy-equals-plain-greedy",
      fc.asyncProperty(
        fc.record({
          window: fc.integer({ min: 2, max: 10 }),
          prompt: fc.array(fc.integer({ min: 0, max: 63 }), { minLength: 1, maxLength: 10 }),
          k: fc.integer({ min: 1, max: 3 }),
          N: fc.integer({ min: 1, max: 4 }),
          self: fc.boolean(),
          draftWindow: fc.integer({ min: 2, max: 10 }),
        }),
        async ({ window, prompt, k, N, self, draftWindow }) => {
          const model = tinyWithWindow("tiny", window);
          const draft = self ? model : tinyWithWindow("tiny_draft", draftWindow);
          const want: string[] = [];
          for await (const t of generateStep(model, prompt, { maxTokens: N })) want.push(`${t.token}:${hex(t.logprobs)}`);
          const got: string[] = [];
          for await (const t of speculativeGenerateStep(model, draft, prompt, {
            maxTokens: N,
            numDraftTokens: k,
            onRound: (r) => {
              rounds++;
              accepted += r.accepted;
              drafted += r.drafted.length;
            },
          })) got.push(`${t.token}:${hex(t.logprobs)}`);
          expect(got).toEqual(want);
        },
      ),
    );
    console.log(`[properties] speculative ≡ greedy: ${rounds} rounds, ${accepted}/${drafted} drafts accepted`);
    expect(accepted).toBeGreaterThan(0);
    expect(accepted).toBeLessThan(drafted);
  }, propertyTimeout(120_000));
});

// ------------------------------------------------------------------ cache-level properties

/** Random keys (1, H, S, D) in a given dtype; deterministic from the seed. */
function randomKV(seed: number, H: number, S: number, D: number, dtype: mx.Dtype): MlxArray {
  using k = mx.random.key(seed);
  using n = mx.random.normal({ shape: [1, H, S, D], key: k });
  return mx.astype(n, dtype);
}

interface CacheSpec {
  rotating: boolean;
  window: number;
  dtype: mx.Dtype;
  chunks: number[];
  seed: number;
}

const arbCache: fc.Arbitrary<CacheSpec> = fc.record({
  rotating: fc.boolean(),
  window: fc.integer({ min: 1, max: 12 }),
  dtype: fc.constantFrom<mx.Dtype>("float32", "bfloat16", "float16"),
  chunks: fc.array(fc.integer({ min: 1, max: 9 }), { minLength: 0, maxLength: 6 }),
  seed: fc.integer({ min: 0, max: 1 << 30 }),
});

const H = 2;
const D = 4;

function makeCache(s: CacheSpec): KVCacheLike {
  return s.rotating ? new RotatingKVCache(s.window, 0) : new KVCache();
}

function feed(c: KVCacheLike, seed: number, S: number, dtype: mx.Dtype): [string, string] {
  using k = randomKV(seed, H, S, D, dtype);
  using v = randomKV(seed + 1, H, S, D, dtype);
  const [a, b] = c.updateAndFetch(k, v);
  try {
    return [hex(a), hex(b)];
  } finally {
    a.dispose();
    b.dispose();
  }
}

function describeCache(c: KVCacheLike): string {
  const buf = c as KVCache | RotatingKVCache;
  return JSON.stringify({ cls: c.constructor.name, meta: c.metaState, k: buf.keys ? [buf.keys.dtype, buf.keys.shape, hex(buf.keys)] : null, v: buf.values ? hex(buf.values) : null });
}

describe("properties of prompt-cache files", () => {
  it("save → load is the identity (class, integers, buffer bytes, and the next update)", () => {
    let n = 0;
    checkProperty(
      "prompt-cache-roundtrip",
      fc.property(fc.array(arbCache, { minLength: 1, maxLength: 4 }), fc.integer({ min: 1, max: 5 }), (specs, probe) => {
        const caches = specs.map(makeCache);
        const file = join(tmp, `rt-${n++}.safetensors`);
        try {
          specs.forEach((s, i) => s.chunks.forEach((S, j) => feed(caches[i]!, s.seed + 7 * j, S, s.dtype)));
          savePromptCache(file, caches, { model: "m", n: String(n) });
          const { cache: back, metadata } = loadPromptCache(file);
          try {
            expect(metadata).toEqual({ model: "m", n: String(n) });
            expect(back.map(describeCache)).toEqual(caches.map(describeCache));
            specs.forEach((s, i) => {
              if (caches[i]!.empty()) return; // an empty cache takes any dtype
              expect(feed(back[i]!, s.seed + 999, probe, s.dtype)).toEqual(feed(caches[i]!, s.seed + 999, probe, s.dtype));
            });
          } finally {
            for (const c of back) c.dispose();
          }
        } finally {
          for (const c of caches) c.dispose();
          rmSync(file, { force: true });
        }
      }),
    );
  }, propertyTimeout(60_000));

  it("trim n, then feed the same n tokens ≡ never trimmed (while trimmable)", () => {
    let trims = 0;
    checkProperty(
      "trim-then-refeed",
      fc.property(arbCache, fc.integer({ min: 1, max: 12 }), fc.integer({ min: 1, max: 5 }), (s, nRaw, probe) => {
        if (s.chunks.length === 0) return;
        const a = makeCache(s);
        const b = makeCache(s);
        try {
          // both see the same history; `b` then trims n of the last chunk's tokens and gets them back
          s.chunks.forEach((S, j) => {
            feed(a, s.seed + 7 * j, S, s.dtype);
            feed(b, s.seed + 7 * j, S, s.dtype);
          });
          const last = s.chunks[s.chunks.length - 1]!;
          const n = ((nRaw - 1) % last) + 1;
          if (!b.isTrimmable()) return;
          trims++;
          expect(b.trim(n)).toBe(n);
          using k = randomKV(s.seed + 7 * (s.chunks.length - 1), H, last, D, s.dtype);
          using v = randomKV(s.seed + 7 * (s.chunks.length - 1) + 1, H, last, D, s.dtype);
          using kt = mx.slice(k, [0, 0, last - n, 0], [1, H, last, D]);
          using vt = mx.slice(v, [0, 0, last - n, 0], [1, H, last, D]);
          const [x, y] = b.updateAndFetch(kt, vt);
          x.dispose();
          y.dispose();
          expect(b.offset).toBe(a.offset);
          expect(feed(b, s.seed + 999, probe, s.dtype)).toEqual(feed(a, s.seed + 999, probe, s.dtype));
        } finally {
          a.dispose();
          b.dispose();
        }
      }),
    );
    expect(trims).toBeGreaterThan(0);
  }, propertyTimeout(60_000));
});
