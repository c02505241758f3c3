"""Regenerate ``cuau.extxyz``: 16 Cu-Au fcc cells for the Monte Carlo config.

2x2x2 conventional fcc cells (32 atoms, a = 3.85 Å, between Cu's 3.61 and Au's 4.08),
Au fractions 1/4 to 3/4 on random sites, positions rattled by 0.02 Å.  Deterministic
(fixed seed); run from anywhere::

    python configs/data/make_cuau.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ase.build import bulk
from ase.io import write


def structures(seed: int = 3) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(16):
        atoms = bulk("Cu", "fcc", a=3.85, cubic=True).repeat(2)
        n_au = 8 + (k % 5) * 4  # 8, 12, 16, 20, 24 of 32
        atoms.numbers[rng.permutation(len(atoms))[:n_au]] = 79
        atoms.rattle(0.02, seed=seed + k)
        out.append(atoms)
    return out


if __name__ == "__main__":
    write(Path(__file__).with_name("cuau.extxyz"), structures())
