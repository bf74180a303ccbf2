"""Test media for suites/multimodal: images, audio clips and processor directories, all made
from fixed seeds (the same bytes on every run).

usage: make_media.py OUT_DIR {images|audio|bad|processors} [--count N] [--configs JSON]
Prints a JSON manifest on stdout: a list of {"name", "file", ...} for media, or of
{"name", "dir", "vocab"} for processor directories.

Images cover every PNG mode Pillow decodes (written by the small PNG writer below, which also
does Adam7 interlacing and all five scanline filters, which PIL's own writer cannot), JPEGs from
PIL's encoder (baseline/progressive, three subsamplings, grayscale), EXIF and XMP orientations,
and sizes from 1x1 to thousands of pixels at extreme aspect ratios. Audio clips are WAV files
(16-bit PCM, 8/24/32-bit PCM, 32/64-bit float, stereo) of tones, noise, silence, clipping and
impulses, at lengths around the extractor's frame and padding boundaries.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------- PNG writer


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _pack_rows(samples: np.ndarray, depth: int) -> list[bytes]:
    """(h, w, c) integer samples -> one packed byte row per image row."""
    h, w, c = samples.shape
    rows = []
    for y in range(h):
        flat = samples[y].reshape(-1).astype(np.uint32)
        if depth == 16:
            rows.append(flat.astype(">u2").tobytes())
        elif depth == 8:
            rows.append(flat.astype(np.uint8).tobytes())
        else:
            per = 8 // depth
            pad = (-len(flat)) % per
            v = np.concatenate([flat, np.zeros(pad, np.uint32)]).reshape(-1, per)
            shifts = np.array([8 - depth * (i + 1) for i in range(per)], np.uint32)
            rows.append((v << shifts).sum(axis=1).astype(np.uint8).tobytes())
    return rows


def _filter_rows(rows: list[bytes], bpp: int, first_filter: int) -> bytes:
    out = bytearray()
    prev = bytes(len(rows[0])) if rows else b""
    for i, row in enumerate(rows):
        f = (first_filter + i) % 5
        r = np.frombuffer(row, np.uint8).astype(np.int32)
        p = np.frombuffer(prev, np.uint8).astype(np.int32)
        left = np.concatenate([np.zeros(bpp, np.int32), r[:-bpp]]) if len(r) > bpp else np.zeros_like(r)
        ul = np.concatenate([np.zeros(bpp, np.int32), p[:-bpp]]) if len(p) > bpp else np.zeros_like(p)
        if f == 0:
            enc = r
        elif f == 1:
            enc = r - left
        elif f == 2:
            enc = r - p
        elif f == 3:
            enc = r - ((left + p) >> 1)
        else:
            pa, pb, pc = np.abs(p - ul), np.abs(left - ul), np.abs(left + p - 2 * ul)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, p, ul))
            enc = r - pred
        out.append(f)
        out += (enc & 0xFF).astype(np.uint8).tobytes()
        prev = row
    return bytes(out)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def png_bytes(samples: np.ndarray, depth: int, ctype: int, *, palette: bytes | None = None, trns: bytes | None = None,
              interlace: bool = False, before_idat: list[bytes] = (), after_idat: list[bytes] = (), idat_split: int = 1) -> bytes:
    h, w, _ = samples.shape
    bpp = max(1, CHANNELS[ctype] * depth // 8)
    if interlace:
        raw = b""
        for k, (x0, y0, dx, dy) in enumerate(ADAM7):
            sub = samples[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += _filter_rows(_pack_rows(sub, depth), bpp, k)
    else:
        raw = _filter_rows(_pack_rows(samples, depth), bpp, 0)
    z = zlib.compress(raw, 6)
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, int(interlace)))
    out += b"".join(before_idat)
    if palette is not None:
        out += _chunk(b"PLTE", palette)
    if trns is not None:
        out += _chunk(b"tRNS", trns)
    step = -(-len(z) // idat_split)
    for i in range(0, len(z), step):
        out += _chunk(b"IDAT", z[i:i + step])
    out += b"".join(after_idat)
    return out + _chunk(b"IEND", b"")


def exif_tiff(orientation: int, little: bool = True) -> bytes:
    """A minimal EXIF TIFF block: IFD0 with one SHORT Orientation entry."""
    e = "<" if little else ">"
    return (b"II*\x00" if little else b"MM\x00*") + struct.pack(e + "I", 8) + struct.pack(e + "H", 1) + \
        struct.pack(e + "HHI", 274, 3, 1) + struct.pack(e + "HH", orientation, 0) + struct.pack(e + "I", 0)


# ---------------------------------------------------------------- images


def content(rng: np.random.Generator, h: int, w: int, kind: int) -> np.ndarray:
    """uint8 (h, w, 3): noise, smooth gradients, or a blend with hard edges."""
    if kind == 0:
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    g = np.stack([xx / max(w - 1, 1), yy / max(h - 1, 1), ((xx + yy) % 17) / 16], -1) * 255
    if kind == 2:
        g = np.where((((xx // 5) + (yy // 3)) % 2)[..., None] == 1, 255 - g, g)
        g = g + rng.normal(0, 12, g.shape)
    return np.clip(np.rint(g), 0, 255).astype(np.uint8)


SIZES = [(1, 1), (1, 2), (2, 1), (3, 3), (7, 5), (5, 7), (16, 16), (17, 33), (47, 49), (48, 48), (64, 64), (96, 48),
         (100, 75), (333, 777), (768, 768), (384, 384), (1, 500), (500, 1), (2, 900), (900, 2), (9, 1400), (1400, 9),
         (1, 3000), (3000, 1), (10, 20000), (241, 479), (479, 241), (720, 1280), (1080, 1920), (1536, 1536),
         (2000, 1500), (3000, 4000), (123, 4567), (4567, 123), (255, 256), (1000, 1001), (37, 1024), (1023, 37)]


def make_images(out: Path, count: int) -> list[dict]:
    from PIL import Image

    rng = np.random.default_rng(20260822)
    items: list[dict] = []

    def add(name: str, data: bytes, **meta):
        p = out / name
        p.write_bytes(data)
        items.append({"name": name, "file": str(p), **meta})

    # PNG modes (Pillow's decoders), several sizes each, plain and Adam7-interlaced.
    mode_sizes = [(1, 1), (3, 5), (13, 9), (40, 33), (97, 130)]
    for i, (depth, ctype) in enumerate([(1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (8, 2), (16, 2), (1, 3), (2, 3), (4, 3),
                                        (8, 3), (8, 4), (16, 4), (8, 6), (16, 6)]):
        for j, (h, w) in enumerate(mode_sizes):
            c = CHANNELS[ctype]
            top = (1 << depth) - 1
            s = rng.integers(0, top + 1, (h, w, c), dtype=np.uint32)
            if depth == 16 and ctype == 0 and j % 2:
                s = rng.integers(0, 300, (h, w, 1), dtype=np.uint32)  # around Pillow's clip at 255
            pal = trns = None
            if ctype == 3:
                n = top + 1 if j % 2 == 0 else max(1, (top + 1) // 2)  # a short palette: some indices past it
                pal = rng.integers(0, 256, 3 * n, dtype=np.uint8).tobytes()
                trns = bytes([0, 128])[: min(2, n)]
            elif ctype in (0, 2) and j == 2:
                trns = struct.pack(">" + "H" * c, *[int(x) for x in s[0, 0]])
            add(f"mode_d{depth}_c{ctype}_{h}x{w}_i{j % 2}.png", png_bytes(s, depth, ctype, palette=pal, trns=trns,
                interlace=bool(j % 2), idat_split=1 + j), group="png_mode")
    # EXIF / XMP orientation, on a non-square image so that every transposition shows.
    base = content(rng, 6, 10, 2)
    for o in range(1, 9):
        buf = io.BytesIO()
        exif = Image.Exif()
        exif[274] = o
        Image.fromarray(base).save(buf, "JPEG", quality=95, exif=exif.tobytes())
        add(f"orient_jpeg_exif{o}.jpg", buf.getvalue(), group="orientation")
        s = base.astype(np.uint32)
        add(f"orient_png_exif{o}.png", png_bytes(s, 8, 2, before_idat=[_chunk(b"eXIf", exif_tiff(o, o % 2 == 0))]), group="orientation")
    s = base.astype(np.uint32)
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    add("orient_png_xmp6.png", png_bytes(s, 8, 2, after_idat=[_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + xmp)]), group="orientation")
    raw = exif_tiff(3)
    text = f"\nexif\n{len(raw):8}\n{raw.hex()}\n".encode()
    add("orient_png_rawprofile3.png", png_bytes(s, 8, 2, before_idat=[_chunk(b"zTXt", b"Raw profile type exif\0\0" + zlib.compress(text))]), group="orientation")
    add("orient_png_exif_beats_xmp.png", png_bytes(s, 8, 2, before_idat=[_chunk(b"eXIf", exif_tiff(1))],
        after_idat=[_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + xmp)]), group="orientation")
    buf = io.BytesIO()
    Image.fromarray(base).save(buf, "JPEG", quality=90, xmp=b'<x:xmpmeta tiff:Orientation="8"></x:xmpmeta>')
    add("orient_jpeg_xmp8.jpg", buf.getvalue(), group="orientation")
    # JPEG encodings.
    for k, (h, w) in enumerate([(1, 1), (8, 8), (17, 23), (64, 48), (131, 99), (240, 320), (5, 700)]):
        img = content(rng, h, w, k % 3)
        for sub in (0, 1, 2):
            for prog in (False, True):
                buf = io.BytesIO()
                try:
                    Image.fromarray(img).save(buf, "JPEG", quality=(50, 75, 95)[(k + sub) % 3], subsampling=sub, progressive=prog)
                except OSError:
                    continue  # PIL cannot write some tiny progressive files
                add(f"jpeg_{h}x{w}_s{sub}_p{int(prog)}.jpg", buf.getvalue(), group="jpeg")
        buf = io.BytesIO()
        Image.fromarray(img).convert("L").save(buf, "JPEG", quality=85)
        add(f"jpeg_{h}x{w}_gray.jpg", buf.getvalue(), group="jpeg")
    # Sizes and aspect ratios (RGB PNG, then RGBA and gray variants).
    sizes = list(SIZES)
    while len(sizes) < count:
        a = float(np.exp(rng.uniform(np.log(1 / 60), np.log(60))))
        px = float(np.exp(rng.uniform(np.log(4), np.log(3e6))))
        h = max(1, int(round(np.sqrt(px / a))))
        w = max(1, int(round(np.sqrt(px * a))))
        sizes.append((min(h, 6000), min(w, 6000)))
    for k, (h, w) in enumerate(sizes[:count]):
        img = content(rng, h, w, k % 3)
        if k % 5 == 3:
            a = rng.integers(0, 256, (h, w, 1), dtype=np.uint8)
            data = png_bytes(np.concatenate([img, a], -1).astype(np.uint32), 8, 6)
        elif k % 5 == 4:
            data = png_bytes(img[..., :1].astype(np.uint32), 8, 0)
        else:
            data = png_bytes(img.astype(np.uint32), 8, 2)
        add(f"size_{k:03d}_{h}x{w}.png", data, group="size")
    return items


def make_bad(out: Path) -> list[dict]:
    """Files that must fail with one clear error each (expected problem in "problem")."""
    from PIL import Image

    rng = np.random.default_rng(7)
    items: list[dict] = []
    img = content(rng, 40, 60, 2)
    png = png_bytes(img.astype(np.uint32), 8, 2)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    jpg = buf.getvalue()

    def add(name: str, data: bytes, problem: str):
        p = out / name
        p.write_bytes(data)
        items.append({"name": name, "file": str(p), "problem": problem})

    add("png_truncated_idat.png", png[: len(png) // 2], "truncated")
    add("png_truncated_header.png", png[:20], "truncated")
    bad_crc = bytearray(png)
    bad_crc[40] ^= 0xFF
    add("png_bad_crc.png", bytes(bad_crc), "corrupt")
    raw = zlib.compress(b"\x00" + b"\x07" * 10, 6)
    add("png_short_data.png", b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 50, 50, 8, 2, 0, 0, 0))
        + _chunk(b"IDAT", raw) + _chunk(b"IEND", b""), "truncated")
    add("png_bad_mode.png", b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 5, 5, 3, 2, 0, 0, 0))
        + _chunk(b"IEND", b""), "unsupported_format")
    add("jpeg_truncated.jpg", jpg[: len(jpg) * 2 // 3], "truncated")
    bad_sos = bytearray(jpg)
    sos = bad_sos.index(b"\xff\xda")
    bad_sos[sos + 5] = 0x26  # the first scan component names a component the frame does not have
    add("jpeg_bad_scan.jpg", bytes(bad_sos), "corrupt")
    buf = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(buf, "JPEG")
    add("jpeg_cmyk.jpg", buf.getvalue(), "unsupported_format")
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "GIF")
    add("image.gif", buf.getvalue(), "unsupported_format")
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "BMP")
    add("image.bmp", buf.getvalue(), "unsupported_format")
    add("empty.png", b"", "unsupported_format")
    add("text.png", b"not an image at all\n", "unsupported_format")
    # Huge dimensions in the header (nothing else): refused before any decoding.
    add("huge.png", b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0))
        + _chunk(b"IEND", b""), "too_large")
    # Audio
    sr = 16000
    t = np.arange(sr // 2) / sr
    tone = (np.sin(2 * np.pi * 440 * t) * 12000).astype("<i2")
    add("audio_44k.wav", wav_bytes(tone, 44100, "pcm16"), "sample_rate")
    add("audio_8k.wav", wav_bytes(tone, 8000, "pcm16"), "sample_rate")
    add("audio_empty.wav", wav_bytes(np.zeros(0, "<i2"), sr, "pcm16"), "empty")
    w = wav_bytes(tone, sr, "pcm16")
    add("audio_truncated.wav", w[:30], "truncated")
    add("audio_not_wav.wav", b"ID3\x03\x00\x00\x00\x00\x00\x00" + bytes(100), "unsupported_format")
    alaw = bytearray(wav_bytes(tone, sr, "pcm16"))
    struct.pack_into("<H", alaw, 20, 6)  # WAVE_FORMAT_ALAW
    add("audio_alaw.wav", bytes(alaw), "unsupported_format")
    return items


# ---------------------------------------------------------------- audio


def wav_bytes(samples: np.ndarray, rate: int, fmt: str, channels: int = 1, extensible: bool = False) -> bytes:
    """A RIFF/WAVE file; `samples` are already in the sample type (interleaved when channels > 1)."""
    tag, bits = {"pcm8": (1, 8), "pcm16": (1, 16), "pcm24": (1, 24), "pcm32": (1, 32), "f32": (3, 32), "f64": (3, 64)}[fmt]
    if fmt == "pcm24":
        v = samples.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3]
        data = v.tobytes()
    else:
        data = samples.tobytes()
    block = channels * bits // 8
    if extensible:
        guid = struct.pack("<H", tag) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt_chunk = struct.pack("<HHIIHHHHI", 0xFFFE, channels, rate, rate * block, block, bits, 22, bits, 0) + guid
    else:
        fmt_chunk = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk
    body += b"LIST" + struct.pack("<I", 4) + b"INFO"  # a chunk to skip
    body += b"data" + struct.pack("<I", len(data)) + data + (b"\x00" if len(data) % 2 else b"")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def make_audio(out: Path, count: int) -> list[dict]:
    rng = np.random.default_rng(16000)
    sr = 16000
    lengths = [1, 100, 159, 160, 161, 320, 321, 481, 1000, 1024, 2047, 4000, 8000, 15999, 16000, 16160, 16001, 16127,
               16128, 16129, 24000, 40000, 48000, 80000, 160000, 479999, 480000, 480001, 500000]
    while len(lengths) < count:
        lengths.append(int(rng.integers(1, 200000)))
    kinds = ["tone", "noise", "silence", "clipped", "chirp", "impulses", "dc", "quiet"]
    fmts = ["pcm16", "pcm16", "f32", "pcm24", "pcm32", "pcm8", "f64", "pcm16"]
    items = []
    for k, n in enumerate(lengths[:count]):
        kind = kinds[k % len(kinds)]
        t = np.arange(n) / sr
        if kind == "tone":
            x = 0.6 * np.sin(2 * np.pi * (100 + 37 * k) * t)
        elif kind == "noise":
            x = rng.normal(0, 0.3, n)
        elif kind == "silence":
            x = np.zeros(n)
        elif kind == "clipped":
            x = np.clip(3 * np.sin(2 * np.pi * 220 * t) + rng.normal(0, 0.5, n), -1.2, 1.2)
        elif kind == "chirp":
            x = 0.9 * np.sin(2 * np.pi * (50 + 4000 * t / max(t[-1] if n else 1, 1e-9)) * t)
        elif kind == "impulses":
            x = np.zeros(n)
            x[:: max(1, n // 7)] = 1.0
        elif kind == "dc":
            x = np.full(n, -0.25)
        else:
            x = 1e-4 * rng.normal(0, 1, n)
        fmt = fmts[k % len(fmts)]
        channels = 2 if k % 6 == 5 else 1
        if channels == 2:
            x = np.stack([x, np.roll(x, 3) * 0.5], -1).reshape(-1)
        if fmt == "pcm16":
            s = np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2")
        elif fmt == "pcm8":
            s = np.clip(np.rint(x * 127 + 128), 0, 255).astype(np.uint8)
        elif fmt == "pcm24":
            s = np.clip(np.rint(x * 8388607), -8388608, 8388607).astype("<i4")
        elif fmt == "pcm32":
            s = np.clip(np.rint(x * 2147483647), -2147483648, 2147483647).astype("<i4")
        elif fmt == "f32":
            s = x.astype("<f4")
        else:
            s = x.astype("<f8")
        name = f"clip_{k:03d}_{kind}_{fmt}_{channels}ch_{n}.wav"
        p = out / name
        p.write_bytes(wav_bytes(s, sr, fmt, channels, extensible=k % 9 == 4))
        items.append({"name": name, "file": str(p), "kind": kind, "format": fmt, "channels": channels, "samples": n})
    return items


# ---------------------------------------------------------------- processor directories


SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<|image>", "<|image|>", "<image|>", "<|audio>", "<|audio|>", "<audio|>",
           "<|video|>"]
WORDS = ["describe", "this", "image", "and", "that", "sound", "please", "hello", "what", "is", "it"]


def make_processor(out: Path, processor_config: dict | None, flat: bool = False) -> dict:
    """A directory `mlx_vlm.utils.load_processor` accepts: config.json (model_type gemma4), a
    tiny word-level tokenizer with Gemma 4's media tokens, and the processor config (as
    processor_config.json, or flat as preprocessor_config.json, or none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>",
        "unk_token": "<unk>", "image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
        "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}))
    (out / "config.json").write_text(json.dumps({"model_type": "gemma4"}))
    if processor_config is not None:
        name = "preprocessor_config.json" if flat else "processor_config.json"
        (out / name).write_text(json.dumps(processor_config))
    return {"dir": str(out), "vocab": vocab}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("what", choices=["images", "audio", "bad", "processors"])
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--configs", default="[]",
                    help='processors: JSON list of {"name", "config" (or null), "flat" (preprocessor_config.json)}')
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.what == "images":
        res = make_images(a.out, a.count)
    elif a.what == "audio":
        res = make_audio(a.out, a.count)
    elif a.what == "bad":
        res = make_bad(a.out)
    else:
        res = [{"name": c["name"], **make_processor(a.out / c["name"], c.get("config"), bool(c.get("flat")))}
               for c in json.loads(a.configs)]
    json.dump(res, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
