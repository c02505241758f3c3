"""Functions the worker-pool tests call in worker processes (a standalone module: the
workers load it from its file, without alchemi_lit)."""

from __future__ import annotations

import os
import sys


def square(x: float) -> float:
    return x * x


def report(x: int) -> tuple[int, int, bool]:
    """x squared, the process id, and whether alchemi_lit or torch were imported; prints
    on stdout, which must not corrupt the answer on the worker's pipe."""
    print("noise on stdout " * 10)
    sys.stdout.flush()
    os.write(1, b"raw bytes on fd 1\n")
    return x * x, os.getpid(), "torch" in sys.modules or "alchemi_lit" in sys.modules


def refuse(x: int) -> int:
    raise ValueError(f"refused {x}")


def die_on_zero(x: int) -> int:
    if x == 0:
        os._exit(3)
    return x


def unpicklable(x: int):
    return lambda: x




def started(x: int) -> tuple[int, int]:
    """Which process ran this call, and when it began (ns, monotonic)."""
    import time

    return os.getpid(), time.monotonic_ns()
