// `np.abs(np.fft.rfft(x, n))` for float32 frames, as numpy 2.4 computes it, bit for bit:
//
// - rfft: numpy's C++ pocketfft (`pocketfft_hdronly`, `rfftp`). For float32 input numpy 2.4
//   picks the ufunc's double loop (the float32 frames are cast up) and casts the complex128
//   result to the complex64 `out` array: measured, np.fft.rfft(x32) equals
//   np.fft.rfft(x32.astype(float64)).astype(complex64) on every bin. So the real radix-4/radix-2
//   passes `radf4`/`radf2` run here in double, in pocketfft's order (JS doubles, no FMA, like
//   the x86-64 build), with `sincos_2pibyn`'s double twiddles, and each bin is rounded to float32
//   at the end. Only power-of-two lengths (fft_length = 2^ceil(log2(frame_length))).
// - abs of complex64: numpy's SIMD `cabs`, `sqrt(fma(r, r, 1)) * L` with L = max(|re|, |im|),
//   r = min/L (0 when L = 0). The fused multiply-add is the one of numpy's AVX2/AVX-512/NEON
//   kernels, emulated exactly here (numpy's plain-SSE build would use mul+add instead).

/** pocketfft's `rfftp` plan for a power-of-two length: factors and per-factor twiddles. */
interface Plan {
  n: number;
  factors: number[];
  twiddles: Float64Array[];
  /** Work buffers of `rfft` (pocketfft's c and ch). */
  a: Float64Array;
  b: Float64Array;
}

const plans = new Map<number, Plan>();

/** `sincos_2pibyn<double>(n)[idx]`: e^(2πi idx/n) from two double tables. */
function sincos2PiByN(n: number): (idx: number) => [number, number] {
  const ang = (0.25 * Math.PI) / n; // 0.25L*pi/n: exact scaling of π for a power of two n
  const calc = (x: number): [number, number] => {
    x *= 8;
    if (x < 4 * n) {
      if (x < 2 * n) {
        if (x < n) return [Math.cos(x * ang), Math.sin(x * ang)];
        return [Math.sin((2 * n - x) * ang), Math.cos((2 * n - x) * ang)];
      }
      x -= 2 * n;
      if (x < n) return [-Math.sin(x * ang), Math.cos(x * ang)];
      return [-Math.cos((2 * n - x) * ang), Math.sin((2 * n - x) * ang)];
    }
    x = 8 * n - x;
    if (x < 2 * n) {
      if (x < n) return [Math.cos(x * ang), -Math.sin(x * ang)];
      return [Math.sin((2 * n - x) * ang), -Math.cos((2 * n - x) * ang)];
    }
    x -= 2 * n;
    if (x < n) return [-Math.sin(x * ang), -Math.cos(x * ang)];
    return [-Math.cos((2 * n - x) * ang), -Math.sin((2 * n - x) * ang)];
  };
  const nval = Math.floor((n + 2) / 2);
  let shift = 1;
  while ((1 << shift) * (1 << shift) < nval) shift++;
  const mask = (1 << shift) - 1;
  const v1: [number, number][] = [[1, 0]];
  for (let i = 1; i <= mask; i++) v1.push(calc(i));
  const v2: [number, number][] = [[1, 0]];
  for (let i = 1; i < Math.floor((nval + mask) / (mask + 1)); i++) v2.push(calc(i * (mask + 1)));
  return (idx) => {
    const conj = 2 * idx > n;
    if (conj) idx = n - idx;
    const [ar, ai] = v1[idx & mask]!;
    const [br, bi] = v2[idx >> shift]!;
    const re = ar * br - ai * bi;
    const im = ar * bi + ai * br;
    return [re, conj ? -im : im];
  };
}

function plan(n: number): Plan {
  let p = plans.get(n);
  if (p) return p;
  if (n < 2 || (n & (n - 1)) !== 0) throw new RangeError(`rfft length ${n} is not a power of two`);
  // rfftp::factorize: 4s first, then a single 2, moved to the front.
  const factors: number[] = [];
  let len = n;
  while (len % 4 === 0) {
    factors.push(4);
    len >>= 2;
  }
  if (len % 2 === 0) {
    factors.push(2);
    [factors[0], factors[factors.length - 1]] = [factors[factors.length - 1]!, factors[0]!];
  }
  // rfftp::comp_twiddle
  const twid = sincos2PiByN(n);
  const twiddles: Float64Array[] = [];
  let l1 = 1;
  factors.forEach((ip, k) => {
    const ido = n / (l1 * ip);
    const tw = new Float64Array(Math.max(0, (ip - 1) * (ido - 1)));
    if (k < factors.length - 1)
      for (let j = 1; j < ip; j++)
        for (let i = 1; i <= (ido - 1) >> 1; i++) {
          const [re, im] = twid(j * l1 * i);
          tw[(j - 1) * (ido - 1) + 2 * i - 2] = re;
          tw[(j - 1) * (ido - 1) + 2 * i - 1] = im;
        }
    twiddles.push(tw);
    l1 *= ip;
  });
  p = { n, factors, twiddles, a: new Float64Array(n), b: new Float64Array(n) };
  plans.set(n, p);
  return p;
}

/** pocketfft's `hsqt2` for T0 = double: 0.707106781186547524400844362104849L as a double. */
const HSQT2 = 0.7071067811865476;

// radf2 / radf4 with pocketfft's index macros written out: CC(a, b, c) = cc[a + ido*(b + l1*c)],
// CH(a, b, c) = ch[a + ido*(b + ip*c)], WA(x, i) = wa[i + x*(ido - 1)]; every expression keeps
// pocketfft's operand order (PM(a, b, c, d): a = c + d, b = c - d; MULPM: conj(wa) * cc).

function radf2(ido: number, l1: number, cc: Float64Array, ch: Float64Array, wa: Float64Array): void {
  const cs = ido * l1; // CC stride of c
  for (let k = 0; k < l1; k++) {
    const c0 = ido * k;
    ch[2 * ido * k] = cc[c0]! + cc[c0 + cs]!;
    ch[ido - 1 + ido * (1 + 2 * k)] = cc[c0]! - cc[c0 + cs]!;
  }
  if ((ido & 1) === 0)
    for (let k = 0; k < l1; k++) {
      ch[ido * (1 + 2 * k)] = -cc[ido - 1 + ido * k + cs]!;
      ch[ido - 1 + 2 * ido * k] = cc[ido - 1 + ido * k]!;
    }
  if (ido <= 2) return;
  for (let k = 0; k < l1; k++) {
    const c0 = ido * k;
    const h0 = 2 * ido * k;
    const h1 = h0 + ido;
    for (let i = 2; i < ido; i += 2) {
      const ic = ido - i;
      const c = wa[i - 2]!;
      const d = wa[i - 1]!;
      const e = cc[i - 1 + c0 + cs]!;
      const g = cc[i + c0 + cs]!;
      const tr2 = c * e + d * g;
      const ti2 = c * g - d * e;
      ch[i - 1 + h0] = cc[i - 1 + c0]! + tr2;
      ch[ic - 1 + h1] = cc[i - 1 + c0]! - tr2;
      ch[i + h0] = ti2 + cc[i + c0]!;
      ch[ic + h1] = ti2 - cc[i + c0]!;
    }
  }
}

function radf4(ido: number, l1: number, cc: Float64Array, ch: Float64Array, wa: Float64Array): void {
  const cs = ido * l1;
  for (let k = 0; k < l1; k++) {
    const c = ido * k;
    const h = 4 * ido * k;
    const tr1 = cc[c + 3 * cs]! + cc[c + cs]!;
    ch[h + 2 * ido] = cc[c + 3 * cs]! - cc[c + cs]!;
    const tr2 = cc[c]! + cc[c + 2 * cs]!;
    ch[ido - 1 + h + ido] = cc[c]! - cc[c + 2 * cs]!;
    ch[h] = tr2 + tr1;
    ch[ido - 1 + h + 3 * ido] = tr2 - tr1;
  }
  if ((ido & 1) === 0)
    for (let k = 0; k < l1; k++) {
      const c = ido - 1 + ido * k;
      const h = 4 * ido * k;
      const ti1 = -HSQT2 * (cc[c + cs]! + cc[c + 3 * cs]!);
      const tr1 = HSQT2 * (cc[c + cs]! - cc[c + 3 * cs]!);
      ch[ido - 1 + h] = cc[c]! + tr1;
      ch[ido - 1 + h + 2 * ido] = cc[c]! - tr1;
      ch[h + 3 * ido] = ti1 + cc[c + 2 * cs]!;
      ch[h + ido] = ti1 - cc[c + 2 * cs]!;
    }
  if (ido <= 2) return;
  const ws = ido - 1;
  for (let k = 0; k < l1; k++) {
    const c = ido * k;
    const h = 4 * ido * k;
    for (let i = 2; i < ido; i += 2) {
      const ic = ido - i;
      const w = i - 2;
      const e1 = cc[i - 1 + c + cs]!, g1 = cc[i + c + cs]!;
      const e2 = cc[i - 1 + c + 2 * cs]!, g2 = cc[i + c + 2 * cs]!;
      const e3 = cc[i - 1 + c + 3 * cs]!, g3 = cc[i + c + 3 * cs]!;
      const cr2 = wa[w]! * e1 + wa[w + 1]! * g1;
      const ci2 = wa[w]! * g1 - wa[w + 1]! * e1;
      const cr3 = wa[w + ws]! * e2 + wa[w + ws + 1]! * g2;
      const ci3 = wa[w + ws]! * g2 - wa[w + ws + 1]! * e2;
      const cr4 = wa[w + 2 * ws]! * e3 + wa[w + 2 * ws + 1]! * g3;
      const ci4 = wa[w + 2 * ws]! * g3 - wa[w + 2 * ws + 1]! * e3;
      const tr1 = cr4 + cr2;
      const tr4 = cr4 - cr2;
      const ti1 = ci2 + ci4;
      const ti4 = ci2 - ci4;
      const tr2 = cc[i - 1 + c]! + cr3;
      const tr3 = cc[i - 1 + c]! - cr3;
      const ti2 = cc[i + c]! + ci3;
      const ti3 = cc[i + c]! - ci3;
      ch[i - 1 + h] = tr2 + tr1;
      ch[ic - 1 + h + 3 * ido] = tr2 - tr1;
      ch[i + h] = ti1 + ti2;
      ch[ic + h + 3 * ido] = ti1 - ti2;
      ch[i - 1 + h + 2 * ido] = tr3 + ti4;
      ch[ic - 1 + h + ido] = tr3 - ti4;
      ch[i + h + 2 * ido] = tr4 + ti3;
      ch[ic + h + ido] = tr4 - ti3;
    }
  }
}

/**
 * `np.fft.rfft(x, n)` of float32 input (zero-padded or cut to n): the n/2 + 1 complex64 bins
 * as interleaved (re, im) float32 pairs.
 */
export function rfft(x: Float32Array, n: number): Float32Array {
  const p = plan(n);
  let p1 = p.a;
  let p2 = p.b;
  p1.fill(0);
  p1.set(x.length > n ? x.subarray(0, n) : x);
  // rfftp::exec, forward (r2hc): the factors from last to first.
  let l1 = n;
  for (let k1 = 0; k1 < p.factors.length; k1++) {
    const k = p.factors.length - k1 - 1;
    const ip = p.factors[k]!;
    const ido = n / l1;
    l1 /= ip;
    if (ip === 4) radf4(ido, l1, p1, p2, p.twiddles[k]!);
    else radf2(ido, l1, p1, p2, p.twiddles[k]!);
    [p1, p2] = [p2, p1];
  }
  // FFTPACK order r0, r1, i1, ..., r(n/2) -> complex bins, with im 0 at DC and Nyquist; the
  // Float32Array store is the cast to complex64.
  const out = new Float32Array(n + 2);
  out[0] = p1[0]!;
  for (let i = 1; i < n; i++) out[i + 1] = p1[i]!;
  out[n + 1] = 0;
  out[1] = 0;
  return out;
}

const scratch = new Float64Array(1);
const scratchLow = new Uint32Array(scratch.buffer); // [0] is the low word on little-endian hosts

/** float32 fma(a, a, 1) for 0 <= a <= 1, correctly rounded: p + 1 in round-to-odd double
 * (exact for the rounding that follows), then rounded to float32. */
function fmaSquarePlusOne(a: number): number {
  const p = a * a; // exact: 24 x 24 bits
  const s = p + 1; // in [1, 2]
  const err = p - (s - 1); // Fast2Sum (1 >= p): the exact p + 1 is s + err
  if (err === 0) return Math.fround(s);
  scratch[0] = s;
  if ((scratchLow[0]! & 1) === 0) {
    // Step one double ulp toward the exact value (the ulp is 2^-52 in [1, 2), 2^-53 below 2).
    const up = err > 0;
    scratch[0] = s === 2 && !up ? s - 2 ** -53 : up ? s + (s === 2 ? 2 ** -51 : 2 ** -52) : s - 2 ** -52;
  }
  return Math.fround(scratch[0]);
}

/** numpy's complex64 `abs` of one bin. */
export function cabs32(re: number, im: number): number {
  const a = Math.abs(re);
  const b = Math.abs(im);
  if (a === Infinity || b === Infinity) return Infinity;
  if (Number.isNaN(a) || Number.isNaN(b)) return Number.NaN;
  const larger = Math.max(a, b);
  const smaller = Math.min(a, b);
  const ratio = larger === 0 ? 0 : Math.fround(smaller / larger);
  return Math.fround(Math.fround(Math.sqrt(fmaSquarePlusOne(ratio))) * larger);
}
