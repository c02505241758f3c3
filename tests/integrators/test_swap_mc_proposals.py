"""``SwapMC(proposals=k)``: k swap proposals per chain per forward (generalized
Metropolis-Hastings over k copies of each structure), against exact enumeration with
ASE's EMT, never against ourselves.

The one-step kernel is computed exactly from the ASE EMT energies of the 6 Cu2Au2
configurations of a 4-atom cluster by summing over every auxiliary swap z (4 from each
state) and every k-tuple of swaps of z; its stationary distribution must be Boltzmann's
(the theory), and the measured transitions (many chains from each configuration, one
step) must equal it within binomial errors (the implementation).  The chains' mean
energy of the 70 Cu4Au4 orderings of an 8-atom cell must fall within 4 standard errors
of the Boltzmann average.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
import torch
from ase.units import kB
from test_mc_contract import UnlikeLJ, alloys
from test_swap_mc import AU, CU, boltzmann, cell8, cluster4, enumerate_, key, within_error

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import Batch
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.engine.hooks import HookStageEnum, LambdaCallback
from alchemi_lit.integrators import FIRE, Hybrid, Langevin, ReplicaExchange, SwapMC
from alchemi_lit.integrators.proposal_copies import Copies
from alchemi_lit.models import EMT
from alchemi_lit.testing import accelerator_path, emulated_cuda_graphs

FIELDS = ("atomic_numbers", "masses", "positions", "velocities", "forces", "energy", "stress",
          "total_steps", "mc_attempts", "mc_accepted", "mc_energy_sum")  # fmt: skip


def run(plan, data, **kw):
    return al.Simulator(model=kw.pop("model", EMT()), stages=plan, precision="64",
                        seed=kw.pop("seed", 3), **kw).run(data)  # fmt: skip


def primary(b: Batch) -> Batch:
    return b.select(torch.nonzero(b.mc_copy == 0).flatten())


def designed_kernel(states: list[int], energy: np.ndarray, temperature: float, k: int):
    """The exact one-step kernel of the move on the Cu2Au2 cluster's configurations."""
    index = {s: n for n, s in enumerate(states)}
    near = [[t for t in states if bin(s ^ t).count("1") == 2] for s in states]  # 4 each
    w = np.exp(-(energy - energy.min()) / (kB * temperature))
    kernel = np.zeros((len(states), len(states)))
    for x in range(len(states)):
        for z in near[x]:
            for ys in itertools.product(near[index[z]], repeat=k):
                members = [x] + [index[y] for y in ys]
                total = w[members].sum()
                for m in members:
                    kernel[x, m] += w[m] / total / (4 * 4**k)
    return kernel


def check_transitions(k: int, copies: int, temperature: float = 900.0) -> None:
    table = enumerate_("cluster4", True)
    states = list(table)
    energy = np.array([table[s][0] for s in states])
    designed = designed_kernel(states, energy, temperature, k)
    p = boltzmann(table, temperature)
    np.testing.assert_allclose(p @ designed, p, atol=1e-14)  # Boltzmann is stationary
    starts = []
    for s in states:
        atoms = cluster4()
        atoms.numbers[:] = [AU if s >> i & 1 else CU for i in range(4)]
        starts += [atoms] * copies
    b = run(SwapMC(["Cu", "Au"], temperature=temperature, steps=1, proposals=k), starts).batch
    z = b.atomic_numbers.view(len(starts), k, 4)
    assert (z == z[:, :1]).all()  # every copy took the chosen state
    index = {s: n for n, s in enumerate(states)}
    measured = np.zeros_like(designed)
    for n, numbers in enumerate(z[:, 0].numpy()):
        measured[n // copies, index[key(numbers)]] += 1.0 / copies
    error = np.sqrt(designed * (1 - designed) / copies)
    assert (np.abs(measured - designed) <= 4 * error + 1e-12).all(), (measured, designed)
    stationary = p @ measured
    assert (np.abs(stationary - p) <= 4 * np.sqrt(p**2 @ error**2) + 1e-12).all()
    moved = 1.0 - np.diag(measured)  # acceptance: the chosen state is not x
    chain = b.mc_accepted.view(len(starts), k)[:, 0].numpy().reshape(len(states), copies)
    np.testing.assert_allclose(chain.mean(1), moved, atol=1e-12)


def test_one_step_kernel_is_exact_and_leaves_boltzmann_invariant():
    check_transitions(k=3, copies=120)


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 4])
def test_one_step_kernel_is_exact_long(k):
    check_transitions(k=k, copies=2000)


def check_canonical(temperature: float, k: int, n_chains: int, steps: int, burn: int) -> None:
    table = enumerate_("cell8", True)
    p = boltzmann(table, temperature)
    energy = np.array([v[0] for v in table.values()])
    seen: list[np.ndarray] = []

    def look(ctx) -> None:
        z = ctx.batch.atomic_numbers.view(n_chains, k, -1)
        assert bool((z == z[:, :1]).all())  # copies identical after every step
        seen.append(z[:, 0].numpy().copy())

    plan = SwapMC(["Cu", "Au"], temperature=temperature, steps=steps, proposals=k)
    hook = LambdaCallback(HookStageEnum.AFTER_STEP, look)
    results = run(plan, [cell8() for _ in range(n_chains)], seed=11, callbacks=[hook])
    lookup = {s: n for n, s in enumerate(table)}
    rows = np.array([[lookup[key(z)] for z in step] for step in seen[burn:]])
    within_error(energy[rows], float(p @ energy), f"<E> at {temperature} K, k={k}")
    b = primary(results.batch)
    assert b.mc_attempts.tolist() == [steps] * n_chains
    final = np.array([table[key(z)][0] for z in b.atomic_numbers.view(n_chains, -1).numpy()])
    np.testing.assert_allclose(b.energy.numpy(), final, rtol=0, atol=1e-9)
    assert torch.equal(b.mc_pair_accepted[:, 0], b.mc_accepted) and (b.mc_accepted > 0).all()
    table_ = results.to_pandas()
    assert len(table_) == n_chains and table_["mc_chain"].tolist() == list(range(n_chains))


def test_canonical_mean_energy_matches_enumeration_short():
    check_canonical(1200.0, k=4, n_chains=12, steps=100, burn=20)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [600.0, 2400.0])
def test_canonical_mean_energy_matches_enumeration(temperature):
    check_canonical(temperature, k=4, n_chains=48, steps=1000, burn=100)


def test_proposals_1_is_the_single_proposal_move_bit_for_bit():
    data = alloys()
    one = run(SwapMC(["Cu", "Au"], 900.0, steps=15, proposals=1), data).batch
    plain = run(SwapMC(["Cu", "Au"], 900.0, steps=15), data).batch
    same(one, plain, "proposals=1")
    assert not one.has_field("mc_copy")


def plan(k: int = 3) -> SwapMC:
    return SwapMC(["Cu", "Au"], temperature=900.0, steps=12, proposals=k)


def same(a: Batch, b: Batch, what: str, rtol: float = 0.0) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if rtol and x.is_floating_point() and name != "masses":
            torch.testing.assert_close(x, y, rtol=rtol, atol=rtol, equal_nan=True, msg=what)
        else:  # bit for bit (stress is NaN without a stress stage: equal_nan)
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True, msg=f"{what}: {name}")


def named(data: list, first: int = 7) -> list:
    for n, atoms in enumerate(data):
        atoms.info["system_id"] = first + n  # the chain's id: its draws' key
    return data


def alone_in_a_batch_and_resumed(plan, tmp_path) -> tuple[Batch, Batch]:
    """Three chains of ``plan()``: each alone equals itself in the batch, and a run cut
    at step 8 and resumed from its checkpoint equals the whole run; (whole, resumed)."""
    data = named(alloys())
    together = run(plan(), data).batch
    assert together.num_systems == 9 and (together.mc_accepted > 0).all()
    for n in range(3):
        alone = run(plan(), [data[n]]).batch
        same(primary(alone), primary(together).select([n]), f"chain {n} alone")

    def stop(ctx):
        if ctx.step == 8:
            raise KeyboardInterrupt

    cut = [Checkpoint(tmp_path, every=4), LambdaCallback(HookStageEnum.AFTER_STEP, stop)]
    with contextlib.suppress(KeyboardInterrupt, al.engine.interrupt.RunInterrupted):
        run(plan(), data, callbacks=cut, sync_every=4)
    resumed = al.Simulator(model=EMT(), stages=plan(), precision="64", seed=3, sync_every=4,
                           callbacks=[Checkpoint(tmp_path)]).run(data, resume=tmp_path)  # fmt: skip
    same(resumed.batch, together, "resumed")
    return together, resumed.batch


def test_chains_are_the_same_alone_in_a_batch_and_after_a_resume(tmp_path):
    alone_in_a_batch_and_resumed(plan, tmp_path)


def test_relaxation_then_chains_and_inflight_batches_keep_chains_whole():
    data = alloys()
    fused = run(FIRE(fmax=0.1, max_steps=5) + plan(), data).batch
    z = fused.atomic_numbers.view(-1)
    for c in range(3):  # copies of one chain: identical rows
        rows = primary(fused).select([c])
        for j in range(1, 3):
            other = fused.select(torch.nonzero((fused.mc_chain == c) & (fused.mc_copy == j))[0])
            same(other, rows, f"chain {c} copy {j}")
    sampler = SizeAwareSampler(Copies(data, 3), max_atoms=60)  # 16-atom cells: 3 at a time
    streamed = run(FIRE(fmax=0.1, max_steps=5) + plan(), sampler).batch
    assert torch.equal(streamed.atomic_numbers.view(-1), z)
    same(streamed, fused, "inflight")


def accelerator_and_graphs_equal_the_cpu(plan) -> None:
    """``plan()`` on the accelerator path equals its CPU run; its graph replays (emulated
    capture, an LJ model) equal the eager steps, with some swaps accepted, some not."""
    data = alloys()
    cpu = run(plan(), data).batch
    with accelerator_path():
        same(run(plan(), data).batch, cpu, "accelerator path", rtol=1e-10)
        lj = UnlikeLJ(epsilon=0.05, sigma=2.42, cutoff=5.0)
        eager = run(plan(), data, model=lj).batch
        with emulated_cuda_graphs() as backends:
            graphed = run(plan(), data, model=lj, cuda_graphs=True).batch
    assert backends[-1].captures >= 1
    assert (eager.mc_accepted > 0).any() and (eager.mc_accepted < eager.mc_attempts).any()
    same(graphed, eager, "graph replays")


def test_accelerator_path_and_replayed_graphs_equal_the_cpu_steps():
    accelerator_and_graphs_equal_the_cpu(plan)


def test_unsupported_combinations_are_refused_naming_the_fix():
    data = alloys(2)
    with pytest.raises(ConfigError, match="proposals"):
        SwapMC(["Cu", "Au"], proposals=0)
    with pytest.raises(ConfigError, match="one temperature"):
        SwapMC(["Cu", "Au"], temperature=[900.0, 800.0], proposals=2)
    with pytest.raises(ConfigError, match=r"Hybrid: .* proposals > 1"):
        Hybrid(Langevin(steps=4), plan(), every=2)
    with pytest.raises(ConfigError, match=r"ReplicaExchange: .* proposals > 1"):
        ReplicaExchange(plan(), [300.0, 600.0])
    with pytest.raises(ConfigError, match="must stay identical"):
        run(Langevin(steps=2) + plan(), data)
    with pytest.raises(ConfigError, match="not a Batch"):
        run(plan(), Batch.from_atoms(data))
    with pytest.raises(ConfigError, match="not in chains of 3 copies"):
        run(plan(), SizeAwareSampler(data, max_atoms=100))
    with pytest.raises(ConfigError, match="max_systems=3"):
        run(plan(), SizeAwareSampler(Copies(data, 3), max_atoms=500, max_systems=2))
    split = list(Copies(data, 3))[:-1]  # chain 1 lacks its copy 2
    with pytest.raises(ConfigError, match=r"chain 1 entered with copies \[0, 1\]"):
        run(plan(), split)


def test_yaml_run_makes_the_copies_and_the_table_has_one_row_per_chain(tmp_path):
    """``alchemi-lit run`` with ``proposals: 2``: the CLI expands the structures; the store
    keeps every row (``mc_chain``, ``mc_copy``), its table one row per chain."""
    import ase.io
    import yaml

    from alchemi_lit.cli import main
    from alchemi_lit.sinks import read_results

    ase.io.write(tmp_path / "cells.extxyz", alloys())
    store = tmp_path / "mc.zarr"
    stage = {"class_path": "SwapMC",
             "init_args": {"species": ["Cu", "Au"], "temperature": 900.0, "steps": 12,
                           "proposals": 3}}  # fmt: skip
    config = {"simulator": {"model": {"class_path": "EMT"}, "stages": [stage], "seed": 3,
                            "precision": "64", "sinks": [{"class_path": "ZarrSink",
                            "init_args": {"store": str(store), "mode": "w"}}]},
              "data": {"structures": str(tmp_path / "cells.extxyz")}}  # fmt: skip
    (tmp_path / "mc.yaml").write_text(yaml.safe_dump(config))
    assert main(["run", "--config", str(tmp_path / "mc.yaml")]) == 0
    stored = read_results(store)
    assert len(stored) == 9
    table = stored.to_pandas()
    assert table["mc_chain"].tolist() == [0, 1, 2] and table["system_id"].tolist() == [0, 3, 6]
    in_memory = run(plan(), ase.io.read(tmp_path / "cells.extxyz", ":")).to_pandas()
    for column in ("energy", "mc_attempts", "mc_accepted", "mc_energy_mean"):
        np.testing.assert_array_equal(table[column], in_memory[column], err_msg=column)
