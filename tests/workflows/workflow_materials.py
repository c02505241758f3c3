"""Small crystals EMT covers, for the workflow tests (importable: pytest puts this folder
on sys.path)."""

from __future__ import annotations

import numpy as np
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT as PlainAseEMT

from conftest import AseEMT


def copper() -> Atoms:
    return bulk("Cu", "fcc", a=3.59)


def aluminium() -> Atoms:
    return bulk("Al", "fcc", a=4.05)


def cu3au() -> Atoms:
    """L1_2 Cu3Au, 4 atoms in the cubic cell."""
    a = 3.75
    return Atoms(
        "AuCu3",
        scaled_positions=[[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]],
        cell=[a, a, a],
        pbc=True,
    )


def triclinic() -> Atoms:
    """Two Cu and one Ni in a sheared, stretched cell: no symmetry left, every C_ij
    independent, and forces on the atoms (so a relaxation moves them)."""
    cell = np.array([[3.62, 0.11, -0.07], [0.23, 3.55, 0.16], [-0.12, 0.31, 3.71]])
    frac = [[0.0, 0.0, 0.0], [0.52, 0.47, 0.05], [0.03, 0.49, 0.55]]
    return Atoms("Cu2Ni", scaled_positions=frac, cell=cell, pbc=True)


def ten_materials() -> list[Atoms]:
    """Ten materials of 1 to 8 atoms."""
    return [
        copper(), aluminium(), cu3au(), triclinic(),
        bulk("Ni", "fcc", a=3.52), bulk("Pd", "fcc", a=3.94, cubic=True),
        bulk("Ag", "fcc", a=4.09), bulk("Pt", "fcc", a=3.97),
        bulk("Au", "fcc", a=4.08) * (2, 1, 1), bulk("Cu", "bcc", a=2.87, cubic=True) * (2, 2, 1),
    ]  # fmt: skip


def with_ase_emt(atoms: Atoms) -> Atoms:
    atoms = atoms.copy()
    atoms.calc = AseEMT()
    return atoms


class NoGold(PlainAseEMT):
    """ASE's EMT, failing on any structure with gold."""

    def calculate(self, atoms=None, properties=("energy",), system_changes=()):
        if 79 in atoms.numbers:
            raise RuntimeError("no gold here")
        super().calculate(atoms, properties, system_changes)
