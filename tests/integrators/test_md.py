"""Molecular dynamics against ASE, trajectory for trajectory, plus NVE energy drift.

Every deterministic integrator is compared with its ASE counterpart from identical
initial velocities (set on the ``Atoms``): VelocityVerlet, NoseHooverChain
(``NoseHooverChainNVT``), Berendsen (``NVTBerendsen``).  The stochastic ones are
compared too, by feeding ASE the very normals our counter-based stream draws (a fake
``rng`` object): Langevin vs ``LangevinBAOAB`` and Bussi vs ``ase.md.bussi.Bussi``.
All in float64; positions must agree to 1e-8 Å after every one of 50 steps (200-250 fs,
several thermostat times: a thermostat's time or temperature 1 % off is 1e-3 Å off by then).
The systems sit in the batch in reverse ``system_id`` order, so a per-system parameter
gathered by row instead of by ``system_id`` gives another system's value; some cases give
one time step per system (the per-system ``dt`` branches, kernels and torch alike).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import units
from ase.constraints import FixAtoms
from ase.md.bussi import Bussi as AseBussi
from ase.md.langevinbaoab import LangevinBAOAB
from ase.md.nose_hoover_chain import NoseHooverChainNVT
from ase.md.nvtberendsen import NVTBerendsen
from ase.md.verlet import VelocityVerlet as AseVV

import alchemi_lit as al
from alchemi_lit.core import random as rng
from alchemi_lit.core.state import Batch
from alchemi_lit.core.units import kB
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import (
    Berendsen,
    Bussi,
    Langevin,
    NoseHooverChain,
    VelocityVerlet,
    maxwell_boltzmann,
)
from alchemi_lit.integrators.ops import bussi_noise
from alchemi_lit.models import LennardJones
from alchemi_lit.testing import accelerator_path
from alchemi_lit.testing.integrators import argon, check_masked_systems_untouched
from conftest import AR_EPSILON, AR_SIGMA, AseLJ, argon_bulk, perturbed_argon

CUTOFF = 8.5
STEPS = 50  # ASE's Python LJ is most of these tests' time
SEED = 7


class Recorder(Callback):
    """Positions (and chosen system fields) after every step, by system_id and step."""

    def __init__(self, fields: tuple[str, ...] = ("positions",)) -> None:
        super().__init__()
        self.fields = fields
        self.data: dict[int, dict[int, dict[str, np.ndarray]]] = {}

    def after_step(self, ctx) -> None:
        b = ctx.batch
        ptr = b.ptr.tolist()
        for row, (sid, t) in enumerate(zip(b.system_id.tolist(), b.total_steps.tolist())):
            frames = self.data.setdefault(sid, {})
            if t in frames:  # did not move this step (finished, waiting to graduate)
                continue
            frames[t] = {
                f: (
                    getattr(b, f)[ptr[row] : ptr[row + 1]]
                    if b.field_kind(f) == "atom"
                    else getattr(b, f)[row]
                )
                .detach()
                .clone()
                .numpy()
                for f in self.fields
            }

    def trajectory(self, sid: int, field: str = "positions") -> list[np.ndarray]:
        frames = self.data[sid]
        return [frames[t][field] for t in sorted(frames)]


def lj_model(**kw) -> LennardJones:
    return LennardJones(AR_EPSILON, AR_SIGMA, CUTOFF, **kw)


def ase_lj() -> AseLJ:
    return AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF)


def moving_argon(n: int, temperature: float = 50.0, seed: int = 0) -> list:
    """Perturbed 32-atom argon crystals with Gaussian velocities, zero momentum."""
    gen = np.random.default_rng(seed + 100)
    out = []
    for k, atoms in enumerate(perturbed_argon(n, 2, 0.08, seed)):
        t = temperature * (1.0 + 0.3 * k)
        m = atoms.get_masses()[:, None]
        v = gen.normal(size=(len(atoms), 3)) * np.sqrt(units.kB * t / m)
        v -= (m * v).sum(0) / m.sum()
        atoms.set_momenta(m * v)
        out.append(atoms)
    return out


def simulate(systems, integrator, fields=("positions",), model=None, seed=SEED):
    """Run ``systems`` (``system_id`` k for ``systems[k]``) in reverse order: row and
    ``system_id`` differ (results come back sorted by ``system_id``)."""
    rec = Recorder(fields)
    ids = list(range(len(systems)))[::-1]
    systems = Batch.from_atoms([systems[k] for k in ids], system_ids=ids)
    sim = al.Simulator(
        model=model or lj_model(),
        stages=integrator,
        precision="64",
        seed=seed,
        sync_every=1,
        callbacks=[rec],
    )
    return sim.run(systems), rec


def max_deviation(ase_dyn, atoms, ours: list[np.ndarray]) -> float:
    worst = 0.0
    for frame in ours:
        ase_dyn.run(1)
        worst = max(worst, float(np.abs(atoms.positions - frame).max()))
    return worst


# ---------------------------------------------------------------------- noise for ASE
def our_atom_normals(n_atoms: int, system_id: int, step: int, purpose: int) -> np.ndarray:
    """The normals our integrators draw for system ``system_id`` at ``step``."""
    z = rng.atom_normals(
        SEED,
        torch.tensor([system_id]),
        torch.tensor([step]),
        torch.zeros(n_atoms, dtype=torch.long),
        torch.arange(n_atoms),
        purpose,
        torch.float64,
    )
    return z.numpy()


class LangevinNoise:
    """Stands in for ASE's ``rng``: ``normal(size)`` returns our Langevin noise."""

    def __init__(self, system_id: int) -> None:
        self.system_id, self.step = system_id, 0

    def normal(self, size):
        z = our_atom_normals(size[0], self.system_id, self.step, rng.PURPOSE_NOISE)
        self.step += 1
        return z


class BussiNoise:
    """Stands in for ASE's ``rng``: our ``R1`` and ``S/2`` (ASE draws chi² as 2·gamma)."""

    def __init__(self, atoms, system_id: int) -> None:
        self.batch = Batch.from_atoms([atoms], system_ids=[system_id])
        self.step = 0

    def standard_normal(self):
        self.batch.total_steps = torch.tensor([self.step])
        self.r1, s = bussi_noise(self.batch, SEED)
        self.s = float(s[0])
        return float(self.r1[0])

    def standard_gamma(self, shape):
        assert shape == 0.5 * (3 * self.batch.num_atoms - 1)
        self.step += 1
        return 0.5 * self.s


# ---------------------------------------------------------------------- trajectories
DTS = [5.0, 4.0, 6.0]  # fs, per system_id

CASES = {
    "verlet": (
        VelocityVerlet(dt=4.0, steps=STEPS),
        lambda a, k: AseVV(a, timestep=4.0 * units.fs),
    ),
    "nose_hoover_chain": (
        NoseHooverChain(dt=5.0, temperature=80.0, tdamp=50.0, chain_length=3, steps=STEPS),
        lambda a, k: NoseHooverChainNVT(a, 5.0 * units.fs, 80.0, tdamp=50.0 * units.fs, tchain=3),
    ),
    "nose_hoover_chain_1_loop2": (  # one time step per system_id
        NoseHooverChain(dt=DTS, temperature=30.0, tdamp=40.0, chain_length=1, chain_steps=2),
        lambda a, k: NoseHooverChainNVT(
            a, DTS[k] * units.fs, 30.0, tdamp=40.0 * units.fs, tchain=1, tloop=2
        ),
    ),
    "berendsen": (  # one time step per system_id
        Berendsen(dt=DTS, temperature=120.0, taut=30.0, steps=STEPS),
        lambda a, k: NVTBerendsen(a, DTS[k] * units.fs, temperature_K=120.0, taut=30.0 * units.fs),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_deterministic_md_matches_ase(name: str) -> None:
    integrator, make_ase = CASES[name]
    integrator.max_steps = STEPS
    systems = moving_argon(2, seed=1)
    res, rec = simulate(systems, integrator)
    assert res.steps.tolist() == [STEPS] * 2
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = ase_lj()
        ours = rec.trajectory(k)
        assert len(ours) == STEPS
        assert max_deviation(make_ase(atoms, k), atoms, ours) < 1e-8
        assert abs(atoms.get_potential_energy() - float(res.energy[k])) < 1e-8
        assert np.abs(atoms.get_velocities() - res.to_atoms()[k].get_velocities()).max() < 1e-8


@pytest.mark.parametrize(
    ("temperature", "friction", "dt"),
    [(70.0, 0.02, 5.0), ([70.0, 150.0, 40.0], [0.02, 0.05, 0.01], DTS)],
)
def test_langevin_matches_ase_baoab_with_the_same_noise(temperature, friction, dt) -> None:
    """One temperature, friction and time step, or one per system (indexed by system_id):
    each system follows ASE's LangevinBAOAB at its own -- a noise amplitude a few percent
    off for one system diverges from ASE's trajectory at once."""
    systems = moving_argon(3, seed=2)
    integrator = Langevin(dt=dt, temperature=temperature, friction=friction, steps=STEPS)
    res, rec = simulate(systems, integrator)
    per_system = isinstance(temperature, list)
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = ase_lj()
        t_k = temperature[k] if per_system else temperature
        tau_k = 1.0 / (friction[k] if per_system else friction)
        dt_k = dt[k] if per_system else dt
        dyn = LangevinBAOAB(
            atoms, dt_k * units.fs, temperature_K=t_k, T_tau=tau_k * units.fs,
            rng=np.random.default_rng(0),
        )  # fmt: skip
        dyn.rng = LangevinNoise(k)
        assert max_deviation(dyn, atoms, rec.trajectory(k)) < 1e-8
        assert abs(atoms.get_potential_energy() - float(res.energy[k])) < 1e-8


def test_a_second_langevin_stage_draws_new_noise() -> None:
    """The noise is keyed by a system's total step count, not its step in the stage: two
    Langevin stages in a row follow ASE's one run with the normals of steps 0..5 (a
    stage that replayed the first one's noise would leave it at the fourth step).  On the
    accelerators' path, which draws each step's noise from its keys (the CPU kernel picks
    rows of a draw ahead by the total step, which hides a wrong key)."""
    systems = moving_argon(1, seed=2)

    def stage() -> Langevin:
        return Langevin(dt=5.0, temperature=70.0, friction=0.02, steps=3)

    with accelerator_path():
        _, rec = simulate(systems, stage() + stage())
    atoms = systems[0].copy()
    atoms.calc = ase_lj()
    dyn = LangevinBAOAB(atoms, 5.0 * units.fs, temperature_K=70.0, T_tau=50.0 * units.fs,
                        rng=np.random.default_rng(0))  # fmt: skip
    dyn.rng = LangevinNoise(0)
    ours = rec.trajectory(0)
    assert len(ours) == 6
    assert max_deviation(dyn, atoms, ours) < 1e-8


def test_bussi_matches_ase_with_the_same_noise() -> None:
    """One time step per system, on the accelerators' path (the torch versions of Bussi's
    noise and factor; the CPU kernel is held to them in tests/kernels)."""
    systems = moving_argon(2, seed=3)
    with accelerator_path():
        res, rec = simulate(systems, Bussi(dt=DTS[:2], temperature=90.0, taut=40.0, steps=STEPS))
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = ase_lj()
        dyn = AseBussi(atoms, DTS[k] * units.fs, 90.0, 40.0 * units.fs, rng=BussiNoise(atoms, k))
        assert max_deviation(dyn, atoms, rec.trajectory(k)) < 1e-8
        assert abs(atoms.get_temperature() - float(res.batch.temperature()[k])) < 1e-6


def test_nose_hoover_conserves_extended_energy() -> None:
    systems = moving_argon(1, temperature=40.0, seed=4)
    nhc = NoseHooverChain(dt=4.0, temperature=60.0, tdamp=40.0, steps=150)
    conserved: list[torch.Tensor] = []
    sim = al.Simulator(
        model=lj_model(), stages=nhc, precision="64", seed=SEED, sync_every=1,
        callbacks=[_Probe(lambda b: conserved.append(nhc.conserved_energy(b)))],
    )  # fmt: skip
    res = sim.run(systems)
    h = torch.stack(conserved)
    # 2.6e-6 eV/atom over 200 steps (the same as ASE's, an O(dt²) error), while the
    # thermostat pumps ~1.5e-3 eV/atom into the system
    assert float((h - h[0]).abs().max()) / 32 < 5e-6
    assert float(res.batch.temperature().min()) > 30.0  # heats up, never drops to 0 K


class _Probe(Callback):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def after_step(self, ctx) -> None:
        self.fn(ctx.batch)


# ---------------------------------------------------------------------- NVE drift
@pytest.mark.slow
def test_nve_energy_drift_lj_argon() -> None:
    """256 atoms, 60 K, dt 2 fs, 10 ps: |E(t) - E(0)| / N < 1e-5 eV over the run."""
    atoms = argon_bulk(4)
    total: list[torch.Tensor] = []
    probe = _Probe(lambda b: total.append(b.energy + b.kinetic_energy()))
    sim = al.Simulator(
        model=lj_model(compute_stress=False),
        stages=VelocityVerlet(dt=2.0, steps=5000, temperature=60.0),
        precision="64", seed=SEED, sync_every=100, callbacks=[probe],
    )  # fmt: skip
    res = sim.run([atoms])
    e = torch.cat(total)
    assert len(e) == 5000
    drift = float((e - e[0]).abs().max()) / len(atoms)
    assert drift < 1e-5, drift
    assert 20.0 < float(res.batch.temperature()[0]) < 60.0  # equipartition: ~T0/2


# ---------------------------------------------------------------------- initial velocities
def test_maxwell_boltzmann_init_zero_momentum_and_mean_temperature() -> None:
    """Every other atom weighs 4 amu (helium's), the others argon's: equipartition holds
    per atom, whatever its mass (a spread sqrt(kT/m) with a wrong mass shows at once)."""
    systems = [argon_bulk(2) for _ in range(200)]
    light = np.arange(32) % 2 == 0
    for atoms in systems:
        atoms.set_masses(np.where(light, 4.0026, atoms.get_masses()))
    batch = Batch.from_atoms(systems)
    maxwell_boltzmann(batch, torch.ones(len(batch), dtype=torch.bool), 75.0, seed=3)
    m = batch.masses.unsqueeze(-1)
    p = torch.zeros(len(batch), 3, dtype=batch.dtype).index_add_(
        0, batch.system_idx, m * batch.velocities
    )
    assert p.abs().max() < 1e-12
    t = batch.temperature()
    # 3N - 3 free dof after momentum removal, counted as 3N by temperature()
    expected = 75.0 * (3 * 32 - 3) / (3 * 32)
    assert abs(float(t.mean()) / expected - 1.0) < 0.02
    assert len(set(t.tolist())) == len(t)  # every system has its own stream
    # per species: removing the mean velocity leaves each atom <m v²/2> = 3/2 kT (1 - m/M);
    # 3 200 atoms a species, each m v²/(3 kT) of variance 2/3: standard error 1.4 %
    ke = 0.5 * (m * batch.velocities**2).sum(-1) / (1.5 * kB * 75.0)
    m_total = float(batch.masses[:32].sum())
    for species in (torch.from_numpy(np.tile(light, 200)), torch.from_numpy(np.tile(~light, 200))):
        mass = float(batch.masses[species][0])
        assert abs(float(ke[species].mean()) / (1.0 - mass / m_total) - 1.0) < 0.06, mass


def test_maxwell_boltzmann_for_some_systems_draws_their_numbers_only() -> None:
    """On CPU only the entering systems' atoms are drawn: their velocities are exactly
    those of a draw for the whole batch, and the others keep theirs."""
    systems = [argon_bulk(2) for _ in range(6)]
    systems[3] = systems[3].repeat((2, 1, 1))  # sizes differ: atom offsets matter
    full = Batch.from_atoms(systems)
    full.total_steps = torch.arange(6) * 7  # keys differ per system
    part = full.clone()
    before = torch.randn_like(part.velocities)
    part.velocities = before.clone()
    maxwell_boltzmann(full, torch.ones(6, dtype=torch.bool), 75.0, seed=3)
    some = torch.tensor([False, True, False, True, True, False])
    maxwell_boltzmann(part, some, 75.0, seed=3)
    drawn = part.atom_mask(some)
    assert torch.equal(part.velocities[drawn], full.velocities[drawn])
    assert torch.equal(part.velocities[~drawn], before[~drawn])


def test_initial_velocities_are_independent_of_the_thermostats_noise() -> None:
    """Velocities drawn at a system's step have their own stream: not the normals Langevin
    or Bussi draw at that step, which would add coherently to them at the first O step
    (with c1 = 0.9 a 78 % hotter first step).  The correlation of 1 920 independent
    pairs has a standard deviation of 1/sqrt(1 920) = 0.023; the test allows 4 of them."""
    batch = Batch.from_atoms([argon_bulk(2) for _ in range(20)])
    batch.total_steps = torch.arange(20) * 7
    maxwell_boltzmann(batch, torch.ones(20, dtype=torch.bool), 75.0, seed=SEED)
    scaled = (batch.velocities * batch.masses[:, None].sqrt()).flatten()
    for purpose in (rng.PURPOSE_NOISE, rng.PURPOSE_THERMOSTAT):
        z = rng.atom_normals(
            SEED, batch.system_id, batch.total_steps, batch.system_idx,
            batch.segments.local_index, purpose, torch.float64,
        )  # fmt: skip
        corr = float(torch.corrcoef(torch.stack([scaled, z.flatten()]))[0, 1])
        assert abs(corr) < 4.0 / len(scaled) ** 0.5, (purpose, corr)


def test_maxwell_boltzmann_with_fixed_atoms_leaves_no_momentum(code_path) -> None:
    """Fixed atoms at rest and zero total momentum: the mean velocity is removed over the
    free atoms' mass alone.  (Every other test of the draw has no fixed atoms, where the
    mass of all atoms is the same sum.)"""
    systems = [argon_bulk(2), argon_bulk(2)[:20]]
    for atoms, fixed in zip(systems, ([0, 5, 17, 30], [3])):
        atoms.set_constraint(FixAtoms(indices=fixed))
    batch = Batch.from_atoms(systems)
    maxwell_boltzmann(batch, torch.ones(2, dtype=torch.bool), 75.0, seed=3)
    v = batch.velocities
    assert torch.equal(v[batch.fixed], torch.zeros_like(v[batch.fixed]))
    p = torch.zeros(2, 3, dtype=v.dtype).index_add_(0, batch.system_idx, batch.masses[:, None] * v)
    # a sum of ~30 momenta: rounding leaves ~1e-15 of the largest
    scale = float((batch.masses[:, None] * v).abs().max())
    assert float(p.abs().max()) < 1e-13 * scale, p


def test_berendsen_fixcm_with_fixed_atoms_zeroes_the_free_momentum(code_path) -> None:
    """Berendsen's ``fixcm`` removes the mean momentum over the free atoms (the module's
    rule): after the opening of a step the free atoms' momenta sum to zero and fixed
    atoms stay at rest.  Every other Berendsen run has no fixed atoms."""
    atoms = perturbed_argon(1, 2, 0.1, seed=6)[0]
    atoms.set_constraint(FixAtoms(indices=[0, 5, 17]))
    batch = Batch.from_atoms([atoms])
    gen = torch.Generator().manual_seed(0)
    batch.velocities = torch.where(
        batch.fixed[:, None], 0.0, 0.01 * torch.randn(32, 3, generator=gen, dtype=torch.float64)
    )
    batch.forces = torch.where(
        batch.fixed[:, None], 0.0, torch.randn(32, 3, generator=gen, dtype=torch.float64)
    )
    stage = Berendsen(dt=5.0, temperature=100.0, taut=30.0)
    stage.setup(batch, seed=0, prefix="s0")
    stage.pre_update(batch, torch.ones(1, dtype=torch.bool))
    p = batch.masses[:, None] * batch.velocities
    assert torch.equal(p[batch.fixed], torch.zeros_like(p[batch.fixed]))
    assert float(p.sum(0).abs().max()) < 1e-13 * float(p.abs().max())


def test_nose_hoover_chain_counts_the_free_atoms_only(code_path) -> None:
    """The chain's force on its first thermostat is ``m v² - Nf kT`` with ``Nf = 3 x free
    atoms``: free atoms exactly at the target temperature (fixed ones at rest) leave a
    one-member chain at rest and the velocities as they are.  Counting the fixed atoms too
    (ASE's NoseHooverChainNVT counts every atom) would heat the free ones by N / N_free."""
    atoms = perturbed_argon(1, 2, 0.1, seed=6)[0]
    atoms.set_constraint(FixAtoms(indices=[0, 5, 17, 30]))
    batch = Batch.from_atoms([atoms])
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(32, 3, generator=gen, dtype=torch.float64)
    v = torch.where(batch.fixed[:, None], 0.0, v)
    free_ke = 0.5 * float((batch.masses[:, None] * v * v).sum())
    target = 80.0
    v = v * (0.5 * 3 * 28 * kB * target / free_ke) ** 0.5  # 28 free atoms at 80 K
    batch.velocities = v.clone()
    stage = NoseHooverChain(dt=5.0, temperature=target, tdamp=50.0, chain_length=1)
    stage.setup(batch, seed=0, prefix="s0")
    stage.chain_half_step(batch, torch.ones(1, dtype=torch.bool))
    p_eta = getattr(batch, stage.p_eta_field)
    # (m v² - Nf kT: a difference of two ~0.3 eV terms, ~1e-16 each, times dt/2 ~ 0.25)
    assert float(p_eta.abs().max()) < 1e-14, p_eta
    assert float((batch.velocities - v).abs().max()) < 1e-14 * float(v.abs().max())


MASKED = {
    "verlet": lambda: VelocityVerlet(dt=2.0, temperature=60.0),
    "langevin": lambda: Langevin(dt=2.0, temperature=60.0),
    "bussi": lambda: Bussi(dt=2.0, temperature=60.0),
    "berendsen": lambda: Berendsen(dt=2.0, temperature=60.0),
    "nose_hoover_chain": lambda: NoseHooverChain(dt=2.0, temperature=60.0),
}


@pytest.mark.parametrize("name", list(MASKED))
def test_a_step_leaves_the_systems_outside_the_mask_untouched(name, code_path) -> None:
    """Several stages share a batch: a step moves the systems of its mask only, on either
    code path, also without fixed atoms (where the CPU's torch updates skip the atom
    mask when the whole batch is theirs)."""
    check_masked_systems_untouched(MASKED[name](), lj_model(), argon())


def test_md_stage_draws_velocities_only_for_systems_at_rest() -> None:
    moving = moving_argon(1, temperature=50.0, seed=5)[0]
    at_rest = argon_bulk(2)
    # a 0-step stage: systems enter (velocities initialised) and leave at once
    res, _ = simulate([moving, at_rest], VelocityVerlet(dt=1.0, steps=0, temperature=300.0))
    out = res.to_atoms()
    assert np.array_equal(out[0].get_velocities(), moving.get_velocities())
    assert np.abs(out[1].get_momenta().sum(0)).max() < 1e-12
    assert 150.0 < out[1].get_temperature() < 450.0  # one 32-atom draw at 300 K


def test_fixed_atoms_never_move_in_any_thermostat(code_path) -> None:
    """On both code paths: the accelerator's builds the mask of moving atoms itself
    (the CPU kernels test ``fixed`` per atom)."""
    for integrator in (
        Langevin(dt=5.0, temperature=100.0, steps=20),
        NoseHooverChain(dt=5.0, temperature=100.0, steps=20),
        Bussi(dt=5.0, temperature=100.0, steps=20),
        Berendsen(dt=5.0, temperature=100.0, steps=20),
        VelocityVerlet(dt=5.0, temperature=100.0, steps=20),
    ):
        atoms = perturbed_argon(1, 2, 0.1, seed=6)[0]
        atoms.set_constraint(FixAtoms(indices=[0, 5, 17]))
        start = atoms.positions.copy()
        res, _ = simulate([atoms], integrator)
        out = res.to_atoms()[0]
        assert np.array_equal(out.positions[[0, 5, 17]], start[[0, 5, 17]]), integrator
        assert np.abs(out.positions - start).max() > 1e-3, integrator
        assert float(res.batch.temperature()[0]) > 10.0, integrator


# ---------------------------------------------------------------------- parameters
@pytest.mark.parametrize(
    ("factory", "word"),
    [
        (lambda: Langevin(dt=0.0), "dt"),
        (lambda: Langevin(dt=-1.0), "dt"),
        (lambda: Langevin(temperature=-1.0), "temperature"),
        (lambda: Langevin(friction=0.0), "friction"),
        (lambda: Langevin(friction=[0.01, -0.1]), "friction"),
        (lambda: Langevin(temperature=[300.0, float("nan")]), "temperature"),
        (lambda: NoseHooverChain(tdamp=0.0), "tdamp"),
        (lambda: NoseHooverChain(chain_length=0), "chain_length"),
        (lambda: NoseHooverChain(chain_steps=0), "chain_steps"),
        (lambda: NoseHooverChain(suzuki_yoshida=2), "suzuki_yoshida"),
        (lambda: NoseHooverChain(temperature=0.0), "temperature"),
        (lambda: NoseHooverChain(dt=-2.0), "dt"),
        (lambda: Bussi(taut=0.0), "taut"),
        (lambda: Bussi(temperature=-5.0), "temperature"),
        (lambda: Bussi(dt=0.0), "dt"),
        (lambda: Berendsen(taut=-1.0), "taut"),
        (lambda: Berendsen(temperature=-1.0), "temperature"),
        (lambda: VelocityVerlet(dt=0.0), "dt"),
        (lambda: Langevin(steps=-1), "step"),
    ],
)
def test_parameter_validation_names_the_parameter(factory, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        factory()


def test_reprs() -> None:
    assert repr(Langevin(dt=2.0, temperature=300.0, steps=1000)) == (
        "Langevin(dt=2.0, T=300.0, steps=1000)"
    )
    assert repr(NoseHooverChain(dt=1.0, temperature=50, steps=10)) == (
        "NoseHooverChain(dt=1.0, T=50.0, steps=10)"
    )
    assert repr(Bussi(dt=1.0, temperature=[10.0, 20.0], steps=5)).startswith("Bussi(dt=1.0, T=")
    assert repr(Berendsen(dt=0.5, temperature=10, steps=3)) == (
        "Berendsen(dt=0.5, T=10.0, steps=3)"
    )
    assert Langevin(temperature=0.0).temperature == 0.0  # 0 K: damped dynamics, allowed
