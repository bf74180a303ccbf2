// Copies a checkpoint and perturbs one element of one tensor by one ULP (its bit pattern + 1),
// to check that the parity command finds the divergence exactly where it starts.
//   bun parity/perturb.ts <src dir> <dst dir> <tensor key> [flat index]
import { copyFileSync, mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import * as mx from "@mlx-bun/mlx";

export function perturbCheckpoint(src: string, dst: string, key: string, index = 0): string {
  mkdirSync(dst, { recursive: true });
  let file: string | null = null;
  for (const f of readdirSync(src)) {
    if (!f.endsWith(".safetensors")) {
      copyFileSync(join(src, f), join(dst, f));
      continue;
    }
    const { arrays, metadata } = mx.loadSafetensors(join(src, f));
    const t = arrays.get(key);
    if (t) {
      const bytes = t.toBytes();
      const width = bytes.byteLength / t.size;
      const view = new DataView(bytes.buffer);
      if (width === 2) view.setUint16(index * 2, view.getUint16(index * 2, true) + 1, true);
      else if (width === 4) view.setUint32(index * 4, view.getUint32(index * 4, true) + 1, true);
      else throw new Error(`cannot perturb ${key}: element width ${width}`);
      arrays.set(key, mx.fromBytes(bytes, t.shape, t.dtype));
      t.dispose();
      file = f;
    }
    mx.saveSafetensors(join(dst, f), arrays, metadata);
    for (const a of arrays.values()) a.dispose();
  }
  if (file === null) throw new Error(`no tensor ${key} in ${src}`);
  return file;
}

if (import.meta.main) {
  const [src, dst, key, idx] = process.argv.slice(2);
  if (!src || !dst || !key) {
    console.error("usage: bun parity/perturb.ts <src dir> <dst dir> <tensor key> [flat index]");
    process.exit(2);
  }
  console.log(`perturbed ${key}[${idx ?? 0}] in ${perturbCheckpoint(src, dst, key, Number(idx ?? 0))}`);
}
