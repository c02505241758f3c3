"""Perturbed crystals for the FixSymmetry tests: perturbations that keep a (sub)group,
so a symmetry-constrained relaxation has internal coordinates and a cell to relax."""

from __future__ import annotations

import numpy as np
from ase import Atoms
from ase.build import bulk
from ase.constraints import FixAtoms, FixCartesian, FixSymmetry


def _stretch(atoms: Atoms, diag: tuple[float, float, float], shear: float = 0.0) -> Atoms:
    out = atoms.copy()
    m = np.diag(diag)
    m[0, 1] = shear
    out.set_cell(out.cell.array @ m, scale_atoms=True)
    return out


def emt_cases() -> list[Atoms]:
    """Five EMT crystals: Fm-3m (48 operations, cell only), P6_3/mmc hcp at a wrong c/a,
    P4/mmm (a conventional Cu cell, one atom lifted, tetragonal strain), R3m (L1_2 Cu3Au,
    the Au lifted along [111]) and a monoclinic sheared Pt pair (low symmetry)."""
    fcc = _stretch(bulk("Cu", "fcc", a=3.61), (1.03, 1.03, 1.03))
    hcp = bulk("Cu", "hcp", a=2.60, c=4.45)
    tet = _stretch(bulk("Cu", "fcc", a=3.61, cubic=True), (1.0, 1.0, 1.03))
    tet.positions[1, 2] += 0.08
    l12 = bulk("Cu", "fcc", a=3.75, cubic=True)
    l12.numbers[0] = 79
    l12.positions[0] += 0.05
    mono = _stretch(bulk("Pt", "fcc", a=3.92, cubic=True) * (1, 1, 1), (1.02, 0.99, 1.0), 0.03)
    mono.positions[1] += (0.04, 0.04, 0.0)
    return [fcc, hcp, tet, l12, mono]


def constrained(atoms: list[Atoms], symprec: float = 1e-3) -> list[Atoms]:
    """Copies with ASE's FixSymmetry (its constructor refines each structure)."""
    out = []
    for a in atoms:
        a = a.copy()
        a.set_constraint(FixSymmetry(a, symprec=symprec))
        out.append(a)
    return out


def fixed_cases() -> list[Atoms]:
    """Tetragonal Cu4 with atoms 0, 3 fixed, Cu3Au with the Au fixed (FixCartesian of
    x, y, z) and Cu3Au with its Cu fixed (FixAtoms listed first)."""
    tet, l12 = emt_cases()[2], emt_cases()[3]
    out = []
    for atoms, fix, first in (
        (tet, FixAtoms([0, 3]), False),
        (l12, FixCartesian([0], mask=(True, True, True)), False),
        (l12, FixAtoms([1, 2, 3]), True),
    ):
        atoms = atoms.copy()
        sym = FixSymmetry(atoms, symprec=1e-3)  # (refines the structure)
        atoms.set_constraint([fix, sym] if first else [sym, fix])
        out.append(atoms)
    return out


def chiral_cu16(polar: bool = True) -> Atoms:
    """16 atoms (a 2x2x1 conventional fcc Cu supercell, c strained 2 %) displaced by a
    chiral field.  ``polar``: P4, every operation keeping z (orbits {0}, {1, 2, 5, 10},
    {3, 7, 11, 15} -- Au --, {4, 8}, {6, 9, 13, 14}, {12}); else, without the term that
    breaks the in-plane 2-fold axes, P4_2 1 2 (they flip z; orbits {0, 12}, {1, 2, 5, 6,
    9, 10, 13, 14}, {3, 7, 11, 15}, {4, 8}), all Cu.  Every orbit moves in x, y and z."""
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True) * (2, 2, 1)
    f = atoms.get_scaled_positions()
    x, y = 2 * np.pi * f[:, 0], 2 * np.pi * f[:, 1]
    u = 0.06 * np.stack([-np.sin(y), np.sin(x), np.zeros(len(atoms))], 1)
    if polar:
        u[:, 2] = 0.05 * (np.cos(x) + np.cos(y)) + 0.04 * np.cos(x) * np.cos(y)
        atoms.numbers[[3, 7, 11, 15]] = 79
    else:
        u[:, 2] = 0.05 * (np.cos(x) + np.cos(y)) + 0.04 * (np.cos(x / 2) ** 2 + np.cos(y / 2) ** 2)
    atoms.positions += u
    return _stretch(atoms, (1.0, 1.0, 1.02))
