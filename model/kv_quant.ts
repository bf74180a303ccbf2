// mlx_vlm/kv_quant.py (mlx-vlm 0.7.10): the KV-cache quantization policy, per key and value.
//
// - fromLegacy(kv_bits, scheme, group_size, key_bits, value_bits, key_scheme, value_scheme) is
//   from_legacy: TurboQuant when the scheme says so or the bits are fractional
//   (turboquant_enabled); then resolve_kv_bits splits a fractional width B into keys floor(B)
//   and values ceil(B) unless key/value bits are given; TurboQuant takes integer and .5 widths
//   >= 1 (_validate_bits); uniform takes integer bits only.
// - Errors carry mlx-vlm's ValueError messages word for word (KVQuantError), so that a face can
//   print the same line the oracle prints.
// - validateUniformGroup: what mx.quantize refuses later in mlx-vlm (bits outside 1-6/8, a group
//   size other than 32/64/128, one that does not divide the head dim); the port checks it before
//   generating (mlx-vlm fails at conversion time, see generate.ts's quantization hook).
import { pyFloatRepr } from "./pyjson.ts";

export const TURBOQUANT_SCHEME = "turboquant";
export const UNIFORM_SCHEME = "uniform";
export const DEFAULT_KV_GROUP_SIZE = 64;
export const DEFAULT_QUANTIZED_KV_START = 5000;

export class KVQuantError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "KVQuantError";
  }
}

export interface KVQuantSpec {
  readonly scheme: string;
  readonly bits: number;
  readonly groupSize: number;
}

/** Python's math.isclose(a, b, abs_tol=1e-6) (rel_tol 1e-9). */
function isClose(a: number, b: number, absTol = 1e-6): boolean {
  if (a === b) return true;
  const diff = Math.abs(a - b);
  return diff <= Math.max(1e-9 * Math.max(Math.abs(a), Math.abs(b)), absTol);
}

/** Python's round(x) on a float: banker's rounding. */
export function pyRound(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** repr() of a Python str as mlx-vlm's messages show it ('x', or "x" when it holds a quote). */
function pyStrRepr(s: string): string {
  return s.includes("'") && !s.includes('"') ? `"${s}"` : `'${s.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`;
}

export class KVQuantPolicy {
  constructor(
    readonly bits: number,
    readonly key: KVQuantSpec,
    readonly value: KVQuantSpec,
  ) {}

  get isHomogeneous(): boolean {
    return this.key.scheme === this.value.scheme;
  }

  get isTurboquant(): boolean {
    return this.key.scheme === TURBOQUANT_SCHEME && this.value.scheme === TURBOQUANT_SCHEME;
  }

  get scheme(): string {
    if (!this.isHomogeneous) throw new KVQuantError("policy mixes quantization schemes; inspect key/value separately");
    return this.key.scheme;
  }

  get groupSize(): number {
    return this.key.groupSize;
  }

  get hasSplitOverride(): boolean {
    return !isDefaultSplit(this.bits, this.key.bits, this.value.bits);
  }
}

function isDefaultSplit(bits: number, keyBits: number, valueBits: number): boolean {
  const fractional = !isClose(bits, pyRound(bits));
  const expectedKey = fractional ? Math.floor(bits) : bits;
  const expectedValue = fractional ? Math.ceil(bits) : bits;
  return isClose(keyBits, expectedKey) && isClose(valueBits, expectedValue);
}

/** turboquant._validate_bits: >= 1, integer or .5; returns the width rounded to a half. */
export function validateTurboBits(bits: number): number {
  if (!(bits >= 1)) throw new KVQuantError("TurboQuant requires kv_bits >= 1.");
  const rounded = pyRound(bits * 2) / 2;
  if (!isClose(bits, rounded)) throw new KVQuantError(`TurboQuant currently supports integer and .5 bit-widths, got ${pyFloatRepr(bits)}.`);
  return rounded;
}

/** turboquant.resolve_kv_bits: [bits, key_bits, value_bits]. */
export function resolveKvBits(bits: number, keyBits: number | null = null, valueBits: number | null = null): [number, number, number] {
  const b = validateTurboBits(bits);
  const fractional = !isClose(b, pyRound(b));
  const k = keyBits ?? (fractional ? Math.floor(b) : b);
  const v = valueBits ?? (fractional ? Math.ceil(b) : b);
  return [b, validateTurboBits(k), validateTurboBits(v)];
}

/** turboquant.turboquant_enabled. */
export function turboquantEnabled(bits: number | null, scheme: string | null = null): boolean {
  if (bits === null) return false;
  if (scheme === TURBOQUANT_SCHEME) return true;
  return !isClose(bits, pyRound(bits));
}

function validateScheme(scheme: string | null, fallback: string): string {
  if (scheme === null) return fallback;
  if (scheme !== UNIFORM_SCHEME && scheme !== TURBOQUANT_SCHEME) {
    throw new KVQuantError(`unknown KV quantization scheme ${pyStrRepr(scheme)}; expected ${pyStrRepr(UNIFORM_SCHEME)} or ${pyStrRepr(TURBOQUANT_SCHEME)}`);
  }
  return scheme;
}

function bitsForScheme(scheme: string, baseScheme: string, defaultBits: number, explicitBits: number | null, nominalBits: number): number {
  const bits = explicitBits !== null ? explicitBits : scheme === baseScheme ? defaultBits : nominalBits;
  if (scheme === UNIFORM_SCHEME && !Number.isInteger(bits)) throw new KVQuantError(`uniform KV quantization requires integer bits, got ${pyFloatRepr(bits)}`);
  return bits;
}

export interface LegacyKVQuantArgs {
  kvBits: number | null;
  kvQuantScheme?: string | null;
  kvGroupSize?: number;
  kvKeyBits?: number | null;
  kvValueBits?: number | null;
  kvKeyScheme?: string | null;
  kvValueScheme?: string | null;
}

/**
 * kv_quant.from_legacy. mlx-vlm's generate_step checks nothing before the first conversion; the
 * same checks run here, with the same messages, in the same order.
 */
export function fromLegacy(a: LegacyKVQuantArgs): KVQuantPolicy | null {
  if (a.kvBits === null) return null;
  const scheme0 = a.kvQuantScheme ?? null;
  const keyBitsArg = a.kvKeyBits ?? null;
  const valueBitsArg = a.kvValueBits ?? null;
  let bits: number;
  let defaultKey: number;
  let defaultValue: number;
  let scheme: string;
  if (turboquantEnabled(a.kvBits, scheme0)) {
    [bits, defaultKey, defaultValue] = resolveKvBits(a.kvBits, keyBitsArg, valueBitsArg);
    scheme = TURBOQUANT_SCHEME;
  } else {
    bits = a.kvBits;
    defaultKey = keyBitsArg ?? bits;
    defaultValue = valueBitsArg ?? bits;
    scheme = UNIFORM_SCHEME;
  }
  const groupSize = Math.trunc(a.kvGroupSize ?? DEFAULT_KV_GROUP_SIZE);
  const keyScheme = validateScheme(a.kvKeyScheme ?? null, scheme);
  const valueScheme = validateScheme(a.kvValueScheme ?? null, scheme);
  const keyBits = bitsForScheme(keyScheme, scheme, defaultKey, keyBitsArg, bits);
  const valueBits = bitsForScheme(valueScheme, scheme, defaultValue, valueBitsArg, bits);
  return new KVQuantPolicy(bits, { scheme: keyScheme, bits: keyBits, groupSize }, { scheme: valueScheme, bits: valueBits, groupSize });
}

/** What mx.quantize accepts for the uniform scheme (MLX 0.32: affine mode). */
export const UNIFORM_BITS = [1, 2, 3, 4, 5, 6, 8] as const;
export const UNIFORM_GROUP_SIZES = [32, 64, 128] as const;

/**
 * The uniform scheme's bits / group size against a head dim, with mx.quantize's own messages
 * (divisibility first, then the group size, then the bits: the order MLX 0.32 checks them in).
 * mlx-vlm meets them at conversion time; the port checks before generating.
 */
export function validateUniformGroup(bits: number, groupSize: number, headDim: number): void {
  if (headDim % groupSize !== 0) throw new KVQuantError(`[quantize] The last dimension of the matrix needs to be divisible by the quantization group size ${groupSize}. The head dim is ${headDim}.`);
  if (!(UNIFORM_GROUP_SIZES as readonly number[]).includes(groupSize)) throw new KVQuantError(`[quantize] The requested group size ${groupSize} is not supported. The supported group sizes are 32, 64, and 128.`);
  if (!(UNIFORM_BITS as readonly number[]).includes(bits)) throw new KVQuantError(`[quantize] The requested number of bits ${bits} is not supported. The supported bits are 1, 2, 3, 4, 5, 6 and 8.`);
}
