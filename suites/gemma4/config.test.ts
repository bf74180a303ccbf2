// Config: mlx-lm's defaults and __post_init__ (compared field by field with Python's own
// ModelArgs via config_ref.py), the gemma4 wrapper rules, gemma4_unified, validation errors, and
// the float32 values of the Python scale constants.

import { describe, expect, it } from "vitest";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { ConfigError, configFromDict, modelArgsFromDict } from "../../model/gemma4/index.ts";
import { pyPow } from "../../model/gemma4/pymath.ts";

const FIX = join(REPO_ROOT, "fixtures", "configs");
const fixtures = readdirSync(FIX)
  .filter((f) => f.endsWith(".json"))
  .sort()
  .map((f) => JSON.parse(readFileSync(join(FIX, f), "utf8")) as Record<string, unknown>);

const edge: Record<string, unknown>[] = [
  { model_type: "gemma4_text" }, // every default (E2B-shaped)
  { model_type: "gemma4_text", num_hidden_layers: 12, sliding_window_pattern: 6, num_kv_shared_layers: 4, extra_key: 1 },
  { model_type: "gemma4", text_config: { ...fixtures[0], vocab_size: 999 }, vocab_size: 256 }, // top-level vocab wins
  { model_type: "gemma4", text_config: { ...fixtures[0] } }, // no top-level vocab: 262144 wins
  { model_type: "gemma4_unified", vocab_size: 256, text_config: { ...fixtures[0], model_type: "gemma4_unified_text" } },
  { model_type: "gemma4", vocab_size: 256, text_config: { hidden_size: 64, num_hidden_layers: 5, num_kv_shared_layers: 0 } },
];

function pythonArgs(cfgs: Record<string, unknown>[]): { layout?: string; args?: Record<string, unknown>; error?: string }[] {
  const p = Bun.spawnSync([DEFAULT_PYTHON, "-I", join(REPO_ROOT, "suites", "gemma4", "config_ref.py")], {
    stdin: new TextEncoder().encode(JSON.stringify(cfgs)),
    cwd: "/",
  });
  if (p.exitCode !== 0) throw new Error(`config_ref.py failed: ${p.stderr.toString()}`);
  return JSON.parse(p.stdout.toString());
}

describe("ModelArgs = mlx-lm's, field by field", () => {
  const all = [...fixtures, ...edge];
  const ref = pythonArgs(all);
  all.forEach((cfg, i) => {
    it(`config ${i} (${String(cfg._comment ?? cfg.model_type).slice(0, 60)})`, () => {
      const r = ref[i]!;
      expect(r.error).toBeUndefined();
      const got = configFromDict(cfg);
      expect(got.layout).toBe(r.layout as "gemma4" | "gemma4_text");
      expect({ ...got.args }).toEqual(r.args as object);
    });
  });
});

describe("wrapper and remapping", () => {
  it("top-level vocab_size always wins, 262144 when absent", () => {
    expect(configFromDict({ model_type: "gemma4", vocab_size: 256, text_config: { vocab_size: 999 } }).args.vocab_size).toBe(256);
    expect(configFromDict({ model_type: "gemma4", text_config: { vocab_size: 256 } }).args.vocab_size).toBe(262144);
  });
  it("gemma4_unified loads as the gemma4 wrapper", () => {
    const c = configFromDict({ model_type: "gemma4_unified", vocab_size: 256, text_config: { model_type: "gemma4_unified_text" } });
    expect(c.layout).toBe("gemma4");
    expect(c.args.model_type).toBe("gemma4_unified_text");
  });
  it("quantization_config is lifted from text_config", () => {
    const c = configFromDict({ model_type: "gemma4", vocab_size: 256, text_config: { quantization_config: { quant_method: "mxfp4" } } });
    expect(c.raw.quantization_config).toEqual({ quant_method: "mxfp4" });
  });
});

describe("validation: clear errors naming file and key", () => {
  const base = fixtures.find((f) => f.model_type === "gemma4_text" && Array.isArray(f.layer_types) && f.num_kv_shared_layers === 4)!;
  const bad = (patch: Record<string, unknown>, key: RegExp | string, what: RegExp) => {
    let err: unknown;
    try {
      modelArgsFromDict({ ...base, ...patch }, "x/config.json");
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    const ce = err as ConfigError;
    expect(ce.file).toBe("x/config.json");
    if (typeof key === "string") expect(ce.key).toBe(key);
    else expect(ce.key).toMatch(key);
    expect(ce.message).toMatch(what);
  };
  it("non-positive or non-integer dims", () => {
    bad({ hidden_size: 0 }, "hidden_size", /positive integer/);
    bad({ head_dim: 16.5 }, "head_dim", /positive integer/);
    bad({ num_hidden_layers: null }, "num_hidden_layers", /required/);
  });
  it("heads not divisible by KV heads", () => bad({ num_key_value_heads: 3 }, "num_key_value_heads", /not divisible/));
  it("k_eq_v global KV heads not dividing the heads", () =>
    bad({ attention_k_eq_v: true, num_global_key_value_heads: 3 }, "num_global_key_value_heads", /not divisible/));
  it("layer_types length and values", () => {
    bad({ layer_types: ["sliding_attention"] }, "layer_types", /entries but num_hidden_layers/);
    bad({ layer_types: [...(base.layer_types as string[]).slice(0, -1), "chunked_attention"] }, /^layer_types\[7\]$/, /unknown layer type/);
  });
  it("a layer type in the shared tail that never occurs before it", () =>
    bad(
      { layer_types: ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "full_attention", "full_attention", "full_attention"] },
      "layer_types[4]",
      /no non-shared layer/,
    ));
  it("num_kv_shared_layers >= num_hidden_layers", () => bad({ num_kv_shared_layers: 8 }, "num_kv_shared_layers", /smaller than/));
  it("odd RoPE dims", () => {
    bad({ head_dim: 15 }, "head_dim", /even/);
    bad(
      { rope_parameters: { full_attention: { rope_type: "proportional", partial_rotary_factor: 0.1, rope_theta: 1e6 }, sliding_attention: {} } },
      "rope_parameters.full_attention.partial_rotary_factor",
      /must be even/,
    );
  });
  it("unsupported rope type", () =>
    bad({ rope_parameters: { full_attention: { rope_type: "yarn" }, sliding_attention: {} } }, "rope_parameters.full_attention.rope_type", /unsupported/));
  it("MoE without expert counts, top_k > num_experts", () => {
    bad({ enable_moe_block: true }, "num_experts", /positive integer/);
    bad({ enable_moe_block: true, num_experts: 2, top_k_experts: 4, moe_intermediate_size: 8 }, "top_k_experts", /exceeds/);
  });
  it("wrapper errors carry the text_config. prefix", () => {
    let err: unknown;
    try {
      configFromDict({ model_type: "gemma4", vocab_size: 256, text_config: { ...base, hidden_size: -1 } }, "w/config.json");
    } catch (e) {
      err = e;
    }
    expect((err as ConfigError).key).toBe("text_config.hidden_size");
  });
  it("unknown or missing model_type", () => {
    expect(() => configFromDict({ model_type: "gemma3" }, "a/config.json")).toThrow(/a\/config.json: model_type: unknown model_type "gemma3"/);
    expect(() => configFromDict({}, "a/config.json")).toThrow(/model_type: is missing/);
  });
});

describe("Python scale constants (float64 ** then float32)", () => {
  // Python: struct.unpack('<I', struct.pack('<f', n ** e)) for the sizes real and tiny models use
  const f32 = (v: number) => {
    const b = new DataView(new ArrayBuffer(4));
    b.setFloat32(0, v, true);
    return b.getUint32(0, true);
  };
  const table: [number, number, number][] = [
    // n, float64 n**0.5 (Python repr), float64 n**-0.5 (Python repr)
    [32, 5.656854249492381, 0.1767766952966369],
    [64, 8.0, 0.125],
    [128, 11.313708498984761, 0.08838834764831845],
    [256, 16.0, 0.0625],
    [1536, 39.191835884530846, 0.02551551815399144],
    [2560, 50.59644256269407, 0.01976423537605237],
    [2816, 53.0659966456864, 0.018844459036110227],
    [3840, 61.96773353931867, 0.016137430609197572],
    [5376, 73.32121111929344, 0.013638618139749524],
  ];
  it.each(table)("%d ** ±0.5", (n, sq, rsq) => {
    expect(pyPow(n, 0.5)).toBe(sq);
    expect(pyPow(n, -0.5)).toBe(rsq);
    expect(f32(pyPow(n, -0.5))).toBe(f32(rsq));
  });
  it("2.0 ** -0.5 is Python's 0.7071067811865476 (JS Math.pow gives ...475)", () => {
    expect(pyPow(2, -0.5)).toBe(0.7071067811865476);
  });
});
