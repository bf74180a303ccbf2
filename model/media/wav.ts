// `mlx_vlm.utils.load_audio(path, sr)` for WAV files: mlx-audio's reader decodes with miniaudio
// (dr_wav) to signed 16-bit samples, divides by 32768 into float32, and `load_audio` averages
// the channels (numpy float32 mean). The conversions to int16 are dr_wav's, measured against
// mlx-audio on every value class: 8-bit (u - 128) << 8, 24-bit >> 8, 32-bit >> 16, float
// clipped to [-1, 1] then (int)((x + 1) * 32767.5) - 32768, in float32 for 32-bit and double
// for 64-bit samples (NaN reads as 32767). Since every sample is then k/32768, the channel sum
// is exact and the mean is one float32 division.
//
// Differences from mlx-vlm, each a MediaError instead: another sample rate than the
// extractor's (mlx-vlm resamples; the resampler is not ported), no samples, a data chunk that
// runs past the end of the file (miniaudio reads what is there), encodings other than PCM and
// IEEE float (A-law, mu-law, ADPCM), and non-WAV files (mlx-audio also reads MP3/FLAC/...).

import { readFileSync } from "node:fs";
import { MediaError } from "./errors.ts";

export interface Waveform {
  /** Mono float32 samples (k / 32768). */
  samples: Float32Array;
  sampleRate: number;
  channels: number;
}

const PCM = 1;
const IEEE_FLOAT = 3;
const EXTENSIBLE = 0xfffe;

/** dr_wav's float-to-s16 ("the accurate way"), in float32 or double like its two functions. */
function floatToS16(x: number, single: boolean): number {
  if (Number.isNaN(x)) return 32767;
  const c = x < -1 ? -1 : x > 1 ? 1 : x;
  const scaled = single ? Math.fround(Math.fround(c + 1) * Math.fround(32767.5)) : (c + 1) * 32767.5;
  return Math.trunc(scaled) - 32768;
}

/** Decode a WAV file's bytes to int16 frames (interleaved), as miniaudio does. */
export function decodeWav(b: Uint8Array, file: string): { pcm: Int16Array; sampleRate: number; channels: number } {
  const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const tag4 = (o: number) => String.fromCharCode(...b.subarray(o, o + 4));
  if (b.length < 12 || tag4(0) !== "RIFF" || tag4(8) !== "WAVE")
    throw new MediaError(file, "unsupported_format", "not a WAV (RIFF/WAVE) file; only WAV audio is supported");
  let fmt: { tag: number; channels: number; rate: number; bits: number; block: number } | undefined;
  let data: Uint8Array | undefined;
  for (let pos = 12; pos + 8 <= b.length; ) {
    const id = tag4(pos);
    const size = v.getUint32(pos + 4, true);
    const body = pos + 8;
    if (body + size > b.length) {
      if (id === "data") throw new MediaError(file, "truncated", `WAV data chunk holds ${b.length - body} of ${size} bytes`);
      throw new MediaError(file, "truncated", `WAV file ends inside its '${id}' chunk`);
    }
    if (id === "fmt ") {
      if (size < 16) throw new MediaError(file, "corrupt", "WAV fmt chunk is too short");
      let tag = v.getUint16(body, true);
      if (tag === EXTENSIBLE) {
        if (size < 40) throw new MediaError(file, "corrupt", "WAV extensible fmt chunk is too short");
        tag = v.getUint16(body + 24, true); // the sub-format GUID starts with the format tag
      }
      fmt = { tag, channels: v.getUint16(body + 2, true), rate: v.getUint32(body + 4, true), block: v.getUint16(body + 12, true), bits: v.getUint16(body + 14, true) };
    } else if (id === "data") {
      data = b.subarray(body, body + size);
      break;
    }
    pos = body + size + (size & 1);
  }
  if (fmt === undefined) throw new MediaError(file, data ? "corrupt" : "truncated", "WAV file has no fmt chunk before its data");
  if (data === undefined) throw new MediaError(file, "truncated", "WAV file has no data chunk");
  const { tag, channels, bits } = fmt;
  const ok = (tag === PCM && [8, 16, 24, 32].includes(bits)) || (tag === IEEE_FLOAT && (bits === 32 || bits === 64));
  if (!ok) throw new MediaError(file, "unsupported_format", `WAV encoding ${tag} with ${bits}-bit samples is not supported (PCM 8/16/24/32-bit and float 32/64-bit are)`);
  if (channels < 1 || fmt.rate < 1) throw new MediaError(file, "corrupt", `WAV header says ${channels} channels at ${fmt.rate} Hz`);
  const width = bits / 8;
  const n = Math.floor(data.length / (width * channels)) * channels;
  const d = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const pcm = new Int16Array(n);
  for (let i = 0; i < n; i++) {
    const o = i * width;
    if (tag === IEEE_FLOAT) pcm[i] = floatToS16(bits === 32 ? d.getFloat32(o, true) : d.getFloat64(o, true), bits === 32);
    else if (bits === 8) pcm[i] = (data[o]! - 128) << 8;
    else if (bits === 16) pcm[i] = d.getInt16(o, true);
    else if (bits === 24) pcm[i] = ((data[o + 2]! << 24) | (data[o + 1]! << 16) | (data[o]! << 8)) >> 16;
    else pcm[i] = d.getInt32(o, true) >> 16;
  }
  return { pcm, sampleRate: fmt.rate, channels };
}

/** `load_audio(path, sr)` for a WAV file: mono float32, refusing another rate than `sr`. */
export function loadAudio(path: string, sr = 16000): Waveform {
  let b: Uint8Array;
  try {
    b = new Uint8Array(readFileSync(path));
  } catch (e) {
    throw new MediaError(path, "unreadable", `cannot read the audio: ${(e as Error).message}`);
  }
  const { pcm, sampleRate, channels } = decodeWav(b, path);
  if (sampleRate !== sr)
    throw new MediaError(path, "sample_rate", `audio is at ${sampleRate} Hz; the feature extractor needs ${sr} Hz (resample it first)`);
  const frames = pcm.length / channels;
  if (frames === 0) throw new MediaError(path, "empty", "audio has no samples");
  const samples = new Float32Array(frames);
  for (let t = 0; t < frames; t++) {
    let s = 0;
    for (let c = 0; c < channels; c++) s += pcm[t * channels + c]! / 32768;
    samples[t] = Math.fround(s / channels);
  }
  return { samples, sampleRate, channels };
}
