// Image preprocessing against mlx-vlm's own processor, byte for byte: file decoding
// (`load_image`: Pillow's decoders, exif_transpose, convert("RGB")) and the Gemma 4 image
// processor (Pillow BICUBIC resize, float32 rescale, normalize, CHW) with the soft-token count,
// under several processor configurations read from the checkpoint directory as mlx-vlm reads
// them. The processor is also run on the oracle's own decoded pixels, so the resize path is
// checked on identical input even where the decoders could differ.
//
// Default: every PNG mode, orientation and JPEG case plus 12 sizes. MEDIA_FULL=1: 60 sizes up to
// 4000x3000 and 1x20000-style aspect ratios (see README.md for the recorded numbers).

import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { sharedOracle } from "../../oracle/client.ts";
import { oracleMedia } from "../../oracle/media.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { compareRaw, formatDiff } from "../../oracle/tensor_diff.ts";
import { hostBytes, type HostArray } from "../../model/media/host.ts";
import { loadImage, type RgbImage } from "../../model/media/image.ts";
import { Gemma4ImageProcessor, loadProcessorConfig } from "../../model/gemma4/processing_gemma4.ts";
import { FULL, makeMedia, makeProcessorDirs, type MediaItem, tempDir } from "./media_fixtures.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = tempDir("img");
afterAll(tmp.remove);
const oracle = await sharedOracle();

const items = makeMedia(join(tmp.dir, "img"), "images", ["--count", FULL ? "60" : "12"]);

/** Processor configurations, cycled over the images (small token budgets keep outputs small). */
const dirs = makeProcessorDirs(join(tmp.dir, "proc"), [
  { name: "mst70", config: { image_processor: { image_processor_type: "Gemma4ImageProcessor", max_soft_tokens: 70 } } },
  { name: "default", config: null },
  { name: "mst140-flat", config: { max_soft_tokens: 140, patch_size: 16 }, flat: true },
  { name: "normalize", config: { image_processor: { max_soft_tokens: 70, do_normalize: true, image_mean: [0.48, 0.46, 0.41], image_std: [0.27, 0.26, 0.28] } } },
  { name: "uint8", config: { image_processor: { max_soft_tokens: 70, do_rescale: false } } },
  { name: "p14k2", config: { image_processor: { max_soft_tokens: 64, patch_size: 14, pooling_kernel_size: 2, rescale_factor: 0.0039 } } },
  { name: "mst560", config: { image_processor: { max_soft_tokens: 560 } } },
]);

function rec(a: HostArray | RgbImage): { dtype: string; shape: number[]; data: Uint8Array } {
  if ("dtype" in a) return { dtype: a.dtype, shape: a.shape, data: hostBytes(a) };
  return { dtype: "uint8", shape: [a.height, a.width, 3], data: a.data };
}

/** Big outputs only for the first images of a group (and every image in the full sweep). */
function configFor(group: string, i: number) {
  const d = dirs[i % dirs.length]!;
  if (!FULL && (d.name === "default" || d.name === "mst560") && group === "size") return dirs[0]!;
  return d;
}

interface Tally {
  images: number;
  decodeExact: number;
  processExact: number;
  samePixelsExact: number;
  failures: string[];
}

async function check(group: string, list: MediaItem[]): Promise<Tally> {
  const t: Tally = { images: 0, decodeExact: 0, processExact: 0, samePixelsExact: 0, failures: [] };
  for (const [i, item] of list.entries()) {
    t.images++;
    const dir = configFor(group, i);
    const proc = new Gemma4ImageProcessor(loadProcessorConfig(dir.dir).image_processor);
    const mine = await loadImage(item.file);
    const ref = await oracleMedia(oracle, "decode_image", { path: item.file });
    const dec = compareRaw(`${item.name} decoded`, rec(mine), ref.rgb as NpyRecord);
    if (dec.equal && mine.note === undefined) t.decodeExact++;
    else t.failures.push(dec.equal ? `${item.name}: exact, but flagged "${mine.note}"` : formatDiff(dec));
    const out = proc.processOne(mine);
    const want = await oracleMedia(oracle, "image", { model_dir: dir.dir, path: item.file });
    const pv = want.pixel_values as NpyRecord;
    const got = rec(out.pixel_values);
    const d = compareRaw(`${item.name} pixel_values [${dir.name}]`, { ...got, shape: [1, ...got.shape] }, pv);
    const soft = (want.num_soft_tokens as number[])[0];
    if (d.equal && soft === out.num_soft_tokens) t.processExact++;
    else t.failures.push(d.equal ? `${item.name} [${dir.name}]: ${out.num_soft_tokens} soft tokens, mlx-vlm ${soft}` : formatDiff(d));
    if (group === "jpeg" || !dec.equal) {
      // The resize path on the oracle's decoded pixels (identical input whatever the decoder).
      const r = ref.rgb as NpyRecord;
      const same = proc.processOne({ height: r.shape[0]!, width: r.shape[1]!, data: r.data });
      const w2 = await oracleMedia(oracle, "image", { model_dir: dir.dir, pixels: r });
      const g2 = rec(same.pixel_values);
      const d2 = compareRaw(`${item.name} pixel_values from mlx-vlm's pixels`, { ...g2, shape: [1, ...g2.shape] }, w2.pixel_values as NpyRecord);
      if (d2.equal) t.samePixelsExact++;
      else t.failures.push(formatDiff(d2));
    }
  }
  return t;
}

const byGroup = (g: string) => items.filter((x) => x.group === g);

describe("image preprocessing = mlx-vlm's processor, byte for byte", () => {
  it(`generated set: ${items.length} images`, () => {
    expect(items.length).toBeGreaterThanOrEqual(FULL ? 200 : 150);
  });
  for (const group of ["png_mode", "orientation", "jpeg", "size"]) {
    it(`${group} (${byGroup(group).length} images)`, async () => {
      const t = await check(group, byGroup(group));
      console.log(`[image] ${group}: ${t.images} images, decode exact ${t.decodeExact}, pixel_values exact ${t.processExact}` +
        (group === "jpeg" ? `, from identical pixels ${t.samePixelsExact}` : ""));
      expect(t.failures).toEqual([]);
      expect(t.images, `${group}: images checked`).toBe(byGroup(group).length);
      expect(t.images, `${group}: images checked`).toBeGreaterThan(0);
      expect(t.processExact).toBe(t.images);
    }, limit(600_000));
  }
});
