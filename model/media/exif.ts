// `PIL.ImageOps.exif_transpose` (Pillow 13), which `mlx_vlm.utils.load_image` applies before
// `convert("RGB")`: the orientation comes from the EXIF block (JPEG APP1 "Exif", PNG eXIf or
// an "exif"/"Raw profile type exif" text chunk), read as `Image.getexif()` reads it (IFD0 tag
// 274); only when that has no orientation tag, from XMP (`tiff:Orientation`). Values 2..8
// flip/rotate the pixels; anything else leaves them alone.

import { MediaError } from "./errors.ts";

/** The metadata a decoder found that can carry an orientation. */
export interface ImageMeta {
  /** EXIF bytes (TIFF structure, possibly behind one or two "Exif\0\0" prefixes). */
  exif?: Uint8Array;
  /** The text of a PNG "Raw profile type exif" chunk (hex after three header lines). */
  rawProfileExif?: string;
  /** XMP packet bytes. */
  xmp?: Uint8Array;
}

const ORIENTATION_TAG = 274;

/** The orientation Pillow's `getexif()` reports, or undefined when there is none. */
export function orientationOf(meta: ImageMeta, file: string): number | undefined {
  let exif = meta.exif;
  if (exif === undefined && meta.rawProfileExif !== undefined) exif = rawProfileBytes(meta.rawProfileExif, file);
  const fromExif = exif === undefined ? undefined : exifOrientation(exif, file);
  if (fromExif !== undefined) return fromExif;
  if (meta.xmp === undefined) return undefined;
  const m = /tiff:Orientation(="|>)([0-9])/.exec(new TextDecoder("latin1").decode(meta.xmp));
  return m ? Number(m[2]) : undefined;
}

function rawProfileBytes(text: string, file: string): Uint8Array {
  // bytes.fromhex("".join(text.split("\n")[3:])): whitespace is skipped, anything else fails.
  const hex = text.split("\n").slice(3).join("").replace(/[ \t\n\r\v\f]/g, "");
  if (hex.length % 2 !== 0 || /[^0-9a-fA-F]/.test(hex))
    throw new MediaError(file, "corrupt", "the PNG 'Raw profile type exif' text is not hex");
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** Field types Pillow loads, and their sizes (TiffImagePlugin's `_load_dispatch`). */
const TYPE_SIZES: Record<number, number> = { 1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8, 17: 8, 18: 8 };

/** Tag 274 of IFD0 as Pillow's `Exif.get` returns it: its value when it is a single integer, 0
 * when the tag is there with another type or count, undefined when it is absent. */
function exifOrientation(data: Uint8Array, file: string): number | undefined {
  let at = 0;
  for (let k = 0; k < 2 && data.length - at >= 6 && String.fromCharCode(...data.subarray(at, at + 6)) === "Exif\0\0"; k++) at += 6;
  const d = data.subarray(at);
  if (d.length === 0) return undefined;
  const head = String.fromCharCode(...d.subarray(0, 4));
  const little = head === "II*\0" || head === "II\0*";
  if (!little && head !== "MM\0*" && head !== "MM*\0") {
    if (head === "MM\0+" || head === "II+\0") return undefined; // BigTIFF: not in EXIF
    throw new MediaError(file, "corrupt", "EXIF data is not a TIFF structure");
  }
  if (d.length < 8) return undefined;
  const v = new DataView(d.buffer, d.byteOffset, d.byteLength);
  const ifd = v.getUint32(4, little);
  // Pillow stops quietly where the directory runs out of data (keeping the tags read so far).
  if (ifd + 2 > d.length) return undefined;
  const n = v.getUint16(ifd, little);
  for (let i = 0; i < n; i++) {
    const e = ifd + 2 + 12 * i;
    if (e + 12 > d.length) return undefined;
    if (v.getUint16(e, little) !== ORIENTATION_TAG) continue;
    const type = v.getUint16(e + 2, little);
    const count = v.getUint32(e + 4, little);
    const size = TYPE_SIZES[type];
    if (size === undefined || count === 0) continue; // skipped by Pillow: a later entry may count
    // Present: XMP is not consulted any more; only a single integer can select a transposition.
    if (count !== 1) return 0;
    if (type === 3) return v.getUint16(e + 8, little);
    if (type === 8) return v.getInt16(e + 8, little);
    if (type === 4) return v.getUint32(e + 8, little);
    if (type === 9) return v.getInt32(e + 8, little);
    if (type === 1 || type === 7) return d[e + 8]!;
    if (type === 6) return v.getInt8(e + 8);
    return 0;
  }
  return undefined;
}

/** `Image.transpose` for the method that `exif_transpose` picks for `orientation`. */
export function exifTranspose(
  rgb: Uint8Array,
  width: number,
  height: number,
  orientation: number | undefined,
): { rgb: Uint8Array; width: number; height: number } {
  if (orientation === undefined || orientation < 2 || orientation > 8) return { rgb, width, height };
  const swap = orientation >= 5;
  const ow = swap ? height : width;
  const oh = swap ? width : height;
  const out = new Uint8Array(rgb.length);
  for (let y = 0; y < oh; y++) {
    for (let x = 0; x < ow; x++) {
      let sx: number;
      let sy: number;
      switch (orientation) {
        case 2: // FLIP_LEFT_RIGHT
          [sx, sy] = [width - 1 - x, y];
          break;
        case 3: // ROTATE_180
          [sx, sy] = [width - 1 - x, height - 1 - y];
          break;
        case 4: // FLIP_TOP_BOTTOM
          [sx, sy] = [x, height - 1 - y];
          break;
        case 5: // TRANSPOSE
          [sx, sy] = [y, x];
          break;
        case 6: // ROTATE_270 (90 degrees clockwise)
          [sx, sy] = [y, height - 1 - x];
          break;
        case 7: // TRANSVERSE
          [sx, sy] = [width - 1 - y, height - 1 - x];
          break;
        default: // 8: ROTATE_90 (90 degrees counter-clockwise)
          [sx, sy] = [width - 1 - y, x];
      }
      const s = (sy * width + sx) * 3;
      const o = (y * ow + x) * 3;
      out[o] = rgb[s]!;
      out[o + 1] = rgb[s + 1]!;
      out[o + 2] = rgb[s + 2]!;
    }
  }
  return { rgb: out, width: ow, height: oh };
}
