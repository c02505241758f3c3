"""Built-in structure sets, generated on the fly (no downloads): the quickstart and
benchmarks need realistic inputs on a fresh machine."""

from __future__ import annotations

from typing import Any

import numpy as np


def argon_crystals(
    n_systems: int = 64,
    repeat: int = 3,
    lattice: float = 5.26,
    noise: float = 0.1,
    seed: int = 0,
) -> list[Any]:
    """Perturbed fcc argon supercells (``repeat``^3 cubic cells, 4 atoms each).

    The benchmark workload of the project (64 x 108 atoms, σ-noise 0.1 Å).

    Args:
        n_systems: number of crystals (>= 1).
        repeat: cubic cells along each axis (>= 1).
        lattice: fcc lattice constant in Å.
        noise: standard deviation of the random displacements in Å.
        seed: seed of the displacements.
    """
    from ase.build import bulk

    if n_systems < 1:
        raise ValueError(f"argon_crystals: n_systems must be >= 1, got {n_systems}")
    if repeat < 1:
        raise ValueError(f"argon_crystals: repeat must be >= 1, got {repeat}")
    rng = np.random.default_rng(seed)
    base = bulk("Ar", "fcc", a=lattice, cubic=True).repeat(repeat)
    out = []
    for _ in range(n_systems):
        atoms = base.copy()
        atoms.positions += rng.normal(0.0, noise, atoms.positions.shape)
        out.append(atoms)
    return out


def mixed_argon(
    n_systems: int = 200,
    min_atoms: int = 8,
    max_atoms: int = 200,
    noise: float = 0.1,
    seed: int = 0,
) -> list[Any]:
    """Argon systems of varied sizes: perturbed fcc supercells with random shapes,
    trimmed to a random atom count between ``min_atoms`` and ``max_atoms`` as
    clusters (no pbc) or kept periodic.  For inflight-batching tests and benchmarks."""
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_systems):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        reps = [int(rng.integers(1, 4)) for _ in range(3)]
        while 4 * np.prod(reps) < n:
            reps[int(np.argmin(reps))] += 1
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(reps)
        if 4 * np.prod(reps) != n:
            atoms = atoms[:n]
            atoms.pbc = False
            atoms.cell = np.zeros((3, 3))
        atoms.positions += rng.normal(0.0, noise, atoms.positions.shape)
        out.append(atoms)
    return out


BUILTIN_SETS = {"argon": argon_crystals, "mixed_argon": mixed_argon}
