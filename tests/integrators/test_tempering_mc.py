"""Replica exchange over swap Monte Carlo: the mean energy at every rung of a Cu4Au4
cell equals the exact canonical average over its 70 orderings (ASE's EMT energies)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT as AseEMT

import alchemi_lit as al
from alchemi_lit.core.units import kB
from alchemi_lit.data import SizeAwareSampler, make_replicas
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import Hybrid, Langevin, ReplicaExchange, SwapMC, geometric_ladder
from alchemi_lit.models import EMT

LADDER = geometric_ladder(300.0, 3000.0, 4)


def cell():
    atoms = bulk("Cu", "fcc", a=3.8, cubic=True).repeat((2, 1, 1))
    atoms.numbers[[0, 3, 5, 6]] = 79
    return atoms


def exact_mean_energies() -> list[float]:
    """<E>_T over every ordering of 4 Au on the 8 sites, by enumeration with ASE's EMT."""
    energies = []
    for sites in itertools.combinations(range(8), 4):
        atoms = cell()
        atoms.numbers[:] = 29
        atoms.numbers[list(sites)] = 79
        atoms.calc = AseEMT()
        energies.append(atoms.get_potential_energy())
    e = np.asarray(energies)
    out = []
    for t in LADDER:
        w = np.exp(-(e - e.min()) / (kB * t))
        out.append(float((w * e).sum() / w.sum()))
    return out


class Energies(Callback):
    def __init__(self, burn: int) -> None:
        super().__init__()
        self.burn, self.rows = burn, []

    def after_step(self, ctx) -> None:
        if ctx.step >= self.burn:
            b = ctx.batch
            self.rows.append((b.rex_group.clone(), b.rex_rung.clone(), b.energy.clone()))


def check_mean_energies(groups: int, steps: int, burn: int) -> None:
    samples = Energies(burn)
    stage = ReplicaExchange(SwapMC(["Cu", "Au"], steps=steps), LADDER, every=2)
    sim = al.Simulator(EMT(), stage, precision="64", seed=2, callbacks=[samples])
    results = sim.run(SizeAwareSampler(make_replicas([cell()] * groups, 4), max_atoms=4096))
    group, rung, energy = (torch.stack(c) for c in zip(*samples.rows))
    for k, want in enumerate(exact_mean_energies()):
        means = np.array([float(energy[(group == g) & (rung == k)].mean()) for g in range(groups)])
        error = means.std(ddof=1) / math.sqrt(groups)
        assert abs(means.mean() - want) < 4 * error + 1e-3, (LADDER[k], means.mean(), want, error)
    assert bool((results.batch.rex_accepts.sum(0) > 0).all())


@pytest.mark.slow
def test_swap_mc_replicas_sample_the_exact_canonical_energy_short():
    check_mean_energies(groups=4, steps=200, burn=20)


@pytest.mark.slow
def test_swap_mc_replicas_sample_the_exact_canonical_energy_long():
    check_mean_energies(groups=16, steps=6000, burn=200)


@pytest.mark.slow
def test_swap_mc_groups_together_equal_each_alone_bit_for_bit():
    """MC exchanges keyed per group (the hybrid test below is the fast sibling)."""
    reps = make_replicas([cell(), cell()], 4)

    def run(structures, ids):
        stage = ReplicaExchange(SwapMC(["Cu", "Au"], steps=12), LADDER, every=2)
        data = SizeAwareSampler(structures, max_atoms=4096, system_ids=ids)
        return al.Simulator(EMT(), stage, precision="64", seed=2).run(data).batch

    together, first, second = run(reps, None), run(reps[:4], range(4)), run(reps[4:], range(4, 8))
    for name in ("atomic_numbers", "energy", "rex_temperature", "rex_accepts", "mc_accepted"):
        joined = torch.cat([getattr(first, name), getattr(second, name)])
        assert torch.equal(getattr(together, name), joined), name
    assert int(together.rex_accepts.sum()) > 0


def test_a_hybrid_md_mc_stage_is_tempered_in_both_parts():
    stage = ReplicaExchange(Hybrid(Langevin(dt=2.0, steps=20), SwapMC(["Cu", "Au"]), every=4),
                            LADDER, every=5)  # fmt: skip
    assert stage.md.md.temperature == stage.md.mc.temperature  # both read rex_temperature
    results = al.Simulator(EMT(), stage, precision="64").run(make_replicas(cell(), 4))
    assert sorted(results.batch.rex_temperature.tolist()) == pytest.approx(LADDER)
    # 25 steps (20 MD, 5 MC), an attempt every 5: odd pairs (1 of them) at steps 5, 15, 25,
    # even pairs (2) at 10 and 20
    assert results.batch.rex_attempts.sum(0).tolist() == [2, 3, 2]
