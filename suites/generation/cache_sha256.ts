// A cache's contents as the oracle reports them (oracle/python/server.py cache_sha256,
// suites/generation/gen_ref.py): per layer, the dtype and the sha256 of the key and value buffers'
// raw bytes as held (KVCache: full capacity; RotatingKVCache: physical order — the state mlx-lm
// saves). Compared with the oracle's, it checks the final caches' contents, not just their
// offsets and shapes.
import { createHash } from "node:crypto";
import type { MlxArray } from "@mlx-bun/mlx";
import type { CacheSha256 } from "../../oracle/client.ts";
import type { KVCacheLike } from "../../model/cache/index.ts";

function digest(a: MlxArray | null | undefined): string | null {
  return a ? createHash("sha256").update(a.toBytes()).digest("hex") : null;
}

export function cacheSha256(cache: readonly KVCacheLike[]): CacheSha256[] {
  return cache.map((c) => {
    const { keys, values } = c as unknown as { keys: MlxArray | null; values: MlxArray | null };
    return { dtype: keys ? keys.dtype : null, keys: digest(keys), values: digest(values) };
  });
}

/** The first layer whose contents differ from the oracle's, named; null when all agree. */
export function firstCacheDifference(ours: readonly CacheSha256[], theirs: readonly CacheSha256[]): string | null {
  if (ours.length !== theirs.length) return `${ours.length} cache layers, the oracle ${theirs.length}`;
  for (const [i, o] of ours.entries()) {
    const t = theirs[i]!;
    for (const k of ["dtype", "keys", "values"] as const) {
      if (o[k] !== t[k]) return `layer ${i} ${k}: TS ${o[k]} vs oracle ${t[k]}`;
    }
  }
  return null;
}
