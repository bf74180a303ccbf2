// The audio front end against mlx-vlm: WAV loading (`load_audio`: miniaudio's int16
// conversion, /32768, channel mean) and `Gemma4AudioFeatureExtractor` (framing, window, rfft,
// abs, mel, log, mask) with the processor's soft-token count, byte for byte, under several
// "feature_extractor" configurations. The extractor also runs on the oracle's own waveform, so
// it is checked on identical input whatever the decoder does. The two constant tables shipped
// in model/gemma4/audio_feature_tables.json are checked against the live extractor's.
//
// Default: 24 clips. MEDIA_FULL=1: 64 clips, up to 500000 samples (31 s, past the 30 s cut).
// The test asserts that many clips were made and compared, each of the 5 configurations used.

import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { sharedOracle } from "../../oracle/client.ts";
import { oracleMedia } from "../../oracle/media.ts";
import type { NpyRecord } from "../../oracle/npy.ts";
import { compareRaw, formatDiff } from "../../oracle/tensor_diff.ts";
import { hostBytes, type HostArray } from "../../model/media/host.ts";
import { loadAudio } from "../../model/media/wav.ts";
import { audioTables, featureExtractorConfig, Gemma4AudioFeatureExtractor } from "../../model/gemma4/audio_feature_extractor.ts";
import { computeAudioNumTokens, loadProcessorConfig } from "../../model/gemma4/processing_gemma4.ts";
import { FULL, makeMedia, makeProcessorDirs, type MediaItem, tempDir } from "./media_fixtures.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = tempDir("audio");
afterAll(tmp.remove);
const oracle = await sharedOracle();

const CLIPS = FULL ? 64 : 24;
const clips = makeMedia<MediaItem[]>(join(tmp.dir, "wav"), "audio", ["--count", String(CLIPS)]);
const fe = (block: Record<string, unknown>) => ({ feature_extractor: { feature_extractor_type: "Gemma4AudioFeatureExtractor", ...block } });
const dirs = makeProcessorDirs(join(tmp.dir, "proc"), [
  { name: "default", config: null },
  { name: "htk-preemph", config: fe({ preemphasis: 0.97 }) },
  { name: "preemph", config: fe({ preemphasis: 0.9, preemphasis_htk_flavor: false, input_scale_factor: 0.5 }) },
  {
    name: "perbin",
    config: fe({ per_bin_mean: Array.from({ length: 128 }, (_, i) => -3 + i / 50), per_bin_stddev: Array.from({ length: 128 }, (_, i) => 1 + i / 100), mel_floor: 1e-5 }),
  },
  { name: "hop", config: fe({ hop_length_ms: 12.5, padding_value: 0.25 }) },
]);

const rec = (a: HostArray) => ({ dtype: a.dtype, shape: a.shape, data: hostBytes(a) });
const f32 = (r: NpyRecord) => new Float32Array(r.data.slice().buffer);

describe("audio front end = mlx-vlm's, byte for byte", () => {
  it("the shipped window and mel tables are the live extractor's", async () => {
    const t = await oracleMedia(oracle, "tables");
    const mine = audioTables();
    expect(compareRaw("window", { dtype: "float32", shape: [320], data: new Uint8Array(mine.window.buffer, mine.window.byteOffset, 1280) }, t.window as NpyRecord).equal).toBe(true);
    const mel = new Float64Array(257 * 128);
    mine.filters.forEach((f, m) => f.values.forEach((v, j) => (mel[(f.start + j) * 128 + m] = v)));
    const d = compareRaw("mel_filters", { dtype: "float64", shape: [257, 128], data: new Uint8Array(mel.buffer) }, t.mel_filters as NpyRecord);
    expect(d.equal, formatDiff(d)).toBe(true);
  });

  it(`${clips.length} clips: waveform, features, mask and token count`, async () => {
    const failures: string[] = [];
    let exact = 0;
    let values = 0;
    let ran = 0;
    const configsUsed = new Set<string>();
    for (const [i, clip] of clips.entries()) {
      const dir = dirs[i % dirs.length]!;
      configsUsed.add(dir.name);
      const cfg = loadProcessorConfig(dir.dir);
      const ex = new Gemma4AudioFeatureExtractor(featureExtractorConfig(cfg.feature_extractor, cfg.file));
      const w = loadAudio(clip.file, ex.samplingRate);
      const ref = await oracleMedia(oracle, "load_audio", { path: clip.file, sr: ex.samplingRate });
      const dw = compareRaw(`${clip.name} waveform`, { dtype: "float32", shape: [w.samples.length], data: new Uint8Array(w.samples.buffer) }, ref.waveform as NpyRecord);
      if (!dw.equal) failures.push(formatDiff(dw));
      const want = await oracleMedia(oracle, "audio", { model_dir: dir.dir, path: clip.file });
      const got = ex.call([w.samples]);
      const df = compareRaw(`${clip.name} input_features [${dir.name}]`, rec(got.input_features[0]!), want.input_features as NpyRecord);
      const dm = compareRaw(`${clip.name} input_features_mask [${dir.name}]`, rec(got.input_features_mask[0]!), want.input_features_mask as NpyRecord);
      const n = computeAudioNumTokens(w.samples.length, ex.samplingRate, cfg.audio_ms_per_token, cfg.audio_seq_length);
      values += got.input_features[0]!.data.length;
      if (df.equal && dm.equal && n === want.num_tokens) exact++;
      for (const d of [df, dm]) if (!d.equal) failures.push(formatDiff(d));
      if (n !== want.num_tokens) failures.push(`${clip.name}: ${n} audio tokens, mlx-vlm ${want.num_tokens}`);
      // The extractor on the oracle's own waveform (identical input).
      const same = ex.call([f32(ref.waveform as NpyRecord)]);
      const d2 = compareRaw(`${clip.name} features from mlx-vlm's waveform`, rec(same.input_features[0]!), want.input_features as NpyRecord);
      if (!d2.equal) failures.push(formatDiff(d2));
      ran++;
    }
    console.log(`[audio] ${clips.length} clips: ${exact} bit-exact (features + mask + tokens), ${values} feature values`);
    expect(failures).toEqual([]);
    // every clip asked for was made and compared, under every processor configuration
    expect({ clips: clips.length, ran, exact, configs: configsUsed.size }).toEqual({ clips: CLIPS, ran: CLIPS, exact: CLIPS, configs: dirs.length });
    expect(dirs.length).toBe(5);
  }, limit(600_000));
});
