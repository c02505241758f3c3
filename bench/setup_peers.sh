#!/usr/bin/env bash
# Build the separate virtual environment in which bench/bench_dynamics.py runs
# nvalchemi-toolkit 0.2.0 (NVIDIA ALCHEMI toolkit, CPU through Warp).
#
#   bash bench/setup_peers.sh
#
# Where: $ALCHEMI_BENCH_VENVS/nvalchemi (default /tmp/alchemi_bench_venvs/nvalchemi),
# outside the repository.  The venv sees the system site-packages, so torch stays the
# system's (2.13.0+cpu here) -- never replaced: nvalchemi-toolkit pins numpy < 2.4
# (installed inside the venv only) and, through nvidia-physicsnemo, asks for a newer
# CUDA torch, torchvision and the CUDA libraries, none of which the LJ benchmark uses.
# The script first asks pip (--dry-run) what a plain install would do; if that would
# touch torch it installs nvalchemi-toolkit and the packages it imports with
# --no-deps, plus their pure-Python dependencies under a constraint pinning the
# installed torch.  TorchSim (torch-sim-atomistic) and ASE are used from the main
# environment.
set -euo pipefail

ROOT="${ALCHEMI_BENCH_VENVS:-/tmp/alchemi_bench_venvs}"
VENV="$ROOT/nvalchemi"
PY="${PYTHON:-python3}"
mkdir -p "$ROOT"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
TORCH_VERSION="$("$VPY" -c 'import torch; print(torch.__version__)')"
echo "venv: $VENV (system torch $TORCH_VERSION)"

echo "pip install --dry-run nvalchemi-toolkit==0.2.0 ..."
PLAN="$("$VPY" -m pip install --dry-run nvalchemi-toolkit==0.2.0 2>/dev/null | grep '^Would install' || true)"
echo "${PLAN:-<nothing to install>}"
if echo "$PLAN" | grep -Eq '(^| )(torch|nvidia-[a-z0-9-]+|triton)-[0-9]'; then
  echo "-> a plain install would replace torch / add CUDA packages: installing with --no-deps"
  CONSTRAINTS="$ROOT/constraints.txt"
  printf 'torch==%s\nnumpy<2.4\n' "$TORCH_VERSION" > "$CONSTRAINTS"
  # the toolkit, its kernels, and the packages its import chain needs (no CUDA, no torch)
  "$VPY" -m pip install --no-deps \
    nvalchemi-toolkit==0.2.0 nvalchemi-toolkit-ops==0.5.0 nvidia-physicsnemo==2.2.2 \
    "warp-lang>=1.16" "numpy<2.4" dm-tree jaxtyping wadler_lindig plum-dispatch beartype \
    periodictable==2.0.2 plotext tensordict pyvers importlib_metadata zipp
  # pure-Python dependencies imported by nvidia-physicsnemo at import time
  "$VPY" -m pip install -c "$CONSTRAINTS" cftime einops hydra-core nvtx omegaconf s3fs termcolor treelib
else
  "$VPY" -m pip install nvalchemi-toolkit==0.2.0
fi

AFTER="$("$VPY" -c 'import torch; print(torch.__version__)')"
if [ "$AFTER" != "$TORCH_VERSION" ]; then
  echo "ERROR: torch changed in the venv ($TORCH_VERSION -> $AFTER)" >&2
  exit 1
fi
echo "checking the import (first use compiles Warp kernels: ~40 s) ..."
"$VPY" - <<'PY'
import numpy, torch, warp
from nvalchemi.dynamics import FIRE, NVTLangevin  # noqa: F401
from nvalchemi.models.lj import LennardJonesModelWrapper  # noqa: F401
from nvalchemi.hooks import NeighborListHook  # noqa: F401
import importlib.metadata as md
print("ok: nvalchemi-toolkit", md.version("nvalchemi-toolkit"), "| torch", torch.__version__,
      "| numpy", numpy.__version__, "| warp", warp.__version__)
PY
echo "bench/bench_dynamics.py finds it at $VPY (or set ALCHEMI_BENCH_NVALCHEMI_PYTHON)"
