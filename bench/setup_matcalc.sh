#!/usr/bin/env bash
# Build the virtual environment in which bench/bench_properties.py runs matcalc 0.7.0
# beside alchemi_lit and ASE + phonopy:
#
#   bash bench/setup_matcalc.sh
#   $ALCHEMI_BENCH_VENVS/matcalc/bin/python bench/bench_properties.py
#
# Where: $ALCHEMI_BENCH_VENVS/matcalc (default /tmp/alchemi_bench_venvs/matcalc), outside
# the repository.  The venv sees the system site-packages (torch, ASE, phonopy, pymatgen
# and alchemi_lit stay the system's); matcalc and the few packages it adds
# (huggingface_hub, httpx ...) are installed inside it only, so the test environment is
# never changed.  The script refuses if the install would replace torch.
set -euo pipefail

ROOT="${ALCHEMI_BENCH_VENVS:-/tmp/alchemi_bench_venvs}"
VENV="$ROOT/matcalc"
PY="${PYTHON:-python3}"
mkdir -p "$ROOT"
[ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
VPY="$VENV/bin/python"
TORCH_VERSION="$("$VPY" -c 'import torch; print(torch.__version__)')"
PLAN="$("$VPY" -m pip install --dry-run matcalc==0.7.0 2>/dev/null | grep '^Would install' || true)"
echo "${PLAN:-<nothing to install>}"
if echo "$PLAN" | grep -Eq '(^| )(torch|nvidia-[a-z0-9-]+|triton)-[0-9]'; then
  echo "ERROR: installing matcalc would replace torch ($TORCH_VERSION); not done" >&2
  exit 1
fi
"$VPY" -m pip install -q matcalc==0.7.0
"$VPY" -c 'import matcalc, torch; from matcalc import ElasticityCalc, PhononCalc; print("matcalc", matcalc.__version__, "torch", torch.__version__)'
