#!/usr/bin/env bash
# Install the documentation tools (the `docs` extra: mkdocs-material, mkdocstrings-python)
# for `make docs` and the test that builds the site (tests/docs/test_docs.py): `make test`
# runs this after scripts/install.sh; `make run` does not need it.  Held to the installed
# torch like every install here (pip_install.sh), though none of these needs torch.
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
# shellcheck source=scripts/pip_install.sh
source scripts/pip_install.sh

# the extra's requirements, as pyproject.toml lists them (one place for the versions)
mapfile -t docs_reqs < <("$PY" -c "import tomllib; print('\n'.join(tomllib.load(open(
  'pyproject.toml', 'rb'))['project']['optional-dependencies']['docs']))")
# all there already (scripts/requirements_met.py): nothing to do
if ! "$PY" scripts/requirements_met.py "${docs_reqs[@]}" 2>/dev/null; then
  pip_install -q "${docs_reqs[@]}"
fi
