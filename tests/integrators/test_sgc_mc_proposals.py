"""``SemiGrandMC(proposals=k)``: k semi-grand changes per chain per forward (generalized
Metropolis-Hastings over k copies of each structure), against exact enumeration with
ASE's EMT, never against ourselves.

The one-step kernel is computed exactly from the ASE EMT energies of all 16
compositions of a 4-atom Cu/Au cluster, weights ``exp(-(E - μ N_Au)/kT)``, by summing
over every auxiliary change z (4 from each state) and every k-tuple of changes of z;
its stationary distribution must be the semi-grand one (the theory), and the measured
transitions (many chains from each configuration, one step) must equal it within
binomial errors (the implementation; exact binomial tails, the 256 entries' small
probabilities being far from normal).  The chains' mean Au count and energy must fall
within 4 standard errors of the semi-grand averages over all 2^4 configurations.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from ase.data import atomic_masses
from scipy.stats import binom
from test_mc_contract import alloys
from test_swap_mc import AU, CU, boltzmann, cluster4, enumerate_, key, within_error
from test_swap_mc_proposals import (
    accelerator_and_graphs_equal_the_cpu,
    alone_in_a_batch_and_resumed,
    primary,
    run,
    same,
)

from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import Batch
from alchemi_lit.engine.hooks import HookStageEnum, LambdaCallback
from alchemi_lit.integrators import Hybrid, Langevin, SemiGrandMC, SwapMC


def designed_kernel(states: list[int], weight: np.ndarray, k: int) -> np.ndarray:
    """The exact one-step kernel on the cluster's 16 configurations (bit masks of the Au
    sites): a change picks one of 4 sites and redraws its species among both (8 outcomes,
    each 1/8: the site kept or flipped), the choice among ``{x, y_1 .. y_k}`` is
    ``∝ weight``."""
    index = {s: n for n, s in enumerate(states)}
    near = [[index[s ^ (f << i)] for i in range(4) for f in (0, 1)] for s in states]
    kernel = np.zeros((len(states), len(states)))
    for x in range(len(states)):
        for z in near[x]:
            for ys in itertools.product(near[z], repeat=k):
                members = [x, *ys]
                total = weight[members].sum()
                for m in members:
                    kernel[x, m] += weight[m] / total / 8 ** (k + 1)
    return kernel


def check_transitions(k: int, copies: int, mu: float = -0.4, temperature: float = 1500.0):
    table = enumerate_("cluster4", False)
    states = list(table)
    p = boltzmann(table, temperature, mu)
    designed = designed_kernel(states, p, k)
    np.testing.assert_allclose(p @ designed, p, atol=1e-14)  # semi-grand is stationary
    starts, rng = [], np.random.default_rng(k)
    for s in states:
        atoms = cluster4()
        atoms.numbers[:] = [AU if s >> i & 1 else CU for i in range(4)]
        atoms.set_momenta(rng.normal(size=(4, 3)))
        starts += [atoms] * copies
    plan = SemiGrandMC({"Cu": 0.0, "Au": mu}, temperature=temperature, steps=1, proposals=k)
    b = run(plan, starts).batch
    z = b.atomic_numbers.view(len(starts), k, 4)
    assert (z == z[:, :1]).all()  # every copy took the chosen state
    index = {s: n for n, s in enumerate(states)}
    measured = np.zeros_like(designed)
    for n, numbers in enumerate(z[:, 0].numpy()):
        measured[n // copies, index[key(numbers)]] += 1.0 / copies
    counts = np.rint(measured * copies)  # each ~ Binomial(copies, designed): both tails
    tails = np.minimum(binom.cdf(counts, copies, designed), binom.sf(counts - 1, copies, designed))
    assert tails.min() > 1e-6, (measured, designed)  # (~5 sigma; 0 where designed is 0)
    error = np.sqrt(designed * (1 - designed) / copies)
    stationary = p @ measured
    assert (np.abs(stationary - p) <= 4 * np.sqrt(p**2 @ error**2) + 1e-12).all()
    moved = 1.0 - np.diag(measured)  # acceptance: the chosen state is not x
    chain = b.mc_accepted.view(len(starts), k)[:, 0].numpy().reshape(len(states), copies)
    np.testing.assert_allclose(chain.mean(1), moved, atol=1e-12)
    # each atom keeps its mass's species and its kinetic energy (LAMMPS ke yes)
    expected = torch.tensor(atomic_masses[b.atomic_numbers.numpy()], dtype=torch.float64)
    torch.testing.assert_close(b.masses, expected, rtol=0, atol=0)
    before = Batch.from_atoms([a for a in starts for _ in range(k)])  # (the rows' order)
    m0, v0 = before.masses, before.velocities
    ke0, ke1 = m0 * (v0**2).sum(-1), b.masses * (b.velocities**2).sum(-1)
    torch.testing.assert_close(ke1, ke0, rtol=1e-13, atol=0.0)
    kept = b.masses == m0
    assert (~kept).any() and torch.equal(b.velocities[kept], v0[kept])


def test_one_step_kernel_is_exact_k2():
    check_transitions(k=2, copies=100)


def test_one_step_kernel_is_exact_k3():
    check_transitions(k=3, copies=80)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("k", [2, 3, 4])
def test_one_step_kernel_is_exact_long(k):
    check_transitions(k=k, copies=1000)


def check_semi_grand(mu: float, temperature: float, k: int, n_chains: int, steps: int,
                     burn: int = 20) -> None:  # fmt: skip
    table = enumerate_("cluster4", False)
    p = boltzmann(table, temperature, mu)
    energy, n_au = (np.array([v[i] for v in table.values()], dtype=float) for i in (0, 2))
    seen: list[np.ndarray] = []

    def look(ctx) -> None:
        z = ctx.batch.atomic_numbers.view(n_chains, k, -1)
        assert bool((z == z[:, :1]).all())  # copies identical after every step
        seen.append(z[:, 0].numpy().copy())

    plan = SemiGrandMC({"Cu": 0.0, "Au": mu}, temperature=temperature, steps=steps, proposals=k)
    hook = LambdaCallback(HookStageEnum.AFTER_STEP, look)
    results = run(plan, [cluster4() for _ in range(n_chains)], seed=11, callbacks=[hook])
    lookup = {s: n for n, s in enumerate(table)}
    rows = np.array([[lookup[key(z)] for z in step] for step in seen])
    within_error(n_au[rows[burn:]], float(p @ n_au), f"<N_Au> mu={mu}, T={temperature}")
    within_error(energy[rows[burn:]], float(p @ energy), f"<E> mu={mu}, T={temperature}")
    b = primary(results.batch)
    assert b.mc_attempts.tolist() == [steps] * n_chains and (b.mc_accepted > 0).all()
    np.testing.assert_allclose(b.mc_count_sum[:, 1].numpy(), n_au[rows].sum(0), atol=1e-9)
    np.testing.assert_allclose(b.mc_energy_sum.numpy(), energy[rows].sum(0), rtol=1e-12)
    table_ = results.to_pandas()  # one row per chain
    assert len(table_) == n_chains and table_["mc_chain"].tolist() == list(range(n_chains))
    np.testing.assert_allclose(table_["mc_fraction[Au]"], n_au[rows].mean(0) / 4, rtol=1e-12)


@pytest.mark.parametrize(("mu", "temperature"), [(-0.5, 1500.0), (-0.25, 1000.0)])
def test_composition_and_energy_match_enumeration_short(mu, temperature):
    check_semi_grand(mu, temperature, k=3, n_chains=12, steps=120)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mu", [-0.9, -0.5, -0.1])  # <N_Au> 0.2 ... 3.8
def test_composition_and_energy_match_enumeration(mu):
    check_semi_grand(mu, 1500.0, k=4, n_chains=32, steps=600, burn=50)


def plan(k: int = 3) -> SemiGrandMC:
    return SemiGrandMC({"Cu": 0.0, "Au": -0.1}, temperature=900.0, steps=12, proposals=k)


def test_proposals_1_is_the_single_proposal_move_bit_for_bit():
    data = alloys()
    mu = {"Cu": 0.0, "Au": -0.1, "Ag": 0.05}
    one = run(SemiGrandMC(mu, 900.0, steps=25, proposals=1), data).batch
    plain = run(SemiGrandMC(mu, 900.0, steps=25), data).batch
    same(one, plain, "proposals=1")
    assert not one.has_field("mc_copy")
    # what the code before proposals= gave (main at da2bae6, the same seed and plan)
    assert one.mc_accepted.tolist() == [11, 13, 11]
    counts = [[49.0, 13.0, 38.0], [104.0, 34.0, 62.0], [51.0, 14.0, 35.0]]
    assert one.mc_count_sum.tolist() == counts


def test_chains_are_the_same_alone_in_a_batch_and_after_a_resume(tmp_path):
    together, resumed = alone_in_a_batch_and_resumed(plan, tmp_path)
    assert torch.equal(resumed.mc_count_sum, together.mc_count_sum)


def test_accelerator_path_and_replayed_graphs_equal_the_cpu_steps():
    accelerator_and_graphs_equal_the_cpu(plan)


def test_bad_input_is_refused_naming_the_fix():
    for bad in (0, -2, 1.5, "2"):
        with pytest.raises(ConfigError, match="proposals"):
            SemiGrandMC({"Cu": 0.0, "Au": 0.1}, proposals=bad)
    with pytest.raises(ConfigError, match="one temperature"):
        SemiGrandMC({"Cu": 0.0, "Au": 0.1}, temperature=[900.0, 800.0], proposals=2)
    with pytest.raises(ConfigError, match=r"Hybrid: .* proposals > 1"):
        Hybrid(Langevin(steps=4), plan(), every=2)
    data = alloys(2)
    with pytest.raises(ConfigError, match="must stay identical"):
        run(Langevin(steps=2) + plan(), data)
    with pytest.raises(ConfigError, match="must stay identical"):
        run(SwapMC(["Cu", "Au"], 900.0, steps=2, proposals=2) + plan(3), data)
