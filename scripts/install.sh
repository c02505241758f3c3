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

if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$PY" -m pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch>=2.4"
  else
    "$PY" -m pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION:-2.13.0}"
  fi
fi
# Editable install with test extras, plus the SevenNet plugin (real pretrained MLIP whose
# MIT-licensed weights ship inside the sevenn wheel; its parity tests run in CI).
# torch is already satisfied, so nothing CUDA comes in.
pip_install -q -e ".[test]" -e plugins/alchemi_lit_sevenn
# The MACE plugin is not needed to run: `make test` adds it with scripts/install_mace.sh
# (mace-torch pins an old e3nn, so it goes in with --no-deps); its tests skip without it.
