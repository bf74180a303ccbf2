// Pillow's 8-bit BICUBIC resize (model/media/pil_resample.ts) against Pillow itself at
// arbitrary sizes: up, down, mixed, 1-pixel sides, and the pairs around Pillow 13's switch
// between horizontal-first and vertical-first passes (the two orders give different bytes).

import { describe, expect, it } from "vitest";
import { sharedOracle } from "../../oracle/client.ts";
import { oracleMedia } from "../../oracle/media.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { compareRaw, formatDiff } from "../../oracle/tensor_diff.ts";
import { resizeBicubic } from "../../model/media/pil_resample.ts";
import { FULL } from "./media_fixtures.ts";
import { limit } from "../../tests/time_limit.ts";

const oracle = await sharedOracle();

/** A small deterministic generator (the pixels only need to be fixed and varied). */
function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32;
}

function cases(n: number): [number, number, number, number][] {
  const r = lcg(9);
  const int = (a: number, b: number) => a + Math.floor(r() * (b - a + 1));
  const out: [number, number, number, number][] = [
    [1, 1, 5, 7], [7, 5, 1, 1], [1, 40, 3, 9], [40, 1, 9, 3], [300, 300, 20, 160], [300, 300, 20, 161], // the switch: 2(W-w) vs H-h
    [300, 300, 100, 200], [300, 300, 100, 201], [120, 4567, 28, 1344], [4567, 123, 1344, 28], [64, 64, 768, 768], [3, 2000, 48, 480],
  ];
  while (out.length < n) {
    const h = int(1, 260);
    const w = int(1, 260);
    const kind = out.length % 4;
    const oh = kind === 0 ? int(1, h) : kind === 1 ? int(h, 3 * h + 2) : int(1, 3 * h + 2);
    const ow = kind === 0 ? int(1, w) : kind === 1 ? int(1, w) : int(1, 3 * w + 2);
    out.push([h, w, oh, ow]);
  }
  return out;
}

describe("Pillow BICUBIC resize, byte for byte", () => {
  const list = cases(FULL ? 600 : 120);
  it(`${list.length} size pairs`, async () => {
    const failures: string[] = [];
    const r = lcg(3);
    for (const [h, w, oh, ow] of list) {
      const px = new Uint8Array(h * w * 3);
      const smooth = (h + w) % 2 === 0;
      for (let i = 0; i < px.length; i++) px[i] = smooth ? (i * 7 + ((i / (w * 3)) | 0) * 3) & 0xff : Math.floor(r() * 256);
      const want = await oracleMedia(oracle, "pil_resize", { pixels: { dtype: "uint8", shape: [h, w, 3], data: px }, width: ow, height: oh });
      const got = resizeBicubic(px, w, h, ow, oh);
      const d = compareRaw(`${h}x${w} -> ${oh}x${ow}`, { dtype: "uint8", shape: [oh, ow, 3], data: got }, want.resized as NpyRecord);
      if (!d.equal) failures.push(formatDiff(d));
    }
    expect(failures).toEqual([]);
  }, limit(600_000));
});
