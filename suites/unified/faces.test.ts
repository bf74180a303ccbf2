// The faces on a gemma4_unified checkpoint (parity/unified_face.ts): `npm run generate -- --model
// U --image IMG` runs the TS processor (the checkpoint's processor_config.json: max_soft_tokens 9
// here), the embedder and the language model alone; `npm run parity -- --model U --image IMG`
// compares every tap of mlx-vlm's generate_step on the same file (run in process here: the
// face's pre-flight and run, parityPlan + modelRun, on the shared oracle) (its own load_image and the
// checkpoint's Gemma4UnifiedImageProcessor, so the embed call's pixel_values and
// image_position_ids compare the two processors), the prompt's tokenization against mlx-lm's
// first. --audio (a WAV file: load_audio, the raw frames through embed_audio) and --video (an
// OpenCV-written MJPEG AVI: load_video's sampling, Gemma4UnifiedVideoProcessor, the <|video|>
// expansion tokenized whole; the parity run feeds both sides OpenCV's frames) the same way. The
// checkpoint: u1_dense/f32's weights and config (video_token_id 249) with a word-level tokenizer
// whose media tokens have the config's ids. Bad input: one line, exit code 2, before any oracle
// starts.
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_PYTHON, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { CKPT_ROOT } from "./run.ts";
import { modelRun, parityPlan } from "../../parity/cli.ts";
import { oracleMedia } from "../../oracle/media.ts";
import { mmTokenTypes } from "../../model/runtime.ts";
import { limit } from "../../tests/time_limit.ts";

await (await sharedOracle()).request("make_checkpoints", { only: ["u1_dense/f32", "u2_e2b/f32"] }, limit(600_000));
const tmp = mkdtempSync(join(tmpdir(), "unified-faces-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const make = spawnSync(
  DEFAULT_PYTHON,
  [
    "-I",
    "-c",
    `import sys, json, os, wave, numpy as np, cv2
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
d, src = sys.argv[1], sys.argv[2]; rng = np.random.default_rng(5)
Image.fromarray(rng.integers(0, 256, (150, 200, 3), dtype=np.uint8)).save(d + "/a.png")
Image.fromarray(rng.integers(0, 256, (90, 140, 3), dtype=np.uint8)).save(d + "/b.jpg", quality=90)
open(d + "/bad.png", "wb").write(b"not an image at all")
open(d + "/bad.avi", "wb").write(b"RIFF" + bytes(rng.integers(0, 256, 400, dtype=np.uint8)))
w = wave.open(d + "/a.wav", "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000)
w.writeframes((np.sin(np.arange(4900) * 0.07) * 9000 + rng.normal(0, 500, 4900)).astype("<i2").tobytes()); w.close()
vw = cv2.VideoWriter(d + "/a.avi", cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (64, 48))
for t in range(12):
    y, x = np.mgrid[0:48, 0:64]
    vw.write(np.clip(np.stack([128 + 100 * np.sin((x + 3 * t) / 7.0), 128 + 100 * np.cos((y - 2 * t) / 5.0), (x * 4.0 + 9 * t) % 256], -1) + rng.normal(0, 12, (48, 64, 3)), 0, 255).astype(np.uint8))
vw.release()
vw = cv2.VideoWriter(d + "/long.avi", cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (32, 32))
for t in range(40):
    vw.write(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
vw.release()
ck = d + "/ck"; os.mkdir(ck)
cfg = json.load(open(src + "/config.json")); cfg["video_token_id"] = 249; json.dump(cfg, open(ck + "/config.json", "w"))
os.symlink(os.path.realpath(src + "/model.safetensors"), ck + "/model.safetensors")
special = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<|video|>": 249, "<|image|>": 250, "<|audio|>": 251, "<|image>": 252, "<image|>": 253, "<|audio>": 254, "<audio|>": 255}
words = ["describe", "this", "image", "and", "that", "one", "clip", "video", "00", ":", "01"]
tok = Tokenizer(models.WordLevel({**special, **{w: 6 + i for i, w in enumerate(words)}}, unk_token="<unk>")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.add_special_tokens(list(special)); tok.save(ck + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>", "video_token": "<|video|>",
           "image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>", "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}, open(ck + "/tokenizer_config.json", "w"))
json.dump({"image_processor": {"image_processor_type": "Gemma4UnifiedImageProcessor", "max_soft_tokens": 9}}, open(ck + "/processor_config.json", "w"))`,
    tmp,
    join(CKPT_ROOT, "u1_dense/f32"),
  ],
  { encoding: "utf8" },
);
if (make.status !== 0) throw new Error(`making the face checkpoint failed: ${make.stderr}`);
const CK = join(tmp, "ck");
const [png, jpg, bad] = [join(tmp, "a.png"), join(tmp, "b.jpg"), join(tmp, "bad.png")];
const [wav, avi, badAvi] = [join(tmp, "a.wav"), join(tmp, "a.avi"), join(tmp, "bad.avi")];
const U2 = join(CKPT_ROOT, "u2_e2b/f32");

function face(file: string, args: string[]): { code: number | null; out: string } {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", file), ...args], { cwd: REPO_ROOT, encoding: "utf8", timeout: limit(180_000) });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

describe("gemma4_unified faces", () => {
  it("generate --image: the TS processor, embedder and language model; the prompt expanded with the image's 6 patches", () => {
    const r = face("generate_cli.ts", ["--model", CK, "--image", png, "--prompt", "describe this image", "--max-tokens", "3"]);
    expect(r.out).toContain("==========");
    // boi, 6 image tokens (150x200 under max_soft_tokens 9 from processor_config.json: a 2x3 grid
    // of 48-pixel model patches; the default 280 would give far more), eoi, 3 words (this
    // word-level tokenizer adds no BOS)
    expect(r.out).toMatch(/Prompt: 11 tokens/);
    expect(r.code).toBe(0);
  }, limit(120_000));

  it("parity --image --audio (the face's pre-flight and run, in process on the shared oracle): every tap of generate_step byte-identical to mlx-vlm on the same files (two images and a WAV clip, the processors and load_audio compared at the embed call)", async () => {
    const plan = await parityPlan(["--model", CK, "--image", `${png},${jpg}`, "--audio", wav, "--prompt", "describe <|image|> and <|image|> <|audio|>", "--steps", "2"]);
    const r = await modelRun(await sharedOracle(), plan!);
    expect({ first: r.firstDivergence, exact: r.bitExact }).toEqual({ first: null, exact: r.tapsCompared });
    expect(r.tokens.ts).toEqual(r.tokens.oracle);
    expect(r.tokens.ts.length).toBe(2);
    // the embed call's processor outputs are among the compared taps (TS's vs mlx-vlm's processor and extractor)
    expect(r.taps.filter((t) => /^embed\/(vision_embedder\/(pixel_values|image_position_ids)|embed_audio\/input_features|merge\/(image|audio))$/.test(t.name)).length).toBe(5);
    expect(r.tapsCompared).toBeGreaterThan(300);
  }, limit(120_000));

  it("generate --image --audio and --video: the TS processors, embedder, embed_audio and language model; the prompts expanded", () => {
    // boi + 6 image tokens + eoi, boa + 8 audio tokens (4,900 samples at 16 kHz: ceil(306.25 ms / 40)) + eoa, 1 word
    const av = face("generate_cli.ts", ["--model", CK, "--image", png, "--audio", wav, "--prompt", "describe", "--max-tokens", "2"]);
    expect({ code: av.code, prompt: /Prompt: 19 tokens/.test(av.out) }).toEqual({ code: 0, prompt: true });
    // 12 frames at 10 fps sampled at 2 fps: 4 frames (min_frames), each "00:0s <|image>" + 63 video
    // tokens (336x432 after the resize: 7x9 model patches) + "<image|>": 4 x (3 + 1 + 63 + 1) = 272, + 2 words
    const v = face("generate_cli.ts", ["--model", CK, "--video", avi, "--prompt", "<|video|> describe this", "--max-tokens", "2"]);
    expect({ code: v.code, prompt: /Prompt: 274 tokens/.test(v.out), out: v.code === 0 ? "" : v.out }).toEqual({ code: 0, prompt: true, out: "" });
  }, limit(120_000));

  it("parity --video (in process, OpenCV's frames on both sides): the expanded ids and token types equal mlx-vlm's Gemma4UnifiedProcessor's; every tap of generate_step byte-identical, the expanded text tokenized as mlx-lm does", async () => {
    const plan = await parityPlan(["--model", CK, "--video", avi, "--prompt", "<|video|> describe this", "--steps", "2", "--video-num-frames", "2"]);
    // the expansion: mlx-vlm's own Gemma4UnifiedProcessor (from_pretrained, its tokenizer) on the same file and flags gives the same ids, token type 2 on the video tokens
    const theirs = (await oracleMedia(await sharedOracle(), "unified_prepare_video", { model_dir: CK, prompt: "<|video|> describe this", paths: [avi], nframes: 2 })) as { input_ids: number[]; mm_token_type_ids: number[] };
    const ids = plan!.spec!.unifiedPlan!.ids;
    expect({ ids, types: mmTokenTypes(ids, { image_token_id: 250, audio_token_id: 251, video_token_id: 249 }) }).toEqual({ ids: theirs.input_ids, types: theirs.mm_token_type_ids });
    expect(theirs.mm_token_type_ids.filter((t) => t === 2).length).toBe(2 * 63);
    const r = await modelRun(await sharedOracle(), plan!);
    expect({ first: r.firstDivergence, exact: r.bitExact }).toEqual({ first: null, exact: r.tapsCompared });
    expect(r.tokens.ts).toEqual(r.tokens.oracle);
    expect(r.taps.filter((t) => /^embed\/(vision_embedder\/(pixel_values|image_position_ids)|video_features|merge\/video)$/.test(t.name)).length).toBe(4);
    expect(r.tapsCompared).toBeGreaterThan(300);
  }, limit(120_000));

  it("bad input: one line and exit code 2 from both faces (missing or undecodable files, audio for a model without embed_audio, placeholders that do not match the files)", () => {
    const cases: [string, string[], RegExp][] = [
      ["generate_cli.ts", ["--model", CK, "--image", join(tmp, "nope.png"), "--prompt", "describe"], /file not found/],
      ["cli.ts", ["--model", CK, "--image", join(tmp, "nope.png"), "--prompt", "describe"], /file not found/],
      ["generate_cli.ts", ["--model", CK, "--image", bad, "--prompt", "describe"], /bad\.png/],
      ["cli.ts", ["--model", CK, "--image", bad, "--prompt", "describe"], /bad\.png/],
      ["generate_cli.ts", ["--model", CK, "--image", png, "--prompt", "describe <|image|> and <|image|>"], /2 image placeholders but --image gives 1 file/],
      ["generate_cli.ts", ["--model", CK, "--video", badAvi, "--prompt", "describe"], /bad\.avi/],
      ["cli.ts", ["--model", CK, "--video", badAvi, "--prompt", "describe"], /bad\.avi/],
      ["generate_cli.ts", ["--model", CK, "--video", avi, "--prompt", "<|video|> and <|video|>"], /2 <\|video\|> placeholders but 1 video/],
      ["generate_cli.ts", ["--model", CK, "--video", join(tmp, "long.avi"), "--prompt", "describe", "--video-max-frames", "40", "--fps", "10"], /40 frames sampled, the processor keeps at most num_frames = 32/],
      ["cli.ts", ["--model", CK, "--video", avi, "--image", png, "--prompt", "<|video|> <|image|>"], /not with --image/],
      ["generate_cli.ts", ["--model", U2, "--audio", wav, "--tokens", "2,audio,5"], /no embed_audio/],
      ["cli.ts", ["--model", U2, "--audio", wav, "--tokens", "2,audio,5"], /no embed_audio/],
    ];
    let n = 0;
    for (const [file, args, msg] of cases) {
      const r = face(file, args);
      expect({ file, args: args.join(" "), code: r.code, msg: msg.test(r.out) }).toEqual({ file, args: args.join(" "), code: 2, msg: true });
      expect(r.out.trim().split("\n").filter((l) => l.startsWith("error")).length).toBe(1);
      n++;
    }
    expect(n).toBe(12);
  }, limit(180_000));
});
