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
