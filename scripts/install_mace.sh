#!/usr/bin/env bash
# Install the MACE plugin (plugins/alchemi_lit_mace) next to the SevenNet plugin, for the
# test-suite (`make test` runs this after scripts/install.sh; `make run` does not need it).
#
# mace-torch 0.3.16 pins e3nn==0.4.4, but sevenn >= 0.12 (the MIT releases the SevenNet
# plugin requires) needs e3nn >= 0.5.  A plain `pip install -e plugins/alchemi_lit_mace`
# would make pip resolve that conflict by downgrading sevenn to a GPL-3.0 release.  So
# mace-torch and the plugin go in with --no-deps, keeping sevenn's e3nn 0.6 (mace runs on
# it: the plugin's tests pass), and mace-torch's other runtime dependencies are listed
# here explicitly.  None of them depends on torch's build or on e3nn, so the installed
# (CPU) torch and e3nn stay; `pip check` will report mace-torch's e3nn pin, as expected.
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
# shellcheck source=scripts/pip_install.sh
source scripts/pip_install.sh

"$PY" -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ('torch', 'e3nn'))))" || {
  echo "install_mace.sh: run scripts/install.sh first (torch and sevenn's e3nn are needed)" >&2
  exit 1
}
# mace-torch 0.3.16's requirements, less torch and e3nn (already installed)
mace_needs=(ConfigArgParse GitPython h5py lmdb matplotlib matscipy numpy opt_einsum orjson pandas
  prettytable python-hostlist pyyaml torch-ema torchmetrics tqdm ase)
# all there already (scripts/requirements_met.py): only the plugin itself is (re)installed
if "$PY" scripts/requirements_met.py "${mace_needs[@]}" --alone "mace-torch==0.3.16" \
  plugins/alchemi_lit_mace/pyproject.toml 2>/dev/null; then
  pip_install -q --no-deps -e plugins/alchemi_lit_mace
else
  pip_install -q "${mace_needs[@]}"
  pip_install -q --no-deps "mace-torch==0.3.16" -e plugins/alchemi_lit_mace
fi
