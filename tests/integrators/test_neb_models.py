"""A band runs on any model (issue #27 part 4): an ASE calculator wrapped by
``ASECalculatorModel``, the built-in Lennard-Jones and a TorchSim model give the same
band steps as ASE's ``NEB`` + ``FIRE`` with the same potential (or, for TorchSim, as the
built-in model it implements), 12 steps of the tutorial hop, every image, 1e-8 Å."""

from __future__ import annotations

import importlib.util

import pytest
from ase.calculators.emt import EMT as AseEMT
from ase.calculators.lj import LennardJones as AseLJ
from neb_cases import tutorial_band
from test_md import Recorder
from test_neb import ase_steps, compare

import alchemi_lit as al
from alchemi_lit.integrators import FIRE, NEB
from alchemi_lit.models import ASECalculatorModel, LennardJones
from alchemi_lit.workflows import label_bands

STEPS = 12
LJ = dict(sigma=2.6, epsilon=0.06, cutoff=6.0)


def band_steps(model, images):
    rec = Recorder(("positions",))
    stage = FIRE(fmax=0.05, max_steps=STEPS, band=NEB(k=0.1, climb=True))
    al.Simulator(model=model, stages=stage, precision="64", callbacks=[rec]).run(
        label_bands([images])
    )
    return rec


def ase_lj():
    return AseLJ(sigma=LJ["sigma"], epsilon=LJ["epsilon"], rc=LJ["cutoff"])


@pytest.mark.parametrize(
    "ours,theirs",
    [(lambda: ASECalculatorModel(AseEMT), AseEMT), (lambda: LennardJones(**LJ), ase_lj)],
    ids=["ASECalculatorModel-EMT", "LennardJones"],
)
def test_a_band_on_any_model_equals_ase_neb_with_its_calculator(ours, theirs, monkeypatch):
    import test_neb

    monkeypatch.setattr(test_neb, "AseEMT", theirs)  # ase_steps attaches this calculator
    frames, _ = ase_steps(tutorial_band(), "fire", steps=STEPS, climb=True)
    rec = band_steps(ours(), tutorial_band())
    assert compare(rec, frames, 5) < 1e-8


@pytest.mark.skipif(importlib.util.find_spec("torch_sim") is None, reason="needs torch-sim")
def test_a_band_on_a_torchsim_model_equals_ase_neb_driving_that_model(monkeypatch):
    """TorchSim's Lennard-Jones (unshifted, unlike ours and ASE's) through the plugin,
    against ASE's NEB + FIRE calling the same TorchSim model on one image at a time."""
    import test_neb
    import torch
    import torch_sim as ts
    from alchemi_lit_torchsim import TorchSimModel
    from ase.calculators.calculator import Calculator, all_changes
    from torch_sim.models.lennard_jones import LennardJonesModel

    def lj():
        return LennardJonesModel(**LJ, dtype=torch.float64, compute_stress=True)

    class TorchSimCalculator(Calculator):
        implemented_properties = ("energy", "forces")

        def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
            super().calculate(atoms, properties, system_changes)
            out = lj()(ts.initialize_state([self.atoms], torch.device("cpu"), torch.float64))
            self.results = {"energy": float(out["energy"][0]),
                            "forces": out["forces"].detach().numpy().copy()}  # fmt: skip

    def periodic():  # (TorchSim 0.3 takes one pbc flag for all three axes)
        images = tutorial_band()
        for img in images:
            img.pbc = True
        return images

    monkeypatch.setattr(test_neb, "AseEMT", TorchSimCalculator)
    frames, _ = ase_steps(periodic(), "fire", steps=STEPS, climb=True)
    rec = band_steps(TorchSimModel(lj()), periodic())
    assert compare(rec, frames, 5) < 1e-8
