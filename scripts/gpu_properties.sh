#!/usr/bin/env bash
# Issue #28's GPU figure in one command, on a machine without network: install from the
# wheels in .whl/ (made beforehand, with phonopy, by `PHONOPY=1 bash
# scripts/fetch_gpu_wheels.sh` where pip reaches PyPI), then bench/bench_properties.py
# --device cuda --model sevennet --engines alchemi_lit ase: elastic tensors and phonons
# of 20 materials, alchemi_lit's batched workflows against SevenNet's ASE calculator with
# phonopy, one material at a time, both on the GPU (phonopy's own work on the CPU cores).
# Logs and the benchmark's JSON go to $OUT (default /tmp/alchemi_gpu_properties):
#
#   PHONOPY=1 bash scripts/fetch_gpu_wheels.sh   # once, with network: .whl/ (~41 MB)
#   bash scripts/gpu_properties.sh               # on the GPU machine, repository root
#
# Time (measured on one H200, 2026-11-28): 258 s in all -- install and imports ~10 s;
# the benchmark's start, model loading and the relaxation of the 20 crystals ~40 s; then
# ~65 s per repeat, ~50 of them ASE's side (a fresh process, 480 launch-bound calculator
# calls on tiny cells, phonopy one material after the other) and ~5 alchemi_lit's
# (phonopy's set-up in one worker per core).  Medians of
# REPEATS=3 where they fit: --deadline starts no repeat that would end past
# BENCH_DEADLINE (then the table has 2), and the JSON holds every run measured so far
# after each engine's run, should the timeout stop the rest.
#
# Settings (environment): OUT, SITE (install folder, default /tmp/alchemi_gpu_site, the
# one scripts/gpu_check.sh uses), MODEL (sevennet), MATERIALS (20), REPEATS (3), THREADS
# (torch's and BLAS's threads per process, default: every core, as an ASE user's numpy
# gets; alchemi_lit's phonopy workers take one each, one per core), BENCH_DEADLINE (s,
# default 240), BENCH_TIMEOUT (s, default 285), BENCH_ARGS (more arguments),
# SKIP_INSTALL=1 (use what is importable already), DEVICE=cpu (a dry run of this script
# without a GPU: the benchmark runs --quick on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/alchemi_gpu_properties}
SITE=${SITE:-/tmp/alchemi_gpu_site}
# the JSON records of the printed tables (bench/records.py) come back with $OUT
export ALCHEMI_BENCH_RESULTS=${ALCHEMI_BENCH_RESULTS:-$OUT/records}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-sevennet}
MATERIALS=${MATERIALS:-20}
REPEATS=${REPEATS:-3}
THREADS=${THREADS:-$(nproc)}
BENCH_DEADLINE=${BENCH_DEADLINE:-240}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-285}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_common.sh
source "$ROOT/scripts/gpu_common.sh"
log_to "$OUT/gpu_properties.log"
install_wheels "PHONOPY=1 bash scripts/fetch_gpu_wheels.sh" \
  alchemi_lit alchemi_lit_sevenn sevenn ase vesin vesin_torch zarr jsonargparse \
  phonopy spglib phonors pyyaml braceexpand

step "environment"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null ||
    echo "nvidia-smi: not found"
  "$PY" - "$DEVICE" "$MODEL" <<'PY'
import importlib.metadata as md
import os
import sys

import torch

import alchemi_lit

print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}")
print(f"alchemi_lit from {alchemi_lit.__file__}")
print(f"cores: {len(os.sched_getaffinity(0))} usable of {os.cpu_count()}; OMP_NUM_THREADS="
      f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}")
missing = []
for dist, module in (("numpy", "numpy"), ("scipy", "scipy"), ("h5py", "h5py"),
                     ("pandas", "pandas"), ("PyYAML", "yaml"), ("ase", "ase"),
                     ("phonopy", "phonopy"), ("spglib", "spglib"), ("phonors", "phonors"),
                     ("sevenn", "sevenn"), ("vesin-torch", "vesin.torch")):  # fmt: skip
    try:
        __import__(module)
        print(f"  {dist} {md.version(dist)}")
    except Exception as exc:  # any failure to import, named
        missing.append(f"{dist} ({type(exc).__name__}: {exc})")
if sys.argv[2] == "sevennet":
    try:
        import alchemi_lit_sevenn  # noqa: F401 (the plugin imports)
    except Exception as exc:
        missing.append(f"alchemi_lit_sevenn ({type(exc).__name__}: {exc})")
    try:  # the ASE side's calculator (imports braceexpand, which the image lacked)
        import sevenn.calculator  # noqa: F401
    except Exception as exc:
        missing.append(f"sevenn.calculator ({type(exc).__name__}: {exc})")
if missing:
    sys.exit("ERROR: cannot import: " + "; ".join(missing))
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit("ERROR: torch sees no CUDA device (DEVICE=cpu for a dry run of this script)")
    print(f"device: {torch.cuda.get_device_name(0)}")
PY
} 2>&1 | tee "$OUT/environment.txt"  # a failure here ends the script (set -e, pipefail)

step "bench/bench_properties.py (deadline $BENCH_DEADLINE s, timeout $BENCH_TIMEOUT s)"
BENCH=(--device "$DEVICE" --model "$MODEL" --engines alchemi_lit ase --threads "$THREADS"
  --json "$OUT/properties.json" --no-wait --deadline "$BENCH_DEADLINE")
if [ "$DEVICE" = cuda ]; then
  BENCH+=(--materials "$MATERIALS" --repeats "$REPEATS")
else
  BENCH+=(--quick)
fi
# shellcheck disable=SC2206  # BENCH_ARGS: words on purpose
BENCH+=(${BENCH_ARGS:-})
echo "$PY bench/bench_properties.py ${BENCH[*]}"
BENCH_RC=0
# timeout signals its whole process group: the ASE process and phonopy's workers too
timeout -k 10 "$BENCH_TIMEOUT" "$PY" bench/bench_properties.py "${BENCH[@]}" 2>&1 |
  tee "$OUT/properties.txt" || BENCH_RC=$?

step "done"
echo "benchmark: exit $BENCH_RC; log, table and JSON in $OUT"
if [ "$BENCH_RC" -eq 124 ] || [ "$BENCH_RC" -eq 137 ]; then
  echo "(timed out: properties.json's partial_runs holds the runs measured before)"
fi
[ "$BENCH_RC" -eq 0 ]
