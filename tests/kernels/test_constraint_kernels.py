"""The constraint kinds' numba kernels (``alchemi_lit.kernels.constraints``) against their
torch references, on one batch carrying every kernel's kind, periodic and open systems.

Tolerance: 1e-12 (Å, Å/fs, eV/Å, eV) -- the kernels add the references' terms in the
same order, but torch's ``norm`` and fused vector operations may round an ulp apart,
and a SHAKE sweep feeds such an ulp to the next.  Decisions (which bond is corrected,
which spring pulls) must match: a wrong one would differ by far more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.constraints import (
    ExternalForce,
    FixBondLengths,
    FixCartesian,
    FixCom,
    FixedLine,
    FixedPlane,
    Hookean,
)

from alchemi_lit.core import constraint_bonds as bonds
from alchemi_lit.core.constraint_bonds import rattle, rattle_forces, shake
from alchemi_lit.core.constraint_forces import pull_terms, spring_terms
from alchemi_lit.core.constraint_kinds import (
    COM_FORCES,
    COM_POSITIONS,
    COM_VELOCITIES,
    axis_positions,
    axis_project,
    fix_com,
)
from alchemi_lit.core.errors import StructureError
from alchemi_lit.core.state import Batch
from alchemi_lit.integrators.constrain import drift_velocities
from conftest import perturbed_argon

pytest.importorskip("numba")
TOL = 1e-12


def systems() -> list:
    """Three 32-atom argon systems (two periodic, one open) with every kernel's kinds,
    links that cross the periodic boundary, and a rigid bond chain (one atom in two)."""
    out = perturbed_argon(3, 2, 0.08, seed=4)
    out[2].pbc = False
    for k, a in enumerate(out):
        far = int(np.argmax(np.linalg.norm(a.positions - a.positions[0], axis=1)))
        a.set_constraint([
            FixCartesian([1, 2], mask=(True, False, True)),
            FixedPlane([3], direction=(1.0, 2.0, -0.5)),
            FixedLine([4], direction=(0.3, -1.0, 0.2)),
            Hookean(0, far, k=3.0, rt=1.0),  # (across the cell: its minimum image is short)
            Hookean(5, a.positions[5] + (0.4, 0.1, 0.0), k=2.0, rt=0.1),
            Hookean(6, (0.0, 0.0, 1.0, -a.positions[6, 2] + 0.05 * k), k=4.0),
            ExternalForce(7, far - 1, 0.05),
            FixBondLengths([(8, 9), (9, 10), (10, 11), (12, far - 2)]),
        ])  # fmt: skip
    return out


def batch_of(atoms: list, seed: int = 0) -> Batch:
    batch = Batch.from_atoms(atoms)
    g = torch.Generator().manual_seed(seed)
    batch.velocities = torch.randn(batch.positions.shape, generator=g, dtype=batch.dtype) * 0.02
    batch.forces = torch.randn(batch.positions.shape, generator=g, dtype=batch.dtype)
    return batch


def both(prim, *args):
    assert prim.choose(*args) == "numba"
    return prim(*args), prim.reference(*args)


ACTIVE = torch.tensor([True, False, True])  # (the second system is left alone)


def test_axis_kernels_equal_the_reference() -> None:
    batch = batch_of(systems())
    new = batch.positions + 0.05 * torch.randn_like(batch.positions)
    got, want = both(axis_positions, batch, batch.positions, new, ACTIVE)
    assert (got - want).abs().max() < TOL and not torch.equal(got, new)
    assert torch.equal(got[32:64], new[32:64])
    for f in (batch.forces, batch.velocities):
        got, want = both(axis_project, batch, f, ACTIVE)
        assert (got - want).abs().max() < TOL and torch.equal(got[32:64], f[32:64])


@pytest.mark.parametrize("prim", [spring_terms, pull_terms])
def test_force_kernels_equal_the_reference(prim) -> None:
    batch = batch_of(systems())
    (force, energy), (force_ref, energy_ref) = both(prim, batch, ACTIVE)
    assert (force - force_ref).abs().max() < TOL and (energy - energy_ref).abs().max() < TOL
    assert force.abs().sum() > 0 and energy.abs().sum() > 0  # (the springs do pull)
    assert not force[32:64].any() and not energy[32:64].any()


def test_shake_and_rattle_kernels_equal_the_reference_and_hold_the_bonds() -> None:
    batch = batch_of(systems())
    new = batch.positions + 0.02 * torch.randn_like(batch.positions)
    got, want = both(shake, batch, batch.positions, new, ACTIVE)
    assert (got - want).abs().max() < TOL and torch.equal(got[32:64], new[32:64])
    batch.positions = got
    forces, forces_ref = both(rattle_forces, batch, batch.forces, ACTIVE)
    assert (forces - forces_ref).abs().max() < TOL
    assert torch.equal(forces[32:64], batch.forces[32:64]) and not torch.equal(forces, batch.forces)
    got, want = both(rattle, batch, batch.velocities, ACTIVE)
    assert (got - want).abs().max() < TOL and torch.equal(got[32:64], batch.velocities[32:64])
    for a in (0, 2):  # each bond at its length, no relative velocity along it
        rows, cols = np.nonzero(batch.bond_length[32 * a : 32 * (a + 1)].numpy())
        for i, c in zip(rows + 32 * a, cols):
            j = i + int(batch.bond_offset[i, c])
            d = batch.positions[i] - batch.positions[j]
            if a == 0:  # (periodic: the bond may cross the cell, compare its image)
                d = d - torch.round(d @ torch.linalg.inv(batch.cell[0])) @ batch.cell[0]
            assert abs(float(d.norm()) - float(batch.bond_length[i, c])) < 1e-10
            assert abs(float((got[i] - got[j]) @ d)) < 1e-10


def test_a_system_swept_alone_equals_it_in_its_batch() -> None:
    """Each system sweeps to its own convergence: its result is its own (#41)."""
    atoms = systems()
    batch, alone = batch_of(atoms), batch_of(atoms[2:])
    alone.positions = batch.positions[64:].clone()
    step = 0.02 * torch.randn_like(batch.positions)
    every = torch.ones(3, dtype=torch.bool)
    together = shake(batch, batch.positions, batch.positions + step, every)
    single = shake(alone, alone.positions, alone.positions + step[64:], every[:1])
    assert torch.equal(together[64:], single)


@pytest.mark.parametrize("use", ["numba", "torch"])
def test_unconverged_sweeps_raise_naming_the_system(monkeypatch, use: str) -> None:
    monkeypatch.setattr(bonds, "MAX_SWEEPS", 1)  # (a chain needs more than one sweep)
    batch = batch_of(systems())
    new = batch.positions + 0.05 * torch.randn_like(batch.positions)
    run = shake if use == "numba" else shake.reference
    with pytest.raises(StructureError, match="system 0: FixBondLengths positions"):
        run(batch, batch.positions, new, ACTIVE)


def test_fix_com_kernel_equals_the_reference() -> None:
    atoms = perturbed_argon(3, 2, 0.08, seed=5)  # (FixCom goes with forces only)
    for a in atoms[1:]:  # (the first: no FixCom, untouched)
        a.set_constraint([FixCom(), Hookean(0, 1, k=1.0, rt=2.0)])
    batch = batch_of(atoms)
    batch.masses = batch.masses * (1.0 + 0.5 * torch.rand(len(batch.masses), dtype=batch.dtype))
    every = torch.ones(3, dtype=torch.bool)
    new = batch.positions + 0.05 * torch.randn_like(batch.positions)
    cases = [(new, batch.positions, COM_POSITIONS), (batch.velocities, batch.velocities,
             COM_VELOCITIES), (batch.forces, batch.forces, COM_FORCES)]  # fmt: skip
    for values, ref, what in cases:
        got, want = both(fix_com, batch, values, ref, what, every)
        assert (got - want).abs().max() < TOL and torch.equal(got[:32], values[:32])
        assert not torch.equal(got[32:], values[32:])


@pytest.mark.parametrize("per_system", [False, True])
def test_drift_velocities_kernel_equals_the_reference(per_system: bool) -> None:
    batch = batch_of(systems())
    new = batch.positions + 0.05 * torch.randn_like(batch.positions)
    dt = torch.tensor([1.0, 2.0, 0.5], dtype=batch.dtype) if per_system else 2.0
    got, want = both(drift_velocities, batch, batch.velocities, new, batch.positions, dt, ACTIVE)
    assert (got - want).abs().max() < TOL and torch.equal(got[32:64], batch.velocities[32:64])
    assert not torch.equal(got[:32], batch.velocities[:32])


def test_minimum_images_in_sheared_cells_equal_the_reference() -> None:
    """Springs to points up to 8 Å away in sheared cells (periodic in three and in two
    axes): the kernel's minimum image -- the wrapped vector where it is short enough
    to be the shortest, else the 27-image search -- is the torch reference's."""
    gen = np.random.default_rng(0)
    out = perturbed_argon(2, 2, 0.08, seed=6)
    for a, pbc in zip(out, [(True, True, True), (True, False, True)]):
        cell = a.cell.array.copy()
        cell[1] += 0.45 * cell[0]
        cell[2] += 0.3 * cell[0] - 0.2 * cell[1]
        a.set_cell(cell, scale_atoms=True)
        a.pbc = pbc
        targets = a.positions + gen.uniform(-8.0, 8.0, (len(a), 3))
        a.set_constraint([Hookean(i, tuple(t), k=1.0, rt=0.0) for i, t in enumerate(targets)])
    batch = batch_of(out)
    (force, energy), (force_ref, energy_ref) = both(
        spring_terms, batch, torch.ones(2, dtype=torch.bool)
    )
    assert (force - force_ref).abs().max() < TOL and (energy - energy_ref).abs().max() < TOL
