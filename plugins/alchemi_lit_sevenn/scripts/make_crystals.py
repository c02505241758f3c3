"""Regenerate ``configs/data/sevennet_crystals.extxyz`` for ``configs/sevennet_relax.yaml``.

Si, Ge (diamond), GaAs (zincblende), NaCl, MgO (rocksalt), Cu, Al (fcc): conventional
cubic cells at experimental lattice constants, a 2x1x1 supercell of each as well, 14
structures in all.  Each is slightly strained (1 %) and its atoms rattled (0.05 Å), so
there are forces to relax.  The config relaxes atomic positions only: FIRE keeps every
cell fixed, so the strain (and the stress it causes) stays and is reported, not relaxed.
Deterministic (fixed seed); run from anywhere::

    python plugins/alchemi_lit_sevenn/scripts/make_crystals.py [OUTPUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from ase import Atoms
from ase.build import bulk
from ase.io import write

#: name -> (symbols, crystal structure, lattice constant Å)
CRYSTALS: dict[str, tuple[str, str, float]] = {
    "Si": ("Si", "diamond", 5.431),
    "Ge": ("Ge", "diamond", 5.658),
    "GaAs": ("GaAs", "zincblende", 5.653),
    "NaCl": ("NaCl", "rocksalt", 5.640),
    "MgO": ("MgO", "rocksalt", 4.212),
    "Cu": ("Cu", "fcc", 3.615),
    "Al": ("Al", "fcc", 4.050),
}


def structures(seed: int = 11) -> list[Atoms]:
    rng = np.random.default_rng(seed)
    out = []
    for name, (symbols, kind, a) in CRYSTALS.items():
        for repeat in ((1, 1, 1), (2, 1, 1)):
            atoms = bulk(symbols, kind, a=a, cubic=True).repeat(repeat)
            strain = np.eye(3) + rng.normal(0.0, 0.01, (3, 3))
            atoms.set_cell(atoms.cell.array @ strain, scale_atoms=True)
            atoms.positions += rng.normal(0.0, 0.05, atoms.positions.shape)
            atoms.info["name"] = f"{name}_{len(atoms)}"
            out.append(atoms)
    return out


#: the repository's configs/data/, next to the config that reads the file
DEFAULT_OUTPUT = (
    Path(__file__).resolve().parents[3] / "configs" / "data" / "sevennet_crystals.extxyz"
)

if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    atoms = structures()
    write(path, atoms, format="extxyz")
    print(f"wrote {len(atoms)} structures, {sum(len(a) for a in atoms)} atoms to {path}")
