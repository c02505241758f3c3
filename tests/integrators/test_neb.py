"""``FIRE(band=NEB(...))`` and ``BFGS(band=NEB(...))`` against ASE's ``NEB`` with
``ase.optimize.FIRE`` / ``BFGS``, step for step, in float64.

The Au-on-Al(100) hop of ASE's NEB tutorial (EMT, 13 atoms, 3 moving images, the
bottom layers fixed) is relaxed by both codes; every image must agree to 1e-8 Å after
every one of 30 steps and the barrier (raw and ``NEBTools``-fitted) to 1e-6 eV, for
each tangent method with and without the climbing image, and with a climbing image
switched on mid-run (ASE: ``neb.climb = True`` between two ``run`` calls of one
optimizer).  Each case relaxes one band 30 steps with both codes (~1-2 s).
"""

from __future__ import annotations

import copy
import itertools
import warnings

import numpy as np
import pytest
import torch
from ase.geometry import find_mic
from ase.mep import NEB as AseNEB
from ase.mep import NEBTools
from ase.optimize import BFGS as AseBFGS
from ase.optimize import FIRE as AseFIRE
from neb_cases import tutorial_band
from test_md import Recorder

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.integrators import BFGS, FIRE, NEB
from alchemi_lit.integrators.band_forces import minimum_image
from alchemi_lit.models import EMT
from alchemi_lit.workflows import band_results, label_bands
from conftest import AseEMT

STEPS = 30
OURS = {"fire": FIRE, "bfgs": BFGS}
ASES = {"fire": AseFIRE, "bfgs": AseBFGS}


class CachedNEB(AseNEB):
    """ASE's NEB, its forces (and what computing them leaves on the band: energies,
    highest image, residuals) computed once per configuration of the band and climbing
    state: ASE's optimizers ask three times a step, each time redoing the tangents and
    springs -- the spline method's fits most of all -- for the same numbers bit for bit."""

    _LEFT = ("energies", "real_forces", "imax", "emax", "residuals")
    _forces_at: tuple = ()

    def get_forces(self):
        key = (tuple(image.positions.tobytes() for image in self.images), self.climb)
        if not self._forces_at or self._forces_at[0] != key:
            forces = super().get_forces()
            left = {name: copy.deepcopy(getattr(self, name)) for name in self._LEFT}
            self._forces_at = (key, forces, left)
        _, forces, left = self._forces_at
        for name, value in left.items():
            setattr(self, name, copy.deepcopy(value))
        return forces.copy()


def run_ours(images, optimizer: str, band: NEB, steps: int = STEPS):
    rec = Recorder(("positions",))
    stage = OURS[optimizer](fmax=0.05, max_steps=steps, band=band)
    sim = al.Simulator(model=EMT(), stages=stage, precision="64", seed=0, callbacks=[rec])
    return sim.run(label_bands([images])), rec


def ase_steps(images, optimizer: str, steps: int = STEPS, switch=None, **neb_kw):
    """ASE's positions of every image after each step (before the first included);
    ``switch(step, neb)`` may change the NEB between steps."""
    for img in images:
        img.calc = AseEMT()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        neb = CachedNEB(images, k=0.1, **neb_kw)
    opt = ASES[optimizer](neb, logfile=None)
    frames = []
    for k, _ in enumerate(opt.irun(fmax=0.05, steps=steps)):
        frames.append([img.positions.copy() for img in images])
        if switch is not None:
            switch(k, neb)
    return frames, neb


def compare(rec, frames, n_images: int) -> float:
    """Largest deviation of any interior image after any step; every step compared."""
    worst = 0.0
    for i in range(1, n_images - 1):
        ours = rec.trajectory(i)
        assert len(ours) == len(frames) - 1, (len(ours), len(frames))
        for k, mine in enumerate(ours, 1):
            worst = max(worst, float(np.abs(mine - frames[k][i]).max()))
    return worst


@pytest.mark.parametrize(
    "method,climb", list(itertools.product(("improvedtangent", "aseneb", "spline"), (True, False)))
)
def test_fire_on_a_band_equals_ase_neb_fire_step_for_step(method, climb):
    band = NEB(k=0.1, climb=climb, method=method)
    res, rec = run_ours(tutorial_band(), "fire", band)
    frames, neb = ase_steps(tutorial_band(), "fire", climb=climb, method=method)
    assert compare(rec, frames, 5) < 1e-8
    ours = band_results(res)[0]
    assert ours.steps == STEPS and not ours.converged
    raw, _ = NEBTools(neb.images).get_barrier(fit=False)
    fitted, d_e = NEBTools(neb.images).get_barrier(fit=True)
    assert abs(ours.forward_barrier - raw) < 1e-6
    assert abs(ours.fitted_barrier - fitted) < 1e-6
    assert abs(ours.reaction_energy - d_e) < 1e-6


@pytest.mark.parametrize("method", ("improvedtangent", "aseneb", "spline"))
def test_bfgs_on_a_band_equals_ase_neb_bfgs_until_converged(method):
    res, rec = run_ours(tutorial_band(), "bfgs", NEB(climb=True, method=method))
    frames, neb = ase_steps(tutorial_band(), "bfgs", climb=True, method=method)
    assert len(frames) - 1 < STEPS  # ASE converged: so must we, at the same step
    assert compare(rec, frames, 5) < 1e-8
    assert bool(res.converged.all()) and res.steps.tolist() == [0, *[len(frames) - 1] * 3, 0]
    fitted, _ = NEBTools(neb.images).get_barrier(fit=True)
    assert abs(band_results(res)[0].fitted_barrier - fitted) < 1e-6


def test_a_three_image_band_takes_the_spline_parabola_as_ase():
    _, rec = run_ours(tutorial_band(3), "fire", NEB(method="spline", climb=True), steps=10)
    frames, _ = ase_steps(tutorial_band(3), "fire", steps=10, method="spline", climb=True)
    assert compare(rec, frames, 3) < 1e-8


def test_a_delayed_climbing_image_equals_ase_switching_climb_on_mid_run():
    def after(k, neb):
        neb.climb = k >= 12  # after 12 steps: the 13th step on climbs

    _, rec = run_ours(tutorial_band(), "fire", NEB(climb=True, climb_after=12))
    frames, _ = ase_steps(tutorial_band(), "fire", switch=after, climb=False)
    assert compare(rec, frames, 5) < 1e-8
    # climb_fmax: ASE's run(fmax=0.3), climb = True, run on with the same optimizer
    _, rec = run_ours(tutorial_band(), "fire", NEB(climb=True, climb_fmax=0.3))
    images = tutorial_band()
    for img in images:
        img.calc = AseEMT()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        neb = CachedNEB(images, k=0.1, method="improvedtangent")
    opt, frames = AseFIRE(neb, logfile=None), []
    for _ in opt.irun(fmax=0.3, steps=STEPS):
        frames.append([img.positions.copy() for img in images])
    switched = len(frames) - 1
    assert 0 < switched < STEPS
    neb.climb = True
    for k, _ in enumerate(opt.irun(fmax=0.05, steps=STEPS - switched)):
        if k:
            frames.append([img.positions.copy() for img in images])
    assert compare(rec, frames, 5) < 1e-8


def test_minimum_image_displacements_equal_ase_find_mic_in_any_cell():
    """Images a small step apart but wrapped into other periodic images (triclinic
    cells, mixed pbc): the spring vector is the small step, as ASE's ``find_mic``."""
    rng = np.random.default_rng(3)
    for trial in range(40):
        cell = np.diag(rng.uniform(4, 8, 3)) + rng.uniform(-1.5, 1.5, (3, 3)) * (trial % 2)
        pbc = rng.random(3) < 0.7
        small = rng.uniform(-1, 1, (6, 3))
        d = small + (rng.integers(-2, 3, (6, 3)) * pbc) @ cell
        want, _ = find_mic(d, cell, pbc)
        got = minimum_image(
            torch.tensor(d)[None, None], torch.tensor(cell)[None], torch.tensor(pbc)[None]
        )[0, 0].numpy()
        assert np.abs(got - want).max() < 1e-9 and np.abs(got - small).max() < 1e-9


def test_bad_neb_settings_and_stages_are_refused():
    with pytest.raises(ConfigError, match="method must be one of"):
        NEB(method="string")
    with pytest.raises(ConfigError, match="add climb=True"):
        NEB(climb_after=5)
    with pytest.raises(ConfigError, match="give cell= or band="):
        FIRE(cell="frechet", band=NEB())
    with pytest.raises(ConfigError, match="band= needs mode='ase'"):
        FIRE(mode="mass_weighted", band=NEB())
    images = tutorial_band()  # no path_id
    sim = al.Simulator(model=EMT(), stages=FIRE(band=NEB()), precision="64")
    with pytest.raises(ConfigError, match=r"system 0 has no info\['path_id'\]"):
        sim.run(images)
    sim = al.Simulator(model=EMT(), stages=BFGS(band=NEB(), max_atoms=20), precision="64")
    with pytest.raises(ConfigError, match="raise max_atoms"):  # a band's 39 interior atoms
        sim.run(label_bands([tutorial_band()]))


def test_bands_a_spring_mapping_leaves_out_get_ase_default_k():
    """``k={path_id: k}``: a band not named springs with ASE's default constant (every
    run above passes one number for all, so none read this default)."""
    batch = al.Batch.from_atoms(label_bands([tutorial_band()]), dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ase_k = AseNEB(tutorial_band()).k
    assert NEB().k == ase_k[0]
    for k, want in (({7: 0.3}, ase_k), ({0: 0.3}, [0.3] * 4)):
        band = NEB(k=k)
        band.declare(batch)
        assert band.k_of(batch, torch.tensor([[1, 2, 3]]), 5).tolist() == [want], k
