"""The heap checks of tests/test_heap.py, run in a fresh interpreter (``python
tests/heap_checks.py``): they probe glibc with 64 MiB blocks, and in a long test process
an earlier test's freed memory can hold a hole that large, which serves the block from
the heap whatever the thresholds (a flaky failure under pytest-xdist's ordering).
Prints one JSON line of what it saw."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BLOCK = 64 * 2**20  # above glibc's largest mmap threshold (32 MB)
MEDIUM = 16 * 2**20  # below it


class _MallInfo(ctypes.Structure):  # glibc's struct mallinfo (int fields)
    _fields_ = [(name, ctypes.c_int) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost",
    )]  # fmt: skip


def mmapped_blocks_during_malloc(size: int = BLOCK) -> int:
    """How many more mmapped blocks glibc holds while one block of ``size`` is allocated."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo.restype = _MallInfo
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo().hblks
    pointer = libc.malloc(size)
    try:
        return libc.mallinfo().hblks - before
    finally:
        libc.free(pointer)


def main() -> None:
    from alchemi_lit.core import heap

    seen: dict = {"default": mmapped_blocks_during_malloc()}
    with heap.kept_heap() as active:
        seen["active"] = active
        seen["inside"] = mmapped_blocks_during_malloc()
        with heap.kept_heap():  # re-entrant: the inner exit restores nothing
            pass
        seen["inside_after_inner"] = mmapped_blocks_during_malloc()
    seen["after"] = mmapped_blocks_during_malloc()
    seen["after_medium"] = mmapped_blocks_during_malloc(MEDIUM)
    with heap.kept_heap(enabled=False) as active:
        seen["disabled_active"] = active
        seen["disabled"] = mmapped_blocks_during_malloc()
    seen["runs"] = {str(reuse): run(reuse) for reuse in (True, False)}
    print(json.dumps(seen))


def run(reuse: bool) -> dict:
    import torch

    from alchemi_lit import Simulator
    from alchemi_lit.core import heap
    from alchemi_lit.engine import run_loop
    from alchemi_lit.integrators import FIRE
    from alchemi_lit.models import LennardJones
    from conftest import perturbed_argon

    calls: list[bool] = []
    original = heap.kept_heap

    def recording(enabled: bool = True):
        calls.append(enabled)
        return original(enabled)

    run_loop.kept_heap = recording
    try:
        sim = Simulator(LennardJones(), FIRE(fmax=0.1, max_steps=5), accelerator="cpu",
                        reuse_cpu_memory=reuse)  # fmt: skip
        results = sim.run(perturbed_argon(2, repeat=2))
    finally:
        run_loop.kept_heap = original
    return {"systems": len(results), "calls": calls, "after": mmapped_blocks_during_malloc(),
            "finite": bool(torch.isfinite(results.energy).all())}  # fmt: skip


if __name__ == "__main__":
    main()
