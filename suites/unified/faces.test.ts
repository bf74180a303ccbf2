// The faces on a gemma4_unified checkpoint (parity/unified_face.ts): `npm run generate -- --model
// U --image IMG` runs the TS processor (the checkpoint's processor_config.json: max_soft_tokens 9
// here), the embedder and the language model alone; `npm run parity -- --model U --image IMG`
// compares every tap of mlx-vlm's generate_step on the same file (run in process here: the
// face's pre-flight and run, parityPlan + modelRun, on the shared oracle) (its own load_image and the
// checkpoint's Gemma4UnifiedImageProcessor, so the embed call's pixel_values and
// image_position_ids compare the two processors), the prompt's tokenization against mlx-lm's
// first. The checkpoint: u1_dense/f32's weights and config with a word-level tokenizer whose
// media tokens have the config's ids. Bad input: one line, exit code 2, before any oracle starts.
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_PYTHON, REPO_ROOT, sharedOracle } from "../../oracle/client.ts";
import { CKPT_ROOT } from "./run.ts";
import { modelRun, parityPlan } from "../../parity/cli.ts";
import { limit } from "../../tests/time_limit.ts";

await (await sharedOracle()).request("make_checkpoints", { only: ["u1_dense/f32"] }, limit(600_000));
const tmp = mkdtempSync(join(tmpdir(), "unified-faces-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const make = spawnSync(
  DEFAULT_PYTHON,
  [
    "-I",
    "-c",
    `import sys, json, os, shutil, numpy as np
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
d, src = sys.argv[1], sys.argv[2]; rng = np.random.default_rng(5)
Image.fromarray(rng.integers(0, 256, (150, 200, 3), dtype=np.uint8)).save(d + "/a.png")
Image.fromarray(rng.integers(0, 256, (90, 140, 3), dtype=np.uint8)).save(d + "/b.jpg", quality=90)
open(d + "/bad.png", "wb").write(b"not an image at all")
ck = d + "/ck"; os.mkdir(ck)
shutil.copy(src + "/config.json", ck); os.symlink(os.path.realpath(src + "/model.safetensors"), ck + "/model.safetensors")
special = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<|image|>": 250, "<|audio|>": 251, "<|image>": 252, "<image|>": 253, "<|audio>": 254, "<audio|>": 255}
words = ["describe", "this", "image", "and", "that", "one"]
tok = Tokenizer(models.WordLevel({**special, **{w: 6 + i for i, w in enumerate(words)}}, unk_token="<unk>")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.add_special_tokens(list(special)); tok.save(ck + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
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

  it("parity --image (the face's pre-flight and run, in process on the shared oracle): every tap of generate_step byte-identical to mlx-vlm on the same files (two images, the processors compared at the embed call)", async () => {
    const plan = await parityPlan(["--model", CK, "--image", `${png},${jpg}`, "--prompt", "describe <|image|> and <|image|>", "--steps", "2"]);
    const r = await modelRun(await sharedOracle(), plan!);
    expect({ first: r.firstDivergence, exact: r.bitExact }).toEqual({ first: null, exact: r.tapsCompared });
    expect(r.tokens.ts).toEqual(r.tokens.oracle);
    expect(r.tokens.ts.length).toBe(2);
    // the embed call's processor outputs are among the compared taps (TS's vs mlx-vlm's processor)
    expect(r.taps.filter((t) => /^embed\/vision_embedder\/(pixel_values|image_position_ids)$/.test(t.name)).length).toBe(2);
    expect(r.tapsCompared).toBeGreaterThan(300);
  }, limit(120_000));

  it("bad input: one line and exit code 2 from both faces (missing file, undecodable file, --audio on this model, placeholders that do not match the files)", () => {
    const cases: [string, string[], RegExp][] = [
      ["generate_cli.ts", ["--model", CK, "--image", join(tmp, "nope.png"), "--prompt", "describe"], /file not found/],
      ["cli.ts", ["--model", CK, "--image", join(tmp, "nope.png"), "--prompt", "describe"], /file not found/],
      ["generate_cli.ts", ["--model", CK, "--image", bad, "--prompt", "describe"], /bad\.png/],
      ["cli.ts", ["--model", CK, "--image", bad, "--prompt", "describe"], /bad\.png/],
      ["cli.ts", ["--model", CK, "--image", png, "--audio", png, "--prompt", "describe"], /takes --image/],
      ["generate_cli.ts", ["--model", CK, "--image", png, "--prompt", "describe <|image|> and <|image|>"], /2 image placeholders but --image gives 1 file/],
    ];
    let n = 0;
    for (const [file, args, msg] of cases) {
      const r = face(file, args);
      expect({ file, args: args.join(" "), code: r.code, msg: msg.test(r.out) }).toEqual({ file, args: args.join(" "), code: 2, msg: true });
      expect(r.out.trim().split("\n").filter((l) => l.startsWith("error")).length).toBe(1);
      n++;
    }
    expect(n).toBe(6);
  }, limit(180_000));
});
