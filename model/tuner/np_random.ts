// numpy's legacy global RandomState (np.random.seed / np.random.permutation), which mlx-lm's
// iterate_batches shuffles the batches with: MT19937 seeded by mt19937_seed(seed), permutation(n)
// = arange(n) shuffled by Fisher-Yates from the end, each index drawn by random_interval (a
// masked 32-bit draw, rejected until it is <= the bound). Ported from numpy's algorithm
// (numpy/random/src/mt19937, distributions.c), checked against numpy in suites/tuner.

const N = 624;
const M = 397;

export class RandomState {
  private readonly mt = new Uint32Array(N);
  private pos = N;

  constructor(seed = 0) {
    this.seed(seed);
  }

  /** RandomState.seed(int): mt19937_seed. */
  seed(seed: number): void {
    if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new RangeError("Seed must be between 0 and 2**32 - 1");
    let s = seed >>> 0;
    for (let i = 0; i < N; i++) {
      this.mt[i] = s;
      s = (Math.imul(1812433253, (s ^ (s >>> 30)) >>> 0) + i + 1) >>> 0;
    }
    this.pos = N;
  }

  private generate(): void {
    const mt = this.mt;
    for (let i = 0; i < N; i++) {
      const y = (mt[i]! & 0x80000000) | (mt[(i + 1) % N]! & 0x7fffffff);
      let v = mt[(i + M) % N]! ^ (y >>> 1);
      if (y & 1) v ^= 0x9908b0df;
      mt[i] = v >>> 0;
    }
    this.pos = 0;
  }

  /** next_uint32 (genrand_int32 with tempering). */
  nextUint32(): number {
    if (this.pos === N) this.generate();
    let y = this.mt[this.pos++]!;
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /** random_interval(max) for max < 2^32: the smallest covering bit mask, rejection sampled. */
  private interval(max: number): number {
    if (max === 0) return 0;
    let mask = max;
    mask |= mask >>> 1;
    mask |= mask >>> 2;
    mask |= mask >>> 4;
    mask |= mask >>> 8;
    mask |= mask >>> 16;
    mask >>>= 0;
    let v: number;
    do v = (this.nextUint32() & mask) >>> 0;
    while (v > max);
    return v;
  }

  /** permutation(n): a shuffled arange(n). */
  permutation(n: number): number[] {
    if (n > 0xffffffff) throw new RangeError("permutation: n must be below 2^32");
    const x = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i >= 1; i--) {
      const j = this.interval(i);
      const t = x[i]!;
      x[i] = x[j]!;
      x[j] = t;
    }
    return x;
  }
}

/** np.random's global state (numpy seeds it from the OS at import; mlx_lm.lora seeds it with --seed). */
export const globalRandom = new RandomState(Math.floor(Math.random() * 0xffffffff));

// ---------------------------------------------------------------- np.random.default_rng (PCG64)
// numpy's Generator(PCG64(SeedSequence(seed))), for mlx-vlm's TurboQuant sign vectors
// (np.random.default_rng(s).choice([-1.0, 1.0], size=n)). Ported from numpy's algorithms
// (bit_generator.pyx SeedSequence, pcg64.h XSL-RR 128/64, _bounded_integers Lemire draw) and
// checked against numpy in suites/kvquant.

const M32 = 0xffffffffn;
const M64 = (1n << 64n) - 1n;
const M128 = (1n << 128n) - 1n;
const PCG_MULT = 0x2360ed051fc65da44385df649fccf645n;

function mul32(a: number, b: number): number {
  return Math.imul(a, b) >>> 0;
}

/** SeedSequence(entropy).generate_state(nWords, uint32), pool size 4, no spawn key. */
export function seedSequenceState(entropy: number | bigint, nWords: number): Uint32Array {
  let e = BigInt(entropy);
  if (e < 0n) throw new RangeError("SeedSequence entropy must be non-negative");
  const words: number[] = [];
  do {
    words.push(Number(e & M32));
    e >>= 32n;
  } while (e > 0n);
  const pool = new Uint32Array(4);
  let hashA = 0x43b0d7e5;
  const hashmix = (value: number): number => {
    let v = (value ^ hashA) >>> 0;
    hashA = mul32(hashA, 0x931e8875);
    v = mul32(v, hashA);
    return (v ^ (v >>> 16)) >>> 0;
  };
  const mix = (x: number, y: number): number => {
    const r = (mul32(0xca01f9dd, x) - mul32(0x4973f715, y)) >>> 0;
    return (r ^ (r >>> 16)) >>> 0;
  };
  for (let i = 0; i < 4; i++) pool[i] = hashmix(i < words.length ? words[i]! : 0);
  for (let s = 0; s < 4; s++) for (let d = 0; d < 4; d++) if (s !== d) pool[d] = mix(pool[d]!, hashmix(pool[s]!));
  for (let s = 4; s < words.length; s++) for (let d = 0; d < 4; d++) pool[d] = mix(pool[d]!, hashmix(words[s]!));
  const out = new Uint32Array(nWords);
  let hashB = 0x8b51f9dd;
  for (let i = 0; i < nWords; i++) {
    let v = (pool[i % 4]! ^ hashB) >>> 0;
    hashB = mul32(hashB, 0x58f38ded);
    v = mul32(v, hashB);
    out[i] = (v ^ (v >>> 16)) >>> 0;
  }
  return out;
}

export class PCG64Generator {
  private state = 0n;
  private inc = 0n;
  private hasUint32 = false;
  private uinteger = 0;

  /** np.random.default_rng(seed) for a non-negative integer seed. */
  constructor(seed: number | bigint) {
    const w = seedSequenceState(seed, 8);
    const u64 = (i: number): bigint => (BigInt(w[2 * i + 1]!) << 32n) | BigInt(w[2 * i]!);
    const initState = (u64(0) << 64n) | u64(1);
    const initSeq = (u64(2) << 64n) | u64(3);
    // pcg_setseq_128_srandom_r
    this.inc = ((initSeq << 1n) | 1n) & M128;
    this.step();
    this.state = (this.state + initState) & M128;
    this.step();
  }

  private step(): void {
    this.state = (this.state * PCG_MULT + this.inc) & M128;
  }

  /** next_uint64: step, then XSL-RR output of the new state. */
  nextUint64(): bigint {
    this.step();
    const x = ((this.state >> 64n) ^ this.state) & M64;
    const rot = this.state >> 122n;
    return ((x >> rot) | (x << ((64n - rot) & 63n))) & M64;
  }

  /** next_uint32: the low half of a 64-bit draw, the high half kept for the next call. */
  nextUint32(): number {
    if (this.hasUint32) {
      this.hasUint32 = false;
      return this.uinteger;
    }
    const n = this.nextUint64();
    this.hasUint32 = true;
    this.uinteger = Number(n >> 32n);
    return Number(n & M32);
  }

  /** integers(0, n) for 1 <= n <= 2^32: Lemire's bounded draw on 32-bit words (numpy's path for ranges below 2^32). */
  integers(n: number, size: number): number[] {
    if (!Number.isInteger(n) || n < 1 || n > 2 ** 32) throw new RangeError("integers: n must be an integer in [1, 2^32]");
    const out: number[] = [];
    if (n === 1) return new Array(size).fill(0);
    const rngExcl = BigInt(n);
    const threshold = (M32 - (rngExcl - 1n)) % rngExcl;
    for (let i = 0; i < size; i++) {
      let m = BigInt(this.nextUint32()) * rngExcl;
      let left = m & M32;
      if (left < rngExcl) {
        while (left < threshold) {
          m = BigInt(this.nextUint32()) * rngExcl;
          left = m & M32;
        }
      }
      out.push(Number(m >> 32n));
    }
    return out;
  }

  /** choice(population, size) with replacement and uniform p: population[integers(0, len)]. */
  choice<T>(population: readonly T[], size: number): T[] {
    return this.integers(population.length, size).map((i) => population[i]!);
  }
}
