"""Kinetic energy, temperature and cell volume (``alchemi_lit.core.system_sums``): the
CPU kernels equal their torch references bit for bit, and both equal ASE."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk, molecule
from ase.constraints import FixAtoms, FixedPlane

from alchemi_lit.core import system_sums
from alchemi_lit.core.state import Batch

pytest.importorskip("numba")


def structures() -> list:
    """A crystal, a molecule with fixed atoms and one in a plane (removed DOF), a
    single atom: systems of different sizes and degrees of freedom."""
    rng = np.random.default_rng(0)
    cu = bulk("Cu", "fcc", a=3.6) * (2, 2, 2)
    water = molecule("H2O", vacuum=3.0)
    water.set_constraint(FixAtoms([0]))
    ch4 = molecule("CH4", vacuum=3.0)
    ch4.set_constraint(FixedPlane([1, 2], [0.0, 0.0, 1.0]))
    lone = bulk("Ar", "sc", a=4.0)
    out = [cu, water, ch4, lone]
    for a in out:
        a.set_velocities(rng.normal(size=(len(a), 3)) * 0.02)
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernels_equal_the_references_bit_for_bit(dtype: torch.dtype) -> None:
    b = Batch.from_atoms(structures(), dtype=dtype)
    v, m, seg = b.atom["velocities"], b.atom["masses"], b.segments
    some = torch.arange(b.num_atoms) % 3 != 0
    fixed, removed = b.atom["fixed"], b.system["constraint_dof"]
    for primitive, args in (
        (system_sums.kinetic_energy, (v, m, seg)),
        (system_sums.kinetic_energy, (v, m, seg, some)),
        (system_sums.temperature, (v, m, seg, b.n_atoms, fixed, removed)),
        (system_sums.temperature, (v, m, seg, b.n_atoms, None, None)),
        (system_sums.cell_volume, (b.cell,)),
    ):
        assert primitive.choose(*args) == "numba"
        got, want = primitive(*args), primitive.reference(*args)
        assert got.dtype == want.dtype == dtype and torch.equal(got, want), primitive


@pytest.mark.parametrize("reference", [False, True])
def test_temperature_kinetic_energy_and_volume_equal_ases(reference: bool, monkeypatch) -> None:
    """``get_temperature`` (ASE's removed degrees of freedom: FixAtoms, FixedPlane),
    ``get_kinetic_energy`` and ``get_volume`` of each structure, on both paths."""
    if reference:
        for p in (system_sums.kinetic_energy, system_sums.temperature, system_sums.cell_volume):
            monkeypatch.setattr(p, "implementations", [])
    atoms = structures()
    b = Batch.from_atoms(atoms, dtype=torch.float64)
    t, ke, vol = b.temperature().numpy(), b.kinetic_energy().numpy(), b.volume.numpy()
    for k, a in enumerate(atoms):
        np.testing.assert_allclose(t[k], a.get_temperature(), rtol=1e-13)
        np.testing.assert_allclose(ke[k], a.get_kinetic_energy(), rtol=1e-13)
        np.testing.assert_allclose(vol[k], a.get_volume(), rtol=1e-13)


def test_volume_of_left_handed_sheared_and_flat_cells() -> None:
    g = torch.Generator().manual_seed(3)
    cells = torch.randn(6, 3, 3, generator=g, dtype=torch.float64)
    cells[1] = -cells[1]  # (left-handed: |det| all the same)
    cells[2, 2] = cells[2, 0] + cells[2, 1]  # (three vectors in a plane)
    cells[3] = 0.0  # (no cell)
    want = torch.linalg.det(cells).abs()
    for got in (system_sums.cell_volume(cells), system_sums.cell_volume.reference(cells)):
        torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
        assert got[3] == 0.0
