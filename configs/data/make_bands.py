"""Regenerate ``bands.extxyz``: 6 nudged elastic bands (EMT adatom hops on fcc(100)
slabs of Al and Cu) for ``configs/neb.yaml``.

Each band runs from an adatom in one hollow site to the next (endpoints relaxed with
ASE's BFGS, the bottom layer fixed), images by ASE's IDPP interpolation, tagged with
``path_id`` by ``alchemi_lit.workflows.make_band``.  The first band has 3 images, so
the first frames of the file are a whole band.  Deterministic; run from anywhere::

    python configs/data/make_bands.py
"""

from __future__ import annotations

from pathlib import Path

from ase.build import add_adsorbate, fcc100
from ase.calculators.emt import EMT
from ase.constraints import FixAtoms
from ase.io import write
from ase.optimize import BFGS

from alchemi_lit.workflows import make_band

CASES = [("Al", "Au", 0, 3), ("Cu", "Cu", 1, 5), ("Al", "Al", 0, 5),
         ("Cu", "Ag", 1, 4), ("Al", "Cu", 1, 5), ("Cu", "Au", 0, 5)]  # fmt: skip


def endpoints(metal: str, adatom: str, along: int) -> tuple:
    slab = fcc100(metal, size=(2, 2, 3), vacuum=5.0)
    add_adsorbate(slab, adatom, 1.6, "hollow")
    slab.set_constraint(FixAtoms(mask=[atom.tag == 3 for atom in slab]))
    final = slab.copy()
    final.positions[-1, along] += slab.cell[along, along] / 2
    for atoms in (slab, final):
        atoms.calc = EMT()
        BFGS(atoms, logfile=None).run(fmax=0.02)
        atoms.calc = None
    return slab, final


def bands() -> list:
    out = []
    for k, (metal, adatom, along, n) in enumerate(CASES):
        out += make_band(*endpoints(metal, adatom, along), n, "idpp", path_id=k)
    return out


if __name__ == "__main__":
    write(Path(__file__).with_name("bands.extxyz"), bands(), format="extxyz")
