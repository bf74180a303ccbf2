// JPEG decoding for `mlx_vlm.utils.load_image`. Pillow 13 decodes with libjpeg-turbo (ISLOW
// IDCT, fancy upsampling, RGB output); @jsquash/jpeg is libjpeg-turbo's decoder (as MozJPEG,
// compiled to WebAssembly) with the same defaults, so the pixels agree bit for bit on the JPEGs
// the test suite measures (baseline and progressive, 4:4:4 / 4:2:2 / 4:2:0, grayscale).
//
// Around the decoder, this file does what Pillow's JpegImagePlugin does with the markers before
// the first scan: the frame header gives the size (checked against the pixel limit before
// anything is decoded) and
// the mode (1 component -> "L", 3 -> "RGB"; CMYK/YCCK and other counts are not supported
// here), APP1 segments give EXIF (several are concatenated) and XMP (the last one wins).
// libjpeg's warnings are ignored as Pillow ignores them; its fatal errors become a MediaError.
// Differences, measured against Pillow with libjpeg-turbo's own cjpeg: 4:4:0 chroma subsampling
// (vertical only, 1x2) decodes with up to 2 levels of difference on about 13% of the bytes
// (this older libjpeg-turbo replicates chroma rows where 3.x interpolates them); other
// sampling factors (4:1:1, 4x2, 1x4, 3x1), restart markers, RGB JPEGs and optimized Huffman
// tables agree bit for bit. Arithmetic-coded, lossless and hierarchical JPEGs (which this build
// cannot decode) are refused as unsupported. Pillow accepts a file whose scans are complete but
// whose EOI marker is missing; here a missing EOI is always "truncated", because the
// WebAssembly decoder silently pads missing data with gray and cannot say which case it met.

import decodeWasm, { init } from "@jsquash/jpeg/decode.js";
import { MediaError } from "./errors.ts";
import type { ImageMeta } from "./exif.ts";
import type { DecodedRgb } from "./png.ts";

export function isJpeg(b: Uint8Array): boolean {
  return b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff;
}

export interface JpegHeader {
  /** The SOFn marker code: 0xC0 baseline, 0xC1 extended, 0xC2 progressive, ... */
  sof: number;
  width: number;
  height: number;
  components: number;
  precision: number;
  /** Per component: horizontal and vertical sampling factors. */
  sampling: [number, number][];
  meta: ImageMeta;
}

const SOF_MARKERS = new Set([0xc0, 0xc1, 0xc2, 0xc3, 0xc5, 0xc6, 0xc7, 0xc9, 0xca, 0xcb, 0xcd, 0xce, 0xcf]);
const EXIF_PREFIX = "Exif\0\0";
const XMP_PREFIX = "http://ns.adobe.com/xap/1.0/\0";

function startsWith(b: Uint8Array, s: string): boolean {
  if (b.length < s.length) return false;
  for (let i = 0; i < s.length; i++) if (b[i] !== s.charCodeAt(i)) return false;
  return true;
}

/** The markers before the first scan (all Pillow reads: the frame header and the metadata),
 * and the EOI marker after it. */
export function readJpegHeader(b: Uint8Array, file: string): JpegHeader {
  if (!isJpeg(b)) throw new MediaError(file, "unsupported_format", "not a JPEG file");
  let frame: Omit<JpegHeader, "meta"> | undefined;
  const meta: ImageMeta = {};
  let pos = 2;
  for (;;) {
    // libjpeg skips (with a warning, which Pillow ignores) any bytes before the next 0xFF, then
    // one or more 0xFF fill bytes precede the marker code.
    while (pos < b.length && b[pos] !== 0xff) pos++;
    while (pos < b.length && b[pos] === 0xff) pos++;
    if (pos >= b.length) throw new MediaError(file, "truncated", "JPEG file ends before its image data");
    const code = b[pos++]!;
    if (code === 0xd9) throw new MediaError(file, "corrupt", "JPEG file ends (EOI) before its image data");
    if ((code >= 0xd0 && code <= 0xd7) || code === 0x01) continue; // no length
    if (pos + 2 > b.length) throw new MediaError(file, "truncated", "JPEG file ends inside a segment header");
    const len = (b[pos]! << 8) | b[pos + 1]!;
    if (len < 2) throw new MediaError(file, "corrupt", `JPEG segment 0xFF${code.toString(16).toUpperCase()} has length ${len}`);
    if (pos + len > b.length) throw new MediaError(file, "truncated", "JPEG file ends inside a segment");
    const seg = b.subarray(pos + 2, pos + len);
    pos += len;
    if (SOF_MARKERS.has(code) && frame === undefined) {
      if (seg.length < 6 || seg.length < 6 + 3 * seg[5]!) throw new MediaError(file, "corrupt", "JPEG frame header is too short");
      const sampling: [number, number][] = [];
      for (let c = 0; c < seg[5]!; c++) sampling.push([seg[7 + 3 * c]! >> 4, seg[7 + 3 * c]! & 15]);
      frame = { sof: code, precision: seg[0]!, height: (seg[1]! << 8) | seg[2]!, width: (seg[3]! << 8) | seg[4]!, components: seg[5]!, sampling };
    } else if (code === 0xe1 && startsWith(seg, EXIF_PREFIX)) {
      // Pillow: the first Exif segment whole, later ones without their "Exif\0\0".
      meta.exif = meta.exif === undefined ? seg.slice() : concat(meta.exif, seg.subarray(6));
    } else if (code === 0xe1 && startsWith(seg, XMP_PREFIX)) {
      meta.xmp = seg.subarray(XMP_PREFIX.length);
    } else if (code === 0xda) break;
  }
  if (frame === undefined) throw new MediaError(file, "corrupt", "JPEG file has no frame header (SOF) before its image data");
  // Entropy-coded data never holds 0xFF 0xD9 (0xFF is stuffed as 0xFF00): the first one is the EOI.
  let eoi = false;
  for (let i = pos; i + 1 < b.length && !eoi; i++) eoi = b[i] === 0xff && b[i + 1] === 0xd9;
  if (!eoi) throw new MediaError(file, "truncated", "JPEG file ends before its EOI marker");
  return { ...frame, meta };
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** libjpeg's messages of the decode in progress (its error text names what is wrong). */
let messages: string[] = [];
let ready: Promise<void> | undefined;

/** Decode a JPEG into Pillow's `convert("RGB")` pixels. */
export async function decodeJpeg(b: Uint8Array, file: string, maxPixels: number): Promise<DecodedRgb> {
  const h = readJpegHeader(b, file);
  if (h.width === 0 || h.height === 0) throw new MediaError(file, "corrupt", `JPEG size ${h.width}x${h.height} is invalid`);
  if (h.width * h.height > maxPixels)
    throw new MediaError(file, "too_large", `image is ${h.width}x${h.height} = ${h.width * h.height} pixels, over the limit of ${maxPixels}`);
  if (h.precision !== 8) throw new MediaError(file, "unsupported_format", `${h.precision}-bit JPEG is not supported`);
  // The WebAssembly libjpeg-turbo has no arithmetic decoder and no lossless/hierarchical modes.
  if (h.sof > 0xc2)
    throw new MediaError(file, "unsupported_format", `JPEG coding SOF${(h.sof - 0xc0).toString()} (${h.sof >= 0xc9 ? "arithmetic" : "lossless or hierarchical"}) is not supported`);
  if (h.components !== 1 && h.components !== 3)
    throw new MediaError(file, "unsupported_format", `JPEG with ${h.components} components (CMYK or other) is not supported`);
  ready ??= init({ print: (s: string) => messages.push(s), printErr: (s: string) => messages.push(s) });
  await ready;
  messages = [];
  let img: { data: Uint8ClampedArray; width: number; height: number };
  try {
    const copy = b.slice(); // the decoder takes an ArrayBuffer of exactly the file
    img = await decodeWasm(copy.buffer, { preserveOrientation: false });
  } catch {
    const why = messages.at(-1) ?? "undecodable data";
    throw new MediaError(file, "corrupt", `JPEG does not decode: ${why}`);
  }
  if (img.width !== h.width || img.height !== h.height)
    throw new MediaError(file, "corrupt", `JPEG decoded to ${img.width}x${img.height}, its header says ${h.width}x${h.height}`);
  const n = img.width * img.height;
  const rgb = new Uint8Array(n * 3);
  for (let i = 0; i < n; i++) {
    rgb[3 * i] = img.data[4 * i]!;
    rgb[3 * i + 1] = img.data[4 * i + 1]!;
    rgb[3 * i + 2] = img.data[4 * i + 2]!;
  }
  return { width: img.width, height: img.height, rgb, meta: h.meta, note: inexactNote(h) };
}

/** The one measured case where these pixels are not Pillow's: a component upsampled 1x2. */
function inexactNote(h: JpegHeader): string | undefined {
  const maxH = Math.max(...h.sampling.map(([x]) => x));
  const maxV = Math.max(...h.sampling.map(([, y]) => y));
  if (!h.sampling.some(([x, y]) => x > 0 && y > 0 && maxH / x === 1 && maxV / y === 2)) return undefined;
  return "4:4:0 (1x2) chroma subsampling: decoded pixels may differ from Pillow's by up to 2 levels (measured)";
}
