"""Thermostats sample the canonical ensemble (statistical checks on many small systems).

Each test runs ``B`` independent 32-atom LJ argon crystals (solid at 60 K) and samples
the kinetic energy of every system after every step once equilibrated.  In the
canonical ensemble the kinetic energy is Gamma distributed whatever the potential:
``<KE> = (Nf/2) kT`` and ``Var(KE) = (Nf/2) (kT)²`` with ``Nf = 3N`` (ASE's count,
which ``Batch.temperature`` uses too).

Tolerances: with B = 24 systems and 800 samples each, correlated over ~5-20 steps
(coupling times 50 fs = 5 steps), the pooled estimates rest on a few thousand
independent samples.  The relative standard error is ~0.3 % for ``<T>`` (one sample:
sqrt(2/Nf) = 14 %) and ~3 % for the variance (sqrt(2/n_eff), plus the kurtosis of a
Gamma(48) variable), so 2 % on ``<T>`` and 12 % on the variance ratio are 4-6
standard errors.  Chains and Bussi see 3N - 3 free momenta (the forces conserve the
total momentum) but target 3N, which shifts the variance ratio by ~3 % at most --
inside the tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import alchemi_lit as al
from alchemi_lit.core.units import kB
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import (
    FIRE,
    Berendsen,
    Bussi,
    CRescale,
    Langevin,
    NoseHooverChain,
    NPTLangevin,
)
from alchemi_lit.models import LennardJones
from conftest import AR_EPSILON, AR_SIGMA, argon_bulk, perturbed_argon

T_TARGET = 60.0
B = 24
EQUILIBRATE = 200
SAMPLE = 800
DT = 10.0  # fs; argon's vibrations have periods of ~500 fs


class KineticEnergies(Callback):
    """KE per system (in system_id order) after every step past ``start``."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start
        self.samples: list[torch.Tensor] = []

    def after_step(self, ctx) -> None:
        b = ctx.batch
        if int(b.total_steps.min()) > self.start:
            self.samples.append(b.kinetic_energy()[torch.argsort(b.system_id)].clone())


def model() -> LennardJones:
    # A short cutoff and a wide skin: cheap forces, neighbour lists built once
    # (a solid at 60 K never moves atoms by skin/2 = 1 Å).
    return LennardJones(AR_EPSILON, AR_SIGMA, cutoff=6.0, skin=2.0, compute_stress=False)


def sample_ke(integrator, systems, start: int = EQUILIBRATE) -> np.ndarray:
    probe = KineticEnergies(start)
    sim = al.Simulator(
        model=model(), stages=integrator, precision="64", seed=11, sync_every=100,
        callbacks=[probe],
    )  # fmt: skip
    sim.run(systems)
    return torch.stack(probe.samples).numpy()  # [steps, B]


def canonical_ratios(ke: np.ndarray, n_atoms: int, temperature: float) -> tuple[float, float]:
    """``<T>/T0`` and ``Var(KE) / ((Nf/2)(kT0)²)``, pooled over systems and steps."""
    nf = 3 * n_atoms
    kt = kB * temperature
    return float(ke.mean() / (0.5 * nf * kt)), float(ke.var() / (0.5 * nf * kt * kt))


CANONICAL = {
    "langevin": lambda: Langevin(
        dt=DT, temperature=T_TARGET, friction=0.02, steps=EQUILIBRATE + SAMPLE
    ),
    "nose_hoover_chain": lambda: NoseHooverChain(
        dt=DT, temperature=T_TARGET, tdamp=50.0, steps=EQUILIBRATE + SAMPLE
    ),
    "bussi": lambda: Bussi(dt=DT, temperature=T_TARGET, taut=50.0, steps=EQUILIBRATE + SAMPLE),
}


# The ensemble statistics of Langevin stay in the fast tier; those of the chains, Bussi
# and Berendsen (1 000 steps of 24 systems each) run in the slow one.  Every thermostat
# follows ASE's step for step in the fast tier (test_md: Langevin and Bussi with the
# same noise, the chains and Berendsen deterministic), to 1e-8 Å.
ENSEMBLE_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "name", [n if n == "langevin" else pytest.param(n, marks=ENSEMBLE_SLOW) for n in CANONICAL]
)
def test_canonical_kinetic_energy_distribution(name: str) -> None:
    systems = perturbed_argon(B, 2, 0.05, seed=1)
    ke = sample_ke(CANONICAL[name](), systems)
    assert ke.shape == (SAMPLE, B)
    t_ratio, var_ratio = canonical_ratios(ke, 32, T_TARGET)
    print(f"{name}: <T>/T0 = {t_ratio:.4f}, Var(KE)/canonical = {var_ratio:.3f}")
    assert abs(t_ratio - 1.0) < 0.02
    assert abs(var_ratio - 1.0) < 0.12


@ENSEMBLE_SLOW
def test_berendsen_reaches_the_target_but_suppresses_fluctuations() -> None:
    systems = perturbed_argon(B, 2, 0.05, seed=2)
    integrator = Berendsen(dt=DT, temperature=T_TARGET, taut=50.0, steps=EQUILIBRATE + SAMPLE)
    t_ratio, var_ratio = canonical_ratios(sample_ke(integrator, systems), 32, T_TARGET)
    print(f"berendsen: <T>/T0 = {t_ratio:.4f}, Var(KE)/canonical = {var_ratio:.3f}")
    assert abs(t_ratio - 1.0) < 0.02
    assert var_ratio < 0.8  # not canonical: that is why it is for equilibration only


def test_per_system_temperatures() -> None:
    """Targets indexed by system_id: each system settles at its own temperature."""
    targets = [20.0, 40.0, 80.0, 120.0] * 2
    systems = perturbed_argon(len(targets), 2, 0.05, seed=3)
    integ = Langevin(dt=DT, temperature=targets, friction=[0.02, 0.04] * 4, steps=600)
    ke = sample_ke(integ, systems, start=100)
    t_mean = ke.mean(0) / (0.5 * 3 * 32 * kB)
    per_target = t_mean.reshape(2, 4).mean(0)  # systems k and k + 4 share a target
    assert np.allclose(per_target, targets[:4], rtol=0.06), per_target


def test_optimizer_then_thermostat_heats_from_rest() -> None:
    """FIRE leaves systems at rest (forces ~0); the chain must still reach its target."""
    systems = perturbed_argon(4, 2, 0.05, seed=4)
    plan = FIRE(fmax=1e-3, max_steps=300) + NoseHooverChain(
        dt=DT, temperature=T_TARGET, tdamp=50.0, steps=300
    )
    probe = KineticEnergies(0)
    sim = al.Simulator(
        model=model(), stages=plan, precision="64", seed=5, sync_every=50, callbacks=[probe]
    )
    res = sim.run(systems)
    assert all(res.converged.tolist())
    t_final = res.batch.temperature()
    assert float(t_final.mean()) > 0.5 * T_TARGET, t_final
    assert float(t_final.min()) > 0.2 * T_TARGET, t_final


def test_zero_kelvin_is_a_quench_for_every_method_that_takes_it() -> None:
    """The temperature-0 rule (MDIntegrator): the NVT thermostats and the two NPT methods
    defined at 0 K (CRescale, NPTLangevin: they used to refuse it) drain the kinetic
    energy; Nosé-Hoover chains refuse 0 K (test_params)."""
    # from ~67 K every method is below 0.01 K after 100 steps (1 ps: 40 friction times or
    # taut), below 0.5 K after ~60; a method that does not quench stays at tens of K
    QUENCH = 100
    systems = [argon_bulk(2) for _ in range(4)]
    for k, atoms in enumerate(systems):
        gen = np.random.default_rng(k)
        atoms.set_momenta(gen.normal(scale=0.5, size=(32, 3)))
    for integ in (
        Langevin(dt=DT, temperature=0.0, friction=0.04, steps=QUENCH),
        Bussi(dt=DT, temperature=0.0, taut=25.0, steps=QUENCH),
        Berendsen(dt=DT, temperature=0.0, taut=25.0, steps=QUENCH),
        CRescale(dt=DT, temperature=0.0, taut=25.0, taup=500.0, compressibility=0.3, steps=QUENCH),
        CRescale(
            dt=DT, temperature=0.0, taut=25.0, compressibility=0.3, isotropic=False, steps=QUENCH
        ),
        NPTLangevin(dt=DT, temperature=0.0, friction=0.04, pdamp=500.0, steps=QUENCH),
        NPTLangevin(dt=DT, temperature=0.0, friction=0.04, isotropic=False, steps=QUENCH),
    ):
        sim = al.Simulator(model=model(), stages=integ, precision="64", seed=1, sync_every=50)
        t = sim.run(systems).batch.temperature()
        assert float(t.max()) < 0.5, (integ, t)


def test_bussi_noise_shortcut_without_fixed_atoms_equals_the_general_count(monkeypatch):
    """Without fixed atoms R1 is each system's first atom's first normal and S the sum of
    all other squares (total minus R1^2); the general path finds the first free atom and
    sums the others directly.  Both must agree."""
    from alchemi_lit import Batch
    from alchemi_lit.integrators.ops import bussi_noise

    batch = Batch.from_atoms(perturbed_argon(3, repeat=1, seed=4), system_ids=[4, 9, 2])
    batch.total_steps = torch.tensor([3, 0, 17])
    assert not batch.may_have_fixed_atoms()
    r1, s = bussi_noise(batch, seed=5)
    monkeypatch.setattr(Batch, "may_have_fixed_atoms", lambda self: True)
    r1_general, s_general = bussi_noise(batch, seed=5)
    assert torch.equal(r1, r1_general)
    torch.testing.assert_close(s, s_general, rtol=1e-14, atol=0)
    assert (s > 0).all()
