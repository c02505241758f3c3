"""Regenerate ``metals.extxyz``: 20 small Cu/Ag/Au/Pt structures for the EMT configs.

Clusters (icosahedra, octahedra, decahedra, cut from ``ase.cluster``) and bulk fcc
supercells (pure and random alloys), all perturbed so that there is something to relax.
Deterministic (fixed seed); run from anywhere::

    python configs/data/make_metals.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ase.build import bulk
from ase.cluster import Decahedron, Icosahedron, Octahedron
from ase.io import write

LATTICE = {"Cu": 3.61, "Ag": 4.09, "Au": 4.08, "Pt": 3.92}


def structures(seed: int = 7) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for el in LATTICE:  # 4 x 3 clusters
        for atoms in (
            Icosahedron(el, 2, latticeconstant=LATTICE[el]),  # 13 atoms
            Octahedron(el, 3, cutoff=1, latticeconstant=LATTICE[el]),  # 38 atoms
            Decahedron(el, 2, 2, 0, latticeconstant=LATTICE[el]),  # 13 atoms
        ):
            atoms.center(vacuum=6.0)
            atoms.pbc = False
            out.append(atoms)
    for el in LATTICE:  # 4 pure bulk cells, 32 atoms
        out.append(bulk(el, "fcc", a=LATTICE[el], cubic=True).repeat(2))
    for a, b in (("Cu", "Au"), ("Ag", "Pt"), ("Cu", "Pt"), ("Ag", "Au")):  # 4 random alloys
        atoms = bulk(a, "fcc", a=0.5 * (LATTICE[a] + LATTICE[b]), cubic=True).repeat(2)
        symbols = np.array(atoms.get_chemical_symbols())
        symbols[rng.random(len(atoms)) < 0.5] = b
        atoms.set_chemical_symbols(symbols.tolist())
        out.append(atoms)
    for k, atoms in enumerate(out):
        atoms.positions += rng.normal(0.0, 0.08, atoms.positions.shape)
        atoms.info["name"] = f"{atoms.get_chemical_formula()}_{k}"
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("metals.extxyz")
    atoms = structures()
    write(path, atoms, format="extxyz")
    print(f"wrote {len(atoms)} structures, {sum(len(a) for a in atoms)} atoms to {path}")
