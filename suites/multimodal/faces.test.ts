// The media faces end to end on real files (a PNG, a JPEG of another size, a WAV): `npm run
// generate` runs the TS processor and model alone; `npm run parity` compares every tap, from the
// processor outputs (TS Gemma4Processor vs mlx-vlm's own on the same files) to the last step's
// logits, against live mlx-vlm. An undecodable file is one line and exit code 2.
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_PYTHON, REPO_ROOT } from "../../oracle/client.ts";
import { CKPT_ROOT } from "./run.ts";
import { limit } from "../../tests/time_limit.ts";

const tmp = mkdtempSync(join(tmpdir(), "mm-faces-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const make = spawnSync(
  DEFAULT_PYTHON,
  [
    "-I",
    "-c",
    `import sys, wave, numpy as np
from PIL import Image
d = sys.argv[1]; rng = np.random.default_rng(7)
Image.fromarray(rng.integers(0, 256, (150, 200, 3), dtype=np.uint8)).save(d + "/a.png")
Image.fromarray(rng.integers(0, 256, (90, 140, 3), dtype=np.uint8)).save(d + "/b.jpg", quality=90)
t = np.arange(int(16000 * 1.3))
x = (0.3 * np.sin(2 * np.pi * 440 * t / 16000) * 32767).astype(np.int16)
w = wave.open(d + "/c.wav", "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(x.tobytes()); w.close()
# a checkpoint with a tokenizer, a chat template and a processor config: M2's weights and config,
# a word-level tokenizer whose media tokens have the config's ids (250-255)
import json, os, shutil
from tokenizers import Tokenizer, models, pre_tokenizers
src = sys.argv[2]; ck = d + "/ck"; os.mkdir(ck)
shutil.copy(src + "/config.json", ck); os.symlink(src + "/model.safetensors", ck + "/model.safetensors")
special = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<|turn>": 4, "<turn|>": 5, "<|video|>": 249, "<|image|>": 250,
           "<|audio|>": 251, "<|image>": 252, "<image|>": 253, "<|audio>": 254, "<audio|>": 255}
words = ["user", "model", "describe", "this", "image", "and", "that", "sound"]
vocab = {**special, **{w: 6 + i for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.add_special_tokens(list(special)); tok.save(ck + "/tokenizer.json")
tmpl = ("{{ bos_token }}{% for m in messages %}<|turn>{{ m.role }} {% if m.content is string %}{{ m.content }}{% else %}"
        "{% for c in m.content %}{% if c.type == 'image' %}<|image|>{% elif c.type == 'audio' %}<|audio|>{% else %}{{ c.text }}{% endif %} {% endfor %}"
        "{% endif %}<turn|> {% endfor %}{% if add_generation_prompt %}<|turn>model {% endif %}")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
           "image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>", "audio_token": "<|audio|>", "boa_token": "<|audio>",
           "eoa_token": "<audio|>", "chat_template": tmpl}, open(ck + "/tokenizer_config.json", "w"))
json.dump({"image_processor": {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 20}}, open(ck + "/processor_config.json", "w"))`,
    tmp,
    join(CKPT_ROOT, "m2_e2b/f32"),
  ],
  { encoding: "utf8" },
);
if (make.status !== 0) throw new Error(`making the media files failed: ${make.stderr}`);
const [png, jpg, wav] = [join(tmp, "a.png"), join(tmp, "b.jpg"), join(tmp, "c.wav")];
const CKPT = join(CKPT_ROOT, "m2_e2b/f32");

function face(file: string, args: string[]): { code: number | null; out: string } {
  const r = spawnSync(process.execPath, [join(REPO_ROOT, "parity", file), ...args], { cwd: REPO_ROOT, encoding: "utf8", timeout: limit(180_000) });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

const MEDIA = ["--model", CKPT, "--image", `${png},${jpg}`, "--audio", wav, "--tokens", "2,image,7,image,audio,9", "--max-soft-tokens", "20"];

describe("media faces on PNG, JPEG and WAV files", () => {
  it("generate: the prompt expanded by the processor's counts, tokens streamed", () => {
    const r = face("generate_cli.ts", [...MEDIA, "--max-tokens", "5"]);
    expect(r.code).toBe(0);
    // 2, boi + 15 + eoi, 7, boi + 15 + eoi, boa + 33 + eoa, 9 (1.3 s at 40 ms a token)
    expect(r.out).toMatch(/Prompt: 72 tokens/);
    expect(r.out).toMatch(/Generation: 5 tokens/);
  }, limit(180_000));

  it("parity: every tap bit-exact against mlx-vlm, the processor outputs included", () => {
    const r = face("cli.ts", [...MEDIA, "--steps", "4", "--out", join(tmp, "report")]);
    expect(r.out).toMatch(/Verdict: PASS/);
    expect(r.code).toBe(0);
    const rep = JSON.parse(readFileSync(join(tmp, "report", "parity.json"), "utf8")) as { runs: { tapsCompared: number; bitExact: number; taps: { name: string }[] }[] };
    const run = rep.runs[0]!;
    expect(run.bitExact).toBe(run.tapsCompared);
    const names = run.taps.map((t) => t.name);
    for (const n of ["embed/vision_tower/pixel_values", "embed/audio_tower/input_features", "embed/audio_tower/input_mask", "embed/inputs"]) expect(names).toContain(n);
  }, limit(180_000));

  it("--prompt --chat on a checkpoint with a tokenizer and a processor config: the media placed as mlx-vlm's chat template places them, parity PASS", () => {
    const ck = join(tmp, "ck");
    const args = ["--model", ck, "--image", png, "--audio", wav, "--prompt", "describe this image and that sound", "--chat"];
    // bos <|turn> user [boi + 15 + eoi] 6 words [boa + 33 + eoa] <turn|> <|turn> model: the image
    // budget (20 soft tokens: 15 for 150x200) from processor_config.json, on both sides
    const g = face("generate_cli.ts", [...args, "--max-tokens", "3"]);
    expect(g.out).toMatch(/Prompt: 64 tokens/);
    expect(g.code).toBe(0);
    const r = face("cli.ts", [...args, "--steps", "3", "--out", join(tmp, "report-chat")]);
    expect(r.out).toMatch(/Verdict: PASS/);
    expect(r.code).toBe(0);
  }, limit(180_000));

  for (const file of ["generate_cli.ts", "cli.ts"]) {
    it(`${file}: an undecodable image is one line naming the file, exit 2`, () => {
      const bad = join(tmp, "bad.png");
      writeFileSync(bad, "not a png");
      const r = face(file, ["--model", CKPT, "--image", bad, "--tokens", "2,image,5"]);
      expect(r.out).toMatch(/bad\.png: /);
      expect(r.code).toBe(2);
      expect(r.out).not.toMatch(/\n\s+at .+:\d+:\d+/);
    }, limit(60_000));
  }
});
