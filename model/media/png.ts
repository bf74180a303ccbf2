// PNG decoding as Pillow 13 does it (PngImagePlugin + libImaging's unpackers), followed by
// `convert("RGB")` (libImaging/Convert.c): the 8-bit RGB pixels `mlx_vlm.utils.load_image`
// hands the image processor. PNG is lossless, so this is Pillow's result bit for bit; the
// zlib stream is inflated by node:zlib. Metadata that can rotate the image (eXIf, an EXIF
// "Raw profile type exif" text chunk, XMP) is returned for `exif_transpose`.
//
// Pillow's mode per (bit depth, colour type), and what `convert("RGB")` then does with it:
//   gray 1/2/4/8 -> "1"/"L" (1 -> 0/255, 2-bit x85, 4-bit x17)   gray 16 -> "I;16", clipped to 255
//   RGB 8/16 -> "RGB" (16-bit: the high byte)                     palette -> "P", looked up
//   gray+alpha 8 -> "LA", 16 -> "RGBA" (high byte)                RGBA 8/16 -> "RGBA" (high byte)
// Alpha is dropped, never composited; tRNS is ignored. A palette index past the PLTE entries
// reads as black (Pillow's palette is zero-filled).

import { inflateSync } from "node:zlib";
import { MediaError } from "./errors.ts";
import type { ImageMeta } from "./exif.ts";

const SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

export function isPng(b: Uint8Array): boolean {
  return b.length >= 8 && SIGNATURE.every((v, i) => b[i] === v);
}

/** Samples per pixel for each colour type Pillow accepts, and the bit depths it accepts. */
const COLOR_TYPES: Record<number, { channels: number; depths: number[] }> = {
  0: { channels: 1, depths: [1, 2, 4, 8, 16] },
  2: { channels: 3, depths: [8, 16] },
  3: { channels: 1, depths: [1, 2, 4, 8] },
  4: { channels: 2, depths: [8, 16] },
  6: { channels: 4, depths: [8, 16] },
};

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

function crc32(b: Uint8Array, start: number, end: number): number {
  let c = 0xffffffff;
  for (let i = start; i < end; i++) c = CRC_TABLE[(c ^ b[i]!) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

export interface PngHeader {
  width: number;
  height: number;
  depth: number;
  colorType: number;
  interlace: number;
}

/** The IHDR fields (no pixel data read): for the size limit and token estimates. */
export function readPngHeader(b: Uint8Array, file: string): PngHeader {
  if (!isPng(b)) throw new MediaError(file, "unsupported_format", "not a PNG file");
  if (b.length < 33) throw new MediaError(file, "truncated", "PNG file ends inside its IHDR chunk");
  const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const type = String.fromCharCode(...b.subarray(12, 16));
  if (type !== "IHDR" || v.getUint32(8) !== 13) throw new MediaError(file, "corrupt", "PNG file does not start with an IHDR chunk");
  const h: PngHeader = {
    width: v.getUint32(16),
    height: v.getUint32(20),
    depth: b[24]!,
    colorType: b[25]!,
    interlace: b[28]!,
  };
  if (h.width === 0 || h.height === 0 || h.width > 0x7fffffff || h.height > 0x7fffffff)
    throw new MediaError(file, "corrupt", `PNG size ${h.width}x${h.height} is invalid`);
  const ct = COLOR_TYPES[h.colorType];
  if (ct === undefined || !ct.depths.includes(h.depth))
    throw new MediaError(file, "unsupported_format", `PNG bit depth ${h.depth} with colour type ${h.colorType} is not a PNG mode`);
  if (b[26] !== 0 || b[27] !== 0 || h.interlace > 1)
    throw new MediaError(file, "unsupported_format", `PNG compression/filter/interlace method ${b[26]}/${b[27]}/${h.interlace} is unknown`);
  return h;
}

/** Adam7 passes: x0, y0, dx, dy (one pass covering everything when not interlaced). */
const ADAM7 = [
  [0, 0, 8, 8],
  [4, 0, 8, 8],
  [0, 4, 4, 8],
  [2, 0, 4, 4],
  [0, 2, 2, 4],
  [1, 0, 2, 2],
  [0, 1, 1, 2],
] as const;
const NO_INTERLACE = [[0, 0, 1, 1]] as const;

function paeth(a: number, b: number, c: number): number {
  const p = a + b - c;
  const pa = Math.abs(p - a);
  const pb = Math.abs(p - b);
  const pc = Math.abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/** Undo the scanline filters in place; `line` includes the filter byte at `at`. */
function unfilter(data: Uint8Array, at: number, prev: number, rowBytes: number, bpp: number, file: string): void {
  const f = data[at]!;
  const s = at + 1;
  const hasPrev = prev >= 0;
  switch (f) {
    case 0:
      return;
    case 1:
      for (let i = bpp; i < rowBytes; i++) data[s + i] = (data[s + i]! + data[s + i - bpp]!) & 0xff;
      return;
    case 2:
      if (hasPrev) for (let i = 0; i < rowBytes; i++) data[s + i] = (data[s + i]! + data[prev + i]!) & 0xff;
      return;
    case 3:
      for (let i = 0; i < rowBytes; i++) {
        const left = i >= bpp ? data[s + i - bpp]! : 0;
        const up = hasPrev ? data[prev + i]! : 0;
        data[s + i] = (data[s + i]! + ((left + up) >> 1)) & 0xff;
      }
      return;
    case 4:
      for (let i = 0; i < rowBytes; i++) {
        const left = i >= bpp ? data[s + i - bpp]! : 0;
        const up = hasPrev ? data[prev + i]! : 0;
        const ul = hasPrev && i >= bpp ? data[prev + i - bpp]! : 0;
        data[s + i] = (data[s + i]! + paeth(left, up, ul)) & 0xff;
      }
      return;
    default:
      throw new MediaError(file, "corrupt", `PNG scanline filter type ${f} is unknown`);
  }
}

export interface DecodedRgb {
  width: number;
  height: number;
  /** Row-major RGB, 3 bytes per pixel. */
  rgb: Uint8Array;
  meta: ImageMeta;
  /** Set when the pixels are known to differ from Pillow's (what, and by how much). */
  note?: string;
}

/** Decode a PNG into Pillow's `convert("RGB")` pixels. */
export function decodePng(b: Uint8Array, file: string, maxPixels: number): DecodedRgb {
  const h = readPngHeader(b, file);
  if (h.width * h.height > maxPixels)
    throw new MediaError(file, "too_large", `image is ${h.width}x${h.height} = ${h.width * h.height} pixels, over the limit of ${maxPixels}`);
  const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const idat: Uint8Array[] = [];
  let palette: Uint8Array | undefined;
  const meta: ImageMeta = {};
  let pos = 8;
  for (;;) {
    if (pos === b.length) break; // no IEND: Pillow reads on as long as the pixels are complete
    if (pos + 12 > b.length) throw new MediaError(file, "truncated", "PNG file ends inside a chunk header");
    const len = v.getUint32(pos);
    const type = String.fromCharCode(...b.subarray(pos + 4, pos + 8));
    const end = pos + 8 + len;
    if (len > 0x7fffffff || end + 4 > b.length) throw new MediaError(file, "truncated", `PNG file ends inside its ${type} chunk`);
    if (crc32(b, pos + 4, end) !== v.getUint32(end)) throw new MediaError(file, "corrupt", `bad checksum in PNG chunk ${type}`);
    const data = b.subarray(pos + 8, end);
    if (type === "IEND") break;
    if (type === "IDAT") idat.push(data);
    else if (type === "PLTE") palette = data;
    else if (type === "eXIf") meta.exif = data;
    else if (type === "tEXt" || type === "zTXt" || type === "iTXt") textChunk(type, data, meta);
    pos = end + 4;
  }
  if (idat.length === 0) throw new MediaError(file, "truncated", "PNG file has no image data (IDAT)");
  if (h.colorType === 3 && palette === undefined) throw new MediaError(file, "corrupt", "palette PNG without a PLTE chunk");

  const channels = COLOR_TYPES[h.colorType]!.channels;
  const bitsPerPixel = channels * h.depth;
  const bpp = Math.max(1, bitsPerPixel >> 3);
  const passes = h.interlace ? ADAM7 : NO_INTERLACE;
  let expected = 0;
  for (const [x0, y0, dx, dy] of passes) {
    const pw = Math.ceil((h.width - x0) / dx);
    const ph = Math.ceil((h.height - y0) / dy);
    if (pw > 0 && ph > 0) expected += ph * (1 + Math.ceil((pw * bitsPerPixel) / 8));
  }
  let raw: Uint8Array;
  try {
    raw = new Uint8Array(inflateSync(concat(idat)));
  } catch (e) {
    const msg = (e as Error).message;
    if (/unexpected end/i.test(msg)) throw new MediaError(file, "truncated", "PNG image data (IDAT) ends early");
    throw new MediaError(file, "corrupt", `PNG image data does not inflate: ${msg}`);
  }
  if (raw.length < expected) throw new MediaError(file, "truncated", `PNG image data holds ${raw.length} of ${expected} bytes`);

  const rgb = new Uint8Array(h.width * h.height * 3);
  const put = pixelWriter(h, rgb, palette);
  let at = 0;
  for (const [x0, y0, dx, dy] of passes) {
    const pw = Math.ceil((h.width - x0) / dx);
    const ph = Math.ceil((h.height - y0) / dy);
    if (pw <= 0 || ph <= 0) continue;
    const rowBytes = Math.ceil((pw * bitsPerPixel) / 8);
    let prev = -1;
    for (let r = 0; r < ph; r++) {
      unfilter(raw, at, prev, rowBytes, bpp, file);
      const row = at + 1;
      for (let c = 0; c < pw; c++) put((y0 + r * dy) * h.width + x0 + c * dx, raw, row, c);
      prev = row;
      at = row + rowBytes;
    }
  }
  return { width: h.width, height: h.height, rgb, meta };
}

function concat(parts: Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

/** The writer of pixel `c` of an unfiltered row into RGB, per Pillow mode. */
function pixelWriter(
  h: PngHeader,
  rgb: Uint8Array,
  palette: Uint8Array | undefined,
): (pixel: number, row: Uint8Array, at: number, c: number) => void {
  const set = (p: number, r: number, g: number, b: number) => {
    rgb[p * 3] = r;
    rgb[p * 3 + 1] = g;
    rgb[p * 3 + 2] = b;
  };
  const gray = (p: number, g: number) => set(p, g, g, g);
  /** Sample `c` of a row of sub-byte samples (most significant bits first). */
  const packed = (row: Uint8Array, at: number, c: number, bits: number) => {
    const bit = c * bits;
    return (row[at + (bit >> 3)]! >> (8 - bits - (bit & 7))) & ((1 << bits) - 1);
  };
  const d = h.depth;
  switch (h.colorType) {
    case 0:
      if (d === 16) return (p, row, at, c) => gray(p, row[at + 2 * c]! === 0 ? row[at + 2 * c + 1]! : 255); // I16_RGB
      if (d === 8) return (p, row, at, c) => gray(p, row[at + c]!);
      {
        const scale = d === 1 ? 255 : d === 2 ? 0x55 : 0x11;
        return (p, row, at, c) => gray(p, packed(row, at, c, d) * scale);
      }
    case 2: {
      const s = d >> 3; // the high byte of each 16-bit sample
      return (p, row, at, c) => set(p, row[at + 3 * s * c]!, row[at + 3 * s * c + s]!, row[at + 3 * s * c + 2 * s]!);
    }
    case 3: {
      const pal = palette!;
      const n = Math.floor(pal.length / 3);
      return (p, row, at, c) => {
        const i = d === 8 ? row[at + c]! : packed(row, at, c, d);
        if (i < n) set(p, pal[3 * i]!, pal[3 * i + 1]!, pal[3 * i + 2]!);
        else set(p, 0, 0, 0);
      };
    }
    case 4: {
      const s = d >> 3;
      return (p, row, at, c) => gray(p, row[at + 2 * s * c]!);
    }
    default: {
      const s = d >> 3;
      return (p, row, at, c) => set(p, row[at + 4 * s * c]!, row[at + 4 * s * c + s]!, row[at + 4 * s * c + 2 * s]!);
    }
  }
}

/** The text chunks Pillow's `getexif` reads: "exif", "Raw profile type exif" and XMP. Like
 * Pillow, a text chunk whose zlib data is broken counts as empty instead of failing. */
function textChunk(type: string, data: Uint8Array, meta: ImageMeta): void {
  const nul = data.indexOf(0);
  if (nul <= 0) return;
  const key = String.fromCharCode(...data.subarray(0, nul));
  if (key !== "exif" && key !== "Raw profile type exif" && key !== "XML:com.adobe.xmp") return;
  let value: Uint8Array;
  if (type === "tEXt") value = data.subarray(nul + 1);
  else if (type === "zTXt") value = data[nul + 1] ? new Uint8Array(0) : inflateOrEmpty(data.subarray(nul + 2));
  else {
    // iTXt: keyword \0 compression-flag method language \0 translated-keyword \0 text
    if (key === "exif") return;
    const flag = data[nul + 1];
    const lang = data.indexOf(0, nul + 3);
    const tk = lang < 0 ? -1 : data.indexOf(0, lang + 1);
    if (tk < 0 || (flag && data[nul + 2] !== 0)) return;
    value = flag ? inflateOrEmpty(data.subarray(tk + 1)) : data.subarray(tk + 1);
  }
  if (key === "exif") meta.exif = type === "tEXt" ? value : undefined;
  else if (key === "XML:com.adobe.xmp") meta.xmp = value;
  else meta.rawProfileExif = new TextDecoder("latin1").decode(value);
}

function inflateOrEmpty(b: Uint8Array): Uint8Array {
  try {
    return new Uint8Array(inflateSync(b));
  } catch {
    return new Uint8Array(0);
  }
}
