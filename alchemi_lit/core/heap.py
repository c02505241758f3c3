"""The process heap on Linux (glibc): trim it, or keep freed memory for reuse in a run.

Why keep it: a model step on a CPU allocates and frees per-edge tensors of tens to
hundreds of MB (an MLIP's features and their gradients).  glibc serves every block
above its mmap threshold (at most 32 MB) with a fresh ``mmap`` and unmaps it on
``free``, and returns freed memory above its trim threshold at the top of the heap, so
the kernel zero-fills the same amount of memory again at every step.  Within a run,
:func:`kept_heap` switches both off (``M_MMAP_MAX = 0``, ``M_TRIM_THRESHOLD`` at its
maximum): freed blocks stay in the heap and the next step reuses them, as PyTorch's
caching allocator does on a GPU.  On leaving, the heap is trimmed (``malloc_trim``)
and mmap is allowed again.  Any ``mallopt`` call ends glibc's dynamic thresholds for
the rest of the process, and its fixed defaults (128 KiB) would then unmap and trim far
more often than before the run, slowing whatever runs next; so the thresholds are left
where the dynamic rule takes a process that frees large tensors: blocks above 32 MiB
mmapped, trimming above 64 MiB free.  Elsewhere (macOS, musl) both functions do
nothing.
"""

from __future__ import annotations

import ctypes
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_DEFAULT_MMAP_MAX = 65536  # glibc's default
_AFTER_MMAP_THRESHOLD = 32 * 2**20  # glibc's dynamic maximum on 64-bit systems
_AFTER_TRIM_THRESHOLD = 2 * _AFTER_MMAP_THRESHOLD  # its dynamic rule: twice the former
_KEEP_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int

_lock = threading.Lock()
_depth = 0


def _libc() -> Any | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018  (both must exist)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def supported() -> bool:
    """True where the heap can be tuned (Linux with glibc)."""
    return _LIBC is not None


def malloc_trim() -> None:
    """Return freed heap pages to the system (glibc ``malloc_trim(0)``); else nothing."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


@contextmanager
def kept_heap(enabled: bool = True) -> Iterator[bool]:
    """Keep freed memory in the heap for reuse while inside (see the module docstring);
    yields whether the setting is active.  Re-entrant: only the outermost level
    changes and restores the settings."""
    global _depth
    if not enabled or _LIBC is None:
        yield False
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            _LIBC.mallopt(_M_MMAP_MAX, 0)
            _LIBC.mallopt(_M_TRIM_THRESHOLD, _KEEP_TRIM_THRESHOLD)
    try:
        yield True
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _LIBC.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
                _LIBC.mallopt(_M_MMAP_THRESHOLD, _AFTER_MMAP_THRESHOLD)
                _LIBC.mallopt(_M_TRIM_THRESHOLD, _AFTER_TRIM_THRESHOLD)
                _LIBC.malloc_trim(0)


__all__ = ["kept_heap", "malloc_trim", "supported"]
