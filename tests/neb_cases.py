"""Nudged-elastic-band test cases: the Au-on-Al(100) hop of ASE's NEB tutorial, and
small adatom hops on fcc(100) slabs of several metals (EMT), for tests/integrators and
tests/workflows; and H2 "bands" with given energies for the band summaries."""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from ase import Atoms
from ase.build import add_adsorbate, fcc100
from ase.calculators.emt import EMT as AseEMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.constraints import FixAtoms
from ase.mep import NEB as AseNEB
from ase.optimize import QuasiNewton

from alchemi_lit.models import EMT


@lru_cache(maxsize=1)
def _tutorial_endpoints() -> tuple:
    slab = fcc100("Al", size=(2, 2, 3))
    add_adsorbate(slab, "Au", 1.7, "hollow")
    slab.center(axis=2, vacuum=4.0)
    slab.set_constraint(FixAtoms(mask=[atom.tag > 1 for atom in slab]))
    initial = slab.copy()
    initial.calc = AseEMT()
    QuasiNewton(initial, logfile=None).run(fmax=0.05)
    final = initial.copy()
    final.calc = AseEMT()
    final[-1].x += final.get_cell()[0, 0] / 2
    QuasiNewton(final, logfile=None).run(fmax=0.05)
    return initial, final


def tutorial_band(n_images: int = 5) -> list:
    """The tutorial's band (ASE's linear interpolation between relaxed endpoints),
    fresh copies without calculators."""
    initial, final = _tutorial_endpoints()
    images = [initial.copy() for _ in range(n_images - 1)] + [final.copy()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        AseNEB(images, method="improvedtangent").interpolate()
    for img in images:
        img.calc = None
    return images


def hop(metal: str, adatom: str, along: int, size: tuple[int, int, int] = (2, 2, 2)) -> tuple:
    """Unrelaxed endpoints of an adatom hop between hollow sites of an fcc(100) slab,
    along x (0) or y (1); the bottom layer fixed."""
    slab = fcc100(metal, size=size, vacuum=4.0)
    add_adsorbate(slab, adatom, 1.6, "hollow")
    slab.set_constraint(FixAtoms(mask=[atom.tag == size[2] for atom in slab]))
    final = slab.copy()
    final.positions[-1, along] += slab.cell[along, along] / size[along]
    return slab, final


class PoisonAt(EMT):
    """EMT whose energy of system ``sid`` turns NaN at its ``at``-th evaluation (per
    process: in a pipeline the endpoint relaxes on rank 0, as in the fused plan's first
    stage)."""

    def __init__(self, sid: int, at: int) -> None:
        super().__init__()
        self.sid, self.at, self.seen = sid, at, 0

    def forward(self, batch: Any, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        out = super().forward(batch, *args, **kwargs)
        hit = (batch.system_id == self.sid).nonzero().flatten().tolist()
        self.seen += bool(hit)
        if hit and self.seen == self.at:
            out["energy"] = out["energy"].clone()
            out["energy"][hit[0]] = float("nan")
        return out


def h2_band(energies: list[float], steps: list[int] | None = None) -> list[Atoms]:
    """H2 images stretched along x, each with its energy (zero forces) and step count
    (default 0): a band's summary without running one."""
    images = []
    for k, (e, n) in enumerate(zip(energies, steps or [0] * len(energies))):
        a = Atoms("H2", positions=[[0, 0, 0], [0.7 + 0.1 * k, 0, 0]])
        a.calc = SinglePointCalculator(a, energy=e, forces=np.zeros((2, 3)))
        a.info.update(steps=n, converged=True, exit_reason="converged")
        images.append(a)
    return images
