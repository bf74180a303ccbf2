// Python float arithmetic that JS does not reproduce bit for bit.
//
// mlx-lm computes its scale constants in float64 with Python's `**` (glibc pow) before they
// become float32 weak scalars: hidden_size**0.5, hidden_size**-0.5, P**0.5, 2.0**-0.5.
// JS Math.pow is far less accurate than glibc (it gives 0.7071067811865475 for 2**-0.5 where
// Python gives 0.7071067811865476; for n = 1..20000 it misses Python's n**-0.5 in 5331 cases).
// Here x**0.5 = sqrt(x) and x**-0.5 = the correctly rounded 1/sqrt(x); glibc pow is within
// 0.52 ULP, so these still differ from Python in the last float64 bit for 39 of n = 1..20000,
// but every one of those 40000 values rounds to the same float32, which is all MLX ever sees
// (a Python float becomes float32 before the array dtype). suites/gemma4/config.test.ts pins
// the float32 values of every size the real and tiny models use.

const buf = new DataView(new ArrayBuffer(8));

function bitsOf(d: number): bigint {
  buf.setFloat64(0, d);
  return buf.getBigUint64(0);
}

function fromBits(b: bigint): number {
  buf.setBigUint64(0, b);
  return buf.getFloat64(0);
}

/** Exact decomposition of a positive finite double: d = m * 2**e with integer m. */
function decompose(d: number): [bigint, number] {
  const b = bitsOf(d);
  const ex = Number((b >> 52n) & 0x7ffn);
  const frac = b & ((1n << 52n) - 1n);
  if (ex === 0) return [frac, -1074];
  return [frac | (1n << 52n), ex - 1075];
}

/** sign of (x * m**2 - 1) for positive doubles x and a dyadic m = p * 2**q. */
function cmpXM2(x: number, p: bigint, q: number): number {
  const [mx, ex] = decompose(x);
  // x * m^2 = mx * p^2 * 2^(ex + 2q)
  const num = mx * p * p;
  const e = ex + 2 * q;
  const lhs = e >= 0 ? num << BigInt(e) : num;
  const rhs = e >= 0 ? 1n : 1n << BigInt(-e);
  return lhs > rhs ? 1 : lhs < rhs ? -1 : 0;
}

/** The midpoint of adjacent positive doubles a < b as (p, q) with value p * 2**q. */
function midpoint(a: number, b: number): [bigint, number] {
  const [ma, ea] = decompose(a);
  const [mb, eb] = decompose(b);
  const e = Math.min(ea, eb);
  const pa = ma << BigInt(ea - e);
  const pb = mb << BigInt(eb - e);
  return [pa + pb, e - 1];
}

/** Correctly rounded x**-0.5 for a positive finite x. */
export function rsqrtCorrectlyRounded(x: number): number {
  if (!(x > 0) || !Number.isFinite(x)) return Math.pow(x, -0.5);
  let y = 1 / Math.sqrt(x);
  for (let i = 0; i < 4; i++) {
    const up = fromBits(bitsOf(y) + 1n);
    const dn = fromBits(bitsOf(y) - 1n);
    // t = x^-1/2 > m  <=>  x * m^2 < 1
    const [pu, qu] = midpoint(y, up);
    if (cmpXM2(x, pu, qu) < 0) {
      y = up;
      continue;
    }
    const [pd, qd] = midpoint(dn, y);
    if (cmpXM2(x, pd, qd) > 0) {
      y = dn;
      continue;
    }
    break;
  }
  return y;
}

/** Python's float `x ** y` for the exponents the model uses (±0.5 exactly; Math.pow otherwise). */
export function pyPow(x: number, y: number): number {
  if (y === 0.5) return Math.sqrt(x);
  if (y === -0.5) return rsqrtCorrectlyRounded(x);
  return Math.pow(x, y);
}
