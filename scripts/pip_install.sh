# Sourced by the install scripts: `pip_install ARGS...` installs ARGS (pip's syntax) into
# $PY's environment.
#
# With uv where it can: on a fresh machine pip spent ~75 s of `make test`'s five minutes
# resolving and unpacking the ~120 packages (uv: ~5 s).  uv is brought in with pip
# (`ALCHEMI_LIT_NO_UV=1` keeps to pip); if it cannot be had, or fails, pip does the
# install as before.  uv reads neither pip's configuration nor its torch cap, so every uv
# call is held to the torch already installed (install.sh puts it there with pip, from
# the local CPU wheel): nothing can swap it for a CUDA build.  uv byte-compiles what it
# installs (--compile-bytecode, on every core), as pip does: where PYTHONDONTWRITEBYTECODE
# is set (this machine kind sets it) nothing is ever compiled later, so every process of
# the tests would otherwise compile each module it imports from source, every time.
#
# pip goes without build isolation where setuptools >= 68 (what our packages build with)
# is already there -- its isolated build environment costs seconds per editable
# package -- and again with isolation if that fails.
# (decided once per script: where uv cannot be installed, e.g. offline, pip's tries to
# reach PyPI would otherwise be repeated at every install call)
_uv_ready() {
  if [ -z "${_UV_READY:-}" ]; then
    _UV_READY=no
    if [ "${ALCHEMI_LIT_NO_UV:-0}" != 1 ] && { "$PY" -m uv --version >/dev/null 2>&1 ||
      { "$PY" -m pip install -q "uv>=0.4" >/dev/null 2>&1 &&
        "$PY" -m uv --version >/dev/null 2>&1; }; }; then
      _UV_READY=yes
    fi
  fi
  [ "$_UV_READY" = yes ]
}

_setuptools_ready() {
  "$PY" -c 'import sys, setuptools; sys.exit(int(setuptools.__version__.split(".")[0]) < 68)' \
    2>/dev/null
}

_uv_install() {
  local python torch_pin status
  python=$("$PY" -c 'import sys; print(sys.executable)') || return 1
  torch_pin=$(mktemp)
  "$PY" -c "from importlib.metadata import version; print('torch==' + version('torch'))" \
    >"$torch_pin" 2>/dev/null || : >"$torch_pin"
  status=0
  "$PY" -m uv pip install --python "$python" -c "$torch_pin" --compile-bytecode \
    $(_setuptools_ready && echo --no-build-isolation) "$@" || status=$?
  rm -f "$torch_pin"
  return "$status"
}

pip_install() {
  if _uv_ready; then
    _uv_install "$@" && return 0
    echo "uv pip install failed; installing with pip instead" >&2
  fi
  if _setuptools_ready; then
    "$PY" -m pip install --no-build-isolation "$@" && return 0
    echo "pip install without build isolation failed; trying again with it" >&2
  fi
  "$PY" -m pip install "$@"
}
