// Images and audio in chat messages (serve/media.ts): `npm run serve` on a checkpoint with vision
// and audio towers against mlx-vlm 0.7.10 on the same request. The checkpoint is the m2_e2b f32
// multimodal fixture (E2B-like: per-layer inputs, KV sharing; both towers) with a word-level
// tokenizer whose media tokens carry the config's ids, a chat template that renders image and
// audio parts as those tokens, and a processor config (20 image soft tokens), as
// suites/multimodal/faces.test.ts builds it; the media are a random 150x200 PNG and a 1.3 s
// 440 Hz WAV, sent as base64 data: URLs.
// The reference is mlx-vlm's own server path without HTTP (mlx_vlm/server/openai.py
// chat_completions): the media collected from the user messages (its loop, with its
// _decode_input_audio_data), _chat_message_to_prompt, _normalize_instruction_messages,
// prompt_utils.apply_chat_template (num_images, num_audios, enable_thinking False), then
// mlx_vlm.generate's stream_generate on the same data URL and audio bytes, greedy. Compared: the
// generated token ids and each one's logprob, bit for bit (this server's logprobs.content; the
// tiny random model repeats a token, so the logprobs are what tells the media apart), and the
// prompt's token count (usage.prompt_tokens = mlx-vlm's prompt_tokens: the placeholders expanded
// alike). A control: the first request without its image gives other logprobs.
// Cases: one image and one clip in one user turn after a system message; an image in an earlier
// user turn (the clip still goes to the last one). Also: a URL or a file path instead of a data:
// URL is a 400 and nothing is read.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_ROOT } from "../../oracle/client.ts";
import { limit } from "../../tests/time_limit.ts";
import { freePort, type ServerProcess, startServerProcess } from "./processes.ts";

const PYTHON = process.env.ORACLE_PYTHON || join(REPO_ROOT, ".venv", "bin", "python");
const M2 = join(REPO_ROOT, ".cache", "checkpoints", "m2_e2b", "f32");
const START = limit(90_000);
const CASE = limit(60_000);
const MAX_TOKENS = 4;

let tmp = "";
let ts: ServerProcess;
let png = "";
let wav = "";

const MAKE = `import sys, wave, json, os, numpy as np
from PIL import Image
d, src = sys.argv[1], sys.argv[2]; rng = np.random.default_rng(7)
Image.fromarray(rng.integers(0, 256, (150, 200, 3), dtype=np.uint8)).save(d + "/a.png")
t = np.arange(int(16000 * 1.3))
x = (0.3 * np.sin(2 * np.pi * 440 * t / 16000) * 32767).astype(np.int16)
w = wave.open(d + "/c.wav", "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(x.tobytes()); w.close()
from tokenizers import Tokenizer, models, pre_tokenizers
ck = d + "/ck"; os.mkdir(ck)
import shutil; shutil.copy(src + "/config.json", ck); os.symlink(src + "/model.safetensors", ck + "/model.safetensors")
special = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<|turn>": 4, "<turn|>": 5, "<|video|>": 249, "<|image|>": 250,
           "<|audio|>": 251, "<|image>": 252, "<image|>": 253, "<|audio>": 254, "<audio|>": 255}
words = ["user", "model", "system", "describe", "this", "image", "and", "that", "sound", "be", "brief", "now"]
vocab = {**special, **{w: 6 + i for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.add_special_tokens(list(special)); tok.save(ck + "/tokenizer.json")
tmpl = ("{{ bos_token }}{% for m in messages %}<|turn>{{ m.role }} {% if m.content is string %}{{ m.content }}{% else %}"
        "{% for c in m.content %}{% if c.type == 'image' %}<|image|>{% elif c.type == 'audio' %}<|audio|>{% else %}{{ c.text }}{% endif %} {% endfor %}"
        "{% endif %}<turn|> {% endfor %}{% if add_generation_prompt %}<|turn>model {% endif %}")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
           "image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>", "audio_token": "<|audio|>", "boa_token": "<|audio>",
           "eoa_token": "<audio|>", "chat_template": tmpl}, open(ck + "/tokenizer_config.json", "w"))
json.dump({"image_processor": {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 20}}, open(ck + "/processor_config.json", "w"))`;

// mlx-vlm's chat_completions up to the generation, then stream_generate (greedy)
const REFERENCE = `import sys, json
sys.path.insert(0, "oracle/python"); import device_env
from mlx_vlm import load
from mlx_vlm.generate.dispatch import stream_generate
from mlx_vlm.prompt_utils import apply_chat_template
from mlx_vlm.server.openai import _decode_input_audio_data
from mlx_vlm.server.request_normalization import _chat_message_to_prompt, _normalize_instruction_messages
ck, req_file, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, processor = load(ck)
out = []
for req in json.load(open(req_file)):
    images, audio, processed = [], [], []
    for message in req["messages"]:
        if isinstance(message["content"], list) and message["role"] == "user":
            for item in message["content"]:
                t = item.get("type")
                if t == "input_image": images.append(item["image_url"])
                elif t == "image_url": images.append(item["image_url"]["url"])
                elif t == "input_audio": audio.append(_decode_input_audio_data(item["input_audio"]))
        processed.append(_chat_message_to_prompt(message))
    _normalize_instruction_messages(processed)
    prompt = apply_chat_template(processor, model.config, processed, num_images=len(images), num_audios=len(audio), enable_thinking=False)
    tokens, logprobs, prompt_tokens = [], [], None
    for r in stream_generate(model, processor, prompt, image=images or None, audio=audio or None, max_tokens=n, temperature=0.0):
        tokens.append(int(r.token)); logprobs.append(float(r.logprobs[r.token])); prompt_tokens = r.prompt_tokens
    out.append({"tokens": tokens[:n], "logprobs": logprobs[:n], "prompt_tokens": prompt_tokens})
print(json.dumps(out))`;

function dataUrl(mime: string, file: string): string {
  return `data:${mime};base64,${readFileSync(file).toString("base64")}`;
}

async function chat(body: Record<string, unknown>): Promise<{ status: number; json: Record<string, unknown> }> {
  const r = await fetch(`${ts.url}/v1/chat/completions`, { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" }, signal: AbortSignal.timeout(CASE) });
  return { status: r.status, json: (await r.json()) as Record<string, unknown> };
}

beforeAll(async () => {
  if (!existsSync(join(M2, "model.safetensors"))) throw new Error(`${M2} is missing: run node scripts/setup.mjs (npm test does) to build the multimodal fixtures`);
  tmp = mkdtempSync(join(tmpdir(), "serve-media-test-"));
  const made = spawnSync(PYTHON, ["-I", "-c", MAKE, tmp, M2], { encoding: "utf8" });
  if (made.status !== 0) throw new Error(`making the media fixture failed: ${made.stderr}`);
  [png, wav] = [join(tmp, "a.png"), join(tmp, "c.wav")];
  const port = await freePort();
  ts = await startServerProcess("npm run serve (media)", process.execPath, ["run", "serve/cli.ts", "--model", join(tmp, "ck"), "--port", String(port)], port, START);
}, 2 * START);

afterAll(async () => {
  await ts?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
}, 15_000);

describe("images and audio in chat messages: npm run serve = mlx-vlm's server path (greedy tokens, prompt length)", () => {
  it("two requests: one image and one clip after a system message; an image in an earlier turn", async () => {
    const image = { type: "image_url", image_url: { url: dataUrl("image/png", png) } };
    const audio = { type: "input_audio", input_audio: { data: dataUrl("audio/wav", wav), format: "wav" } };
    const requests = [
      { messages: [{ role: "system", content: "be brief" }, { role: "user", content: [{ type: "text", text: "describe this image and that sound" }, image, audio] }] },
      { messages: [{ role: "user", content: [image, { type: "text", text: "describe this image" }] }, { role: "assistant", content: "image" }, { role: "user", content: [{ type: "text", text: "and that sound now" }, audio] }] },
    ];
    const reqFile = join(tmp, "requests.json");
    writeFileSync(reqFile, JSON.stringify(requests));
    const ref = spawnSync(PYTHON, ["-c", REFERENCE, join(tmp, "ck"), reqFile, String(MAX_TOKENS)], { cwd: REPO_ROOT, encoding: "utf8", timeout: CASE });
    if (ref.status !== 0) throw new Error(`mlx-vlm reference failed: ${ref.stderr.slice(-3000)}`);
    const expected = JSON.parse(ref.stdout.trim().split("\n").at(-1)!) as { tokens: number[]; logprobs: number[]; prompt_tokens: number }[];
    expect(expected).toHaveLength(requests.length);
    let compared = 0;
    for (const [i, req] of requests.entries()) {
      const r = await chat({ ...req, max_tokens: MAX_TOKENS, logprobs: true });
      expect([i, r.status, r.json.error]).toEqual([i, 200, undefined]);
      const choice = (r.json.choices as { logprobs: { content: { id: number; logprob: number }[] } }[])[0]!;
      const usage = r.json.usage as { prompt_tokens: number };
      // the placeholders were expanded: far more prompt tokens than words
      expect(usage.prompt_tokens).toBeGreaterThan(40);
      expect([i, usage.prompt_tokens]).toEqual([i, expected[i]!.prompt_tokens]);
      expect([i, choice.logprobs.content.map((c) => c.id)]).toEqual([i, expected[i]!.tokens]);
      expect([i, choice.logprobs.content.map((c) => c.logprob)]).toEqual([i, expected[i]!.logprobs]);
      compared++;
    }
    expect(compared).toBe(requests.length);
    // control: without the image, the same turn gives other logprobs (the image reaches the model)
    const first = requests[0]!.messages;
    const noImage = await chat({ messages: [first[0], { role: "user", content: [{ type: "text", text: "describe this image and that sound" }, audio] }], max_tokens: MAX_TOKENS, logprobs: true });
    expect(noImage.status).toBe(200);
    const lp = (noImage.json.choices as { logprobs: { content: { logprob: number }[] } }[])[0]!.logprobs.content.map((c) => c.logprob);
    expect(lp).not.toEqual(expected[0]!.logprobs);
    console.log(`media requests: prompt tokens ${expected.map((e) => e.prompt_tokens).join(", ")}; greedy tokens ${expected.map((e) => e.tokens.join(" ")).join(" / ")}`);
  }, 3 * CASE);

  it("only data: URLs: a remote URL or a file path is a 400 and nothing is fetched or read", async () => {
    const cases: [unknown, RegExp][] = [
      [{ type: "image_url", image_url: { url: "http://127.0.0.1:9/a.png" } }, /^image 1: only base64 data: URLs/],
      [{ type: "input_image", image_url: png }, /^image 1: only base64 data: URLs/],
      [{ type: "input_audio", input_audio: { data: wav, format: "wav" } }, /^audio 1: only inline audio is accepted/],
      [{ type: "image_url", image_url: { url: "data:image/png;base64,not base64!" } }, /^image 1: only base64 data: URLs|^image 1: the data: URL is not valid base64/],
    ];
    for (const [part, message] of cases) {
      const r = await chat({ messages: [{ role: "user", content: [{ type: "text", text: "describe this" }, part] }], max_tokens: 1 });
      expect([part, r.status]).toEqual([part, 400]);
      expect(String(r.json.error)).toMatch(message);
    }
  }, CASE);
});
