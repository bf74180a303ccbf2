// mlx_lm/models/rope_utils.py: initialize_rope and ProportionalRoPE (the rope types Gemma 4 uses).
//
// The two RoPE paths compute inverse frequencies differently inside mx.fast.rope (spec §3.4):
// nn.RoPE passes `base` (exp of a scaled arange), ProportionalRoPE passes `freqs` (reciprocal).
// Which one a layer uses is decided exactly as initialize_rope decides it.

import * as mx from "@mlx-bun/mlx";
import type { MlxArray } from "@mlx-bun/mlx";
import { type RopeParams, ropeTypeOf } from "./config.ts";
import { Module, RoPE, type RopeLike } from "./nn.ts";
import { mutated } from "./mutations.ts";

/**
 * ProportionalRoPE (rope_utils.py): rotates the first `rotated_dims/2` angle pairs of each half
 * of the FULL head dim; the rest get an infinite period (θ = 0 ⇒ identity). `_freqs` is built
 * on-device with the same float32 ops as Python:
 *   exponents = arange(0, rotated_dims, 2, float32) / dims
 *   freqs = concatenate([factor * (base ** exponents), full(((dims - rotated_dims) // 2,), inf)])
 */
export class ProportionalRoPE extends Module implements RopeLike {
  readonly _freqs: MlxArray; // leading underscore: not a parameter (as in Python)
  constructor(
    readonly dims: number,
    readonly rotated_dims: number,
    readonly traditional = false,
    readonly base = 10000.0,
    readonly factor = 1.0,
  ) {
    super();
    if (rotated_dims > dims) throw new Error("rotated_dims should be smaller than dims");
    using ar = mx.arange(0, rotated_dims, 2, "float32");
    using exponents = mx.divide(ar, dims); // `/ dims`: Python int → weak scalar in float32
    using pw = mx.power(mx.pyFloat(base), exponents); // base ** exponents → __rpow__ → power(array(f32 base), e)
    using scaled = mx.multiply(pw, mx.pyFloat(factor)); // factor * (...) → __rmul__ → multiply(t, factor)
    using inf = mx.full([Math.floor((dims - rotated_dims) / 2)], Infinity); // mx.full(..., mx.inf): float32
    this._freqs = mx.concatenate([scaled, inf]);
  }

  call(x: MlxArray, offset: number | MlxArray = 0): MlxArray {
    return mx.fast.rope(x, this.dims, { traditional: this.traditional, base: null, scale: 1.0, offset, freqs: this._freqs });
  }
}

/** rope_utils.initialize_rope for the types Gemma 4 configs use (default, linear, proportional). */
export function initializeRope(dims: number, base: number, traditional: boolean, scalingConfig: RopeParams | null): RopeLike {
  const ropeType = scalingConfig ? ropeTypeOf(scalingConfig) : "default";
  if (ropeType === "default" || ropeType === "linear") {
    const scale = ropeType === "linear" ? 1 / (scalingConfig!.factor as number) : 1.0;
    return new RoPE(dims, traditional, base, scale);
  }
  if (ropeType === "proportional") {
    const prf = mutated("rope_full_factor_1") ? 1.0 : (scalingConfig!.partial_rotary_factor ?? 1.0);
    return new ProportionalRoPE(dims, Math.trunc(dims * prf), traditional, base, scalingConfig!.factor ?? 1.0);
  }
  throw new Error(`Unsupported RoPE type ${ropeType}`);
}
