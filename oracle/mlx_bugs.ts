// Differences that are MLX's own, each proven by a Python-only reproducer, and where they reach.
// A parity run is attributed to such a bug only when its FIRST divergent tap is produced by an op
// on the bug's path (mlxBugAtTap: the tap's quantized matmul has K = one group and more than one
// row, or it is a decode step's attention in the affected dtype and size), on the backend where
// the bug lives; every other divergence stays a failure, even on a checkpoint that has such a
// layer. Taps after an attributed divergence are unverified, and the verdict says so. No
// tolerance is involved: the taps are still compared bit for bit and shown.
//
// MLX_BUGS_ASSUME_CUDA_GPU=1 (tests only) makes this process classify as if it ran on the CUDA
// backend's GPU device, so the CPU tests can check the attribution (tests/oracle/mlx_bugs.test.ts,
// tests/parity/attribution.test.ts); every predicate below also takes the answer as a parameter.
import * as mx from "@mlx-bun/mlx";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { checkSafetensors } from "../model/gemma4/weights.ts";

export interface MlxBug {
  id: string;
  what: string;
  reproducer: string;
}

/**
 * MLX 0.32.4's CUDA `QuantizedMatmul` takes the CUTLASS `qmm_sm90` kernel on compute capability 9
 * when a quantized layer has one group per row (K = group size, 64 or 128), bits 4 or 8, affine,
 * and x has more than one row (prefill). Measured on the H200 with bench/cuda/repro_qmm.py: the
 * same inputs give other outputs after the allocator's free blocks were filled with junk (up to
 * 3.7e19 apart), outputs change when junk follows any operand in memory, and they are far from
 * the CPU's (max |d| 23 against 0.3 for the same layer with K = 2 groups, which takes another
 * kernel and is stable). The fixtures' hidden size is 64: their g64 layers take that path.
 */
const QMM_SM90: MlxBug = {
  id: "cuda-qmm-sm90",
  what: "MLX's CUDA qmm_sm90 kernel (a quantized layer with K = group size, prefill rows > 1) reads memory it does not own: its result depends on the process's allocator state",
  reproducer: "bench/cuda/repro_qmm.py",
};

/**
 * MLX 0.32.4's CUDA `ScaledDotProductAttention` for one query row (a decode step) with no mask
 * array, float16/bfloat16, head dims multiples of 8 up to 128 and >= 256 keys takes cuDNN only if
 * the keys and values look like slices of a cache buffer whose length is a multiple of 256
 * (`use_cudnn_for_decoding`), and it reads that buffer's length from `array::buffer_size()`: the
 * allocation's size. The CUDA allocator hands out cached free blocks up to 32 KiB larger than
 * asked for, so the same cache buffer takes cuDNN in one process and MLX's vector kernel in
 * another, and the two round differently (bench/cuda/repro_sdpa.py: identical inputs, the output
 * follows the allocation). Measured on the H200: the three bfloat16 runs of gen_P300_S128
 * diverge at a decode step's sdpa tap, and are bit-exact with MLX_CUDA_USE_CUDNN_SDPA=0 on both
 * sides (the vector kernel always). Real Gemma 4 head dims (256, 512) never take cuDNN.
 */
const SDPA_DECODE_KERNEL: MlxBug = {
  id: "cuda-sdpa-decode-kernel",
  what: "MLX's CUDA one-row attention picks cuDNN or its vector kernel by the allocated size of the KV-cache buffer, which depends on the process's allocator state; the two kernels round differently in float16/bfloat16",
  reproducer: "bench/cuda/repro_sdpa.py",
};

/** On the CUDA backend's GPU device, where the recorded bugs live (or told to assume so: MLX_BUGS_ASSUME_CUDA_GPU=1, tests only). */
export const onCudaGpu = (): boolean => process.env.MLX_BUGS_ASSUME_CUDA_GPU === "1" || (mx.backend() === "cuda" && mx.defaultDevice() === "gpu");

/** The checkpoint's floating-point dtype (of its unquantized tensors and quantization scales). */
function floatDtype(dir: string): string | null {
  const n = new Map<string, number>();
  for (const f of readdirSync(dir).filter((x) => x.endsWith(".safetensors"))) {
    for (const v of Object.values(checkSafetensors(join(dir, f)))) if (["F16", "BF16", "F32"].includes(v.dtype)) n.set(v.dtype, (n.get(v.dtype) ?? 0) + 1);
  }
  return [...n].sort((a, b) => b[1] - a[1])[0]?.[0] ?? null;
}

/** Half-precision attention with head dims cuDNN takes (multiples of 8, at most 128), from config.json and the headers. */
export function halfAttentionForCudnn(dir: string): boolean {
  if (!existsSync(join(dir, "config.json"))) return false;
  const cfg = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  const tc = (cfg.text_config ?? cfg) as { head_dim?: number; global_head_dim?: number };
  const dims = [tc.head_dim, tc.global_head_dim ?? tc.head_dim].filter((d): d is number => typeof d === "number");
  const dt = floatDtype(dir);
  return (dt === "F16" || dt === "BF16") && dims.some((d) => d % 8 === 0 && d <= 128);
}

/** The affine quantized layers (biases beside the scales) with one group per row: their `.scales` last dimension is 1. */
function oneGroupKeys(dir: string): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".safetensors"))) {
    const h = checkSafetensors(join(dir, f));
    for (const [k, v] of Object.entries(h)) {
      if (k.endsWith(".scales") && v.shape.at(-1) === 1 && `${k.slice(0, -".scales".length)}.biases` in h) out.push(k.slice(0, -".scales".length));
    }
  }
  return out;
}

/** `.scales` tensors with one group per row (their last dimension is 1), from the safetensors headers. */
export function hasOneGroupRows(dir: string): boolean {
  return oneGroupKeys(dir).length > 0;
}

// Prefixes a checkpoint puts before the text model's module paths (flat, wrapper, raw HF
// layouts), and before the media towers' (mlx-vlm's gemma4 wrapper).
const TEXT_PREFIXES = ["", "model.", "language_model.model.", "model.language_model.", "language_model."];
const MEDIA_PREFIXES = ["", "model."];
const MEDIA_ROOTS = /^(vision_tower|audio_tower|embed_vision|embed_audio)\//;

const oneGroupCache = new Map<string, Set<string>>();
function oneGroupModules(dir: string): Set<string> {
  let s = oneGroupCache.get(dir);
  if (!s) oneGroupCache.set(dir, (s = new Set(oneGroupKeys(dir))));
  return s;
}

/** A full tap name's call ("", "embed", "prefill0", "step3") and the rest (the tap scheme's name, oracle/TAPS.md). */
function splitCall(name: string): { call: string; short: string } {
  const m = /^(embed|prefill\d+|step\d+)\//.exec(name);
  return m ? { call: m[1]!, short: name.slice(m[0].length) } : { call: "", short: name };
}

/**
 * The checkpoint key (without `.scales`) of the quantized matmul that produces tap `short`, when
 * that layer has one group per row; null when the tap is not a quantized matmul's output or its
 * layer has more groups. A module tap is the module's output under its own path (oracle/TAPS.md):
 * `layers.0/per_layer_projection` is `…layers.0.per_layer_projection`; the lookups
 * `embed_tokens` and `embed_tokens_per_layer` gather rows, they multiply nothing; a tied
 * `lm_head` is `embed_tokens.as_linear`; `experts/switch_glu/{gate,up,down}_proj` are the
 * QuantizedSwitchLinear layers.
 */
export function oneGroupMatmulOf(dir: string, short: string): string | null {
  if (short === "embed_tokens" || short === "embed_tokens_per_layer") return null;
  const mods = oneGroupModules(dir);
  const prefixes = MEDIA_ROOTS.test(short) ? MEDIA_PREFIXES : TEXT_PREFIXES;
  const path = short === "lm_head" && !hasLmHead(dir) ? "embed_tokens" : short.replaceAll("/", ".");
  for (const x of prefixes) if (mods.has(`${x}${path}`)) return `${x}${path}`;
  return null;
}

/** An untied output layer (a `lm_head.weight` in the headers); tied checkpoints use embed_tokens.as_linear. */
function hasLmHead(dir: string): boolean {
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".safetensors"))) {
    if (Object.keys(checkSafetensors(join(dir, f))).some((k) => k === "lm_head.weight" || k.endsWith(".lm_head.weight"))) return true;
  }
  return false;
}

/** Where a run's first divergence was seen: the full tap name, its dtype and shape, and for an attention tap the keys it attended to. */
export interface DivergentTap {
  name: string;
  dtype: string;
  shape: readonly number[];
  /** `self_attn/sdpa` taps: the number of keys (the cache_keys tap's length axis). */
  kvLength?: number;
}

/**
 * Rows of the matmul that produced a module tap: every axis but the output features, and for a
 * QuantizedSwitchLinear's (B, L, K, 1, I) output the tokens B·L (its per-expert products have one
 * row each; the call's rows are the tokens), for the sorted (N, 1, I) the N gathered rows.
 */
export function matmulRows(short: string, shape: readonly number[]): number {
  const prod = (xs: readonly number[]) => xs.reduce((a, b) => a * b, 1);
  if (/experts\/switch_glu\//.test(short)) return shape.length >= 5 ? prod(shape.slice(0, -3)) : prod(shape.slice(0, -2));
  return prod(shape.slice(0, -1));
}

/**
 * The recorded MLX bug that produced this first divergent tap, if any (on the backend where the
 * bug lives: `onCuda`, default this process's). `cuda-qmm-sm90`: the tap is a quantized matmul
 * (QuantizedLinear, QuantizedEmbedding.as_linear, QuantizedSwitchLinear) whose layer has K =
 * one group (oneGroupMatmulOf) and the call has more than one row. `cuda-sdpa-decode-kernel`: the
 * tap is a `step{n}/…/self_attn/sdpa` of one query row, float16 or bfloat16, head dim a multiple
 * of 8 up to 128 (the tap is (B, heads, L, head_dim)) and at least 256 keys. Anything else: null,
 * and the divergence is a failure.
 */
export function mlxBugAtTap(dir: string, tap: DivergentTap, onCuda: boolean = onCudaGpu()): MlxBug | null {
  if (!onCuda) return null;
  const { call, short } = splitCall(tap.name);
  if (/(^|\/)self_attn\/sdpa$/.test(short)) {
    const headDim = tap.shape.at(-1) ?? 0;
    const rows = tap.shape.at(-2) ?? 0;
    const half = tap.dtype === "float16" || tap.dtype === "bfloat16";
    const cudnnDims = headDim % 8 === 0 && headDim > 0 && headDim <= 128;
    if (call.startsWith("step") && rows === 1 && half && cudnnDims && (tap.kvLength ?? 0) >= 256 && process.env.MLX_CUDA_USE_CUDNN_SDPA !== "0") return SDPA_DECODE_KERNEL;
    return null;
  }
  if (oneGroupMatmulOf(dir, short) !== null && matmulRows(short, tap.shape) > 1) return QMM_SM90;
  return null;
}

/**
 * The keys an attention tap attended to, from the oracle's capture: its `meta.k` names the keys'
 * tap in the same call (a KV-shared layer's points at its source layer's `cache_keys`), whose
 * shape is (B, kv heads, keys, head_dim). Undefined for any other tap or when not recorded.
 */
export function kvLengthAt(name: string, theirs: readonly { name: string; shape?: readonly number[]; meta?: Record<string, unknown> }[]): number | undefined {
  if (!name.endsWith("/self_attn/sdpa")) return undefined;
  const k = theirs.find((t) => t.name === name)?.meta?.k;
  if (typeof k !== "string") return undefined;
  const prefix = splitCall(name).call;
  const keys = theirs.find((t) => t.name === (prefix ? `${prefix}/${k}` : k));
  return keys?.shape?.at(-2);
}

/**
 * The first divergent tap of a tap-list comparison (suites/gemma4/tap_compare.ts's Verdict), when
 * its bytes were compared: a name, kind, dtype or shape difference is structural and no MLX bug's.
 */
export function divergentTapOf(
  first: { name: string; reason: string; diff?: { dtype: string; shape: readonly number[] } } | undefined,
  theirs: readonly { name: string; shape?: readonly number[]; meta?: Record<string, unknown> }[] = [],
): DivergentTap | null {
  if (!first || first.reason !== "value" || !first.diff) return null;
  return { name: first.name, dtype: first.diff.dtype, shape: first.diff.shape, kvLength: kvLengthAt(first.name, theirs) };
}

/**
 * The recorded MLX bug a run on this checkpoint CAN meet on the current backend (a layer on a
 * bug's path anywhere in it), if any; `kvLength` is the most keys a decode step attends to. Only
 * to leave a checkpoint out of a pool before it runs (said aloud), where only the final
 * logprobs are compared; it never excuses a divergence (mlxBugAtTap does, at the first divergent tap).
 */
export function reachableMlxBug(dir: string, kvLength = 0, onCuda: boolean = onCudaGpu()): MlxBug | null {
  if (!onCuda) return null;
  if (hasOneGroupRows(dir)) return QMM_SM90;
  if (kvLength >= 256 && process.env.MLX_CUDA_USE_CUDNN_SDPA !== "0" && halfAttentionForCudnn(dir)) return SDPA_DECODE_KERNEL;
  return null;
}

/**
 * `what` (a divergence whose first divergent tap is `tap`) with the recorded MLX bug that
 * produced that tap named, for the suites that count such runs apart; null when the tap is not
 * on a bug's path, or is unknown (a failure).
 */
export function atMlxBug(dir: string, what: string, tap: DivergentTap | null): string | null {
  const bug = tap && mlxBugAtTap(dir, tap);
  return bug ? `${what} (MLX bug ${bug.id} at the first divergent tap ${tap!.name}, ${bug.reproducer})` : null;
}

/**
 * Keeps `note` (a run counted apart at a recorded MLX bug) in `notes` and prints it at once: a
 * suite stopped at a time limit before its summary (a GPU lane) still shows every one.
 */
export function keepMlxBugNote(notes: string[], suite: string, note: string): void {
  notes.push(note);
  console.log(`[${suite}] at a recorded MLX bug: ${note}`);
}

/** What an op parity case is, as far as the predicates below need it (oracle/ops/cases.ts). */
export interface OpCaseShape {
  oracle: string;
  inputs: readonly ({ shape: number[] } | { scalar: number })[];
  params: Record<string, unknown>;
}

/** The sm90 condition on one quantized_matmul call (qmm.cu): affine with biases, bits 4 or 8, transposed, K a multiple of 64 and at most one group, more than one row (one row takes qmv). */
function sm90Call(p: Record<string, unknown>, k: number, rows: number): boolean {
  const bits = (p.bits as number | undefined) ?? 4;
  return p.mode === "affine" && p.has_biases === true && (bits === 4 || bits === 8) && k % 64 === 0 && ((p.group_size as number | undefined) ?? 64) >= k && rows > 1;
}

/**
 * A `quantized_matmul` case on the path MLX's CUDA QuantizedMatmul sends to qmm_sm90 on compute
 * capability 9 (mlx/backend/cuda/quantized/qmm/qmm.cu). A gradient case (`params._vjp`, from
 * oracle/ops/vjp_runner.ts) also takes it where the forward does not: the vjp of a
 * transpose=False product w.r.t. x is quantized_matmul(cotangent, w, transpose=True), whose K is
 * w's row length (bench/cuda/repro_vjp.py checks that the two are one computation).
 */
export function takesQmmSm90(c: OpCaseShape): boolean {
  const [x, w] = c.inputs;
  if (c.oracle !== "quantized_matmul" || !x || !("shape" in x)) return false;
  const rows = x.shape.slice(0, -1).reduce((a, b) => a * b, 1);
  const p = c.params;
  if (p.transpose === true) return sm90Call(p, x.shape.at(-1)!, rows);
  const vjp = p._vjp as { diff: number[] } | undefined;
  if (p.transpose !== false || !vjp?.diff.includes(0) || !w || !("shape" in w)) return false;
  return sm90Call(p, (w.shape.at(-1)! * 32) / ((p.bits as number | undefined) ?? 4), rows);
}

/**
 * MLX's CUDA scatter_add and scatter_add_axis add with atomics (ScatterSum,
 * mlx/backend/cuda/device/scatter_ops.cuh, used by scatter.cuh and scatter_axis.cuh): where
 * indices repeat, the order of the float additions follows the threads' arrival, and so does the
 * rounding. gather_mm's and gather_qmm's vjp with unsorted indices scatter-add their gradients
 * (gather_mm_grad and GatherQMM::vjp, mlx/primitives.cpp), and so does the vjp of cummax and
 * cummin (Scan::vjp: each cotangent goes to the element holding the running extreme there, with
 * scatter_add_axis; an element that holds it over several positions takes several).
 */
const SCATTER_ADD_ORDER: MlxBug = {
  id: "cuda-scatter-add-order",
  what: "MLX's CUDA scatter_add sums repeated indices with atomics in no fixed order: the gradients of gather_mm and gather_qmm with unsorted indices, and of cummax and cummin, round differently from run to run",
  reproducer: "bench/cuda/repro_vjp.py",
};

/**
 * A gradient case whose vjp scatter-adds floats over indices that can repeat: cummax and cummin
 * (over the owners of the running extreme), and gather_mm or gather_qmm with unsorted indices
 * (x's gradient over the lhs indices, the weight side's, w or scales and biases, over the rhs
 * indices; without given indices MLX uses an arange: no index repeats).
 */
export function scatterAddsGradients(c: OpCaseShape): boolean {
  const diff = (c.params._vjp as { diff: number[] } | undefined)?.diff;
  if (!diff) return false;
  if (c.oracle === "cummax" || c.oracle === "cummin") return true;
  if ((c.oracle !== "gather_mm" && c.oracle !== "gather_qmm") || c.params.sorted_indices === true) return false;
  return (c.params.lhs === true && diff.includes(0)) || (c.params.rhs === true && diff.some((i) => i > 0));
}

/**
 * The recorded MLX bug a model gradient meets on the current backend, if any. The experts' weight
 * side (SwitchGLU's gate, up and down projections: weight, scales and biases, LoRA's lora_a and
 * lora_b) is gather_mm's or gather_qmm's rhs gradient, scatter-added over the router's indices,
 * which mlx-lm's SwitchGLU leaves unsorted below 64 routes (tokens × top-k). Measured on the
 * H200 (suites/gemma4/grad.test.ts, c5_moe/f32, 28 routes): 18 of 138 gradients differ, as many
 * as there are such weights (6 layers × 3), and the six the log names are among them (max |d|
 * 9.5e-7). From 64 routes the sort's gather scatter-adds x's gradient too; that is not measured,
 * so it stays a failure.
 */
export function mlxBugForGradient(path: string, routes: number): MlxBug | null {
  if (!onCudaGpu() || routes >= 64) return null;
  return /\.switch_glu\.(gate|up|down)_proj\.(weight|scales|biases|lora_a|lora_b)$/.test(path) ? SCATTER_ADD_ORDER : null;
}

/** The recorded MLX bug an op case meets on the current backend, if any. */
export function mlxBugForOp(c: OpCaseShape): MlxBug | null {
  if (!onCudaGpu()) return null;
  return takesQmmSm90(c) ? QMM_SM90 : scatterAddsGradients(c) ? SCATTER_ADD_ORDER : null;
}
