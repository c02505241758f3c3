"""heap.kept_heap: inside a run on the CPU, freed large blocks stay in the heap (no
mmap per allocation) and the settings come back afterwards; the run loop uses it
unless ``reuse_cpu_memory=False``."""

from __future__ import annotations

import ctypes

import pytest
import torch

from alchemi_lit import Simulator
from alchemi_lit.core import heap
from alchemi_lit.engine import run_loop
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import LennardJones
from conftest import perturbed_argon

pytestmark = pytest.mark.skipif(not heap.supported(), reason="needs Linux with glibc")

BLOCK = 64 * 2**20  # above glibc's largest mmap threshold (32 MB)
MEDIUM = 16 * 2**20  # below it


class _MallInfo(ctypes.Structure):  # glibc's struct mallinfo (int fields)
    _fields_ = [(name, ctypes.c_int) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost",
    )]  # fmt: skip


def _mmapped_blocks_during_malloc(size: int = BLOCK) -> int:
    """How many more mmapped blocks glibc holds while one block of ``size`` is allocated.

    A block above the mmap threshold is made larger than all the free memory the heap
    holds: earlier tests leave freed chunks inside the heap (below live ones, where no
    trim reaches), and one large enough serves a malloc without asking for memory at all,
    mmap or not (whether glibc mmaps would then depend on what ran before)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo.restype = _MallInfo
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    if size >= BLOCK:
        size += max(libc.mallinfo().fordblks, 0)  # (an int: wraps past 2 GiB)
    before = libc.mallinfo().hblks
    pointer = libc.malloc(size)
    try:
        return libc.mallinfo().hblks - before
    finally:
        libc.free(pointer)


def test_large_blocks_come_from_the_heap_only_inside() -> None:
    assert _mmapped_blocks_during_malloc() == 1  # glibc's default: its own mmap
    with heap.kept_heap() as active:
        assert active is True
        assert _mmapped_blocks_during_malloc() == 0
        with heap.kept_heap():  # re-entrant: the inner exit restores nothing
            pass
        assert _mmapped_blocks_during_malloc() == 0
    assert _mmapped_blocks_during_malloc() == 1
    # afterwards glibc is left as its dynamic rule leaves a process that freed large
    # tensors (not at its fixed 128 KiB defaults, which would slow whatever runs next)
    assert _mmapped_blocks_during_malloc(MEDIUM) == 0
    with heap.kept_heap(enabled=False) as active:
        assert active is False
        assert _mmapped_blocks_during_malloc() == 1


@pytest.mark.parametrize("reuse", [True, False])
def test_the_run_loop_keeps_the_heap_on_cpu_unless_told_not_to(monkeypatch, reuse) -> None:
    seen: list[bool] = []
    original = heap.kept_heap

    def recording(enabled: bool = True):
        seen.append(enabled)
        return original(enabled)

    monkeypatch.setattr(run_loop, "kept_heap", recording)
    sim = Simulator(LennardJones(), FIRE(fmax=0.1, max_steps=5), accelerator="cpu",
                    reuse_cpu_memory=reuse)  # fmt: skip
    results = sim.run(perturbed_argon(2, repeat=2))
    assert len(results) == 2
    assert seen == [reuse]
    assert _mmapped_blocks_during_malloc() == 1  # restored after the run
    assert torch.isfinite(results.energy).all()
