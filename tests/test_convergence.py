"""Convergence criteria: per system, combinable, step budgets reported as not converged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import alchemi_lit as al
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import FIRE
from alchemi_lit.integrators.convergence import EnergyChange, ForceMax
from alchemi_lit.models import LennardJones


def lj() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0)


def test_force_max_is_per_system_and_strict() -> None:
    batch = al.Batch.from_atoms(argon_crystals(3, 1, seed=0))
    batch.forces = torch.zeros_like(batch.forces)
    batch.forces[batch.ptr[1], 0] = 0.05  # system 1: exactly fmax -> not converged (ASE: <)
    batch.forces[batch.ptr[2], 1] = 0.01
    assert ForceMax(0.05)(batch).tolist() == [True, False, True]


def test_energy_change_criterion_stops_when_energy_settles() -> None:
    data = argon_crystals(4, 2, noise=0.1, seed=1)
    tol = 1e-6
    crit = EnergyChange(tol, per_atom=True)
    res = al.Simulator(model=lj(), stages=FIRE(max_steps=400, criterion=crit), sync_every=1).run(
        data
    )
    assert res.exit_reasons == ["converged"] * 4
    # an uncombined force criterion at a tight fmax needs more steps than the energy one
    tight = al.Simulator(model=lj(), stages=FIRE(fmax=1e-4, max_steps=400), sync_every=1).run(data)
    assert (res.steps <= tight.steps).all()


def test_combined_criteria_and_or() -> None:
    data = argon_crystals(3, 2, noise=0.1, seed=2)
    both = FIRE(max_steps=400, criterion=ForceMax(0.01) & EnergyChange(1e-7))
    either = FIRE(max_steps=400, criterion=ForceMax(0.01) | EnergyChange(1e-7))
    r_and = al.Simulator(model=lj(), stages=both, sync_every=1).run(data)
    r_or = al.Simulator(model=lj(), stages=either, sync_every=1).run(data)
    assert (r_or.steps <= r_and.steps).all()
    for atoms in r_and.to_atoms():
        assert np.linalg.norm(atoms.get_forces(), axis=1).max() < 0.01
    assert repr(both.criterion) == "ForceMax(0.01) & EnergyChange(1e-07)"


def test_step_budget_reported_as_not_converged() -> None:
    res = al.Simulator(model=lj(), stages=FIRE(fmax=1e-6, max_steps=5)).run(
        argon_crystals(2, 2, noise=0.2, seed=3)
    )
    assert res.exit_reasons == ["max_steps", "max_steps"]
    assert not bool(res.converged.any()) and res.steps.tolist() == [5, 5]
    assert [a.info["converged"] for a in res.to_atoms()] == [False, False]


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_bad_thresholds_raise(bad: float) -> None:
    with pytest.raises(ValueError, match="fmax"):
        ForceMax(bad)
    with pytest.raises(ValueError, match="tolerance"):
        EnergyChange(bad)
