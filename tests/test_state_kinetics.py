"""Batch kinetics against ASE: kinetic energy and temperature per system (free atoms,
fixed atoms, every atom fixed) on the CPU and the accelerator path; cell volume."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.constraints import FixAtoms
from test_state import rich_structures, thermalize

from alchemi_lit import Batch
from alchemi_lit.testing import accelerator_path
from conftest import perturbed_argon, rng_for, triclinic_argon

DT = torch.float64


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu", "accelerator-path"])
@pytest.mark.parametrize("constrained", [True, False], ids=["fixed-atoms", "no-constraints"])
def test_temperature_and_kinetic_energy_match_ase(constrained: bool, accelerator: bool) -> None:
    """Per system and for the free atoms alone, against ASE; a batch without any fixed
    atom takes the CPU's shortcut (3 N degrees of freedom), the accelerator path never."""
    structures = rich_structures(seed=4)
    for k, atoms in enumerate(structures):
        if not constrained:
            del atoms.constraints
        thermalize(atoms, temperature_K=300 + 100 * k, rng=rng_for(k))
    batch = Batch.from_atoms(structures, dtype=DT)
    free = ~batch.fixed
    with accelerator_path() if accelerator else contextlib.nullcontext():
        ke, temp, ke_free = batch.kinetic_energy(), batch.temperature(), batch.kinetic_energy(free)
    for k, atoms in enumerate(structures):
        assert float(ke[k]) == pytest.approx(atoms.get_kinetic_energy(), rel=1e-12)
        assert float(temp[k]) == pytest.approx(atoms.get_temperature(), rel=1e-12)
        moving = atoms[~np.isin(np.arange(len(atoms)), fixed_indices(atoms))]
        assert float(ke_free[k]) == pytest.approx(moving.get_kinetic_energy(), rel=1e-12)


def fixed_indices(atoms: Atoms) -> list[int]:
    return [int(i) for c in atoms.constraints for i in c.index]


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu", "accelerator-path"])
def test_a_system_with_every_atom_fixed_has_zero_temperature(accelerator: bool) -> None:
    """No degree of freedom and no kinetic energy: 0 K, not 0/0 (ASE divides by zero)."""
    frozen = perturbed_argon(1, 1, 0.1, seed=9)[0]
    frozen.set_constraint(FixAtoms(indices=range(len(frozen))))
    moving = perturbed_argon(1, 1, 0.1, seed=10)[0]
    thermalize(moving, temperature_K=500, rng=rng_for(10))
    batch = Batch.from_atoms([frozen, moving], dtype=DT)
    with accelerator_path() if accelerator else contextlib.nullcontext():
        temp = batch.temperature()
    assert batch.degrees_of_freedom().tolist() == [0.0, 3.0 * len(moving)]
    assert float(temp[0]) == 0.0
    assert float(temp[1]) == pytest.approx(moving.get_temperature(), rel=1e-12)


def test_volume_of_a_left_handed_cell_is_positive_as_in_ase() -> None:
    left = triclinic_argon(1, 0.05, 0.05, seed=11)
    left.set_cell(left.cell.array[[1, 0, 2]], scale_atoms=False)  # det < 0
    assert np.linalg.det(left.cell.array) < 0
    batch = Batch.from_atoms([left, triclinic_argon(1, 0.05, 0.05, seed=12)], dtype=DT)
    assert float(batch.volume[0]) == pytest.approx(left.get_volume(), rel=1e-12)
    assert float(batch.volume[0]) > 0
