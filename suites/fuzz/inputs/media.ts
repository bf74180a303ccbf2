// Malformed media files (the image and audio inputs of the multimodal processor): a small valid
// PNG (RGB, 8-bit) and WAV (16-bit PCM) built here, and JPEG marker streams, with bytes set,
// cut, inserted or header fields (sizes, depths, channel counts, chunk lengths) replaced.
import { deflateSync } from "node:zlib";
import fc from "fast-check";

export type Edit = { set: number; to: number } | { cut: number } | { insert: number; bytes: number[] } | { u32be: number; to: number } | { u16le: number; to: number } | { u32le: number; to: number };
export interface MediaSpec {
  format: "png" | "wav" | "jpeg";
  /** jpeg: the marker stream after SOI, as bytes. */
  body?: number[];
  edits: Edit[];
}

function crc32(b: Uint8Array): number {
  let c = ~0;
  for (const x of b) {
    c ^= x;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}

function chunk(type: string, data: Uint8Array): Buffer {
  const td = Buffer.concat([Buffer.from(type, "latin1"), data]);
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(td));
  return Buffer.concat([len, td, crc]);
}

/** A 5x3 RGB PNG, 8 bits per sample, one IDAT; IHDR's width sits at byte 16, height at 20. */
function png(): Buffer {
  const w = 5;
  const h = 3;
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr.set([8, 2, 0, 0, 0], 8);
  const raw = Buffer.alloc(h * (1 + 3 * w));
  for (let i = 0; i < raw.length; i++) raw[i] = i % (1 + 3 * w) === 0 ? (i / (1 + 3 * w)) % 5 : (i * 29) & 0xff; // filter types 0..4
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk("IHDR", ihdr), chunk("IDAT", deflateSync(raw)), chunk("IEND", new Uint8Array())]);
}

/** 0.01 s of 16 kHz stereo 16-bit PCM; fmt fields at 22 (channels), 24 (rate), 34 (bits), data size at 40. */
function wav(): Buffer {
  const n = 160;
  const data = Buffer.alloc(n * 4);
  for (let i = 0; i < n * 2; i++) data.writeInt16LE(((i * 997) % 65536) - 32768, 2 * i);
  const h = Buffer.alloc(44);
  h.write("RIFF", 0, "latin1");
  h.writeUInt32LE(36 + data.length, 4);
  h.write("WAVEfmt ", 8, "latin1");
  h.writeUInt32LE(16, 16);
  h.writeUInt16LE(1, 20);
  h.writeUInt16LE(2, 22);
  h.writeUInt32LE(16000, 24);
  h.writeUInt32LE(16000 * 4, 28);
  h.writeUInt16LE(4, 32);
  h.writeUInt16LE(16, 34);
  h.write("data", 36, "latin1");
  h.writeUInt32LE(data.length, 40);
  return Buffer.concat([h, data]);
}

export function mediaBytes(s: MediaSpec): Buffer {
  let b = s.format === "png" ? png() : s.format === "wav" ? wav() : Buffer.from([0xff, 0xd8, ...(s.body ?? [])]);
  for (const e of s.edits) {
    if ("cut" in e) b = b.subarray(0, Math.min(e.cut, b.length));
    else if ("insert" in e) b = Buffer.concat([b.subarray(0, e.insert), Buffer.from(e.bytes), b.subarray(e.insert)]);
    else {
      const at = "set" in e ? e.set : "u32be" in e ? e.u32be : "u32le" in e ? e.u32le : e.u16le;
      const size = "set" in e ? 1 : "u16le" in e ? 2 : 4;
      if (at + size > b.length) continue;
      b = Buffer.from(b);
      if ("set" in e) b[at] = e.to & 0xff;
      else if ("u32be" in e) b.writeUInt32BE(e.to >>> 0, at);
      else if ("u32le" in e) b.writeUInt32LE(e.to >>> 0, at);
      else b.writeUInt16LE(e.to & 0xffff, at);
    }
  }
  return b;
}

const big = fc.oneof(fc.integer({ min: 0, max: 70 }), fc.constantFrom(0, 1, 0xffff, 0x7fffffff, 0xffffffff, 46341, 1 << 20));
const at = fc.integer({ min: 0, max: 700 });
const edit = (fields: number[]): fc.Arbitrary<Edit> =>
  fc.oneof(
    { weight: 4, arbitrary: fc.record({ set: at, to: fc.integer({ min: 0, max: 255 }) }) },
    { weight: 2, arbitrary: fc.record({ cut: at }) },
    { weight: 1, arbitrary: fc.record({ insert: at, bytes: fc.array(fc.integer({ min: 0, max: 255 }), { maxLength: 12 }) }) },
    { weight: 3, arbitrary: fc.record({ u32be: fc.constantFrom(...fields), to: big }) },
    { weight: 2, arbitrary: fc.record({ u16le: fc.constantFrom(...fields), to: big }) },
    { weight: 2, arbitrary: fc.record({ u32le: fc.constantFrom(...fields), to: big }) },
  );
// PNG: IHDR length, width, height, depth/color bytes, IDAT length. WAV: sizes, format, channels, rate, bits, data size.
const PNG_FIELDS = [8, 16, 20, 24, 25, 33];
const WAV_FIELDS = [4, 16, 20, 22, 24, 28, 32, 34, 40];
// JPEG marker segments: SOF0/SOF2 with odd sizes, DHT/DQT/SOS fragments, APP1 (EXIF), EOI
const SEGMENT = fc.oneof(
  fc.constantFrom([0xff, 0xc0, 0, 17, 8, 0, 3, 0, 5, 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1], [0xff, 0xc2, 0, 11, 8, 0xff, 0xff, 0xff, 0xff, 1, 1, 0x11, 0], [0xff, 0xdb, 0, 67, 0, ...new Array<number>(64).fill(1)], [0xff, 0xc4, 0, 20, 0, ...new Array<number>(17).fill(0)], [0xff, 0xda, 0, 8, 1, 1, 0, 0, 63, 0], [0xff, 0xe1, 0, 16, 0x45, 0x78, 0x69, 0x66, 0, 0, 0x4d, 0x4d, 0, 42, 0, 0, 0, 8], [0xff, 0xd9], [0xff, 0xc3, 0, 2], [0xff, 0xe0, 0xff, 0xff]),
  fc.array(fc.integer({ min: 0, max: 255 }), { maxLength: 24 }),
);

export function arbMedia(): fc.Arbitrary<MediaSpec> {
  return fc.oneof(
    fc.record({ format: fc.constant("png" as const), edits: fc.array(edit(PNG_FIELDS), { maxLength: 3 }) }),
    fc.record({ format: fc.constant("wav" as const), edits: fc.array(edit(WAV_FIELDS), { maxLength: 3 }) }),
    fc.record({ format: fc.constant("jpeg" as const), body: fc.array(SEGMENT, { maxLength: 6 }).map((s) => s.flat()), edits: fc.array(edit([2, 4, 6]), { maxLength: 2 }) }),
  );
}
