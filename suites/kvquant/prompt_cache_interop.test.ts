// Prompt-cache files holding a TurboQuant cache, both ways between the port and mlx-vlm 0.7.10
// (the interop format: model/cache/prompt_cache.ts's header, oracle/python/kv_quant_prompt_cache.py).
//
// On the c1_dense f32 fixture (13-token prompt in prefill chunks of 4, TurboQuant 4 bits,
// quantized_kv_start 0: cache 2 is converted; the sliding window of 8 is crossed):
// - both sides run generate_step(prompt, max_tokens=1) and save their caches: the port with
//   savePromptCache, Python with mlx-lm's own save_prompt_cache on mlx-vlm's cache objects (plus
//   their meta_state in the user metadata). The two files must hold the same class names, the
//   same meta_states and the same tensors bit for bit, key by key;
// - each side loads the other's file and continues with a 3-token suffix for 4 tokens; both runs
//   must equal mlx-vlm's own in-memory continuation (no file) per step: token, logprobs sha256,
//   every cache's type and offset, and every TurboQuant state array (sha256, shape, dtype) and
//   meta_state; the port's own in-memory continuation too;
// - the generate face (`npm run generate -- --prompt-cache-file F --tokens …`) on mlx-vlm's file
//   prints mlx-vlm's continuation tokens;
// - mlx-vlm's inherited from_state is checked to fail on TurboQuantKVCache (as the loader's comment
//   says: why the Python loader builds the cache with __init__ and sets state + meta_state) and on
//   HybridQuantKVCache (which the format does not carry);
// - bad input to the loader (broken meta_state JSON, a missing tensor, an unknown class) is one
//   PromptCacheError each; a Split-codec cache is refused at save.
import { afterAll, describe, expect, test } from "vitest";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { KVCache, type KVCacheLike } from "../../model/cache/index.ts";
import { makeKvQuantizer } from "../../model/cache/kv_quantize.ts";
import { loadPromptCache, PromptCacheError, savePromptCache, VLM_META_STATE_KEY } from "../../model/cache/prompt_cache.ts";
import { TurboQuantKVCache } from "../../model/cache/turboquant.ts";
import { TurboQuantSplitKVCache } from "../../model/cache/turboquant_split.ts";
import { generateStep, type GenerateModel } from "../../model/generate.ts";
import { loadModel } from "../../model/gemma4/index.ts";
import { generationModel } from "../../model/runtime.ts";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { cacheRecord, compareGenerations, type StepRecord } from "../../oracle/kv_quant.ts";
import { limit } from "../../tests/time_limit.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints", "c1_dense", "f32");
const PROMPT = Array.from({ length: 13 }, (_, i) => (i * 37 + 11) % 256);
const SUFFIX = [5, 6, 7];
const N = 4;
const KV = { kv_bits: 4, kv_quant_scheme: "turboquant", quantized_kv_start: 0, prefill_step_size: 4 };
const tmp = mkdtempSync(join(tmpdir(), "kvq-prompt-cache-"));
const F_TS = join(tmp, "port.safetensors");
const F_PY = join(tmp, "mlx_vlm.safetensors");

afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function oracle(job: Record<string, unknown>): any {
  const r = spawnSync(DEFAULT_PYTHON, [join(REPO_ROOT, "oracle", "python", "kv_quant_prompt_cache.py")], { input: JSON.stringify(job), encoding: "utf8", maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`kv_quant_prompt_cache.py failed (exit ${r.status}): ${r.stderr.slice(-2000)}`);
  return JSON.parse(r.stdout);
}

const sha = (a: mx.MlxArray) => createHash("sha256").update(a.toBytes()).digest("hex");

async function steps(model: GenerateModel, tokens: number[], cache: KVCacheLike[], maxTokens: number): Promise<StepRecord[]> {
  const quantizeCache = makeKvQuantizer({ kvBits: KV.kv_bits, kvQuantScheme: "turboquant", kvGroupSize: 64, quantizedKvStart: KV.quantized_kv_start })!;
  const out: StepRecord[] = [];
  for await (const t of generateStep(model, tokens, { maxTokens, prefillStepSize: KV.prefill_step_size, promptCache: cache, quantizeCache })) {
    using lp32 = mx.astype(t.logprobs, "float32");
    out.push({ token: t.token, logprobs_sha256: sha(lp32), cache: cache.map(cacheRecord) });
  }
  return out;
}

/** A file's tensors (sha256 of their bytes, dtype, shape) and metadata, for a key-by-key comparison. */
function fileDigest(file: string) {
  const { arrays, metadata } = mx.loadSafetensors(file);
  try {
    const tensors = Object.fromEntries([...arrays].sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, a]) => [k, `${a.dtype}[${a.shape}] ${sha(a)}`]));
    const meta: Record<string, unknown> = { ...metadata, [`0.${VLM_META_STATE_KEY}`]: JSON.parse(metadata[`0.${VLM_META_STATE_KEY}`] ?? "null") };
    delete meta["0.model"];
    return { tensors, meta };
  } finally {
    for (const a of arrays.values()) a.dispose();
  }
}

function expectSame(label: string, port: StepRecord[], ref: StepRecord[]) {
  const c = compareGenerations({ steps: port, error: null }, { steps: ref, error: null });
  expect({ label, mismatch: c.firstMismatch }).toEqual({ label, mismatch: null });
  expect(c.tokens).toBe(N);
  expect(c.turboCaches).toBe(1);
  expect(c.quantizedArrays).toBe(4 * N);
}

describe("prompt-cache files with a TurboQuant cache: port <-> mlx-vlm", () => {
  test("each side continues from the other's file bit for bit", async () => {
    const loaded = loadModel(CKPT);
    const model = generationModel(loaded);
    // the port writes its file, then continues in memory
    const cache = model.makeCache();
    let tsFirst: StepRecord[];
    let tsSaved: StepRecord["cache"];
    let tsMem: StepRecord[];
    try {
      tsFirst = await steps(model, PROMPT, cache, 1);
      savePromptCache(F_TS, cache, { model: CKPT });
      tsSaved = cache.map(cacheRecord);
      tsMem = await steps(model, SUFFIX, cache, N);
    } finally {
      for (const c of cache) c.dispose();
    }
    // mlx-vlm writes its file and continues in memory; then loads the port's file and continues
    const common = { checkpoint: CKPT, suffix: SUFFIX, max_tokens: N, ...KV };
    const [pyWrite, pyFromTs, probe] = oracle({
      command: "many",
      jobs: [{ command: "write", prompt: PROMPT, file: F_PY, ...common }, { command: "continue", file: F_TS, ...common }, { command: "from_state_probe" }],
    }).results;
    // the port loads mlx-vlm's file and continues
    const { cache: fromPy, metadata } = loadPromptCache(F_PY);
    let tsLoaded: StepRecord["cache"];
    let tsFromPy: StepRecord[];
    try {
      tsLoaded = fromPy.map(cacheRecord);
      tsFromPy = await steps(model, SUFFIX, fromPy, N);
    } finally {
      for (const c of fromPy) c.dispose();
    }

    expect(metadata).toEqual({ model: CKPT });
    expect(tsFirst.map((s) => s.token)).toEqual(pyWrite.first.map((s: StepRecord) => s.token));
    const snap = (cache: StepRecord["cache"]): StepRecord[] => [{ token: 0, logprobs_sha256: "", cache }];
    const snapCmp = (a: StepRecord["cache"], b: StepRecord["cache"]) => compareGenerations({ steps: snap(a), error: null }, { steps: snap(b), error: null }).firstMismatch;
    expect(snapCmp(tsSaved, pyWrite.saved)).toBeNull(); // the saved caches, before writing
    expect(snapCmp(tsLoaded, pyWrite.saved)).toBeNull(); // the port's load of mlx-vlm's file
    expect(snapCmp(pyFromTs.loaded, pyWrite.saved)).toBeNull(); // mlx-vlm's load of the port's file
    expect(pyWrite.saved.map((c: { type: string }) => c.type)).toContain("TurboQuantKVCache");

    // the two files, key by key
    const a = fileDigest(F_TS);
    const b = fileDigest(F_PY);
    expect(Object.keys(a.tensors).length).toBe(4 + 2 * 5); // 4 TurboQuant arrays + keys/values of 5 other caches
    expect(a).toEqual(b);

    expectSame("mlx-vlm continuing from the port's file", pyFromTs.continued, pyWrite.continued);
    expectSame("the port continuing from mlx-vlm's file", tsFromPy, pyWrite.continued);
    expectSame("the port continuing in memory", tsMem, pyWrite.continued);

    // the generate face's loader on mlx-vlm's file
    const face = spawnSync("bun", ["run", join(REPO_ROOT, "parity", "generate_cli.ts"), "--prompt-cache-file", F_PY, "--tokens", SUFFIX.join(","), "--max-tokens", String(N)], { encoding: "utf8", cwd: REPO_ROOT });
    expect({ status: face.status, stderr: face.status === 0 ? "" : face.stderr }).toEqual({ status: 0, stderr: "" });
    const printed = face.stdout.split("==========")[1]!.trim().split(/\s+/).map(Number);
    expect(printed).toEqual(pyWrite.continued.map((s: StepRecord) => s.token));

    expect(probe).toEqual({
      TurboQuantKVCache: { type: "AttributeError", message: "'TurboQuantKVCache' object has no attribute 'key_codec'" },
      HybridQuantKVCache: { type: "AttributeError", message: "'HybridQuantKVCache' object has no attribute 'key_quantizer'" },
    });
    loaded.model.dispose();
  }, limit(60_000));
});

describe("the interop format: bad input is one clear error", () => {
  test("a broken or mismatched mlx_vlm_meta_state, a missing TurboQuant tensor, a Split cache to save", () => {
    // a small file of one TurboQuant cache and one KVCache, written by the port (no model needed)
    const t = new TurboQuantKVCache(4);
    const kv = new KVCache();
    const file = join(tmp, "small.safetensors");
    mx.random.seed(1);
    using k = mx.random.normal({ shape: [1, 2, 3, 32] });
    using v = mx.random.normal({ shape: [1, 2, 3, 32] });
    for (const a of [...t.updateAndFetch(k, v), ...kv.updateAndFetch(k, v)]) a.dispose();
    try {
      savePromptCache(file, [t, kv]);
    } finally {
      t.dispose();
      kv.dispose();
    }
    const rewrite = (name: string, edit: (arrays: Map<string, mx.MlxArray>, meta: Record<string, string>) => void): string => {
      const { arrays, metadata } = mx.loadSafetensors(file);
      try {
        edit(arrays, metadata);
        const out = join(tmp, name);
        mx.saveSafetensors(out, arrays, metadata);
        return out;
      } finally {
        for (const a of arrays.values()) a.dispose();
      }
    };
    const back = loadPromptCache(file);
    expect(back.cache.map((c) => c.constructor.name)).toEqual(["TurboQuantKVCache", "KVCache"]);
    for (const c of back.cache) c.dispose();
    const cases: [string, string, RegExp][] = [
      ["not JSON", rewrite("a.safetensors", (_, m) => (m[`0.${VLM_META_STATE_KEY}`] = "[")), /\[0\.mlx_vlm_meta_state\]: not JSON/],
      ["one meta_state short", rewrite("b.safetensors", (_, m) => (m[`0.${VLM_META_STATE_KEY}`] = '[["3","4.0","0","4.0","4.0"]]')), /must be a JSON list of 2 meta_states/],
      ["a TurboQuant tensor missing", rewrite("c.safetensors", (a) => { a.get("0.1.1")!.dispose(); a.delete("0.1.1"); }), /\[0\.1\.1\]: missing tensor/],
      ["an unknown class", rewrite("d.safetensors", (_, m) => (m["1.0"] = "PolarKVCache")), /unsupported cache class "PolarKVCache"/],
    ];
    let ran = 0;
    for (const [, f, re] of cases) {
      expect(() => loadPromptCache(f)).toThrow(PromptCacheError);
      expect(() => loadPromptCache(f)).toThrow(re);
      ran++;
    }
    expect(ran).toBe(4);
    // mlx-vlm cannot restore a Split codec from a file (its outlier dims are in neither state nor meta_state)
    const s = new TurboQuantSplitKVCache(4, { keyBits: 3.5 });
    try {
      for (const a of s.updateAndFetch(k, v)) a.dispose();
      expect(() => savePromptCache(join(tmp, "split.safetensors"), [s])).toThrow(/cannot save a TurboQuantSplitKVCache/);
    } finally {
      s.dispose();
    }
  });
});
