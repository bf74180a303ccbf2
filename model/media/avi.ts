// A Motion-JPEG AVI demuxer: the container and codec the video path reads (the RIFF layout of
// Microsoft's AVI 1.0: hdrl/avih, strl/strh/strf, movi with "NNdc" chunks). Each frame is a
// complete JPEG, decoded by jpeg.ts (libjpeg-turbo in WebAssembly); no inter-frame state, so a
// frame index maps to one chunk. Anything else (other codecs, OpenDML "AVIX" extensions,
// palette changes) is refused with a MediaError naming it.

import { MediaError } from "./errors.ts";

export interface AviVideo {
  width: number;
  height: number;
  /** strh dwRate / dwScale: the frame rate the file declares. */
  fps: number;
  /** strh dwLength: the frame count the header declares. */
  declared_frames: number;
  /** Byte ranges of the video stream's frame chunks, in file order. */
  frames: { offset: number; size: number }[];
}

const tag = (b: Uint8Array, o: number) => String.fromCharCode(b[o]!, b[o + 1]!, b[o + 2]!, b[o + 3]!);

/** The video stream of an MJPEG AVI file (header fields and frame chunk positions). */
export function parseAvi(b: Uint8Array, file: string): AviVideo {
  if (b.length === 0) throw new MediaError(file, "empty", "the video file is empty");
  if (b.length < 12 || tag(b, 0) !== "RIFF" || tag(b, 8) !== "AVI ")
    throw new MediaError(file, "unsupported_format", "not an AVI file (only Motion-JPEG AVI video is supported)");
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const u32 = (o: number) => dv.getUint32(o, true);
  const riffEnd = Math.min(b.length, 8 + u32(4));
  let video: { index: number; width: number; height: number; fps: number; length: number } | undefined;
  let streams = 0;
  const frames: { offset: number; size: number }[] = [];
  let sawMovi = false;

  const walk = (start: number, end: number, inside: string): void => {
    let o = start;
    while (o + 8 <= end) {
      const id = tag(b, o);
      const size = u32(o + 4);
      const body = o + 8;
      if (body + size > b.length) {
        if (inside === "movi" || (id === "LIST" && body + 4 <= b.length && tag(b, body) === "movi")) throw new MediaError(file, "truncated", `the video data ends inside chunk "${id}" (${size} bytes declared at byte ${o}, the file has ${b.length})`);
        throw new MediaError(file, "truncated", `the AVI header ends early (chunk "${id}" at byte ${o})`);
      }
      if (id === "LIST") {
        const kind = tag(b, body);
        if (kind === "movi") sawMovi = true;
        if (kind === "hdrl" || kind === "strl" || kind === "movi" || kind === "rec ") walk(body + 4, body + size, kind);
      } else if (inside === "strl" && id === "strh") {
        const type = tag(b, body);
        if (type === "vids" && !video) {
          const scale = u32(body + 20);
          const rate = u32(body + 24);
          video = { index: streams, width: 0, height: 0, fps: scale ? rate / scale : 0, length: u32(body + 32) };
          const handler = tag(b, body + 4);
          if (!/^(MJPG|mjpg|\0\0\0\0)$/.test(handler)) throw new MediaError(file, "unsupported_format", `video codec "${handler}" is not supported (only Motion-JPEG)`);
        }
        streams++;
      } else if (inside === "strl" && id === "strf" && video && video.index === streams - 1 && video.width === 0) {
        video.width = dv.getInt32(body + 4, true);
        video.height = Math.abs(dv.getInt32(body + 8, true));
        const comp = tag(b, body + 16);
        if (comp !== "MJPG" && comp !== "mjpg") throw new MediaError(file, "unsupported_format", `video codec "${comp}" is not supported (only Motion-JPEG)`);
      } else if (inside === "movi" || inside === "rec ") {
        if (video && /^\d\d(dc|db)$/.test(id) && Number(id.slice(0, 2)) === video.index) frames.push({ offset: body, size });
      }
      o = body + size + (size & 1);
    }
  };
  walk(12, riffEnd, "RIFF");
  if (riffEnd + 12 <= b.length && tag(b, riffEnd) === "RIFF" && tag(b, riffEnd + 8) === "AVIX")
    throw new MediaError(file, "unsupported_format", "OpenDML (AVIX) extension chunks are not supported");
  if (!video) throw new MediaError(file, "corrupt", "the AVI file has no video stream");
  if (video.width <= 0 || video.height <= 0) throw new MediaError(file, "corrupt", `video size ${video.width}x${video.height} is invalid`);
  if (!(video.fps > 0)) throw new MediaError(file, "corrupt", "the video stream declares no frame rate");
  if (!sawMovi) throw new MediaError(file, "truncated", "the AVI file has no frame data (no movi list)");
  if (frames.length < video.length)
    throw new MediaError(file, "truncated", `the header declares ${video.length} frames but the file holds ${frames.length}`);
  return { width: video.width, height: video.height, fps: video.fps, declared_frames: video.length, frames };
}
