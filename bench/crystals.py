"""The real-crystal workload of the MLIP benchmarks (issues #17 and #18).

Twelve crystals at experimental lattice constants, each as its primitive cell and as a
2x2x2 supercell of it: 24 structures, 234 atoms.  Every structure is strained and
rattled from one seeded generator, so the set is identical on every machine and for
every engine:

* strain: the cell is multiplied by ``I + eps`` with ``eps`` symmetric, its diagonal
  ``+3 %`` for even-numbered structures and ``-3 %`` for odd ones (half expanded, half
  compressed), its off-diagonal entries uniform in +-1 % (a shear, so the cell has
  something to relax besides its volume); atoms move with the cell;
* rattle: Gaussian noise of 0.05 Å on every coordinate, so the positions have something
  to relax (a one-atom cell has no force whatever its noise: it converges at step 0).

Only ``ase`` and ``numpy``: the TorchSim worker imports it too.  The engines are handed
the arrays of :func:`pack` (exact float64), never a rebuilt set.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: name -> (formula, ase.build.bulk crystal structure, bulk keyword arguments)
BULK: dict[str, tuple[str, str, dict[str, float]]] = {
    "Si": ("Si", "diamond", {"a": 5.431}),
    "Ge": ("Ge", "diamond", {"a": 5.658}),
    "GaAs": ("GaAs", "zincblende", {"a": 5.653}),
    "NaCl": ("NaCl", "rocksalt", {"a": 5.640}),
    "MgO": ("MgO", "rocksalt", {"a": 4.212}),
    "LiF": ("LiF", "rocksalt", {"a": 4.026}),
    "Cu": ("Cu", "fcc", {"a": 3.615}),
    "Al": ("Al", "fcc", {"a": 4.050}),
    "Ni": ("Ni", "fcc", {"a": 3.524}),
    "Fe": ("Fe", "bcc", {"a": 2.866}),
    "ZnO": ("ZnO", "wurtzite", {"a": 3.250, "c": 5.207, "u": 0.382}),
}
#: rutile TiO2 (space group 136, P4_2/mnm): a, c (Å) and the oxygen coordinate x
RUTILE = {"a": 4.594, "c": 2.959, "x": 0.3048}

STRAIN = 0.03  # diagonal strain, + for even structures, - for odd
SHEAR = 0.01  # largest off-diagonal strain
RATTLE = 0.05  # Å, standard deviation of the positional noise


def primitive(name: str) -> Any:
    """The unstrained primitive cell of one of the twelve crystals."""
    from ase.build import bulk
    from ase.spacegroup import crystal

    if name == "TiO2":
        a, c, x = RUTILE["a"], RUTILE["c"], RUTILE["x"]
        return crystal(
            ["Ti", "O"],
            basis=[(0.0, 0.0, 0.0), (x, x, 0.0)],
            spacegroup=136,
            cellpar=[a, a, c, 90, 90, 90],
            primitive_cell=True,
        )
    formula, kind, kwargs = BULK[name]
    return bulk(formula, kind, **kwargs)


NAMES: tuple[str, ...] = (*BULK, "TiO2")


def crystal_set(seed: int = 17, supercell: int = 2, names: tuple[str, ...] = NAMES) -> list[Any]:
    """Primitive cell and ``supercell``^3 supercell of each crystal, strained and rattled.

    Order: all primitive cells (in ``names`` order), then all supercells.  Each
    structure's ``info["name"]`` is ``"<crystal>_<n atoms>"``.
    """
    rng = np.random.default_rng(seed)
    bases = [(name, primitive(name)) for name in names]
    unstrained = [(n, a.copy()) for n, a in bases] + [
        (n, a.repeat((supercell,) * 3)) for n, a in bases
    ]
    out = []
    for k, (name, atoms) in enumerate(unstrained):
        eps = np.zeros((3, 3))
        off = rng.uniform(-SHEAR, SHEAR, 3)
        eps[0, 1] = eps[1, 0] = off[0]
        eps[0, 2] = eps[2, 0] = off[1]
        eps[1, 2] = eps[2, 1] = off[2]
        eps += np.eye(3) * (STRAIN if k % 2 == 0 else -STRAIN)
        atoms.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
        atoms.positions += rng.normal(0.0, RATTLE, atoms.positions.shape)
        atoms.wrap()
        atoms.info["name"] = f"{name}_{len(atoms)}"
        out.append(atoms)
    return out


def quick_set(seed: int = 17) -> list[Any]:
    """Four small structures of the full set (16 atoms) for a smoke run: Si and NaCl
    primitive cells, the ZnO primitive cell and the Al 2x2x2 supercell."""
    full = crystal_set(seed)
    wanted = ("Si_2", "NaCl_2", "ZnO_4", "Al_8")
    return [a for a in full if a.info["name"] in wanted]


def pack(atoms_list: list[Any]) -> dict[str, np.ndarray]:
    """The arrays that define a set exactly (for ``np.savez``): ptr, numbers, positions,
    cells, pbc and names."""
    return {
        "ptr": np.cumsum([0] + [len(a) for a in atoms_list]),
        "numbers": np.concatenate([a.numbers for a in atoms_list]),
        "positions": np.concatenate([a.positions for a in atoms_list]),
        "cells": np.stack([a.cell.array for a in atoms_list]),
        "pbc": np.stack([a.pbc for a in atoms_list]),
        "names": np.array([a.info.get("name", str(k)) for k, a in enumerate(atoms_list)]),
    }


def unpack(arrays: Any) -> list[Any]:
    """The ``ase.Atoms`` of :func:`pack`'s arrays (an ``np.load`` result or a dict)."""
    from ase import Atoms

    ptr = arrays["ptr"]
    out = []
    for k in range(len(ptr) - 1):
        lo, hi = int(ptr[k]), int(ptr[k + 1])
        atoms = Atoms(
            numbers=arrays["numbers"][lo:hi],
            positions=arrays["positions"][lo:hi],
            cell=arrays["cells"][k],
            pbc=arrays["pbc"][k],
        )
        atoms.info["name"] = str(arrays["names"][k])
        out.append(atoms)
    return out


if __name__ == "__main__":
    for atoms in crystal_set():
        lengths = ", ".join(f"{x:.3f}" for x in atoms.cell.lengths())
        print(f"{atoms.info['name']:>10}  {atoms.get_chemical_formula():>10}  cell {lengths}")
