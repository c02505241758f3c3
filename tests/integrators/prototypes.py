"""Twenty crystal prototypes in EMT's elements (Al, Ni, Cu, Pd, Ag, Pt, Au), near their
EMT volumes, for the symmetry-kept relaxations: close-packed and open, elemental and
ordered, cubic to hexagonal; several are unstable under EMT (simple cubic, diamond, the
B1/B3 compounds), so an unconstrained relaxation leaves their space group."""

from __future__ import annotations

import numpy as np
from ase import Atoms
from ase.build import bulk
from ase.spacegroup import crystal


def prototypes() -> list[Atoms]:
    """The 20 structures, ideal (exactly symmetric)."""
    out = [
        bulk("Cu", "fcc", a=3.60),  # A1 Fm-3m
        bulk("Ni", "bcc", a=2.80),  # A2 Im-3m
        bulk("Pd", "hcp", a=2.75, c=4.49),  # A3 P6_3/mmc
        bulk("Ag", "sc", a=2.70),  # Ah Pm-3m
        bulk("Al", "diamond", a=5.8),  # A4 Fd-3m
        bulk("CuAu", "rocksalt", a=4.9),  # B1 Fm-3m
        bulk("NiAl", "cesiumchloride", a=2.90),  # B2 Pm-3m
        bulk("CuAg", "zincblende", a=5.7),  # B3 F-43m
        bulk("AuAg", "wurtzite", a=3.9, c=6.4),  # B4 P6_3mc
        bulk("PtCu2", "fluorite", a=5.6),  # C1 Fm-3m
    ]
    l12 = bulk("Cu", "fcc", a=3.75, cubic=True)  # L1_2 Cu3Au, Pm-3m
    l12.numbers[0] = 79
    l10 = Atoms("CuAu", scaled_positions=[[0, 0, 0], [0.5, 0.5, 0.5]],
                cell=[2.8, 2.8, 3.7], pbc=True)  # L1_0 P4/mmm
    perovskite = crystal(["Au", "Ni", "Cu"], [(0, 0, 0), (0.5, 0.5, 0.5), (0.5, 0.5, 0)],
                         spacegroup=221, cellpar=[3.9, 3.9, 3.9, 90, 90, 90])  # E2_1
    a15 = crystal(["Pt", "Ni"], [(0, 0, 0), (0.25, 0, 0.5)], spacegroup=223,
                  cellpar=[4.9] * 3 + [90] * 3)  # A15 Pm-3n
    nias = crystal(["Ni", "Al"], [(0, 0, 0), (1 / 3, 2 / 3, 0.25)], spacegroup=194,
                   cellpar=[3.0, 3.0, 5.0, 90, 90, 120])  # B8_1 P6_3/mmc
    bct = bulk("Pd", "bct", a=3.3, c=4.2)  # A6-like I4/mmm
    rhombo = crystal(["Au"], [(0, 0, 0)], spacegroup=166, cellpar=[2.95, 2.95, 7.9, 90, 90, 120],
                     primitive_cell=True)  # A10 R-3m
    ortho = bulk("Pt", "orthorhombic", a=2.8, b=4.0, c=4.9, basis=[[0, 0, 0], [0.5, 0.5, 0.5]])
    c11b = crystal(["Ag", "Cu"], [(0, 0, 0), (0, 0, 0.333)], spacegroup=139,
                   cellpar=[2.9, 2.9, 8.7, 90, 90, 90])  # C11_b I4/mmm
    b19 = crystal(["Pt", "Al"], [(0.25, 0, 0.31), (0.25, 0.5, 0.81)], spacegroup=51,
                  cellpar=[4.4, 2.8, 4.8, 90, 90, 90])  # B19 Pmma
    out += [l12, l10, perovskite, a15, nias, bct, rhombo, ortho, c11b, b19]
    return out


def perturbed(atoms: list[Atoms], noise: float = 1e-4, seed: int = 0) -> list[Atoms]:
    """Copies with every atom moved by up to ``noise`` Å (below the results table's 1e-3
    Å symprec, so each still reads as its ideal group) and the cell by ``noise`` too."""
    rng = np.random.default_rng(seed)
    out = []
    for a in atoms:
        a = a.copy()
        a.positions += rng.uniform(-noise, noise, a.positions.shape)
        a.set_cell(a.cell.array + rng.uniform(-noise, noise, (3, 3)), scale_atoms=False)
        out.append(a)
    return out
