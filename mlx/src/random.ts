// mx.random, with Python's global key sequence: mx.random.seed(s) sets state = key(s), and
// every draw without an explicit key does (state, sub) = split(state) and uses sub.
import { MlxArray, own, ownVec, shapeArg } from "./array.ts";
import { type Dtype, dtypeCode } from "./dtype.ts";
import { MlxError } from "./errors.ts";
import { lib } from "./native.ts";
import { take } from "./ops.ts";

let state: MlxArray | null = null;

export function key(seed: number): MlxArray {
  if (!Number.isInteger(seed) || seed < 0) throw new MlxError("random.key", `seed must be a non-negative integer, got ${seed}`);
  return own(lib.mlxb_random_key(seed), "random.key");
}

/** mx.random.seed(s). */
export function seed(s: number): void {
  const k = key(s);
  state?.dispose();
  state = k;
}

/**
 * mx.random.state: the global key as a list of arrays, for compile({inputs, outputs}) capture
 * (Python's `@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)`).
 * get() returns new handles the caller owns; set() takes ownership of what it is given.
 */
export const state_ = {
  get(): MlxArray[] {
    if (state === null) seed(Date.now() % 2 ** 32);
    return [own(lib.mlxb_retain(state!.handle), "random.state")];
  },
  set(arrays: MlxArray[]): void {
    if (arrays.length !== 1) throw new MlxError("random.state", `expected 1 key array, got ${arrays.length}`);
    state?.dispose();
    state = arrays[0]!;
  },
};
export { state_ as state };

/** mx.random.split(key, num=2) → an array of shape (num, 2). */
export function split(k: MlxArray, num = 2): MlxArray {
  const [out] = ownVec(lib.mlxb_random_split(k.handle, num), "random.split");
  return out!;
}

/** Next subkey of the global sequence (seeded from the clock if never seeded, as in Python). */
function nextKey(): MlxArray {
  if (state === null) seed(Date.now() % 2 ** 32);
  const pair = split(state!, 2);
  try {
    const zero = own(lib.mlxb_scalar(0, 1, dtypeCode("int32")), "random");
    const one = own(lib.mlxb_scalar(1, 1, dtypeCode("int32")), "random");
    try {
      const next = take(pair, zero, 0);
      const sub = take(pair, one, 0);
      state!.dispose();
      state = next;
      return sub;
    } finally {
      zero.dispose();
      one.dispose();
    }
  } finally {
    pair.dispose();
  }
}

function withKey<T>(k: MlxArray | undefined, f: (h: number) => T): T {
  if (k) return f(k.handle);
  const sub = nextKey();
  try {
    return f(sub.handle);
  } finally {
    sub.dispose();
  }
}

export function uniform(
  { low = 0, high = 1, shape = [], dtype = "float32", key: k }: { low?: number | MlxArray; high?: number | MlxArray; shape?: readonly number[]; dtype?: Dtype; key?: MlxArray } = {},
): MlxArray {
  const s = shapeArg(shape, "random.uniform");
  // Python: low/high scalars become float32 arrays.
  const lo = low instanceof MlxArray ? low : own(lib.mlxb_scalar(low, 0, dtypeCode("float32")), "random.uniform");
  const hi = high instanceof MlxArray ? high : own(lib.mlxb_scalar(high, 0, dtypeCode("float32")), "random.uniform");
  try {
    return withKey(k, (kh) => own(lib.mlxb_random_uniform(lo.handle, hi.handle, s, s.length, dtypeCode(dtype), kh), "random.uniform"));
  } finally {
    if (lo !== low) lo.dispose();
    if (hi !== high) hi.dispose();
  }
}

export function normal(
  { shape = [], dtype = "float32", loc, scale, key: k }: { shape?: readonly number[]; dtype?: Dtype; loc?: number; scale?: number; key?: MlxArray } = {},
): MlxArray {
  const s = shapeArg(shape, "random.normal");
  // As the C++ float overload Python calls: loc 0 / scale 1 are absent, else array((float)v, dtype).
  const l = loc === undefined || loc === 0 ? null : own(lib.mlxb_scalar(loc, 0, dtypeCode(dtype)), "random.normal");
  const sc = scale === undefined || scale === 1 ? null : own(lib.mlxb_scalar(scale, 0, dtypeCode(dtype)), "random.normal");
  try {
    return withKey(k, (kh) => own(lib.mlxb_random_normal(s, s.length, dtypeCode(dtype), l ? l.handle : 0, sc ? sc.handle : 0, kh), "random.normal"));
  } finally {
    l?.dispose();
    sc?.dispose();
  }
}

/** mx.random.categorical(logits, axis=-1, shape=None, num_samples=None, key=None). */
export function categorical(
  logits: MlxArray,
  { axis = -1, shape, numSamples, key: k }: { axis?: number; shape?: readonly number[]; numSamples?: number; key?: MlxArray } = {},
): MlxArray {
  if (shape !== undefined && numSamples !== undefined) throw new MlxError("random.categorical", "give at most one of shape and numSamples");
  const s = shapeArg(shape ?? [], "random.categorical");
  return withKey(k, (kh) =>
    own(lib.mlxb_random_categorical(logits.handle, axis, s, shape === undefined ? -1 : s.length, numSamples ?? 0, kh), "random.categorical"),
  );
}

/** mx.random.bernoulli(p, shape, key): a Python float p becomes a float32 array, as in Python. */
export function bernoulli(p: number | MlxArray, { shape, key: k }: { shape?: readonly number[]; key?: MlxArray } = {}): MlxArray {
  const pa = p instanceof MlxArray ? p : own(lib.mlxb_scalar(p, 0, dtypeCode("float32")), "random.bernoulli");
  try {
    const s = shapeArg(shape ?? pa.shape, "random.bernoulli");
    return withKey(k, (kh) => own(lib.mlxb_random_bernoulli(pa.handle, s, s.length, kh), "random.bernoulli"));
  } finally {
    if (pa !== p) pa.dispose();
  }
}
