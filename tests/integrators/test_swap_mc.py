"""Swap and semi-grand Monte Carlo against exact enumeration with ASE's EMT.

References, never ourselves: every configuration's energy comes from
``ase.calculators.emt.EMT`` and the Boltzmann (or semi-grand) averages from summing over
all of them.  An 8-atom fcc Cu4Au4 cell has C(8, 4) = 70 configurations; a 4-atom
irregular cluster (distinct energies, no symmetry) has 6 at Cu2Au2 and 16 at any
composition.  Chains are independent systems of one batch (their own keyed draws); a
mean's error is the spread of the chains' means over sqrt(chains), and averages must
fall within 4 of those errors.  The transition matrix of one step is measured on many
copies of each cluster configuration and compared with the designed kernel (symmetric
proposal x Metropolis), whose stationary distribution is Boltzmann's.
"""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT as AseEMT
from ase.neighborlist import neighbor_list
from ase.units import kB

import alchemi_lit as al
from alchemi_lit.engine.hooks import HookStageEnum, LambdaCallback
from alchemi_lit.integrators import SemiGrandMC, SwapMC
from alchemi_lit.models import EMT

CU, AU = 29, 79


def cell8() -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.9, cubic=True).repeat((1, 1, 2))
    atoms.numbers[:4] = AU
    return atoms


def cluster4() -> Atoms:
    pos = [[0, 0, 0], [2.6, 0.1, 0], [1.2, 2.3, 0.2], [1.4, 0.8, 2.2]]
    return Atoms("Au2Cu2", positions=pos)


def key(numbers: np.ndarray) -> int:
    """A configuration as the bit mask of its Au sites."""
    return int(sum(1 << i for i, z in enumerate(numbers) if z == AU))


@cache
def enumerate_(name: str, fixed_composition: bool) -> dict[int, tuple[float, int, int]]:
    """Every configuration of ``name``: key -> (ASE EMT energy, unlike nearest-neighbour
    bonds, Au count)."""
    base = cell8() if name == "cell8" else cluster4()
    n = len(base)
    i, j = neighbor_list("ij", base, 0.8 * 3.9 if name == "cell8" else 3.0)
    counts = [n // 2] if fixed_composition else range(n + 1)
    out = {}
    for k in counts:
        for au in itertools.combinations(range(n), k):
            atoms = base.copy()
            atoms.numbers[:] = CU
            atoms.numbers[list(au)] = AU
            atoms.calc = AseEMT()
            bonds = int((atoms.numbers[i] != atoms.numbers[j]).sum()) // 2
            out[key(atoms.numbers)] = (atoms.get_potential_energy(), bonds, k)
    return out


def chains(plan, start: Atoms, n_chains: int, burn: int):
    """Run ``n_chains`` copies of ``start``; per chain and step the configuration's key
    after the step (the steps after ``burn``), and the results."""
    seen: list[np.ndarray] = []

    def look(ctx) -> None:
        seen.append(ctx.batch.atomic_numbers.view(n_chains, -1).numpy().copy())

    sim = al.Simulator(model=EMT(), stages=plan, precision="64", seed=11,
                       callbacks=[LambdaCallback(HookStageEnum.AFTER_STEP, look)])  # fmt: skip
    results = sim.run([start.copy() for _ in range(n_chains)])
    keys = np.array([[key(z) for z in step] for step in seen[burn:]])  # [steps, chains]
    return keys, results


def boltzmann(table, temperature: float, mu: float = 0.0) -> np.ndarray:
    e = np.array([v[0] - mu * v[2] for v in table.values()])
    w = np.exp(-(e - e.min()) / (kB * temperature))
    return w / w.sum()


def within_error(values: np.ndarray, exact: float, what: str) -> None:
    """``values`` [steps, chains]: the mean over both within 4 errors of ``exact``."""
    means = values.mean(0)
    error = means.std(ddof=1) / np.sqrt(len(means))
    assert abs(means.mean() - exact) < 4 * error + 1e-12, (what, means.mean(), exact, error)


def check_canonical(temperature: float, n_chains: int, steps: int, burn: int) -> None:
    table = enumerate_("cell8", True)
    p = boltzmann(table, temperature)
    energy, bonds = (np.array([v[i] for v in table.values()]) for i in (0, 1))
    plan = SwapMC(["Cu", "Au"], temperature=temperature, steps=steps)
    keys, results = chains(plan, cell8(), n_chains, burn)
    lookup = {k: n for n, k in enumerate(table)}
    rows = np.vectorize(lookup.__getitem__)(keys)
    within_error(energy[rows], float(p @ energy), f"<E> at {temperature} K")
    within_error(bonds[rows], float(p @ bonds), f"<unlike bonds> at {temperature} K")
    # the chain's own energy statistics are the energies of the configurations it visited
    b = results.batch
    assert b.mc_attempts.tolist() == [steps] * n_chains
    final = np.array([table[key(z)][0] for z in b.atomic_numbers.view(n_chains, -1).numpy()])
    np.testing.assert_allclose(b.energy.numpy(), final, rtol=0, atol=1e-9)
    accepted = b.mc_pair_accepted[:, 0]
    assert torch.equal(accepted, b.mc_accepted) and (b.mc_accepted > 0).all()


def test_canonical_averages_match_enumeration_short():
    check_canonical(1200.0, n_chains=12, steps=100, burn=20)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [600.0, 1200.0, 2400.0])
def test_canonical_averages_match_enumeration(temperature):
    check_canonical(temperature, n_chains=48, steps=1500, burn=100)


def check_semi_grand(mu: float, temperature: float, n_chains: int, steps: int) -> None:
    table = enumerate_("cluster4", False)
    p = boltzmann(table, temperature, mu)
    n_au = np.array([v[2] for v in table.values()], dtype=float)
    plan = SemiGrandMC({"Cu": 0.0, "Au": mu}, temperature=temperature, steps=steps)
    keys, _ = chains(plan, cluster4(), n_chains, burn=20)
    lookup = {k: n for n, k in enumerate(table)}
    within_error(n_au[np.vectorize(lookup.__getitem__)(keys)], float(p @ n_au), f"<N_Au> mu={mu}")


def test_semi_grand_composition_matches_enumeration_short():
    check_semi_grand(-0.5, 1500.0, n_chains=12, steps=120)  # <N_Au> = 2.15 of 4


@pytest.mark.slow
@pytest.mark.parametrize("mu", [-0.9, -0.7, -0.5, -0.3, -0.1])  # <N_Au> 0.2 ... 3.8
def test_semi_grand_composition_matches_enumeration(mu):
    check_semi_grand(mu, 1500.0, n_chains=48, steps=1500)


def measured_transitions(temperature: float, copies: int):
    """One step from ``copies`` copies of each Cu2Au2 cluster configuration: the
    measured transition matrix, the designed one, and the Boltzmann weights."""
    table = enumerate_("cluster4", True)
    states = list(table)
    starts = []
    for k in states:
        atoms = cluster4()
        atoms.numbers[:] = [AU if k >> i & 1 else CU for i in range(4)]
        starts += [atoms] * copies
    plan = SwapMC(["Cu", "Au"], temperature=temperature, steps=1)
    b = al.Simulator(model=EMT(), stages=plan, precision="64", seed=5).run(starts).batch
    after = [key(z) for z in b.atomic_numbers.view(len(starts), -1).numpy()]
    index = {k: n for n, k in enumerate(states)}
    measured = np.zeros((len(states), len(states)))
    for n, k in enumerate(after):
        measured[n // copies, index[k]] += 1.0 / copies
    e = np.array([table[k][0] for k in states])
    designed = np.zeros_like(measured)
    for s, t in itertools.permutations(range(len(states)), 2):
        if bin(states[s] ^ states[t]).count("1") == 2:  # one Cu-Au swap apart: 4 such
            designed[s, t] = 0.25 * min(1.0, np.exp(-(e[t] - e[s]) / (kB * temperature)))
    designed += np.diag(1.0 - designed.sum(1))
    return measured, designed, boltzmann(table, temperature)


def check_detailed_balance(copies: int) -> None:
    measured, designed, p = measured_transitions(900.0, copies)
    error = np.sqrt(designed * (1 - designed) / copies)  # binomial, per entry
    assert (np.abs(measured - designed) <= 4 * error + 1e-12).all(), (measured, designed)
    flow = p[:, None] * designed
    np.testing.assert_allclose(flow, flow.T, atol=1e-15)  # detailed balance
    np.testing.assert_allclose(p @ designed, p, atol=1e-14)  # Boltzmann is stationary
    stationary = p @ measured  # within the measured rows' errors of p
    assert (np.abs(stationary - p) <= 4 * np.sqrt(p**2 @ error**2) + 1e-12).all()


def test_one_step_transition_matrix_is_the_detailed_balance_kernel_short():
    check_detailed_balance(copies=150)


@pytest.mark.slow
def test_one_step_transition_matrix_is_the_detailed_balance_kernel():
    check_detailed_balance(copies=3000)
