#!/usr/bin/env bash
# Install alchemi_lit and its test tools into the active Python environment.
#
# torch is installed first and deliberately: on a machine without an NVIDIA GPU we
# pin the CPU build (torch==2.13.0 is served as a local CPU wheel on our CI machines;
# elsewhere set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu) so pip never
# pulls gigabytes of CUDA packages.  With a GPU, install the CUDA torch you want
# beforehand, or let this script take pip's default build.  An existing torch is kept.
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
# shellcheck source=scripts/pip_install.sh
source scripts/pip_install.sh

# (found, not imported: importing torch takes seconds, and three scripts ask)
# --no-compile: byte-compiling all of torch's ~4,000 modules took 25 of the 43 s of its
# install here; Python compiles the few hundred an import needs once, on first import.
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$PY" -m pip install --no-compile ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch>=2.4"
  else
    "$PY" -m pip install --no-compile ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION:-2.13.0}"
  fi
fi
# Editable install with test extras, plus the SevenNet plugin (real pretrained MLIP whose
# MIT-licensed weights ship inside the sevenn wheel; its parity tests run in CI).
# torch is already satisfied, so nothing CUDA comes in.
# Where everything they need is installed already (a CI machine, a second clone), only
# our packages are (re)installed: pip's resolution of every dependency took most of the
# time (scripts/requirements_met.py says why it is safe).
if "$PY" scripts/requirements_met.py "pyproject.toml[test]" \
  plugins/alchemi_lit_sevenn/pyproject.toml 2>/dev/null; then
  pip_install -q --no-deps -e . -e plugins/alchemi_lit_sevenn
else
  pip_install -q -e ".[test]" -e plugins/alchemi_lit_sevenn
fi
# The MACE plugin is not needed to run: `make test` adds it with scripts/install_mace.sh
# (mace-torch pins an old e3nn, so it goes in with --no-deps); its tests skip without it.
