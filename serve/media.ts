// Images and audio in chat messages, taken as mlx-vlm 0.7.10's server takes them
// (mlx_vlm/server/openai.py chat_completions, request_normalization._chat_message_to_prompt,
// prompt_utils.apply_chat_template for gemma4's LIST_WITH_IMAGE_TYPE_TEXT format), when the
// served checkpoint has a vision or audio tower:
//  - media come from user messages whose content is a list: `image_url` ({"url": ...}),
//    `input_image` (the URL as a string) and `input_audio` ({"data": ...}), collected in message
//    order, images and audio apart;
//  - the messages are rebuilt as mlx-vlm rebuilds them: system (and developer) messages joined
//    into one leading system message; a user message with image parts keeps its text and image
//    parts in order, any other content becomes one text part (texts joined by a space); every
//    audio clip is appended to the last user message; an assistant message keeps its text;
//  - the chat template renders them (image parts as the checkpoint's image token, audio parts as
//    its audio token), and the port's Gemma4Processor (byte-identical to mlx-vlm's) expands each
//    placeholder into boi + image tokens + eoi (boa + audio tokens + eoa) and computes the pixel
//    values and audio features; the request then runs alone (mlx_lm.server serves images
//    sequentially too) through the port's multimodal prefill (model/runtime.ts
//    mediaGenerationModel), without the prompt cache.
// Safety, this server's (mlx-vlm fetches http(s) URLs and reads file paths): an image must be a
// base64 `data:image/...;base64,` URL; audio a `data:audio/...;base64,` URL or bare base64.
// Nothing is fetched and no path a request names is read. The decoded bytes go to a private
// temporary directory for the processor (its decoders read files) and are removed at once.
// Not taken: video parts, and media together with tool calls or tool messages (a 400 each).
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { MultimodalConfig } from "../model/gemma4/config.ts";
import { disposeMediaInputs, type MultimodalModel } from "../model/gemma4/gemma4.ts";
import type { GenerateModel } from "../model/generate.ts";
import { mediaGenerationModel } from "../model/runtime.ts";
import { UsageError } from "../parity/args.ts";
import { type MediaFile, prepareMedia } from "../parity/media.ts";

/** The multimodal side of the served checkpoint (loaded at start when it has a tower). */
export interface ServedMedia {
  dir: string;
  model: MultimodalModel;
  config: MultimodalConfig;
  towers: { vision: boolean; audio: boolean };
}

/** A media request's own model for the engine: the prefill with the media embedded, then plain decoding. */
export interface MediaRun {
  generate: GenerateModel;
  chunked: boolean;
  dispose(): void;
}

export class MediaRequestError extends Error {
  override readonly name = "MediaRequestError";
}

type Part = Record<string, unknown>;
type Msg = { role?: unknown; content?: unknown; tool_calls?: unknown; tool_call_id?: unknown };

const IMAGE_KINDS = ["image", "image_url", "input_image"];
const TEXT_KINDS = ["text", "input_text", "output_text"];
const VIDEO_KINDS = ["input_video", "video_url", "video"];

function isPart(x: unknown): x is Part {
  return x !== null && typeof x === "object" && !Array.isArray(x);
}

/** Whether a chat request carries media parts (images, audio or video) in a user message. */
export function hasMedia(messages: unknown): boolean {
  if (!Array.isArray(messages)) return false;
  return messages.some((m) => isPart(m) && m.role === "user" && Array.isArray(m.content) && m.content.some((p) => isPart(p) && [...IMAGE_KINDS, "input_audio", ...VIDEO_KINDS].includes(String(p.type))));
}

const B64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** base64.b64decode(s, validate=True): null when s is not strict base64. */
function strictBase64(s: string): Uint8Array | null {
  if (s.length % 4 !== 0 || !B64.test(s)) return null;
  return new Uint8Array(Buffer.from(s, "base64"));
}

function imageBytes(url: unknown, n: number): Uint8Array {
  if (typeof url !== "string") throw new MediaRequestError(`image ${n}: the image URL must be a string`);
  const m = /^data:image\/[A-Za-z0-9.+-]+;base64,(.*)$/s.exec(url.trim());
  if (!m) throw new MediaRequestError(`image ${n}: only base64 data: URLs (data:image/...;base64,...) are accepted; this server fetches no URL and reads no file`);
  const b = strictBase64(m[1]!);
  if (b === null || b.length === 0) throw new MediaRequestError(`image ${n}: the data: URL is not valid base64`);
  return b;
}

/** _decode_input_audio_data, limited to inline data: a data:audio/...;base64 URL or bare base64. */
function audioBytes(input: unknown, n: number): Uint8Array {
  const data = isPart(input) ? input.data : undefined;
  if (typeof data !== "string") throw new MediaRequestError(`audio ${n}: input_audio needs a string 'data' (base64 or a data:audio/...;base64 URL)`);
  const s = data.trim();
  const m = /^data:audio\/[A-Za-z0-9.+-]+;base64,(.*)$/s.exec(s);
  const b = strictBase64(m ? m[1]! : s);
  if (b === null || b.length === 0) throw new MediaRequestError(`audio ${n}: only inline audio is accepted (base64, or a data:audio/...;base64 URL); this server fetches no URL and reads no file`);
  return b;
}

/** extract_text_from_content. */
function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    const texts = content.filter(isPart).filter((p) => TEXT_KINDS.includes(String(p.type))).map((p) => String(p.text || p.content || "")).filter((t) => t);
    return texts.join(" ").trim();
  }
  return content ? String(content) : "";
}

export interface MediaPrompt {
  /** The messages as mlx-vlm's apply_chat_template hands them to the chat template. */
  messages: unknown[];
  images: Uint8Array[];
  audio: Uint8Array[];
}

/** chat_completions' media collection, _chat_message_to_prompt, _normalize_instruction_messages and apply_chat_template (gemma4). */
export function mediaPrompt(raw: unknown[]): MediaPrompt {
  const images: Uint8Array[] = [];
  const audio: Uint8Array[] = [];
  const processed: { role: string; content: unknown }[] = [];
  for (const m of raw) {
    if (!isPart(m)) throw new MediaRequestError("each message must be an object");
    const msg = m as Msg;
    const role = String(msg.role ?? "user");
    if (msg.tool_calls !== undefined || msg.tool_call_id !== undefined || role === "tool") throw new MediaRequestError("tool calls and tool messages together with images or audio are not supported by this server");
    let content = msg.content;
    if (Array.isArray(content)) {
      if (role === "user") {
        for (const p of content) {
          if (!isPart(p)) continue;
          if (p.type === "input_image") images.push(imageBytes(p.image_url, images.length + 1));
          else if (p.type === "image_url") images.push(imageBytes(isPart(p.image_url) ? p.image_url.url : undefined, images.length + 1));
          else if (p.type === "input_audio") audio.push(audioBytes(p.input_audio, audio.length + 1));
          else if (VIDEO_KINDS.includes(String(p.type))) throw new MediaRequestError("video parts are not supported by this server");
        }
        // normalize_image_content: ordered image and text parts when there is an image, else the text
        const parts: Part[] = [];
        for (const p of content) {
          if (!isPart(p)) continue;
          if (IMAGE_KINDS.includes(String(p.type))) parts.push({ type: "image" });
          else if (TEXT_KINDS.includes(String(p.type))) {
            const t = p.text || p.content || "";
            if (t) parts.push({ type: "text", text: t });
          }
        }
        content = parts.some((p) => p.type === "image") ? parts : parts.map((p) => String(p.text)).join(" ").trim();
      } else content = textOf(content);
    }
    processed.push({ role, content });
  }
  // _normalize_instruction_messages: system and developer contents, joined, as one leading system message
  const instructions = processed.filter((m) => (m.role === "system" || m.role === "developer") && m.content).map((m) => String(m.content));
  const conversation = processed.filter((m) => m.role !== "system" && m.role !== "developer");
  if (instructions.length) conversation.unshift({ role: "system", content: instructions.join("\n\n") });
  // apply_chat_template's list path: explicit image markers stay on their messages; every clip goes to the last user message
  let lastUser = -1;
  conversation.forEach((m, i) => {
    if (!["system", "assistant", "tool"].includes(m.role)) lastUser = i;
  });
  const explicit = conversation.map((m) => (m.role === "system" || m.role === "assistant" || !Array.isArray(m.content) ? 0 : (m.content as Part[]).filter((p) => IMAGE_KINDS.includes(String(p.type))).length));
  const remaining = Math.max(images.length - explicit.reduce((a, b) => a + b, 0), 0);
  const imageCounts = explicit.map((c, i) => (i === lastUser ? c + remaining : c));
  const messages = conversation.map((m, i) => {
    const skipImage = imageCounts[i] === 0 || m.role === "system" || m.role === "assistant";
    const skipAudio = i !== lastUser || audio.length === 0 || m.role === "system" || m.role === "assistant";
    // _format_list_with_image_type: text parts carry both "text" and "content"
    const textPart = (t: string) => ({ type: "text", text: t, content: t });
    let content: Part[];
    let nExplicit = 0;
    if (!Array.isArray(m.content) || !(m.role === "user" && !skipImage)) content = [textPart(textOf(m.content))];
    else {
      content = [];
      for (const p of m.content as Part[]) {
        if (IMAGE_KINDS.includes(String(p.type))) {
          content.push({ type: "image" });
          nExplicit++;
        } else if (TEXT_KINDS.includes(String(p.type)) && (p.text || p.content)) content.push(textPart(String(p.text || p.content)));
      }
    }
    if (m.role === "user") {
      if (!skipImage && imageCounts[i]! > 0) content = [...Array.from({ length: imageCounts[i]! - nExplicit }, () => ({ type: "image" })), ...content];
      if (!skipAudio) content = [...content, ...audio.map(() => ({ type: "audio" }))];
    }
    if (m.role === "assistant") return { role: m.role, content: String(content[0]?.content ?? content[0]?.text ?? "") };
    return { role: m.role, content };
  });
  return { messages, images, audio };
}

/**
 * The processor's work on a rendered media prompt: each placeholder token expanded, pixel values
 * and audio features computed (from the decoded bytes, written to a private temporary directory
 * and removed), everything checked against the model's rules; then the request's MediaRun.
 */
export async function prepareMediaRun(served: ServedMedia, ids: number[], mp: MediaPrompt): Promise<{ ids: number[]; run: MediaRun }> {
  const c = served.config;
  if (mp.images.length && !served.towers.vision) throw new MediaRequestError("the request has images, but the served checkpoint has no vision tower");
  if (mp.audio.length && !served.towers.audio) throw new MediaRequestError("the request has audio, but the served checkpoint has no audio tower");
  let ni = 0;
  let na = 0;
  const items = ids.map((t) => (t === c.image_token_id ? `image:${ni++}` : t === c.audio_token_id ? `audio:${na++}` : t));
  if (ni !== mp.images.length || na !== mp.audio.length) {
    throw new MediaRequestError(`the chat template placed ${ni} image and ${na} audio placeholders for ${mp.images.length} images and ${mp.audio.length} audio clips`);
  }
  const tmp = mkdtempSync(join(tmpdir(), "serve-media-"));
  try {
    const media: Record<string, MediaFile> = {};
    mp.images.forEach((b, k) => {
      const path = join(tmp, `image-${k + 1}`);
      writeFileSync(path, b, { mode: 0o600 });
      media[`image:${k}`] = { kind: "image", path };
    });
    mp.audio.forEach((b, k) => {
      const path = join(tmp, `audio-${k + 1}`);
      writeFileSync(path, b, { mode: 0o600 });
      media[`audio:${k}`] = { kind: "audio", path };
    });
    let prepared;
    try {
      prepared = await prepareMedia(served.dir, { prompt: items, media, config: c }, served.towers);
    } catch (e) {
      // the message names the temporary file: name the part instead
      if (e instanceof UsageError) throw new MediaRequestError(e.message.split(`${tmp}/`).join(""));
      throw e;
    }
    const gm = mediaGenerationModel(served.model, { ids: prepared.ids, media: prepared.media });
    return {
      ids: prepared.ids,
      run: {
        generate: gm.generate,
        chunked: gm.chunked,
        dispose: () => {
          gm.dispose();
          disposeMediaInputs(prepared.media);
        },
      },
    };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}
