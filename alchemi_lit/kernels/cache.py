"""Where the compiled kernels are cached on disk: a folder keyed on every source they
compile.

Why: numba's ``cache=True`` checks only the file that defines a kernel.  A kernel in
:mod:`.dynamics` that calls ``formulas.bussi_alpha`` (or reads a constant of
:mod:`alchemi_lit.core.random`) keeps its compiled code when that other file changes, so a
warm cache ran yesterday's physics under today's source -- and a test of the new source
passed against the old machine code.  Keying the whole cache folder on a digest of
every compiled source (and numba's own version) makes any change compile afresh,
whatever file it is in.  ``numba.config.CACHE_DIR`` is set only while the kernel
modules are imported (numba picks a function's cache folder when it is decorated), so
other numba users in the process keep theirs.

Processes starting together (two pytest workers, the ranks of a pipeline started with
``popen``) all meet a cold cache at once and each compiled every kernel, at the same
time, on the same cores.  A kernel is now compiled under a lock file of its own in the
cache folder: the first process compiles and saves it, the others wait and load it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

PACKAGE = Path(__file__).resolve().parents[1]

#: every source whose code or constants the kernels compile in (relative to the
#: package); tests/kernels/test_kernel_cache.py checks it against the kernels' imports
COMPILED_SOURCES = (
    "kernels/bookkeeping.py",
    "kernels/constraints.py",
    "kernels/dynamics.py",
    "kernels/fire.py",
    "kernels/observables.py",
    "kernels/philox.py",
    "kernels/rdf.py",
    "kernels/reductions.py",
    "kernels/scalar_xp.py",
    "integrators/formulas.py",
    "core/random.py",
    "core/constraint_forces.py",
    "core/constraint_kinds.py",
)

#: cache folders of other source versions untouched this long are removed
STALE_AFTER_S = 7 * 24 * 3600


def source_digest(root: Path = PACKAGE) -> str:
    """A digest of the compiled sources under ``root`` (a package folder)."""
    import numba

    digest = hashlib.sha256(numba.__version__.encode())
    for name in COMPILED_SOURCES:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """The folder that holds one cache folder per source version: under
    ``NUMBA_CACHE_DIR`` if the user set one, else the user's cache folder."""
    base = os.environ.get("NUMBA_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    return Path(base or Path.home() / ".cache") / "alchemi_lit-kernels"


def cache_dir(root: Path = PACKAGE) -> Path:
    """This source version's cache folder."""
    return cache_root() / source_digest(root)


def compiled(fn: F) -> F:
    """``numba.njit(cache=True, nogil=True)``, cached in this source version's folder
    and compiled by one process at a time (module docstring)."""
    import numba

    with keyed_cache() as folder:
        dispatcher = numba.njit(cache=True, nogil=True)(fn)
    one_process_at_a_time(dispatcher, folder / f"{fn.__module__}.{fn.__qualname__}.lock")
    return dispatcher


def one_process_at_a_time(dispatcher: Any, lock_path: Path) -> None:
    """Make ``dispatcher.compile`` (where numba loads a cached signature or compiles
    it) hold an exclusive lock on ``lock_path``: a process that finds it taken waits,
    then loads what the other saved.  Taken inside numba's own compiler lock, so
    threads of one process queue there first; no lock where the file cannot be opened
    (a read-only cache) or the system has no ``flock``."""
    try:
        import fcntl
    except ImportError:  # (not POSIX: each process compiles for itself, as before)
        return
    from numba.core.compiler_lock import global_compiler_lock

    original = dispatcher.compile

    @functools.wraps(original)
    def compile_locked(sig: Any) -> Any:
        with global_compiler_lock:
            try:
                handle = open(lock_path, "a")  # noqa: SIM115 (closed below)
            except OSError:
                return original(sig)
            with handle:  # (closing it releases the lock)
                fcntl.flock(handle, fcntl.LOCK_EX)
                return original(sig)

    dispatcher.compile = compile_locked


@contextlib.contextmanager
def keyed_cache() -> Iterator[Path]:
    """Point numba's cache at this source version's folder while a kernel is decorated
    (numba fixes a function's cache folder then), and put the setting back."""
    import numba

    folder = _prepared_folder()
    before = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(folder)
    try:
        yield folder
    finally:
        numba.config.CACHE_DIR = before


@functools.cache
def _prepared_folder() -> Path:
    """This version's folder, created and marked as used; stale siblings removed."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)
    _remove_stale(folder)
    return folder


def _remove_stale(current: Path) -> None:
    """Remove the cache folders of source versions nobody used for a week (each is a
    few MB; an edited checkout would otherwise collect one per edit)."""
    now = time.time()
    for other in current.parent.iterdir():
        with contextlib.suppress(OSError):
            if other != current and now - other.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(other, ignore_errors=True)


__all__ = [
    "COMPILED_SOURCES", "cache_dir", "cache_root", "compiled", "keyed_cache",
    "one_process_at_a_time", "source_digest",
]  # fmt: skip
