#!/usr/bin/env bash
# The oracle's packages beyond the gpu-bundle (mlx, mlx-lm): mlx-vlm and what its Gemma 4 path
# imports (the image processor, the tokenizers, mlx-audio's WAV reader), for an offline CUDA
# machine, in parts that travel one per call beside the working tree like the bundle's.
#
#   bash bench/cuda/extras.sh [PART_MB]  # here, after npm test set up .venv
#   bash .gpu-extra/pK/unpack.sh         # there, after the bundle's last part, K = 1 … N in turn
#
# Versions are this machine's .venv's (the pins of requirements.txt and what they resolved to).
# There, a pinned package is installed where the machine's version differs; a support package
# only where the machine has none (their code is not on any compared path: scipy is imported by
# mlx-audio's resampler, huggingface_hub, tqdm and yaml by its module imports, cffi and pycparser
# by miniaudio's compiled module: without them mlx-vlm's audio path fails on `_cffi_backend`).
# OpenCV (mlx-vlm's video decoder) travels as opencv-python-headless at the version of the pinned
# opencv-python: the same cv2 module and bundled FFmpeg, without the GUI libraries (libGL) that a
# bare GPU machine lacks.
set -euo pipefail
cd "$(dirname "$0")/../.."
PINNED=(mlx-vlm mlx-audio miniaudio pillow transformers tokenizers safetensors sentencepiece regex)
SUPPORT=(scipy huggingface-hub hf-xet tqdm pyyaml cffi pycparser)
version() { .venv/bin/python -I -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
specs=()
for p in "${PINNED[@]}" "${SUPPORT[@]}"; do specs+=("$p==$(version "$p")"); done
specs+=("opencv-python-headless==$(version opencv-python)"); PINNED+=(opencv-python-headless)

tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) || true # a tracked file deleted here is not sent
part_mb=${1:-$(( (64 * 1024 * 1024 - tree) / 1000000 - 3 ))}
(( part_mb >= 5 )) || { echo "the working tree ($((tree / 1000000)) MB) leaves no room for parts" >&2; exit 2; }

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/w"
plat=(--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
.venv/bin/python -I -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d "$work/w" "${specs[@]}"
printf '%s\n' "${PINNED[@]}" > "$work/w/pinned"
(cd "$work/w" && tar cf "$work/extras.tar" .)
sum=$(sha256sum "$work/extras.tar" | cut -d' ' -f1)
rm -rf .gpu-extra; mkdir -p .gpu-extra
(cd "$work" && split -d -a 2 -b "${part_mb}000000" extras.tar chunk.)
n=$(ls "$work"/chunk.* | wc -l)
i=0
for c in "$work"/chunk.*; do
  i=$((i + 1)); d=.gpu-extra/p$i; mkdir -p "$d"
  mv "$c" "$d/"; cp bench/cuda/extras_unpack.sh "$d/unpack.sh"
  printf 'parts=%s\nsha256=%s\n' "$n" "$sum" > "$d/MANIFEST"
done
grep -qx '/.gpu-extra/' .git/info/exclude 2>/dev/null || echo '/.gpu-extra/' >> .git/info/exclude
echo "wrote $n parts of <= ${part_mb} MB in .gpu-extra/ (${specs[*]})"
echo "there, after the bundle: carry .gpu-extra/p1 … p$n one per call, each running: bash .gpu-extra/pK/unpack.sh"
