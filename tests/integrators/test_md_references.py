"""MD integrators and barostats against references where the broad trajectory tests of
``test_md`` and ``test_npt`` look the same whichever way a detail goes: plans of stages
with different time steps or chain lengths, Berendsen's momentum removal (unequal masses,
a drifting system) and its clamped scaling far from the target, Nosé-Hoover chains of
other Suzuki-Yoshida orders, time constants given per system, the run seed of the
initial velocities, the barostats' ``exprel`` at 0, their pressure tensor with an
unsymmetric stress and their refusal of slabs.

References: ASE's ``VelocityVerlet``, ``NVTBerendsen``, ``Bussi``, ``NoseHooverChainNVT``,
``IsotropicMTKNPT`` and ``LangevinBAOAB`` (trajectories in float64 to 1e-8 Å, as in
``test_md``; the stochastic ones fed our keyed normals), ``test_npt``'s transcription of
the C-rescale authors' scheme, ASE's stress with the ideal-gas term, SciPy's ``exprel``,
and analytic conditions (the Suzuki-Yoshida weights).  Systems are small, runs short.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
import torch
from ase import units
from ase.calculators.singlepoint import SinglePointCalculator
from ase.md import nose_hoover_chain as ase_nhc
from ase.md.bussi import Bussi as AseBussi
from ase.md.langevinbaoab import LangevinBAOAB
from ase.md.nose_hoover_chain import IsotropicMTKNPT, NoseHooverChainNVT
from ase.md.nvtberendsen import NVTBerendsen
from ase.md.verlet import VelocityVerlet as AseVV
from test_md import BussiNoise, ase_lj, max_deviation, moving_argon, simulate
from test_npt import BarostatNoise, crescale_reference
from test_npt import ase_lj as npt_ase_lj
from test_npt import simulate as npt_simulate

from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import Batch
from alchemi_lit.core.units import kB
from alchemi_lit.integrators import (
    MTKNPT,
    Berendsen,
    Bussi,
    CRescale,
    NoseHooverChain,
    NPTLangevin,
    VelocityVerlet,
    maxwell_boltzmann,
)
from alchemi_lit.integrators.barostat import exprel, instantaneous_pressure, pressure_tensor
from alchemi_lit.integrators.formulas import SUZUKI_YOSHIDA
from conftest import argon_bulk


def test_stages_with_different_time_steps_each_use_their_own(code_path) -> None:
    """``VelocityVerlet(dt=2) + VelocityVerlet(dt=5)`` follows ASE's velocity Verlet run
    three steps at 2 fs, then three at 5 fs.  Every built-in integrator kicks by ``dt/2``
    throughout a stage, so only a second stage with another ``dt`` shows whether the
    kept ``dt/m`` factors are keyed by the time step."""
    atoms = moving_argon(1, seed=8)[0]
    plan = VelocityVerlet(dt=2.0, steps=3) + VelocityVerlet(dt=5.0, steps=3)
    _, rec = simulate([atoms], plan)
    ours = rec.trajectory(0)
    assert len(ours) == 6
    ref = atoms.copy()
    ref.calc = ase_lj()
    assert max_deviation(AseVV(ref, timestep=2.0 * units.fs), ref, ours[:3]) < 1e-8
    assert max_deviation(AseVV(ref, timestep=5.0 * units.fs), ref, ours[3:]) < 1e-8


@pytest.mark.parametrize("fixcm", [True, False], ids=["fixcm", "no-fixcm"])
def test_berendsen_momentum_removal_follows_ase_with_unequal_masses(fixcm: bool, code_path) -> None:
    """A drifting system of two masses (every other atom 10 amu): with ``fixcm`` ASE
    removes the mean *momentum* ``sum(p)/N`` from every atom (not the centre-of-mass
    velocity, which differs when masses do), without it the drift stays.  Every other
    Berendsen run has one mass and no total momentum, where all three agree.  On both
    code paths (the CPU kernels' kicks, the accelerator's torch ones)."""
    atoms = moving_argon(1, temperature=60.0, seed=9)[0]
    masses = atoms.get_masses()
    masses[::2] = 10.0
    velocities = atoms.get_velocities() + np.array([2e-3, -1e-3, 5e-4])
    atoms.set_masses(masses)
    atoms.set_velocities(velocities)
    steps = 6
    stage = Berendsen(dt=4.0, temperature=90.0, taut=20.0, steps=steps, fixcm=fixcm)
    res, rec = simulate([atoms], stage)
    ref = atoms.copy()
    ref.calc = ase_lj()
    dyn = NVTBerendsen(ref, 4.0 * units.fs, temperature_K=90.0, taut=20.0 * units.fs,
                       fixcm=fixcm)  # fmt: skip
    assert max_deviation(dyn, ref, rec.trajectory(0)) < 1e-8
    assert np.abs(ref.get_velocities() - res.to_atoms()[0].get_velocities()).max() < 1e-8


def test_suzuki_yoshida_weights_meet_the_order_conditions() -> None:
    """Yoshida's symmetric compositions (Phys. Lett. A 150, 262 (1990)): the weights
    sum to 1 (consistency) and, for 3 and 5 stages, their cubes sum to 0 (the
    third-order error cancels, giving fourth order); 5 stages are ``w, w, 1 - 4w, w,
    w`` with ``w = 1/(4 - 4^(1/3))``."""
    assert SUZUKI_YOSHIDA[1] == (1.0,)
    for order in (3, 5):
        w = np.array(SUZUKI_YOSHIDA[order])
        assert len(w) == order
        assert abs(w.sum() - 1.0) < 1e-14
        assert abs((w**3).sum()) < 1e-14
        assert np.array_equal(w, w[::-1])  # symmetric: time-reversible
    w5 = 1.0 / (4.0 - 4.0 ** (1.0 / 3.0))
    np.testing.assert_allclose(SUZUKI_YOSHIDA[5], [w5, w5, 1 - 4 * w5, w5, w5], rtol=1e-15)


#: Yoshida's weights, written out here (not read from alchemi_lit) for ASE's chain
YOSHIDA = {1: [1.0], 5: [1 / (4 - 4 ** (1 / 3))] * 2 + [1 - 4 / (4 - 4 ** (1 / 3))]
           + [1 / (4 - 4 ** (1 / 3))] * 2}  # fmt: skip


@pytest.mark.parametrize("order", [1, 5])
def test_nose_hoover_chain_of_another_order_follows_ase_with_those_weights(
    order: int, code_path, monkeypatch
) -> None:
    """``suzuki_yoshida=1`` and ``5`` against ASE's ``NoseHooverChainNVT`` with its
    Suzuki-Yoshida weights replaced by those orders' (ASE only has 3, the only order the
    other tests run), on the CPU kernels and on the accelerator's torch path."""
    monkeypatch.setattr(ase_nhc, "FOURTH_ORDER_COEFFS", YOSHIDA[order])
    atoms = moving_argon(1, temperature=40.0, seed=10)[0]
    steps = 8
    stage = NoseHooverChain(dt=5.0, temperature=80.0, tdamp=15.0, chain_length=2,
                            suzuki_yoshida=order, steps=steps)  # fmt: skip
    _, rec = simulate([atoms], stage)
    ref = atoms.copy()
    ref.calc = ase_lj()
    dyn = NoseHooverChainNVT(ref, 5.0 * units.fs, 80.0, tdamp=15.0 * units.fs, tchain=2)
    assert max_deviation(dyn, ref, rec.trajectory(0)) < 1e-8


def test_exprel_is_scipys_and_one_at_zero() -> None:
    """``(e^x - 1)/x`` of MTK's exact flows against SciPy's ``exprel``, 0 included (a
    cell momentum exactly at rest, as every barostat starts): the quotient is ill
    conditioned near 0 only through ``expm1``'s own rounding, so 4 ulps."""
    x = torch.tensor([0.0, -0.0, 1e-300, 1e-12, -3e-8, 0.25, -2.0, 7.5], dtype=torch.float64)
    np.testing.assert_allclose(exprel(x).numpy(), scipy.special.exprel(x.numpy()), rtol=1e-15)
    assert float(exprel(torch.zeros(1, dtype=torch.float64))[0]) == 1.0


def test_a_slab_is_refused_by_an_npt_stage() -> None:
    """NPT needs a cell periodic in x, y and z: a slab periodic in x and y only, with a
    cell of finite volume (vacuum above it), is refused with the reason, as a cluster
    is (``test_npt``)."""
    good, slab = moving_argon(2, seed=12)
    slab.pbc = (True, True, False)
    assert slab.get_volume() > 100.0
    with pytest.raises(ConfigError, match="periodic in x, y and z"):
        simulate([good, slab], MTKNPT(dt=2.0, temperature=60.0, steps=2))


def test_pressure_tensor_is_ases_with_an_unsymmetric_stress() -> None:
    """The barostats' instantaneous pressure tensor is ASE's
    ``-atoms.get_stress(voigt=False, include_ideal_gas=True)``: ASE stores a 3x3 stress
    as its symmetric part (Voigt), so an unsymmetric model stress (autograd through a
    general strain can give one) enters symmetrised; the ideal-gas term with two masses.
    Every model in the other tests has a symmetric stress."""
    atoms = moving_argon(1, temperature=80.0, seed=14)[0]
    masses = atoms.get_masses()
    masses[::3] = 4.0
    atoms.set_masses(masses)
    sigma = np.random.default_rng(15).normal(scale=1e-3, size=(3, 3))  # eV/Å^3
    assert np.abs(sigma - sigma.T).max() > 1e-4
    atoms.calc = SinglePointCalculator(atoms, stress=sigma)
    expected = -atoms.get_stress(voigt=False, include_ideal_gas=True)
    batch = Batch.from_atoms([atoms])
    batch.stress = torch.from_numpy(sigma)[None]
    # sums of 32 terms of similar size: a few ulps of the largest
    np.testing.assert_allclose(pressure_tensor(batch)[0].numpy(), expected, rtol=0, atol=1e-17)
    pressure = float(instantaneous_pressure(batch)[0])
    assert abs(pressure - np.trace(expected) / 3.0) < 1e-17


def test_crescale_per_system_compressibility_follows_the_reference() -> None:
    """``compressibility`` one per system (indexed by ``system_id``, the systems in the
    batch in reverse order): each system follows the authors' scheme (``test_npt``'s
    transcription of SimpleMD) at its own.  The other C-rescale runs give one number."""
    systems = moving_argon(2, temperature=60.0, seed=1)
    betas, steps = [2.0, 0.5], 6
    params = dict(temperature=80.0, taut=40.0, taup=200.0)
    stage = CRescale(dt=5.0, pressure_gpa=0.1, compressibility=betas, steps=steps, **params)
    _, rec = npt_simulate(systems, stage)
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = npt_ase_lj()
        ref = crescale_reference(atoms, k, steps, True, dt=5.0, pressure_gpa=0.1,
                                 compressibility=betas[k], **params)  # fmt: skip
        for t, (positions, cell) in enumerate(ref, start=1):
            frame = rec.data[k][t]
            assert np.abs(positions - frame["positions"]).max() < 1e-8, (k, t)
            assert np.abs(cell - frame["cell"]).max() < 1e-8, (k, t)


def test_berendsen_clamps_its_scaling_as_ase_far_from_the_target(code_path) -> None:
    """Far from the target ASE's NVTBerendsen clamps the velocity scaling to [0.9, 1.1]:
    with ``dt/taut = 1/2`` a cold system (~60 K, target 900 K: ``sqrt(1 + 14 / 2)`` ≈
    2.8) heats by 1.1 and a hot one (target 2 K: ``sqrt(1 - 0.97 / 2)`` ≈ 0.72) cools by
    0.9 per step; both bounds against ASE step for step, per-system targets.  The other
    Berendsen runs stay near their targets, inside the bounds."""
    systems = moving_argon(2, temperature=60.0, seed=16)
    targets, steps = [900.0, 2.0], 4
    stage = Berendsen(dt=5.0, temperature=targets, taut=10.0, steps=steps)
    _, rec = simulate(systems, stage)
    for k, atoms in enumerate(systems):
        ref = atoms.copy()
        ref.calc = ase_lj()
        dyn = NVTBerendsen(ref, 5.0 * units.fs, temperature_K=targets[k], taut=10.0 * units.fs)
        assert max_deviation(dyn, ref, rec.trajectory(k)) < 1e-8


def test_a_chain_of_another_length_in_the_next_stage_is_its_own() -> None:
    """``NoseHooverChain(chain_length=3) + NoseHooverChain(chain_length=1)`` on one
    batch: the second stage runs a chain of one from rest, as a fresh ASE
    ``NoseHooverChainNVT(tchain=1)`` does after ASE's three steps with ``tchain=3``.
    The chain's fields are named by its length, so the second stage cannot pick up
    the first one's three members."""
    atoms = moving_argon(1, temperature=40.0, seed=17)[0]
    plan = NoseHooverChain(dt=5.0, temperature=80.0, tdamp=15.0, chain_length=3, steps=3)
    plan = plan + NoseHooverChain(dt=5.0, temperature=80.0, tdamp=15.0, chain_length=1, steps=3)
    _, rec = simulate([atoms], plan)
    ours = rec.trajectory(0)
    assert len(ours) == 6
    ref = atoms.copy()
    ref.calc = ase_lj()
    for tchain, frames in ((3, ours[:3]), (1, ours[3:])):
        dyn = NoseHooverChainNVT(ref, 5.0 * units.fs, 80.0, tdamp=15.0 * units.fs, tchain=tchain)
        assert max_deviation(dyn, ref, frames) < 1e-8, tchain


def test_initial_velocities_follow_the_run_seed() -> None:
    """Maxwell-Boltzmann velocities drawn on entering an MD stage come from the run's
    seed: one seed twice gives the same velocities bit for bit, two seeds independent
    ones (replicas started with different seeds must not share their start).  For 96
    independent pairs the correlation has a standard deviation of 1/sqrt(96) ≈ 0.1;
    the test allows 4 of them."""

    def start(seed: int) -> np.ndarray:
        res, _ = simulate([argon_bulk(2)], VelocityVerlet(dt=1.0, steps=0, temperature=300.0),
                          seed=seed)  # fmt: skip
        return res.to_atoms()[0].get_velocities().ravel()

    first, again, other = start(1), start(1), start(2)
    assert np.array_equal(first, again)
    assert abs(np.corrcoef(first, other)[0, 1]) < 4.0 / np.sqrt(first.size)


TAUS = [12.0, 40.0]  # fs, per system_id
PER_SYSTEM_TIME_CONSTANTS = {
    "berendsen": (
        lambda: Berendsen(dt=5.0, temperature=120.0, taut=TAUS, steps=8),
        lambda a, k: NVTBerendsen(a, 5.0 * units.fs, temperature_K=120.0, taut=TAUS[k] * units.fs),
    ),
    "bussi": (
        lambda: Bussi(dt=5.0, temperature=120.0, taut=TAUS, steps=8),
        lambda a, k: AseBussi(a, 5.0 * units.fs, 120.0, TAUS[k] * units.fs, rng=BussiNoise(a, k)),
    ),
    "nose_hoover_chain": (
        lambda: NoseHooverChain(dt=5.0, temperature=120.0, tdamp=TAUS, steps=8),
        lambda a, k: NoseHooverChainNVT(a, 5.0 * units.fs, 120.0, tdamp=TAUS[k] * units.fs),
    ),
}


@pytest.mark.parametrize("name", list(PER_SYSTEM_TIME_CONSTANTS))
def test_a_time_constant_per_system_follows_ase_for_each(name: str, code_path) -> None:
    """``taut``/``tdamp`` one per system (indexed by ``system_id``, the systems in the
    batch in reverse order): each system follows ASE at its own, on both code paths.
    The other thermostat runs give one time constant (Langevin's per-system friction is
    in ``test_md``)."""
    make, make_ase = PER_SYSTEM_TIME_CONSTANTS[name]
    systems = moving_argon(2, temperature=50.0, seed=18)
    _, rec = simulate(systems, make())
    for k, atoms in enumerate(systems):
        ref = atoms.copy()
        ref.calc = ase_lj()
        assert max_deviation(make_ase(ref, k), ref, rec.trajectory(k)) < 1e-8, k


NPT_STEPS = 6
NPT_PER_SYSTEM = {
    "mtk": (
        lambda: MTKNPT(dt=5.0, temperature=80.0, pressure_gpa=0.1, tdamp=[30.0, 60.0],
                       pdamp=[150.0, 400.0], steps=NPT_STEPS),
        lambda a, k: IsotropicMTKNPT(a, 5.0 * units.fs, 80.0, 0.1 * units.GPa,
                                     tdamp=[30.0, 60.0][k] * units.fs,
                                     pdamp=[150.0, 400.0][k] * units.fs),
    ),
    "npt_langevin": (
        lambda: NPTLangevin(dt=5.0, temperature=80.0, pressure_gpa=0.1, friction=[0.02, 0.05],
                            pdamp=[150.0, 400.0], steps=NPT_STEPS),
        lambda a, k: npt_langevin_reference(a, k, [50.0, 20.0][k], [150.0, 400.0][k]),
    ),
}  # fmt: skip


def npt_langevin_reference(atoms, system_id: int, t_tau: float, p_tau: float):
    """ASE's ``LangevinBAOAB`` with ``externalstress``, fed our keyed normals."""
    dyn = LangevinBAOAB(atoms, 5.0 * units.fs, temperature_K=80.0,
                        externalstress=-0.1 * units.GPa, hydrostatic=True,
                        T_tau=t_tau * units.fs, P_tau=p_tau * units.fs, rng=0)  # fmt: skip
    dyn.rng = BarostatNoise(atoms, system_id)
    return dyn


@pytest.mark.filterwarnings("ignore:Using heuristic P_mass:UserWarning")  # (ASE's note)
@pytest.mark.parametrize("name", [*NPT_PER_SYSTEM, "crescale"])
def test_barostat_time_constants_per_system_follow_the_reference(name: str) -> None:
    """MTK's ``tdamp`` and ``pdamp``, NPTLangevin's ``friction`` and ``pdamp``, C-rescale's
    ``taut`` and ``taup``, one per system (systems in reverse ``system_id`` order): each
    system follows ASE's ``IsotropicMTKNPT``, ASE's ``LangevinBAOAB`` or the authors'
    scheme (``test_npt``) at its own.  The other NPT runs give one of each."""
    systems = moving_argon(2, temperature=60.0, seed=1)
    if name == "crescale":
        taut, taup = [20.0, 60.0], [150.0, 400.0]
        stage = CRescale(dt=5.0, temperature=80.0, pressure_gpa=0.1, taut=taut, taup=taup,
                         compressibility=2.0, steps=NPT_STEPS)  # fmt: skip
    else:
        stage = NPT_PER_SYSTEM[name][0]()
    _, rec = npt_simulate(systems, stage)
    for k, atoms in enumerate(systems):
        ref = atoms.copy()
        ref.calc = npt_ase_lj()
        if name == "crescale":
            frames = crescale_reference(ref, k, NPT_STEPS, True, dt=5.0, temperature=80.0,
                                        pressure_gpa=0.1, compressibility=2.0, taut=taut[k],
                                        taup=taup[k])  # fmt: skip
        else:
            dyn = NPT_PER_SYSTEM[name][1](ref, k)
            frames = []
            for _ in range(NPT_STEPS):
                dyn.run(1)
                frames.append((ref.positions.copy(), ref.cell.array.copy()))
        for t, (positions, cell) in enumerate(frames, start=1):
            frame = rec.data[k][t]
            assert np.abs(positions - frame["positions"]).max() < 1e-8, (k, t)
            assert np.abs(cell - frame["cell"]).max() < 1e-8, (k, t)


def test_initial_velocities_of_a_float32_batch_are_float32() -> None:
    """A float32 batch gets float32 Maxwell-Boltzmann velocities (a float64 draw would
    leave float64 velocities in it: mixed precision from then on), the same draw as a
    float64 batch's to float32 rounding.  Box-Muller's ``sqrt(-2 ln u)`` amplifies an
    ulp of ``u`` near 1 to at most ``sqrt(eps/2)`` ≈ 2e-4 of a unit normal, so the two
    agree to 3e-4 of each atom's spread ``sqrt(kT/m)``."""
    draws = {}
    for dtype in (torch.float32, torch.float64):
        batch = Batch.from_atoms([argon_bulk(2)], dtype=dtype)
        maxwell_boltzmann(batch, torch.ones(1, dtype=torch.bool), 300.0, seed=3)
        draws[dtype] = batch.velocities
    assert draws[torch.float32].dtype == torch.float32
    spread = (kB * 300.0 / torch.from_numpy(argon_bulk(2).get_masses())).sqrt()[:, None]
    error = (draws[torch.float32].double() - draws[torch.float64]).abs() / spread
    assert float(error.max()) < 3e-4
