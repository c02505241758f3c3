"""Bands: the checks before a run (which cells must match) and the per-band summary
(highest image as ASE's NEB picks it, the band's step count)."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from ase.mep import NEB

from alchemi_lit.core.errors import StructureError
from alchemi_lit.data.bands import check_band
from alchemi_lit.io.bands import Band, highest_image


def h2_band(energies: list[float], steps: list[int]) -> list[Atoms]:
    """H2 images stretched along x, each with its energy (zero forces) and step count."""
    images = []
    for k, (e, n) in enumerate(zip(energies, steps)):
        a = Atoms("H2", positions=[[0, 0, 0], [0.7 + 0.1 * k, 0, 0]])
        a.calc = SinglePointCalculator(a, energy=e, forces=np.zeros((2, 3)))
        a.info.update(steps=n, converged=True, exit_reason="converged")
        images.append(a)
    return images


@pytest.mark.parametrize("energies", [[0, 1, 1, 0.5, 0], [0, 0.2, 0.9, 0.9, -0.1], [0, 3, 1, 2, 1]])
def test_highest_image_is_the_one_ase_neb_climbs(energies: list[float]) -> None:
    """ASE's ``NEB.imax`` (the climbing image): the last of a tie among the interior."""
    images = h2_band(energies, [0] * len(energies))
    neb = NEB(images, climb=True, method="improvedtangent")
    neb.get_forces()
    band = Band(0, images)
    assert highest_image(np.array(energies)) == band.highest_image == neb.imax
    assert band.forward_barrier == energies[neb.imax] - energies[0]


def test_a_bands_steps_are_its_slowest_interior_images() -> None:
    band = Band(3, h2_band([0, 1, 2, 1, 0], [0, 5, 9, 7, 0]))
    assert band.steps == 9 and band.converged and band.exit_reason == "converged"


def test_only_periodic_cell_vectors_must_match() -> None:
    """A cluster band's images may sit in different (non-periodic) boxes, as in ASE's NEB;
    a periodic vector that differs is refused."""
    images = h2_band([0, 1, 0], [0, 0, 0])
    for k, a in enumerate(images):
        a.cell = [10.0 + k, 10.0, 10.0 + 2 * k]
        a.pbc = (False, True, False)
    NEB(images, method="improvedtangent")  # ASE accepts the band
    check_band(images, path_id=1)
    images[2].cell[1, 1] = 10.5
    with pytest.raises(NotImplementedError, match="Variable cell in periodic directions"):
        NEB(images, method="improvedtangent")
    with pytest.raises(StructureError, match="image 2 has another periodic cell"):
        check_band(images, path_id=1)
