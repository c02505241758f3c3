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
# torch goes in with --no-compile and is byte-compiled afterwards on every core: pip
# compiles its 2,285 modules one after another (25 of the 43 s of its install here).
# Compiled it must be: with PYTHONDONTWRITEBYTECODE set (as on this machine kind) every
# process would compile what it imports from source, every time (import torch 3 -> 9 s).
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$PY" -m pip install --no-compile ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch>=2.4"
  else
    "$PY" -m pip install --no-compile ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION:-2.13.0}"
  fi
  torch_dir=$("$PY" -c "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])")
  # (a module that does not compile is left to Python at import, as pip leaves it)
  "$PY" -m compileall -q -j 0 "$torch_dir" >/dev/null || true
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
