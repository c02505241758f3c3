#!/usr/bin/env bash
# The GPU check of issue #26, in one command, on a machine without network: install
# from the wheels in .whl/ (made beforehand by scripts/fetch_gpu_wheels.sh where pip
# reaches PyPI), run the tests marked `cuda`, then bench/bench_gpu.py --device cuda.
# Under 5 minutes on one H100; logs and the benchmark's JSON go to $OUT (default
# /tmp/alchemi_gpu_check):
#
#   bash scripts/fetch_gpu_wheels.sh      # once, with network: .whl/ (~37 MB)
#   bash scripts/gpu_check.sh             # on the GPU machine, from the repository root
#
# The wheels bring what the machine's image lacks (REFERENCE.md section 7): ase,
# jsonargparse, zarr, loguru, vesin, vesin-torch, lightning-fabric, sevenn with only
# SevenNet-0, TorchSim 0.6.2 (if fetched) and this project's and its SevenNet plugin's
# own wheels; torch, numpy and the rest stay the image's (--no-deps).  The code tested
# and timed is this working tree's (first on PYTHONPATH); the project's wheels add its
# entry points (the plugins alchemi_lit finds).
#
# Settings (environment): OUT, SITE (install folder, default /tmp/alchemi_gpu_site),
# TEST_TIMEOUT (s, default 60), BENCH_DEADLINE (s after which the benchmark starts no
# new row, default 150), BENCH_TIMEOUT (s, default 200), BENCH_ARGS (more arguments),
# SKIP_INSTALL=1 (use what is importable already), DEVICE=cpu (a dry run of this script
# without a GPU: the cuda tests skip and the benchmark runs --quick on the CPU),
# BENCH_SCRIPT (default bench/bench_gpu.py).  The CUDA-graph check that issue #26 still
# waits for (graphs equal to eager in whole inflight runs, list rebuilds inside replays):
#
#   BENCH_SCRIPT=bench/bench_cuda_graphs.py BENCH_ARGS="--only whole" bash scripts/gpu_check.sh
#   (then the same with BENCH_ARGS="--only whole --deterministic")
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/alchemi_gpu_check}
SITE=${SITE:-/tmp/alchemi_gpu_site}
# the JSON records of the printed tables (bench/records.py) come back with $OUT
export ALCHEMI_BENCH_RESULTS=${ALCHEMI_BENCH_RESULTS:-$OUT/records}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_common.sh
source "$ROOT/scripts/gpu_common.sh"
log_to "$OUT/gpu_check.log"
install_wheels "bash scripts/fetch_gpu_wheels.sh" \
  alchemi_lit alchemi_lit_sevenn sevenn ase vesin_torch zarr jsonargparse

step "environment"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null ||
    echo "nvidia-smi: not found"
  "$PY" - "$DEVICE" <<'PY'
import importlib.metadata as md
import sys

import torch

import alchemi_lit
import alchemi_lit_sevenn  # noqa: F401 (the plugin imports)

print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}")
print(f"alchemi_lit from {alchemi_lit.__file__}")
for dist in ("numpy", "ase", "sevenn", "vesin-torch", "zarr", "torch-sim-atomistic"):
    try:
        print(f"  {dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"  {dist}: not installed")
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit("ERROR: torch sees no CUDA device (DEVICE=cpu for a dry run of this script)")
    print(f"device: {torch.cuda.get_device_name(0)}")
PY
} 2>&1 | tee "$OUT/environment.txt"

step "tests marked cuda (timeout ${TEST_TIMEOUT:-60} s)"
mapfile -t FILES < <(grep -rl --include='test_*.py' "mark.cuda" tests plugins/alchemi_lit_sevenn/tests || true)
TESTS_RC=0
if [ "${#FILES[@]}" -eq 0 ]; then
  echo "no test is marked cuda"
else
  timeout "${TEST_TIMEOUT:-60}" "$PY" -m pytest -q -p no:cacheprovider -m cuda --durations=5 \
    --timeout 120 "${FILES[@]}" 2>&1 | tee "$OUT/pytest_cuda.txt" || TESTS_RC=$?
fi

BENCH_SCRIPT=${BENCH_SCRIPT:-bench/bench_gpu.py}
BENCH_NAME=$(basename "$BENCH_SCRIPT" .py)
step "$BENCH_SCRIPT (timeout ${BENCH_TIMEOUT:-200} s)"
BENCH=(--device "$DEVICE" --json "$OUT/$BENCH_NAME.json")
if [ "$BENCH_NAME" = bench_gpu ]; then  # (its own deadline: no new row after it)
  BENCH+=(--deadline "${BENCH_DEADLINE:-150}")
fi
if [ "$DEVICE" != cuda ]; then
  BENCH+=(--quick)
fi
# shellcheck disable=SC2206  # BENCH_ARGS: words on purpose
BENCH+=(${BENCH_ARGS:-})
BENCH_RC=0
timeout "${BENCH_TIMEOUT:-200}" "$PY" "$BENCH_SCRIPT" "${BENCH[@]}" 2>&1 |
  tee "$OUT/$BENCH_NAME.txt" || BENCH_RC=$?

step "done"
echo "cuda tests: exit $TESTS_RC; benchmark: exit $BENCH_RC; logs and JSON in $OUT"
if [ "$TESTS_RC" -eq 124 ] || [ "$BENCH_RC" -eq 124 ]; then
  echo "(124: timed out; $BENCH_NAME.json holds the rows measured before, if it writes them as it goes)"
fi
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
