"""Bands: the checks before a run (which cells must match) and the per-band summary
(highest image as ASE's NEB picks it, the band's step count)."""

from __future__ import annotations

import numpy as np
import pytest
from ase.mep import NEB, NEBTools
from neb_cases import h2_band

from alchemi_lit.core.errors import StructureError
from alchemi_lit.data.bands import check_band
from alchemi_lit.io.bands import Band, highest_image
from alchemi_lit.report.bands import band_rows


@pytest.mark.parametrize("energies", [[0, 1, 1, 0.5, 0], [0, 0.2, 0.9, 0.9, -0.1], [0, 3, 1, 2, 1]])
def test_highest_image_is_the_one_ase_neb_climbs(energies: list[float]) -> None:
    """ASE's ``NEB.imax`` (the climbing image): the last of a tie among the interior."""
    images = h2_band(energies, [0] * len(energies))
    neb = NEB(images, climb=True, method="improvedtangent")
    neb.get_forces()
    band = Band(0, images)
    assert highest_image(np.array(energies)) == band.highest_image == neb.imax


BANDS = [[0, 1, 1, 0.5, 0], [0, 0.2, 0.5, 0.3, 0.9], [0.4, 0.2, 0.1, 0.3, 0.0], [0, 3, 1, 2, 1]]


@pytest.mark.parametrize("energies", BANDS)
def test_barriers_are_nebtools_and_never_negative(energies: list[float]) -> None:
    """Forward barrier as ``NEBTools.get_barrier(fit=False)``: the highest energy along the
    path, endpoints included.  A band that only climbs (or only falls) has no barrier the
    other way: 0, not the negative number the highest *interior* image gives; the
    report's rows, read from a store's per-system arrays, say the same."""
    images = h2_band(energies, [0] * len(energies))
    forward, reaction = NEBTools(images).get_barrier(fit=False)
    band = Band(0, images)
    assert band.forward_barrier == pytest.approx(forward, abs=1e-12)
    assert band.reaction_energy == pytest.approx(reaction, abs=1e-12)
    assert band.backward_barrier == pytest.approx(forward - reaction, abs=1e-12)
    assert min(band.forward_barrier, band.backward_barrier) >= 0
    systems = {"system_id": np.arange(len(energies))[::-1], "energy": np.array(energies)[::-1],
               "converged": np.ones(len(energies), bool), "exit_code": np.zeros(len(energies), int)}
    (row,) = band_rows(systems, np.zeros(len(energies), int))
    assert (row["forward_barrier"], row["backward_barrier"]) == (
        band.forward_barrier, band.backward_barrier)


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
