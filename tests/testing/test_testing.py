"""alchemi_lit.testing: the contract checks pass on the built-ins and catch breakage."""

from __future__ import annotations

import os

import pytest
from ase.build import bulk

from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import EMT, LennardJones
from alchemi_lit.testing import check_integrator, check_model, check_pipeline_equals_fused
from alchemi_lit.testing.integrators import argon, check_masked_systems_untouched
from alchemi_lit.testing.models import check_forces_are_the_energy_gradient


@pytest.mark.parametrize(
    "make",
    [lambda: FIRE(fmax=0.05, max_steps=20), lambda: Langevin(dt=2.0, temperature=60.0, steps=12)],
    ids=["FIRE", "Langevin"],
)
def test_built_in_integrators_keep_the_contract(tmp_path, make):
    check_integrator(make, tmp_path)


class Leaky(Langevin):
    """Writes every system's velocities, not only those of its stage."""

    def pre_update(self, batch, mask):
        super().pre_update(batch, mask)
        batch.velocities = batch.velocities * 1.0001


def test_a_leaking_integrator_is_caught():
    with pytest.raises(AssertionError, match="changed field 'velocities' of systems outside"):
        check_masked_systems_untouched(
            Leaky(dt=2.0, temperature=60.0, steps=5), LennardJones(0.0104, 3.40, 6.0), argon()
        )


def crystals() -> list:
    cu = bulk("Cu", "fcc", a=3.65, cubic=True).repeat((2, 1, 1))
    cu.rattle(0.05, seed=1)
    au = bulk("Au", "fcc", a=4.05) * (2, 2, 2)
    au.rattle(0.05, seed=2)
    au.set_cell(au.cell.array @ [[1.01, 0.02, 0], [0, 0.99, 0], [0, 0, 1]], scale_atoms=True)
    return [cu, au]


@pytest.mark.parametrize("model", [EMT(), LennardJones(0.4, 2.3, 5.0)], ids=["EMT", "LennardJones"])
def test_built_in_models_keep_the_contract(model):
    check_model(model, crystals())


class HalfForces(LennardJones):
    def forward(self, batch, compute_stress=None, neighbors=None):
        out = super().forward(batch, compute_stress=compute_stress, neighbors=neighbors)
        return {**out, "forces": out["forces"] * 0.5}


def test_forces_that_are_not_the_energy_gradient_are_caught():
    with pytest.raises(AssertionError, match="force on atom 0 along x"):
        check_forces_are_the_energy_gradient(HalfForces(0.4, 2.3, 5.0), crystals())


class Drifting(LennardJones):
    """Gives other energies in a forked rank than at home (a model that does not travel)."""

    def __init__(self) -> None:
        super().__init__(0.0104, 3.40, 6.0)
        self.home = os.getpid()

    def forward(self, batch, **kw):
        out = super().forward(batch, **kw)
        if os.getpid() != self.home:
            out["energy"] = out["energy"] + 1e-9
        return out


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_the_pipeline_check_passes_on_a_built_in_and_catches_a_model_that_drifts():
    check_pipeline_equals_fused(LennardJones(0.0104, 3.40, 6.0), argon(2))
    with pytest.raises(AssertionError, match="energy: the pipeline's results differ"):
        check_pipeline_equals_fused(Drifting(), argon(2))
