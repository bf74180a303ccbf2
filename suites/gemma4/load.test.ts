// Loading: layouts (flat gemma4_text, gemma4 wrapper, raw Hugging Face) give the same logits
// bytes; bad checkpoints give one clear error naming the file and the key.

import { afterAll, describe, expect, it } from "vitest";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, truncateSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { ConfigError, loadModel, WeightsError } from "../../model/gemma4/index.ts";
import { limit } from "../../tests/time_limit.ts";

const CKPT = join(REPO_ROOT, ".cache", "checkpoints");
const oracle = await sharedOracle();
await oracle.request("make_checkpoints", { only: ["c1_dense/f32", "c3_e2b/*bf16", "c5_moe/*f32", "c6_sink/*f32"] }, limit(600_000));

const TOKENS = [
  [92, 35, 201, 117, 109, 58, 233, 71, 198, 75, 117, 114, 158],
  [85, 73, 70, 119, 23, 255, 187, 96, 215, 183, 245, 126, 85],
];

function logitsBytes(dir: string): Uint8Array {
  const { model } = loadModel(dir);
  try {
    using x = mx.array(TOKENS.flat(), [2, 13], "int32");
    using l = model.call(x);
    return l.toBytes();
  } finally {
    model.dispose();
  }
}

describe("layouts give the same logits bytes", () => {
  for (const [flat, others] of [
    ["c3_e2b/bf16", ["c3_e2b/wrap_bf16", "c3_e2b/hf_bf16"]],
    ["c6_sink/f32", ["c6_sink/wrap_f32"]],
    ["c5_moe/f32", ["c5_moe/hf_f32"]],
  ] as const) {
    it(`${flat} = ${others.join(" = ")}`, () => {
      const ref = logitsBytes(join(CKPT, flat));
      for (const o of others) {
        const b = logitsBytes(join(CKPT, o));
        expect(Buffer.compare(Buffer.from(b), Buffer.from(ref)), `${o} logits differ from ${flat}`).toBe(0);
      }
    });
  }
});

// ------------------------------------------------------------------ bad input

const scratch = mkdtempSync(join(tmpdir(), "gemma4-bad-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

function copyCheckpoint(id: string, name: string): string {
  const d = join(scratch, name);
  mkdirSync(d, { recursive: true });
  for (const f of ["config.json", "model.safetensors"]) copyFileSync(join(CKPT, id, f), join(d, f));
  return d;
}

function loadError(dir: string): Error {
  try {
    const { model } = loadModel(dir);
    model.dispose();
  } catch (e) {
    return e as Error;
  }
  throw new Error(`loading ${dir} did not fail`);
}

describe("bad checkpoints: one clear error naming file and key", () => {
  it("missing shard (index names a file that is absent)", () => {
    const d = join(scratch, "missing_shard");
    mkdirSync(d);
    copyFileSync(join(CKPT, "c1_dense/f32/config.json"), join(d, "config.json"));
    const { arrays } = mx.loadSafetensors(join(CKPT, "c1_dense/f32/model.safetensors"));
    const keys = [...arrays.keys()];
    const half = Math.floor(keys.length / 2);
    const shards = [new Map(keys.slice(0, half).map((k) => [k, arrays.get(k)!])), new Map(keys.slice(half).map((k) => [k, arrays.get(k)!]))];
    const names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    mx.saveSafetensors(join(d, names[0]!), shards[0]!, { format: "mlx" });
    mx.saveSafetensors(join(d, names[1]!), shards[1]!, { format: "mlx" });
    const weight_map: Record<string, string> = {};
    keys.forEach((k, i) => (weight_map[k] = names[i < half ? 0 : 1]!));
    writeFileSync(join(d, "model.safetensors.index.json"), JSON.stringify({ metadata: {}, weight_map }));
    for (const a of arrays.values()) a.dispose();
    // complete: loads and matches the single-file checkpoint
    expect(Buffer.compare(Buffer.from(logitsBytes(d)), Buffer.from(logitsBytes(join(CKPT, "c1_dense/f32"))))).toBe(0);
    unlinkSync(join(d, names[1]!));
    const e = loadError(d);
    expect(e).toBeInstanceOf(WeightsError);
    expect(e.message).toContain(names[1]!);
    expect(e.message).toContain(keys[half]!);
    expect(e.message).toMatch(/missing shard/);
  });

  it("truncated safetensors", () => {
    const d = copyCheckpoint("c1_dense/f32", "truncated");
    const f = join(d, "model.safetensors");
    const size = readFileSync(f).byteLength;
    truncateSync(f, Math.floor(size / 2));
    const e = loadError(d);
    expect(e).toBeInstanceOf(WeightsError);
    expect(e.message).toContain(f);
    expect(e.message).toMatch(/truncated/);
    expect(e.message).toMatch(/\[model\.[\w.]+\]/); // names a tensor that lies past the end
  });

  it("truncated inside the header", () => {
    const d = copyCheckpoint("c1_dense/f32", "truncated_header");
    const f = join(d, "model.safetensors");
    truncateSync(f, 100);
    const e = loadError(d);
    expect(e).toBeInstanceOf(WeightsError);
    expect(e.message).toContain(f);
    expect(e.message).toMatch(/truncated/);
  });

  it("config/weights shape mismatch", () => {
    const d = copyCheckpoint("c1_dense/f32", "shape_mismatch");
    const cfg = JSON.parse(readFileSync(join(d, "config.json"), "utf8"));
    cfg.intermediate_size = 96;
    writeFileSync(join(d, "config.json"), JSON.stringify(cfg));
    const e = loadError(d);
    expect(e).toBeInstanceOf(WeightsError);
    expect(e.message).toContain(join(d, "model.safetensors"));
    expect(e.message).toContain("model.layers.0.mlp.gate_proj.weight");
    expect(e.message).toMatch(/expected shape \(96, 64\) but received shape \(128, 64\)/);
    // every mismatching parameter is listed, not only the first
    expect(e.message).toContain("model.layers.5.mlp.down_proj.weight");
  });

  it("extra and missing keys are listed together", () => {
    const d = copyCheckpoint("c1_dense/f32", "extra_missing");
    const cfg = JSON.parse(readFileSync(join(d, "config.json"), "utf8"));
    cfg.tie_word_embeddings = false; // lm_head.weight now missing
    cfg.num_hidden_layers = 5; // layers.5.* now extra
    cfg.layer_types = cfg.layer_types.slice(0, 5);
    writeFileSync(join(d, "config.json"), JSON.stringify(cfg));
    const e = loadError(d);
    expect(e).toBeInstanceOf(WeightsError);
    expect(e.message).toMatch(/Received \d+ parameters not in model/);
    expect(e.message).toContain("model.layers.5.self_attn.q_proj.weight");
    expect(e.message).toMatch(/Missing 1 parameters/);
    expect(e.message).toContain("lm_head.weight");
  });

  it("unknown model_type", () => {
    const d = copyCheckpoint("c1_dense/f32", "unknown_type");
    const cfg = JSON.parse(readFileSync(join(d, "config.json"), "utf8"));
    cfg.model_type = "llama";
    writeFileSync(join(d, "config.json"), JSON.stringify(cfg));
    const e = loadError(d);
    expect(e).toBeInstanceOf(ConfigError);
    expect(e.message).toContain(join(d, "config.json"));
    expect(e.message).toContain("model_type");
    expect(e.message).toContain('"llama"');
  });

  it("no safetensors at all", () => {
    const d = join(scratch, "empty");
    mkdirSync(d);
    copyFileSync(join(CKPT, "c1_dense/f32/config.json"), join(d, "config.json"));
    const e = loadError(d);
    expect(e).toBeInstanceOf(WeightsError);
    expect(e.message).toMatch(/No safetensors found/);
  });

  it("missing config.json", () => {
    const d = join(scratch, "noconfig");
    mkdirSync(d);
    const e = loadError(d);
    expect(e).toBeInstanceOf(ConfigError);
    expect(e.message).toContain(join(d, "config.json"));
  });
});
