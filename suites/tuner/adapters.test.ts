// Adapters against mlx-lm's tuner, both directions, tensor by tensor:
// 1. linear_to_lora_layers: the same modules converted (named_modules order after conversion
//    equal to mlx-lm's) and every lora_a / lora_b / m bit-identical after mx.random.seed(42),
//    which proves the draw order (dummy base-layer init, then lora_a, per module, LIFO walk);
// 2. mlx-lm -> TS: adapters trained-looking (perturbed) and saved by mlx-lm, loaded with
//    load_adapters: logits bit-identical to mlx-lm's;
// 3. TS -> mlx-lm: adapters made and saved by the TS side, loaded by mlx-lm's load_adapters:
//    mlx-lm's logits bit-identical to the TS model's;
// 4. fuse: every tensor of the TS-fused checkpoint equals mlx-lm's fused one; mlx-lm loads the
//    TS-fused directory and the TS side loads mlx-lm's, with bit-identical logits.
// Cases: dense f32/bf16, k_eq_v, E2B-like (KV sharing, PLE), the gemma4 wrapper, MoE
// (LoRASwitchLinear), 4-bit bases (QLoRA/QDoRA, re-quantized and de-quantized fuses), DoRA,
// LoRA/DoRA on the tied embedding (top-level keys), and DoRA on MoE (the same error). The
// default run takes 6 of the 14 cases; TUNER_FULL=1 runs all of them.

import { afterAll, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";
import { loadModel } from "../../model/gemma4/index.ts";
import { fuse_model, loadWithAdapters } from "../../model/fuse.ts";
import { linear_to_lora_layers, load_adapters, type LoraParameters } from "../../model/tuner/utils.ts";
import { loadRawConfig, saveSafetensorsAtomic, save_config, save_model } from "../../model/utils.ts";
import { PyFloat } from "../../model/pyjson.ts";
import { CKPT_ROOT, firstMismatch, readMeta, readTensors, runTunerRef } from "./ref.ts";

interface Case {
  name: string;
  /** In the default run (TUNER_FULL=1 runs every case). */
  quick?: boolean;
  ckpt: string;
  type: "lora" | "dora";
  num_layers: number;
  lora: LoraParameters;
  /** mlx-lm's error, when the conversion must fail. */
  error?: RegExp;
  fuse?: { dequantize: boolean };
}

const P = (extra: Partial<LoraParameters> = {}): LoraParameters => ({ rank: 4, scale: 20.0, dropout: 0.0, ...extra });

const CASES_ALL: Case[] = [
  { name: "dense f32 LoRA, last 4 layers", ckpt: "c1_dense/f32", type: "lora", num_layers: 4, lora: P(), fuse: { dequantize: false } },
  { name: "dense bf16 LoRA, all (-1)", ckpt: "c1_dense/bf16", type: "lora", num_layers: -1, lora: P({ rank: 8 }), fuse: { dequantize: false } },
  { quick: true, name: "dense bf16 DoRA (fuse writes float32)", ckpt: "c1_dense/bf16", type: "dora", num_layers: 2, lora: P(), fuse: { dequantize: false } },
  { name: "k_eq_v f32 DoRA, all (0)", ckpt: "c2_keqv/f32", type: "dora", num_layers: 0, lora: P(), fuse: { dequantize: false } },
  { quick: true, name: "E2B-like f32 LoRA (KV sharing, PLE)", ckpt: "c3_e2b/f32", type: "lora", num_layers: 8, lora: P({ scale: 10.0 }), fuse: { dequantize: false } },
  { name: "gemma4 wrapper bf16 LoRA", ckpt: "c3_e2b/wrap_bf16", type: "lora", num_layers: 3, lora: P(), fuse: { dequantize: false } },
  { quick: true, name: "MoE f32 LoRA (LoRASwitchLinear)", ckpt: "c5_moe/f32", type: "lora", num_layers: 2, lora: P(), fuse: { dequantize: false } },
  { quick: true, name: "MoE f32 DoRA is rejected", ckpt: "c5_moe/f32", type: "dora", num_layers: 1, lora: P(), error: /SwitchLinear doesn't support DoRA yet/ },
  { quick: true, name: "4-bit dense QLoRA, re-quantized fuse", ckpt: "c1_dense/q4g32", type: "lora", num_layers: 6, lora: P(), fuse: { dequantize: false } },
  { name: "4-bit dense QLoRA, de-quantized fuse", ckpt: "c1_dense/q4g32", type: "lora", num_layers: 3, lora: P(), fuse: { dequantize: true } },
  { name: "4-bit dense QDoRA, de-quantized fuse", ckpt: "c1_dense/q4g32", type: "dora", num_layers: 2, lora: P(), fuse: { dequantize: true } },
  { name: "4-bit MoE QLoRA (QuantizedSwitchLinear)", ckpt: "c5_moe/q4g32", type: "lora", num_layers: 2, lora: P(), fuse: { dequantize: false } },
  {
    quick: true,
    name: "LoRA on explicit keys incl. the tied embedding (top-level pass)",
    ckpt: "c1_dense/f32",
    type: "lora",
    num_layers: 2,
    lora: P({ keys: ["self_attn.q_proj", "mlp.down_proj", "model.embed_tokens"] }),
    fuse: { dequantize: false },
  },
  { name: "DoRA on the tied embedding", ckpt: "c1_dense/f32", type: "dora", num_layers: 1, lora: P({ keys: ["self_attn.o_proj", "model.embed_tokens"] }), fuse: { dequantize: false } },
];

const CASES = process.env.TUNER_FULL === "1" ? CASES_ALL : CASES_ALL.filter((c) => c.quick);

const TOKENS = [
  [92, 35, 201, 117, 109, 58, 233, 71, 198, 75, 117, 114, 158],
  [85, 73, 70, 119, 23, 255, 187, 96, 215, 183, 245, 126, 85],
];

const tmp = mkdtempSync(join(tmpdir(), "tuner-adapters-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const dirOf = (i: number, what: string) => join(tmp, `case${i}`, what);

const ADAPTER_LEAVES = new Set(["lora_a", "lora_b", "m"]);
const isAdapter = (k: string) => ADAPTER_LEAVES.has(k.slice(k.lastIndexOf(".") + 1));

function logitsOf(model: { call(x: mx.MlxArray): mx.MlxArray }): mx.MlxArray {
  using x = mx.array(TOKENS.flat(), [TOKENS.length, TOKENS[0]!.length], "int32");
  return model.call(x);
}

/** TS-made adapters: the TS conversion with its own seed, each tensor moved by its own noise. */
function makeTsAdapters(i: number, c: Case): void {
  const { model } = loadModel(join(CKPT_ROOT, c.ckpt));
  try {
    mx.random.seed(7);
    linear_to_lora_layers(model, c.num_layers, c.lora, c.type === "dora");
    const out = new Map<string, mx.MlxArray>();
    let j = 0;
    for (const [k, v] of model.parameters()) {
      if (!isAdapter(k)) continue;
      using key = mx.random.key(2000 + j++);
      using n = mx.random.normal({ shape: v.shape, key });
      using s = mx.multiply(n, 0.05);
      out.set(k, mx.add(v, s));
    }
    const dir = dirOf(i, "ts_adapters");
    saveSafetensorsAtomic(join(dir, "adapters.safetensors"), out);
    const lp: Record<string, unknown> = { ...c.lora, scale: new PyFloat(c.lora.scale), dropout: new PyFloat(c.lora.dropout) };
    save_config({ fine_tune_type: c.type, num_layers: c.num_layers, lora_parameters: lp as never }, join(dir, "adapter_config.json"));
    for (const a of out.values()) a.dispose();
  } finally {
    model.dispose();
  }
}

// Phase 1: mlx-lm converts, perturbs, saves and fuses; the TS side writes its own adapters.
const phase1 = CASES.map((c, i) => ({
  kind: "lora",
  ckpt: join(CKPT_ROOT, c.ckpt),
  seed: 42,
  num_layers: c.num_layers,
  lora_parameters: c.lora,
  fine_tune_type: c.type,
  tokens: TOKENS,
  perturb: !c.error,
  fuse: c.fuse ?? null,
  out: dirOf(i, "py"),
}));
runTunerRef(phase1);
CASES.forEach((c, i) => c.error || makeTsAdapters(i, c));

// The TS fuse of mlx-lm's adapters, saved for mlx-lm to load in phase 2.
CASES.forEach((c, i) => {
  if (!c.fuse) return;
  const { model } = loadWithAdapters(join(CKPT_ROOT, c.ckpt), dirOf(i, "py/adapters"));
  try {
    const config = loadRawConfig(join(CKPT_ROOT, c.ckpt));
    fuse_model(model, c.fuse.dequantize);
    if (c.fuse.dequantize) {
      delete config.quantization;
      delete config.quantization_config;
    }
    save_model(dirOf(i, "ts_fused"), model);
    save_config(config, join(dirOf(i, "ts_fused"), "config.json"));
  } finally {
    model.dispose();
  }
});

// Phase 2: mlx-lm loads the TS adapters and the TS-fused checkpoints.
const phase2 = CASES.flatMap((c, i) =>
  c.error
    ? []
    : [
        { kind: "lora", ckpt: join(CKPT_ROOT, c.ckpt), load: dirOf(i, "ts_adapters"), fine_tune_type: c.type, tokens: TOKENS, out: dirOf(i, "py_load_ts") },
        ...(c.fuse ? [{ kind: "load_fused", load_fused: dirOf(i, "ts_fused"), tokens: TOKENS, out: dirOf(i, "py_load_ts_fused") }] : []),
      ],
);
runTunerRef(phase2);

describe("linear_to_lora_layers vs mlx-lm (targets, draw order, init tensors)", () => {
  CASES.forEach((c, i) => {
    it(c.name, () => {
      const meta = readMeta<{ named_modules?: string[]; error?: { message: string } }>(dirOf(i, "py"));
      const { model } = loadModel(join(CKPT_ROOT, c.ckpt));
      try {
        mx.random.seed(42);
        if (c.error) {
          expect(meta.error?.message).toMatch(c.error);
          expect(() => linear_to_lora_layers(model, c.num_layers, c.lora, c.type === "dora")).toThrow(c.error);
          return;
        }
        linear_to_lora_layers(model, c.num_layers, c.lora, c.type === "dora");
        expect(model.namedModules().map(([k]) => k)).toEqual(meta.named_modules!);
        const init = readTensors(join(dirOf(i, "py"), "init.safetensors"));
        const ours = [...model.parameters()].filter(([k]) => isAdapter(k));
        expect(ours.length).toBeGreaterThan(0);
        const bad = firstMismatch(ours, init);
        if (bad) throw new Error(bad);
      } finally {
        model.dispose();
      }
    });
  });
});

describe("adapter files interoperate with mlx-lm (bit-identical logits)", () => {
  CASES.forEach((c, i) => {
    if (c.error) return;
    it(`${c.name}: mlx-lm adapters -> TS load_adapters`, () => {
      const { model } = loadWithAdapters(join(CKPT_ROOT, c.ckpt), dirOf(i, "py/adapters"));
      try {
        using logits = logitsOf(model);
        const bad = firstMismatch([["logits", logits]], readTensors(join(dirOf(i, "py"), "logits.safetensors")));
        if (bad) throw new Error(bad);
      } finally {
        model.dispose();
      }
    });
    it(`${c.name}: TS adapters -> mlx-lm load_adapters`, () => {
      readMeta(dirOf(i, "py_load_ts"));
      const { model } = loadWithAdapters(join(CKPT_ROOT, c.ckpt), dirOf(i, "ts_adapters"));
      try {
        using logits = logitsOf(model);
        const bad = firstMismatch([["logits", logits]], readTensors(join(dirOf(i, "py_load_ts"), "logits.safetensors")));
        if (bad) throw new Error(bad);
      } finally {
        model.dispose();
      }
    });
  });
});

describe("fuse vs mlx_lm.fuse (tensors, dtypes, logits both ways)", () => {
  CASES.forEach((c, i) => {
    if (!c.fuse) return;
    it(`${c.name}: fused tensors and config`, () => {
      const ours = readTensors(join(dirOf(i, "ts_fused"), "model.safetensors"));
      const theirs = readTensors(join(dirOf(i, "py/fused"), "model.safetensors"));
      const bad = firstMismatch(ours, theirs);
      if (bad) throw new Error(bad);
      expect(readFileSync(join(dirOf(i, "ts_fused"), "config.json"), "utf8")).toBe(readFileSync(join(dirOf(i, "py/fused"), "config.json"), "utf8"));
      expect(JSON.parse(readFileSync(join(dirOf(i, "ts_fused"), "model.safetensors.index.json"), "utf8"))).toEqual(
        JSON.parse(readFileSync(join(dirOf(i, "py/fused"), "model.safetensors.index.json"), "utf8")),
      );
    });
    it(`${c.name}: mlx-lm loads the TS fuse, TS loads mlx-lm's`, () => {
      const want = readTensors(join(dirOf(i, "py"), "fused_logits.safetensors"));
      const bad = firstMismatch(readTensors(join(dirOf(i, "py_load_ts_fused"), "load_fused_logits.safetensors")), want);
      if (bad) throw new Error(`mlx-lm on the TS fuse: ${bad}`);
      const { model } = loadModel(dirOf(i, "py/fused"));
      try {
        using logits = logitsOf(model);
        const bad2 = firstMismatch([["logits", logits]], want);
        if (bad2) throw new Error(`TS on mlx-lm's fuse: ${bad2}`);
      } finally {
        model.dispose();
      }
    });
  });
});
