#!/usr/bin/env bash
# Build the Python 3.12 virtual environment in which bench_mlip_relax.py and
# bench_mace_nvt.py run TorchSim 0.6.2 (torch-sim-atomistic needs Python >= 3.12 since
# 0.4; the main environment is 3.11, where 0.3.0 is the newest release).
#
#   bash bench/setup_torchsim.sh          # ~5 min and ~5 GB the first time
#
# Where: $ALCHEMI_BENCH_VENVS/torchsim (default /tmp/alchemi_bench_venvs/torchsim),
# outside the repository; the benchmarks find it there (or through
# ALCHEMI_BENCH_TORCHSIM_PYTHON).  The venv is isolated (no system site-packages) and
# never touches the main environment.  Python 3.12 comes from pyenv
# (PYENV_VERSION=3.12.1) or $PYTHON312.
#
# What goes in, and why:
# * torch==2.13.0, the main environment's version.  No CPU-only wheel of it for Python
#   3.12 is reachable here (PyPI's Linux wheels are CUDA builds), so this is the
#   CUDA 13 build with its nvidia-* libraries (it needs them to import), running on the
#   CPU; its CPU kernels are the same MKL/oneDNN code as the CPU build's.  The
#   benchmarks time a bare model call in both environments so a difference would show.
# * torch-sim-atomistic==0.6.2 with its own dependencies (nvalchemi-toolkit-ops and
#   warp-lang come with it: TorchSim then builds neighbour lists with them);
# * sevenn==0.13.0 (the main environment's; SevenNet-0's weights are in its wheel, and
#   its TorchSim wrapper, sevenn.torchsim, is what torch_sim.models.sevennet imports);
# * ase==3.29.0 and numpy==2.4.6, as in the main environment;
# * mace-torch==0.3.16 with --no-deps (it pins e3nn 0.4.4, sevenn needs e3nn >= 0.5;
#   mace runs on sevenn's e3nn 0.6) plus its pure-Python requirements, for
#   bench_mace_nvt.py (torch_sim.models.mace imports mace's own TorchSim wrapper).
set -euo pipefail

ROOT="${ALCHEMI_BENCH_VENVS:-/tmp/alchemi_bench_venvs}"
VENV="$ROOT/torchsim"
mkdir -p "$ROOT"

if [ ! -x "$VENV/bin/python" ]; then
  if [ -n "${PYTHON312:-}" ]; then
    "$PYTHON312" -m venv "$VENV"
  else
    PYENV_VERSION=3.12.1 python -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"
"$VPY" -c 'import sys; assert sys.version_info >= (3, 12), sys.version' || {
  echo "ERROR: $VENV is not a Python >= 3.12 venv; remove it or set PYTHON312" >&2
  exit 1
}
CONSTRAINTS="$ROOT/torchsim_constraints.txt"
printf 'torch==2.13.0\nnumpy==2.4.6\n' > "$CONSTRAINTS"
echo "venv: $VENV ($("$VPY" --version))"

"$VPY" -m pip install -q -c "$CONSTRAINTS" \
  torch==2.13.0 torch-sim-atomistic==0.6.2 sevenn==0.13.0 ase==3.29.0 numpy==2.4.6
# mace-torch 0.3.16's requirements, less torch and e3nn (see above)
"$VPY" -m pip install -q -c "$CONSTRAINTS" ConfigArgParse GitPython h5py lmdb matplotlib \
  matscipy opt_einsum orjson pandas prettytable python-hostlist pyyaml torch-ema torchmetrics tqdm
"$VPY" -m pip install -q --no-deps mace-torch==0.3.16

echo "checking the imports ..."
"$VPY" - <<'PY'
import importlib.metadata as md
import torch, torch_sim
from torch_sim.models.sevennet import SevenNetModel  # noqa: F401
from torch_sim.models.mace import MaceModel  # noqa: F401
print("ok: torch-sim-atomistic", md.version("torch-sim-atomistic"), "| torch", torch.__version__,
      "| sevenn", md.version("sevenn"), "| mace-torch", md.version("mace-torch"),
      "| numpy", md.version("numpy"))
PY
echo "bench/bench_mlip_relax.py and bench/bench_mace_nvt.py find it at $VPY"
