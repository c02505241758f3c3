"""Regenerate ``crystals.extxyz``: 8 crystals EMT covers, relaxed with EMT (cell and
atoms), for the property-workflow configs (``configs/workflows/``).

Primitive fcc cells of the seven EMT metals and L1_2 Cu3Au, each relaxed by alchemi_lit
(LBFGS with a Frechet cell filter, to 1e-4 eV/Å): properties are computed at a
stress-free cell.  Deterministic; run from anywhere::

    python configs/data/make_crystals.py
"""

from __future__ import annotations

from pathlib import Path

from ase import Atoms
from ase.build import bulk
from ase.io import write

import alchemi_lit as al
from alchemi_lit.integrators import LBFGS, CellFilter
from alchemi_lit.models import EMT

LATTICE = {"Al": 4.05, "Ni": 3.52, "Cu": 3.61, "Pd": 3.89, "Ag": 4.09, "Pt": 3.92, "Au": 4.08}


def crystals() -> list[Atoms]:
    out = [bulk(e, "fcc", a=a) for e, a in LATTICE.items()]
    a = 3.75
    cu3au = Atoms(
        "AuCu3",
        scaled_positions=[[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]],
        cell=[a, a, a],
        pbc=True,
    )
    return [*out, cu3au]


if __name__ == "__main__":
    relax = LBFGS(fmax=1e-4, max_steps=500, cell=CellFilter())
    relaxed = al.Simulator(EMT(), relax, precision="64").run(crystals())
    assert all(relaxed.converged.tolist())
    frames = []
    for atoms in relaxed:
        clean = Atoms(atoms.numbers, atoms.positions, cell=atoms.cell, pbc=True)
        frames.append(clean)
    write(Path(__file__).with_name("crystals.extxyz"), frames)
