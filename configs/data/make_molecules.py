"""Regenerate ``molecules.extxyz``: 4 small molecules EMT covers (H, C, N, O), relaxed
with EMT, for the vibrations config (``configs/workflows/vibrations.yaml``).

ASE's g2 geometries of H2O, NH3, CO2 and H2CO, each relaxed by alchemi_lit (FIRE to
1e-3 eV/Å): a vibrational analysis needs a minimum.  Deterministic; run from anywhere::

    python configs/data/make_molecules.py
"""

from __future__ import annotations

from pathlib import Path

from ase import Atoms
from ase.build import molecule
from ase.io import write

import alchemi_lit as al
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import EMT


def molecules() -> list:
    return [molecule(name) for name in ("H2O", "NH3", "CO2", "H2CO")]


def main() -> None:
    relaxed = al.Simulator(EMT(), FIRE(fmax=1e-3, max_steps=5000), precision="64").run(molecules())
    out = [Atoms(a.numbers, positions=a.positions) for a in relaxed]  # no results, no info
    write(Path(__file__).with_name("molecules.extxyz"), out, format="extxyz")


if __name__ == "__main__":
    main()
