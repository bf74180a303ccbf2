#!/usr/bin/env python
"""Writes the synthetic videos of suites/multimodal/video.test.ts into OUT_DIR (from fixed seeds).

Motion-JPEG in AVI (4:2:0), written by OpenCV's VideoWriter through its FFmpeg backend (the
library mlx-vlm decodes with): moving
colour gradients plus seeded noise, so that every frame differs and the JPEG coder has detail
to keep. Each entry: name, width, height, fps, frames. Also the bad files: an empty file, random
bytes, an AVI whose writer got no frame, and a video cut in half.

  make_video.py OUT_DIR [--full]   prints a JSON list of what it wrote
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np

# name, width, height, fps, frames: different lengths, frame rates and aspect ratios
VIDEOS = [
    ("v1_4x3_10fps", 64, 48, 10.0, 12),
    ("v2_tall_24fps", 40, 96, 24.0, 50),
    ("v3_wide_5fps", 120, 32, 5.0, 7),
]
FULL_VIDEOS = [
    ("v4_square_30fps_long", 48, 48, 30.0, 600),  # 40 frames at 2 fps: the 32-frame cap
    ("v5_tiny_1fps", 16, 24, 1.0, 9),
]


def frame(seed: int, t: int, w: int, h: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 1000 + t)
    y, x = np.mgrid[0:h, 0:w]
    img = np.empty((h, w, 3), np.float64)
    img[..., 0] = 128 + 100 * np.sin((x + 3 * t) / 7.0)
    img[..., 1] = 128 + 100 * np.cos((y - 2 * t) / 5.0)
    img[..., 2] = (x * 255.0 / max(w - 1, 1) + 9 * t) % 256
    img += rng.normal(0, 12, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)  # BGR order for the writer; the content does not care


def write(path: Path, seed: int, w: int, h: int, fps: float, n: int) -> None:
    vw = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (w, h))
    if not vw.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    for t in range(n):
        vw.write(frame(seed, t, w, h))
    vw.release()


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    full = "--full" in argv
    wrote = []
    for i, (name, w, h, fps, n) in enumerate(VIDEOS + (FULL_VIDEOS if full else [])):
        p = out / f"{name}.avi"
        write(p, i + 1, w, h, fps, n)
        wrote.append({"name": name, "path": str(p), "width": w, "height": h, "fps": fps, "frames": n, "kind": "video"})
    bad = []
    (out / "bad_empty.avi").write_bytes(b"")
    bad.append("bad_empty.avi")
    (out / "bad_random.avi").write_bytes(np.random.default_rng(7).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    bad.append("bad_random.avi")
    write(out / "bad_no_frames.avi", 9, 32, 32, 10.0, 0)
    bad.append("bad_no_frames.avi")
    src = (out / f"{VIDEOS[0][0]}.avi").read_bytes()
    (out / "bad_truncated.avi").write_bytes(src[: len(src) // 2])
    bad.append("bad_truncated.avi")
    for b in bad:
        wrote.append({"name": b[:-4], "path": str(out / b), "kind": "bad"})
    print(json.dumps(wrote))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
