"""Workloads and helpers shared by the benchmarks in this folder.

Import from a benchmark script run as ``python bench/<name>.py`` (the script's folder
is on ``sys.path``): ``from common import argon_set, ARGON_LJ, time_call``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: Argon fcc lattice constant (Å) and the Lennard-Jones parameters used throughout.
ARGON_A = 5.26
ARGON_LJ: dict[str, float] = {"epsilon": 0.0104, "sigma": 3.40, "cutoff": 8.5}


def argon_set(n_systems: int = 64, repeat: int = 3, noise: float = 0.1, seed: int = 0) -> list[Any]:
    """``n_systems`` perturbed fcc argon crystals (cubic cell, ``4 * repeat**3`` atoms).

    Gaussian noise of ``noise`` Å on every coordinate, from one seeded generator, so
    the set is identical on every machine.  Default: 64 systems of 108 atoms.
    """
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    base = bulk("Ar", "fcc", a=ARGON_A, cubic=True).repeat(repeat)
    out = []
    for _ in range(n_systems):
        atoms = base.copy()
        atoms.positions += rng.normal(scale=noise, size=atoms.positions.shape)
        out.append(atoms)
    return out


def setup_threads(n: int = 2) -> None:
    """Pin torch's intra-op threads (and BLAS/OpenMP threads of later imports)."""
    import torch

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(n))
    torch.set_num_threads(n)


def time_call(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median(times: Sequence[float]) -> float:
    return statistics.median(times)


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_line() -> str:
    """One line naming the machine and the library versions a result depends on."""
    import torch

    parts = [
        f"python {platform.python_version()}",
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)",
        f"numpy {np.__version__}",
    ]
    for dist in ("ase", "vesin", "torch-sim-atomistic"):
        v = package_version(dist)
        if v:
            parts.append(f"{dist} {v}")
    return f"{platform.machine()} {platform.processor() or ''}".strip() + " | " + ", ".join(parts)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain fixed-width table (left-aligned text, right-aligned numbers)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(headers))]
    numeric = [all(_is_number(r[k]) for r in cells[1:]) for k in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", "").rstrip("x"))
    except ValueError:
        return False
    return True
