"""The memory budget's arithmetic on stated numbers (no probing): edges in every
estimate, a negative intercept, a dense system's edge budget; and the free memory the
CPU reader reports under a container limit (cgroup v1 and v2)."""

from __future__ import annotations

import numpy as np
import pytest

from alchemi_lit.core.errors import ConfigError
from alchemi_lit.data.memory import MemoryReader, ProcessMemoryReader


class _Stated(MemoryReader):
    """A reader that only states the free memory (for choose() and its checks)."""

    name, resolution = "stated", 1

    def __init__(self, free: int) -> None:
        self.free = free

    def start(self) -> None: ...

    def peak_growth(self) -> int:
        return 0

    def available(self) -> int:
        return self.free


def test_edges_count_in_every_estimate():
    """The probe bound scales a measured growth by the larger of the atom and edge
    ratios, and a system that alone exceeds the memory through its pairs (not its
    atoms) is the one named: a law of 100 B/atom + 1000 B/pair, three systems."""
    from alchemi_lit.data.memory_budget import _bound, choose

    assert _bound([(10, 10, 1000)], 10, 40, 1) == 4000  # 4x the pairs, same atoms
    assert _bound([(10, 10, 1000)], 30, 20, 1) == 3000
    sizes, edges = np.array([10, 10, 20]), np.array([10, 500, 20])  # 1: dense; 2: large
    probes = [(10, 10, 11000), (20, 20, 22000), (10, 500, 501000)]
    with pytest.raises(ConfigError, match=r"system 1 \(10 atoms, 500 pairs\) alone needs"):
        choose(probes, sizes, edges, np.arange(3), _Stated(400000), 1.0)


def test_the_process_reader_takes_the_container_limit_when_it_is_lower(monkeypatch):
    """On the CPU the free memory is MemAvailable, or the room under the container's
    memory limit where that is less (a budget sized past it gets the run killed)."""
    from alchemi_lit.data import memory

    reader = ProcessMemoryReader.__new__(ProcessMemoryReader)  # (no /proc needed)
    monkeypatch.setattr(memory, "_meminfo", lambda key: 8 << 30)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: 1 << 30)
    assert reader.available() == 1 << 30
    monkeypatch.setattr(memory, "_cgroup_room", lambda: 1 << 62)  # no limit
    assert reader.available() == 8 << 30


def test_the_container_room_is_its_limit_less_what_it_uses(tmp_path, monkeypatch):
    """cgroup v2 (``memory.max`` less ``memory.current``), else v1; ``max``: no limit."""
    from pathlib import Path

    from alchemi_lit.data import memory

    monkeypatch.setattr(memory, "Path", lambda p: tmp_path if p == "/sys/fs/cgroup" else Path(p))
    assert memory._cgroup_room() == 1 << 62  # no files: no limit
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("400000\n")
    assert memory._cgroup_room() == 600000
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory/memory.limit_in_bytes").write_text("5000\n")
    (tmp_path / "memory/memory.usage_in_bytes").write_text("7000\n")  # over: no room
    assert memory._cgroup_room() == 0


def test_a_negative_fitted_intercept_counts_as_zero():
    """Probes on ``-1000 + 100 atoms`` (edges proportional: a per-atom law): the budget
    puts a full batch at the usable memory by ``100 atoms`` alone (an intercept below 0
    is noise and would promise memory that is not there)."""
    from alchemi_lit.data.memory_budget import choose

    probes = [(10, 20, 0), (20, 40, 1000), (40, 80, 3000)]
    sizes, edges = np.full(100, 10), np.full(100, 20)
    fit = choose(probes, sizes, edges, np.arange(100), _Stated(50_000), 1.0)
    assert fit.intercept == 0.0 and fit.per_atom == pytest.approx(100.0, rel=1e-9)
    assert fit.max_atoms == 500 and fit.predicted_peak <= 50_000


def test_a_dense_system_raises_the_edge_budget_and_lowers_the_atoms():
    """Law ``100 atoms + 10 pairs``; nine sparse systems and one of 1000 pairs.  At the
    mean density the edge budget (782) would not hold the dense system, so it is raised
    to 1000 pairs and the atom budget lowered to what is left: (15000 - 10000) / 100."""
    from alchemi_lit.data.memory_budget import choose

    probes = [(10, 10, 1100), (20, 40, 2400), (40, 200, 6000)]
    sizes = np.full(10, 10)
    edges = np.array([10] * 9 + [1000])
    fit = choose(probes, sizes, edges, np.arange(10), _Stated(15_000), 1.0)
    assert (fit.per_atom, fit.per_edge) == (pytest.approx(100.0), pytest.approx(10.0))
    assert (fit.max_atoms, fit.max_edges) == (50, 1000)
    assert fit.predicted_peak == pytest.approx(15_000)
