// mx.fast: rms_norm, layer_norm, rope, scaled_dot_product_attention.
import { MlxArray, own } from "./array.ts";
import { MlxError } from "./errors.ts";
import { cstr, lib } from "./native.ts";

function need(x: unknown, op: string, what: string): MlxArray {
  if (x instanceof MlxArray) return x;
  throw new MlxError(op, `${what} must be an MlxArray`);
}

/** mx.fast.rms_norm(x, weight | null, eps). eps is a C float, as in Python. */
export function rmsNorm(x: MlxArray, weight: MlxArray | null, eps: number): MlxArray {
  return own(lib.mlxb_rms_norm(need(x, "fast.rms_norm", "x").handle, weight ? weight.handle : 0, eps), "fast.rms_norm");
}

export function layerNorm(x: MlxArray, weight: MlxArray | null, bias: MlxArray | null, eps: number): MlxArray {
  return own(lib.mlxb_layer_norm(need(x, "fast.layer_norm", "x").handle, weight ? weight.handle : 0, bias ? bias.handle : 0, eps), "fast.layer_norm");
}

export interface RopeArgs {
  traditional: boolean;
  /** Exactly one of base and freqs. */
  base?: number | null;
  freqs?: MlxArray | null;
  scale: number;
  /** An int, or an int array (0-d or one per batch). */
  offset: number | MlxArray;
}

/** mx.fast.rope(x, dims, traditional=, base=, scale=, offset=, freqs=). */
export function rope(x: MlxArray, dims: number, { traditional, base = null, freqs = null, scale, offset }: RopeArgs): MlxArray {
  const hasBase = base !== null && base !== undefined;
  const off = offset instanceof MlxArray ? offset.handle : 0;
  const intOff = offset instanceof MlxArray ? 0 : offset;
  if (!(offset instanceof MlxArray) && !Number.isInteger(offset)) throw new MlxError("fast.rope", "offset must be an integer");
  return own(
    lib.mlxb_rope(need(x, "fast.rope", "x").handle, dims, traditional ? 1 : 0, hasBase ? base : 0, hasBase ? 1 : 0, scale, intOff, off, freqs ? freqs.handle : 0),
    "fast.rope",
  );
}

/** mask: null (none), "causal", or an array (bool, or additive in the output dtype). */
export function scaledDotProductAttention(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  { scale, mask = null, sinks = null }: { scale: number; mask?: MlxArray | "causal" | null; sinks?: MlxArray | null },
): MlxArray {
  const op = "fast.scaled_dot_product_attention";
  let mode = "";
  let arrMask = 0;
  if (mask === "causal") mode = "causal";
  else if (mask instanceof MlxArray) arrMask = mask.handle;
  else if (mask !== null) throw new MlxError(op, `mask must be null, "causal" or an MlxArray, got ${String(mask)}`);
  return own(
    lib.mlxb_sdpa(need(q, op, "queries").handle, need(k, op, "keys").handle, need(v, op, "values").handle, scale, cstr(mode), arrMask, sinks ? sinks.handle : 0),
    op,
  );
}

/** mx.fast.cross_entropy(logits, targets): per-position CE over the last axis (nn.losses' GPU path). */
export function crossEntropy(logits: MlxArray, targets: MlxArray): MlxArray {
  return own(lib.mlxb_fast_cross_entropy(need(logits, "fast.cross_entropy", "logits").handle, need(targets, "fast.cross_entropy", "targets").handle), "fast.cross_entropy");
}
export { cudaKernel, CustomKernel, type KernelCall, type KernelSpec, metalKernel, type TemplateArg } from "./kernels.ts";
