#!/usr/bin/env bash
# One part of bench/cuda/extras.sh's packages, run there from the project root after the
# gpu-bundle's last part: stages this part's chunk; the call that brings the last missing chunk
# checks the sha256 and installs into the oracle's Python.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(pwd)
source ~/gpu-stage/env.sh
# shellcheck disable=SC1091 # parts=, sha256=
source "$here/MANIFEST"
stage=~/gpu-stage/extras
mkdir -p "$stage"
cp "$here"/chunk.* "$stage/"
have=$(ls "$stage"/chunk.* | wc -l)
echo "staged $have/$parts extra chunks"
(( have == parts )) || exit 0
cat "$stage"/chunk.* > "$stage/extras.tar"
got=$(sha256sum "$stage/extras.tar" | cut -d' ' -f1)
[[ $got == "$sha256" ]] || { echo "extras sha256 $got != $sha256: stage the parts again from p1" >&2; rm -f "$stage"/chunk.*; exit 1; }
mkdir -p "$stage/w" && tar xf "$stage/extras.tar" -C "$stage/w"
py=$root/.venv/bin/python
need=()
for w in "$stage"/w/*.whl; do
  f=$(basename "$w"); name=${f%%-*}; ver=$(echo "$f" | cut -d- -f2)
  dist=$(echo "$name" | tr _ -)
  have=$($py -I -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except Exception: print('none')" "$dist")
  if grep -qix "$dist" "$stage/w/pinned"; then
    [[ $have == "$ver" ]] && echo "have $dist $ver" || { echo "install $dist $ver (was $have)"; need+=("$w"); }
  else
    [[ $have != none ]] && echo "have $dist $have (support package: kept)" || { echo "install $dist $ver (was none)"; need+=("$w"); }
  fi
done
(( ${#need[@]} )) && $py -I -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "${need[@]}"
$py -I -c "import mlx_vlm, transformers, PIL, cv2, mlx_vlm.models.gemma4, mlx_audio.audio_io, mlx_audio.utils, mlx_audio.resample, miniaudio; print('mlx-vlm', mlx_vlm.__version__, 'transformers', transformers.__version__, 'pillow', PIL.__version__, 'opencv', cv2.__version__, 'mlx-audio: imports')"
