#!/usr/bin/env bash
# The project's checks and benchmarks on a CUDA machine where `scripts/setup.mjs` cannot run (no
# package registry): the environment comes from the offline bundle (`source ~/gpu-stage/env.sh`,
# see bench/cuda/README.md). Each stage writes its log to $LOGS/<stage>.log and stops at its own
# time limit; the stages run in the order given.
#
#   LOGS=/some/dir bash bench/cuda/run.sh ckpt ops decode gen parity golden bench-e2b
#
# With $OUT set (the device tool's folder of files to bring back), the logs end up packed in
# $OUT/cuda-logs.tgz (that folder takes few files).
# Stages:
#   info        GPU, versions, the binding's backend and device
#   ckpt        the fixture checkpoints, built on the CPU device (bit-identical to the ones the
#               goldens were made from: their sha256 are checked against golden/manifest.json),
#               and the speculative-decoding fixtures built from them
#   after-ckpt  waits until a ckpt stage (in another lane) has finished them
#   ops         op-level parity (every case exact, unsupported on cuda, or a failure; sticky errors isolated)
#   ops@<table> one of the two tables (ops@forward, ops@vjp: one lane each)
#   ops-<op>    the same for one op's cases (e.g. ops-quantizedMatmul)
#   decode      the compiled decode route against the op-by-op route (suites/gemma4/decode_compile.test.ts)
#   gen         generation parity vs mlx-lm, compiled decode route and op-by-op (GEMMA4_DECODE_COMPILE=0)
#   genfull     the full generation matrix (GEN_FULL=1)
#   genfull@<c> the matrix's greedy runs of the comma-separated checkpoints <c> (lanes split it;
#               genfull-sampled is the rest of that file under GEN_FULL=1)
#   gen-sdpa    the bfloat16 runs of gen_P300_S128 (one query row against >= 256 keys), both
#               sides with MLX_CUDA_USE_CUDNN_SDPA=0 (the vector kernel always), then as MLX picks
#   parity      `npm run parity` on the fixtures without the op section, with --bisect
#   parity@<g>  the same for the checkpoints matching the glob <g> (e.g. 'parity@m*')
#   modes       the stages batch (vs mlx-lm's BatchGenerator), speculative (draft model and MTP vs
#               mlx-lm / mlx-vlm, prompt-cache files) and train (the trainer vs mlx-lm's)
#   golden      the distance between the CPU goldens and mlx-lm here (oracle/python/golden_distance.py)
#   golden@<g>  the same for the entries matching the comma-separated globs <g> (parts combine with
#               golden_distance.py --merge)
#   repro       Python-only: is MLX's GPU quantized matmul a function of its inputs? (bench/cuda/repro_qmm.py)
#   repro-sdpa  Python-only: does MLX's GPU one-row attention depend on the allocator? (bench/cuda/repro_sdpa.py)
#   repro-compile  Python-only: does mx.compile change elementwise bits on the GPU? (bench/cuda/repro_compile.py)
#   repro-vjp   Python-only: are the op gradients that differ on CUDA functions of their inputs? (bench/cuda/repro_vjp.py)
#   tests       the whole bun test suite on the GPU
#   tests@<p>   the test files under the comma-separated paths <p> (lanes split the suite)
#   bench-<w>   `npm run bench` for workload(s) <w> (comma-separated) at full width on the GPU
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${LOGS:-report/cuda}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
# NVRTC-compiled kernels are kept across the processes of one machine (the first use of a
# quantized-matmul variant compiles for tens of seconds)
export MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-$HOME/.cache/mlx-ptx}

stage() { # name, time limit (s), command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*" | tee -a "$LOGS/summary.log"
  timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOGS/summary.log"
  tail -n 25 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$LOGS/summary.log"
  return $rc
}

# lanes (bench/cuda/lanes.sh) share the machine's checkpoints: one lane builds them, the others wait
CKPT_READY=$HOME/.cache/gemma4-parity-ckpt.ready
wait_ckpts() { while [[ ! -e $CKPT_READY ]]; do sleep 2; done; }

check_ckpts() {
  MLX_DEVICE=cpu .venv/bin/python -I oracle/python/make_checkpoints.py || return 1
  # what scripts/setup.mjs builds next: the speculative-decoding fixtures (drafts, MTP drafters)
  MLX_DEVICE=cpu .venv/bin/python -I oracle/python/make_speculative_fixtures.py || return 1
  .venv/bin/python -I - <<'EOF'
import json, hashlib, pathlib, sys
m = json.load(open("golden/manifest.json"))
root = pathlib.Path(".cache/checkpoints")
bad = 0
for cid, c in m["checkpoints"].items():
    for f, want in c["files"].items():
        got = hashlib.sha256((root / cid / f).read_bytes()).hexdigest()
        if got != want:
            bad += 1
            print(f"checkpoint {cid}/{f}: sha256 {got[:12]} != golden manifest {want[:12]}")
print(f"{len(m['checkpoints'])} fixture checkpoints, {bad} files differing from the goldens' checkpoints")
sys.exit(1 if bad else 0)
EOF
}

set -f # stage names may hold globs (parity@m*)
# shellcheck disable=SC2046
set -- $(for s in "$@"; do if [[ $s == modes ]]; then echo batch speculative train; else echo "$s"; fi; done)
set +f
echo "$*" > "$LOGS/stages"
for s in "$@"; do
  case $s in
    info) stage info 120 bash -c 'nvidia-smi; .venv/bin/python -I -c "import mlx.core as mx, mlx_lm; print(mx.__version__, mlx_lm.__version__, mx.default_device(), mx.device_info(mx.gpu))"; bun -e "import * as mx from \"@mlx-bun/mlx\"; console.log(mx.backend(), mx.defaultDevice(), mx.gpuName())"' ;;
    ckpt) export -f check_ckpts; stage ckpt 300 bash -c check_ckpts && touch "$CKPT_READY" ;;
    after-ckpt) export -f wait_ckpts; export CKPT_READY; stage after-ckpt 400 bash -c wait_ckpts ;;
    ops) stage ops 540 bun run parity/ops_report.ts ;;
    ops@*) stage "ops-${s#ops@}" 540 bun run parity/ops_report.ts --table "${s#ops@}" --jobs "${OPS_JOBS:-4}" ;;
    ops-*) stage "$s" 300 bun run parity/ops_report.ts "${s#ops-}" --jobs "${OPS_JOBS:-4}" ;;
    decode) stage decode 400 bun test suites/gemma4/decode_compile.test.ts ;;
    gen) stage gen 300 bun test suites/generation/parity.test.ts
         stage gen-opbyop 300 env GEMMA4_DECODE_COMPILE=0 bun test suites/generation/parity.test.ts ;;
    genfull) stage genfull 560 env GEN_FULL=1 bun test suites/generation/parity.test.ts ;;
    genfull@*) stage "genfull-$(echo "${s#genfull@}" | tr -c 'A-Za-z0-9_\n' _)" 560 env GEN_CKPTS="${s#genfull@}" bun test suites/generation/parity.test.ts -t "generation parity vs mlx-lm" ;;
    genfull-sampled) stage genfull-sampled 560 env GEN_FULL=1 bun test suites/generation/parity.test.ts -t "sampled generation parity" ;;
    gen-sdpa) sel=(GEN_CKPTS=c1_dense/bf16,c2_keqv/bf16,c3_e2b/bf16 GEN_SCENARIOS=gen_P300_S128)
              stage gen-sdpa-vector 300 env "${sel[@]}" MLX_CUDA_USE_CUDNN_SDPA=0 bun test suites/generation/parity.test.ts
              stage gen-sdpa-default 300 env "${sel[@]}" bun test suites/generation/parity.test.ts ;;
    parity) stage parity 540 bun run parity/cli.ts --skip-ops --bisect --out "$LOGS/parity" ;;
    batch) stage batch 300 bun test suites/batch/parity.test.ts ;;
    speculative) stage speculative 300 bun test suites/speculative/speculative.test.ts suites/speculative/mtp.test.ts suites/speculative/prompt-cache.test.ts ;;
    train) stage train 540 bun test --timeout 600000 suites/tuner/train.test.ts ;;
    parity@*) stage "parity-$(echo "${s#parity@}" | tr -c 'A-Za-z0-9_\n' _)" 400 bun run parity/cli.ts --skip-ops --bisect --only "${s#parity@}" --out "$LOGS/parity-$(echo "${s#parity@}" | tr -c 'A-Za-z0-9_\n' _)" ;;
    golden) stage golden 540 .venv/bin/python -I oracle/python/golden_distance.py --out "$LOGS/golden-distance-cuda.json" ;;
    golden@*) tag=$(echo "${s#golden@}" | tr -c 'A-Za-z0-9_\n' _); IFS=, read -ra globs <<< "${s#golden@}"
              only=(); for g in "${globs[@]}"; do only+=(--only "$g"); done
              stage "golden-$tag" 540 .venv/bin/python -I oracle/python/golden_distance.py "${only[@]}" --out "$LOGS/golden-distance-cuda-$tag.json" ;;
    repro) stage repro 240 .venv/bin/python -I bench/cuda/repro_qmm.py ;;
    repro-sdpa) stage repro-sdpa 240 env MLX_DEVICE=gpu .venv/bin/python -I bench/cuda/repro_sdpa.py ;;
    repro-vjp) stage repro-vjp 240 env MLX_DEVICE=gpu .venv/bin/python -I bench/cuda/repro_vjp.py ;;
    repro-compile) stage repro-compile 240 .venv/bin/python -I bench/cuda/repro_compile.py ;;
    # --timeout: bun's default 5 s, times 5 as tests/time_limit.ts scales every explicit limit on a
    # GPU (a first use of a kernel compiles it); it only catches hangs
    tests) stage tests 560 bun test --timeout 25000 ;;
    tests@*) IFS=, read -ra paths <<< "${s#tests@}"; stage "tests-$(echo "${s#tests@}" | tr -c 'A-Za-z0-9_\n' _)" 560 bun test --timeout 25000 "${paths[@]}" ;;
    bench-*) stage "$s" 560 bun run bench/run.ts --device gpu --only "${s#bench-}" --e2b-layers 35 --e4b-layers 42 --moe-layers 30 --31b-layers 60 --big-prompts 512,4096 --big-decode 128
             cp bench/RESULTS-cuda.md bench/results-cuda.json "$LOGS/" 2>/dev/null ;;
    *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done

if [[ -n ${OUT:-} ]]; then tar czf "$OUT/cuda-logs.tgz" -C "$LOGS" . && cp "$LOGS/summary.log" "$OUT/"; fi
