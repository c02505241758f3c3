# Sourced by the install scripts: `pip_install ARGS...` is `$PY -m pip install ARGS...`,
# first without build isolation where setuptools >= 68 (what our packages build with) is
# already there -- pip's isolated build environment costs seconds per editable package --
# and again with isolation if that fails (a dependency whose build needs more).
pip_install() {
  if "$PY" -c 'import sys, setuptools; sys.exit(int(setuptools.__version__.split(".")[0]) < 68)' \
    2>/dev/null; then
    "$PY" -m pip install --no-build-isolation "$@" && return 0
    echo "pip install without build isolation failed; trying again with it" >&2
  fi
  "$PY" -m pip install "$@"
}
