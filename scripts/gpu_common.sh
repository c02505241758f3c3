# Sourced by scripts/gpu_check.sh and scripts/gpu_properties.sh (not run alone): their
# log, step banners and install from the wheels in .whl/ on a machine without network.
# The caller sets ROOT (repository root), OUT, SITE (install folder) and PY.

# Everything printed from here on also goes to the log file $1.
log_to() {
  mkdir -p "$OUT"
  exec > >(tee "$1") 2>&1
  START=$SECONDS
}

step() { echo; echo "=== [$((SECONDS - START)) s] $*"; }

# Install .whl/*.whl into $SITE and put the working tree first on PYTHONPATH; with
# SKIP_INSTALL set, use what $PY imports already.  $1: the command that makes .whl/
# (named in the error), then the wheels (name stems) that must be there.
install_wheels() {
  local fetch=$1 need
  shift
  step "install from .whl/ into $SITE"
  if [ -n "${SKIP_INSTALL:-}" ]; then
    echo "SKIP_INSTALL set: using what $PY imports already"
    export PYTHONPATH="$ROOT:$ROOT/plugins/alchemi_lit_sevenn${PYTHONPATH:+:$PYTHONPATH}"
    return
  fi
  shopt -s nocaseglob  # (PyYAML's wheel is pyyaml-*)
  for need in "$@"; do
    if ! compgen -G ".whl/${need}-*.whl" >/dev/null; then
      echo "ERROR: no .whl/${need}-*.whl: run '$fetch' where pip reaches PyPI, and bring" \
        ".whl/ along with the repository" >&2
      exit 1
    fi
  done
  shopt -u nocaseglob
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  export PYTHONPATH="$ROOT:$ROOT/plugins/alchemi_lit_sevenn:$SITE"
}
