// `mlx_vlm.utils.load_image` for files: `Image.open` (PNG or JPEG here), then
// `ImageOps.exif_transpose`, then `.convert("RGB")`, giving the 8-bit RGB pixels that the
// Gemma 4 image processor receives. Everything else Pillow opens (GIF, WebP, BMP, TIFF, ...)
// is refused with a MediaError naming the format.

import { readFileSync } from "node:fs";
import { MediaError } from "./errors.ts";
import { exifTranspose, orientationOf } from "./exif.ts";
import { decodeJpeg, isJpeg, readJpegHeader } from "./jpeg.ts";
import { decodePng, isPng, readPngHeader } from "./png.ts";

/** An 8-bit RGB image, row-major, 3 bytes per pixel (numpy's HWC uint8). */
export interface RgbImage {
  width: number;
  height: number;
  data: Uint8Array;
  /** Set when the decoded pixels are known to differ from Pillow's (only 4:4:0 JPEGs; see
   * jpeg.ts): a report that compares against mlx-vlm should show it. */
  note?: string;
}

/** Pillow's `Image.MAX_IMAGE_PIXELS`: above twice this, `Image.open` raises
 * DecompressionBombError, so that is the default limit here too. */
export const PIL_MAX_IMAGE_PIXELS = Math.floor((1024 * 1024 * 1024) / 4 / 3);
export const DEFAULT_MAX_PIXELS = 2 * PIL_MAX_IMAGE_PIXELS;

export interface LoadImageOptions {
  /** Refuse images with more pixels than this (before decoding them). */
  maxPixels?: number;
}

/** What the first bytes say a file is, for the error of an unsupported one. */
function sniff(b: Uint8Array): string {
  const s = String.fromCharCode(...b.subarray(0, 12));
  if (s.startsWith("GIF8")) return "GIF";
  if (s.startsWith("RIFF") && s.slice(8, 12) === "WEBP") return "WebP";
  if (s.startsWith("BM")) return "BMP";
  if (s.startsWith("II*\0") || s.startsWith("MM\0*")) return "TIFF";
  if (s.slice(4, 12) === "ftypavif" || s.slice(4, 12) === "ftypheic") return "AVIF/HEIC";
  if (b.length === 0) return "an empty file";
  return "not an image format that is recognized";
}

function readBytes(path: string): Uint8Array {
  try {
    return new Uint8Array(readFileSync(path));
  } catch (e) {
    throw new MediaError(path, "unreadable", `cannot read the image: ${(e as Error).message}`);
  }
}

/** Width and height from the header alone (no pixels decoded, no orientation applied). */
export function imageSize(path: string): { width: number; height: number } {
  const b = readBytes(path);
  if (isPng(b)) return readPngHeader(b, path);
  if (isJpeg(b)) return readJpegHeader(b, path);
  throw new MediaError(path, "unsupported_format", `unsupported image format (${sniff(b)}); PNG and JPEG are supported`);
}

/** Decode image bytes as `load_image` does; `name` is used in errors. */
export async function decodeImage(b: Uint8Array, name: string, opts: LoadImageOptions = {}): Promise<RgbImage> {
  const maxPixels = opts.maxPixels ?? DEFAULT_MAX_PIXELS;
  let d;
  if (isPng(b)) d = decodePng(b, name, maxPixels);
  else if (isJpeg(b)) d = await decodeJpeg(b, name, maxPixels);
  else throw new MediaError(name, "unsupported_format", `unsupported image format (${sniff(b)}); PNG and JPEG are supported`);
  const t = exifTranspose(d.rgb, d.width, d.height, orientationOf(d.meta, name));
  return { width: t.width, height: t.height, data: t.rgb, ...(d.note ? { note: d.note } : {}) };
}

/** `mlx_vlm.utils.load_image(path)` for a PNG or JPEG file: RGB pixels, EXIF-oriented. */
export async function loadImage(path: string, opts: LoadImageOptions = {}): Promise<RgbImage> {
  return decodeImage(readBytes(path), path, opts);
}
