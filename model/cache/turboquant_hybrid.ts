// mlx_vlm/turboquant.py's HybridQuantKVCache (mlx-vlm 0.7.10): keys and values quantized by
// different schemes (uniform on one side, TurboQuant on the other), on the plain-MLX path.
//
// When mlx-vlm runs it: generate_step's maybe_quantize_kv_cache, when the policy's key and value
// schemes differ (from_legacy with kv_key_scheme / kv_value_scheme: generate_step's arguments,
// mlx_vlm.chat's and the server's flags): every KVCache but the last cache entry (when there are
// more than two) becomes a HybridQuantKVCache at once when empty, or once its offset reaches
// quantized_kv_start; RotatingKVCache (sliding layers) stays. The automatic prefix cache builds
// one too (apc.py).
//
// - Each side is a tensor quantizer: uniform → mx.quantize(x, group_size, bits) as (weights,
//   scales, biases), dequantized by mx.dequantize; TurboQuant → _build_codec(x, bits, "mse"): the
//   MSE codec for an integer width, the Split codec for a .5 width (turboquant_split.ts), built from
//   the first tensor. Key seed `seed`, value seed `seed + 1`.
// - update_and_fetch quantizes the new tokens, concatenates them to each side's state along the
//   token axis (no capacity steps), and returns both sides dequantized over the whole history:
//   plain arrays, so attention is ordinary mx.fast.scaled_dot_product_attention (models/base.py
//   has no Hybrid route). KV-shared layers would read these arrays; the port still refuses a
//   converted donor (kv_quantize.ts), since no fixture exercises it against mlx-vlm.
// - state = (keys state, values state) as held (not sliced); trim truncates both to the new
//   offset; meta_state = (offset, seed, bits, key scheme, key bits, value scheme, value bits,
//   group size) as Python's str().
import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { KVQuantError, type KVQuantPolicy, type KVQuantSpec, TURBOQUANT_SCHEME } from "../kv_quant.ts";
import { cacheAttentionMask, type MakeMaskOptions, type Mask } from "../mask.ts";
import { CacheError, type KVCacheLike } from "./index.ts";
import { type CodecOptions, DEFAULT_TURBOQUANT_SEED, TurboQuantMSECodec } from "./turboquant.ts";
import { buildCodec, TurboQuantSplitCodec } from "./turboquant_split.ts";

const pyFloat = (x: number) => (Number.isInteger(x) ? `${x}.0` : String(x));

// Every state leaf is (B, H, T, …): uniform's weights/scales/biases (axis -2 of a 4-D array) and
// TurboQuant's norms (B, H, T) and indices (B, H, T, W) alike have the tokens on axis 2.
function truncateT(a: MlxArray, n: number): MlxArray {
  const stop = [...a.shape];
  stop[2] = n;
  return mx.slice(a, a.shape.map(() => 0), stop);
}

/** One side's quantizer; a state is the flat list of mlx-vlm's state leaves (tokens on axis 2). */
interface TensorQuantizer extends Disposable {
  quantize(x: MlxArray): MlxArray[];
  dequantize(state: MlxArray[]): MlxArray;
}

/** _UniformTensorQuantizer: mx.quantize / mx.dequantize at (bits, group_size). */
function uniformQuantizer(bits: number, groupSize: number): TensorQuantizer {
  return {
    quantize: (x) => mx.quantize(x, { groupSize, bits }),
    dequantize: (s) => mx.dequantize(s[0]!, s[1]!, s[2]!, { groupSize, bits }),
    [Symbol.dispose]: () => {},
  };
}

/** _TurboTensorQuantizer: the codec built from the first tensor (_build_codec, mode "mse"). */
function turboQuantizer(bits: number, seed: number, opts: CodecOptions): TensorQuantizer & { codec: TurboQuantMSECodec | TurboQuantSplitCodec | null } {
  const q = {
    codec: null as TurboQuantMSECodec | TurboQuantSplitCodec | null,
    quantize(x: MlxArray): MlxArray[] {
      q.codec ??= buildCodec(x, bits, seed, opts);
      const c = q.codec;
      if (c instanceof TurboQuantSplitCodec) {
        const s = c.quantize(x);
        return [s.low.norms, s.low.indices, s.high.norms, s.high.indices];
      }
      const s = c.quantize(x);
      return [s.norms, s.indices];
    },
    dequantize(s: MlxArray[]): MlxArray {
      const c = q.codec;
      if (c === null) throw new CacheError("HybridQuantKVCache", "dequantize before the first update");
      if (c instanceof TurboQuantSplitCodec) return c.dequantize({ low: { norms: s[0]!, indices: s[1]! }, high: { norms: s[2]!, indices: s[3]! } });
      return c.dequantize({ norms: s[0]!, indices: s[1]! });
    },
    [Symbol.dispose]: () => q.codec?.dispose(),
  };
  return q;
}

function makeQuantizer(spec: KVQuantSpec, seed: number, opts: CodecOptions): TensorQuantizer {
  if (spec.scheme === TURBOQUANT_SCHEME) return turboQuantizer(spec.bits, seed, opts);
  if (!Number.isInteger(spec.bits)) throw new KVQuantError(`uniform KV quantization requires integer bits, got ${spec.bits}`);
  return uniformQuantizer(spec.bits, spec.groupSize);
}

const disposeAll = (l: MlxArray[] | null) => l?.forEach((a) => a.dispose());

export class HybridQuantKVCache implements KVCacheLike {
  readonly pythonClass = "HybridQuantKVCache";
  offset = 0;
  keys: MlxArray[] | null = null;
  values: MlxArray[] | null = null;
  private keyQuantizer: TensorQuantizer;
  private valueQuantizer: TensorQuantizer;

  constructor(
    readonly policy: KVQuantPolicy,
    readonly seed: number = DEFAULT_TURBOQUANT_SEED,
    private readonly opts: CodecOptions = {},
  ) {
    this.keyQuantizer = makeQuantizer(policy.key, seed, opts);
    this.valueQuantizer = makeQuantizer(policy.value, seed + 1, opts);
  }

  /** The conversion of a filled KVCache (maybe_quantize_kv_cache's hybridize): its state, updated in. */
  static fromCache(cache: KVCacheLike, policy: KVQuantPolicy, opts: CodecOptions = {}): HybridQuantKVCache {
    const h = new HybridQuantKVCache(policy, DEFAULT_TURBOQUANT_SEED, opts);
    const st = cache.state;
    try {
      if (st.length === 2 && cache.offset > 0) {
        using k = truncateT(st[0]!, cache.offset);
        using v = truncateT(st[1]!, cache.offset);
        for (const a of h.updateAndFetch(k, v)) a.dispose();
      }
    } catch (e) {
      h.dispose();
      throw e;
    } finally {
      for (const s of st) s.dispose();
    }
    return h;
  }

  private static concat(prev: MlxArray[] | null, next: MlxArray[]): MlxArray[] {
    if (prev === null) return next;
    const out = prev.map((a, i) => mx.concatenate([a, next[i]!], 2));
    disposeAll(prev);
    disposeAll(next);
    return out;
  }

  updateAndFetch(keys: MlxArray, values: MlxArray): [MlxArray, MlxArray] {
    if (keys.shape.length !== 4 || values.shape.length !== 4) throw new CacheError("HybridQuantKVCache.updateAndFetch", "keys and values must be 4-D (B, n_kv_heads, S, head_dim)");
    this.keys = HybridQuantKVCache.concat(this.keys, this.keyQuantizer.quantize(keys));
    this.values = HybridQuantKVCache.concat(this.values, this.valueQuantizer.quantize(values));
    this.offset += keys.shape[2]!;
    return this.dequantize();
  }

  /** (keys, values) dequantized over the whole state (caller-owned). */
  dequantize(): [MlxArray, MlxArray] {
    if (this.keys === null || this.values === null) throw new CacheError("HybridQuantKVCache", "dequantize of an empty cache");
    const k = this.keyQuantizer.dequantize(this.keys);
    try {
      return [k, this.valueQuantizer.dequantize(this.values)];
    } catch (e) {
      k.dispose();
      throw e;
    }
  }

  /** The state leaves as held: the keys' then the values' (caller-owned). */
  get quantizedState(): MlxArray[] {
    if (this.keys === null || this.values === null) return [];
    return [...this.keys, ...this.values].map((a) => mx.alias(a));
  }

  get keyLeafCount(): number {
    return this.keys?.length ?? 0;
  }

  get state(): MlxArray[] {
    return this.quantizedState;
  }

  set state(_v: MlxArray[]) {
    throw new CacheError("HybridQuantKVCache.state", "restoring a HybridQuantKVCache from state is not ported (a TurboQuant side's Split index sets are not in its state)");
  }

  get metaState(): string[] {
    const p = this.policy;
    return [String(this.offset), String(this.seed), pyFloat(p.bits), p.key.scheme, pyFloat(p.key.bits), p.value.scheme, pyFloat(p.value.bits), String(p.groupSize)];
  }

  set metaState(_v: string[]) {
    throw new CacheError("HybridQuantKVCache.metaState", "restoring a HybridQuantKVCache from meta_state is not ported");
  }

  isTrimmable(): boolean {
    return true;
  }

  trim(n: number): number {
    if (!Number.isInteger(n) || n < 0) throw new CacheError("HybridQuantKVCache.trim", `n must be a non-negative integer, got ${n}`);
    n = Math.min(this.offset, n);
    if (n <= 0) return 0;
    this.offset -= n;
    const cut = (s: MlxArray[] | null) => {
      if (s === null) return null;
      const out = s.map((a) => truncateT(a, this.offset));
      disposeAll(s);
      return out;
    };
    this.keys = cut(this.keys);
    this.values = cut(this.values);
    return n;
  }

  size(): number {
    return this.offset;
  }

  empty(): boolean {
    return this.keys === null;
  }

  makeMask(N: number, { windowSize = null, returnArray = false }: MakeMaskOptions = {}): Mask {
    return cacheAttentionMask(N, this.offset, returnArray, windowSize);
  }

  get nbytes(): number {
    return [...(this.keys ?? []), ...(this.values ?? [])].reduce((s, a) => s + a.nbytes, 0);
  }

  dispose(): void {
    disposeAll(this.keys);
    disposeAll(this.values);
    this.keys = this.values = null;
    this.keyQuantizer[Symbol.dispose]();
    this.valueQuantizer[Symbol.dispose]();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
