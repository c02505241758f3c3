#!/usr/bin/env bash
# Install the CHGNet and TorchSim plugins (plugins/alchemi_lit_chgnet,
# plugins/alchemi_lit_torchsim) for the test-suite: `make test` runs this after
# scripts/install.sh and scripts/install_mace.sh; `make run` does not need it.
#
# Neither may touch the installed torch build or e3nn, so every install here runs with a
# constraint pinning the torch already installed (no CUDA wheels come in).
# * CHGNet: chgnet 0.4.x (its wheel ships the pretrained weights) and pymatgen with its
#   dependencies (spglib, monty, plotly, ...), through the plugin's own requirements.
# * TorchSim: torch-sim-atomistic 0.3.0 (the newest release for Python 3.11; the plugin
#   also runs on 0.4-0.6) with --no-deps, so that pip resolves nothing around torch;
#   its other requirements are listed here: h5py, numpy, tables (pytables, imported by
#   torch_sim at import), tqdm, vesin and vesin-torch (the last two come with alchemi_lit).
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
# shellcheck source=scripts/pip_install.sh
source scripts/pip_install.sh

torch_version=$("$PY" -c "from importlib.metadata import version; print(version('torch'))" \
  2>/dev/null) || {
  echo "install_extra_models.sh: run scripts/install.sh first (torch is needed)" >&2
  exit 1
}
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==${torch_version}" >"$constraints"

# one resolution for the CHGNet plugin and TorchSim's requirements (a pip call costs seconds)
chgnet_needs=(h5py numpy tables tqdm vesin vesin-torch)
# all there already (scripts/requirements_met.py): only the plugins are (re)installed
if "$PY" scripts/requirements_met.py plugins/alchemi_lit_chgnet/pyproject.toml \
  "${chgnet_needs[@]}" --alone "torch-sim-atomistic==0.3.0" \
  plugins/alchemi_lit_torchsim/pyproject.toml 2>/dev/null; then
  pip_install -q --no-deps -e plugins/alchemi_lit_chgnet -e plugins/alchemi_lit_torchsim
else
  pip_install -q -c "$constraints" -e plugins/alchemi_lit_chgnet "${chgnet_needs[@]}"
  pip_install -q --no-deps "torch-sim-atomistic==0.3.0" -e plugins/alchemi_lit_torchsim
fi
