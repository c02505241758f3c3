"""Replica exchange (parallel tempering): the exact Boltzmann marginals of a double well
at every rung (by quadrature), the acceptance against its formula, batch independence,
resume, and the accelerator and CUDA-graph paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ase import Atoms
from scipy import integrate

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import Batch
from alchemi_lit.core.units import kB
from alchemi_lit.data import SizeAwareSampler, make_replicas
from alchemi_lit.engine.hooks import Callback, HookStageEnum, LambdaCallback
from alchemi_lit.integrators import (
    Bussi,
    Langevin,
    NoseHooverChain,
    ReplicaExchange,
    VelocityVerlet,
    exchange,
    geometric_ladder,
)  # fmt: skip
from alchemi_lit.models import LennardJones
from alchemi_lit.testing import DoubleWell, accelerator_path, emulated_cuda_graphs
from alchemi_lit.testing.models import check_forces_are_the_energy_gradient
from conftest import AR_EPSILON, AR_SIGMA, perturbed_argon

LADDER = geometric_ladder(150.0, 1200.0, 4)
MODEL = DoubleWell(barrier=0.15, a=1.0, spring=1.0)


def particle(x: float = -1.0) -> Atoms:
    return Atoms("Ar", positions=[[x, 0.1, -0.1]], pbc=False)


class Samples(Callback):
    """``x`` of every replica at every ``every``-th step after ``burn`` steps, by rung."""

    def __init__(self, burn: int, every: int) -> None:
        super().__init__()
        self.burn, self.each, self.rows = burn, every, []

    def after_step(self, ctx) -> None:
        if ctx.step >= self.burn and ctx.step % self.each == 0:
            b = ctx.batch
            self.rows.append((b.rex_group.clone(), b.rex_rung.clone(), b.positions[:, 0].clone()))


def exact_fraction_right(t: float) -> float:
    """P(x > 0) of one well is 1/2 by symmetry; what the test checks is <x^2> instead."""
    return 0.5


def exact_x2(t: float) -> float:
    """<x^2> of exp(-U(x)/kT) by quadrature."""
    weight = lambda x: math.exp(-float(MODEL.potential(torch.tensor(x))) / (kB * t))  # noqa: E731
    z = integrate.quad(weight, -4, 4, points=[-1, 0, 1])[0]
    return integrate.quad(lambda x: x * x * weight(x), -4, 4, points=[-1, 0, 1])[0] / z


def sample(groups: int, steps: int, burn: int, every: int = 10):
    samples = Samples(burn, 5)
    md = Langevin(dt=10.0, friction=0.01, steps=steps)
    sim = al.Simulator(MODEL, ReplicaExchange(md, LADDER, every=every), precision="64", seed=11,
                       callbacks=[samples])  # fmt: skip
    results = sim.run(make_replicas([particle() for _ in range(groups)], len(LADDER)))
    group = torch.stack([r[0] for r in samples.rows])
    rung = torch.stack([r[1] for r in samples.rows])
    x = torch.stack([r[2] for r in samples.rows])
    return results, group, rung, x


def check_marginals(groups: int, steps: int, burn: int) -> None:
    """Per rung, each group's mean of x > 0 and of x^2 over its trajectory; the groups
    are independent, so their spread gives the standard error of the mean over groups."""
    results, group, rung, x = sample(groups, steps, burn)
    for k, t in enumerate(LADDER):
        right, x2 = np.zeros(groups), np.zeros(groups)
        for g in range(groups):
            at = (group == g) & (rung == k)
            right[g] = float((x[at] > 0).double().mean())
            x2[g] = float((x[at] ** 2).mean())
        for name, values, want in (("P(x>0)", right, exact_fraction_right(t)),
                                   ("<x^2>", x2, exact_x2(t))):  # fmt: skip
            error = values.std(ddof=1) / math.sqrt(groups)
            got = values.mean()
            assert abs(got - want) < 4 * error + 0.01 * want, (name, t, got, want, error)
    accepted = results.batch.rex_accepts.sum(0).double() / results.batch.rex_attempts.sum(0)
    assert bool((accepted > 0.05).all()), accepted  # every neighbour pair exchanges
    assert int(results.batch.rex_round_trips.sum()) > 0


def test_the_double_well_forces_are_its_gradient():
    check_forces_are_the_energy_gradient(MODEL, [particle(-0.7), particle(0.3)])


def test_replicas_sample_the_exact_marginal_at_every_temperature_short():
    """Without exchanges the lowest rung (barrier/kT = 11.6) would stay in its well; with
    them every rung is split evenly between the wells and <x^2> is the quadrature's."""
    check_marginals(groups=8, steps=1200, burn=200)


@pytest.mark.slow
def test_replicas_sample_the_exact_marginal_at_every_temperature_long():
    check_marginals(groups=24, steps=30000, burn=1000)


def test_the_acceptance_is_metropolis_on_hand_set_energies():
    """Two replicas at 300 and 600 K with set energies: the exchange rate over many keyed
    draws equals min(1, exp[(1/kT1 - 1/kT2)(E1 - E2)]) within its binomial error, and an
    accepted exchange swaps temperatures and rescales velocities by sqrt(T_new/T_old)."""
    ladder = torch.tensor([300.0, 600.0], dtype=torch.float64)
    for e1, e2 in ((0.0, 0.02), (0.0, 0.1), (0.05, 0.0)):
        want = min(1.0, math.exp((1 / (kB * 300) - 1 / (kB * 600)) * (e1 - e2)))
        energies = torch.tensor([e1, e2], dtype=torch.float64)
        got = exchange.acceptance(ladder[:1], ladder[1:], energies[:1], energies[1:])
        assert float(got) == pytest.approx(want, rel=1e-12)
        swaps, tries = 0, 200
        b = Batch.from_atoms([particle(), particle()], dtype=torch.float64)
        b.ensure_field("rex_group", "system", (), torch.int64, 7)
        for name, fill in (("rex_end", -1), ("rex_round_trips", 0), ("rex_rung", 0)):
            b.ensure_field(name, "system", (), torch.int64, fill)
        b.ensure_field("rex_temperature", "system", (), None, 0.0)
        for name in ("rex_attempts", "rex_accepts"):
            b.ensure_field(name, "system", (1,), torch.int64, 0)
        for step in range(tries):
            b.rex_rung, b.rex_temperature = torch.tensor([0, 1]), ladder.clone()
            b.rex_attempts = b.rex_accepts = torch.zeros(2, 1, dtype=torch.int64)
            b.energy = torch.tensor([e1, e2], dtype=torch.float64)
            b.velocities = torch.ones_like(b.velocities)
            b.step = torch.full_like(b.step, 4 * step + 3)  # an even-pair attempt
            b.total_steps = torch.full_like(b.total_steps, step)
            exchange.attempt(b, torch.ones(2, dtype=torch.bool), ladder, 2, seed=5)
            assert int(b.rex_attempts[0, 0]) == 1
            if int(b.rex_accepts[0, 0]):
                swaps += 1
                assert b.rex_temperature.tolist() == [600.0, 300.0]
                assert b.rex_rung.tolist() == [1, 0]
                assert b.velocities[0, 0] == pytest.approx(math.sqrt(2.0))
                assert b.velocities[1, 0] == pytest.approx(math.sqrt(0.5))
        error = math.sqrt(max(want * (1 - want), 1e-4) / tries)
        assert abs(swaps / tries - want) < 4 * error + 1e-9, (e1, e2, swaps / tries, want)


def run(structures, md=None, ids=None, callbacks=(), resume=None, **kw):
    md = md or Langevin(dt=10.0, friction=0.01, steps=60)
    sim = al.Simulator(MODEL, ReplicaExchange(md, LADDER, every=5), precision="64", seed=3,
                       sync_every=4, callbacks=list(callbacks), **kw)  # fmt: skip
    data = SizeAwareSampler(structures, max_atoms=64, system_ids=ids)
    return sim.run(data, resume=resume)


FIELDS = ("positions", "velocities", "energy", "rex_temperature", "rex_rung", "rex_accepts",
          "rex_round_trips")  # fmt: skip


def same(a, b) -> None:
    for name in FIELDS:
        assert torch.equal(getattr(a.batch, name), getattr(b.batch, name)), name


@pytest.mark.parametrize("md", [
    lambda: Langevin(dt=10.0, friction=0.01, steps=60),
    pytest.param(lambda: Bussi(dt=10.0, taut=100.0, steps=60), marks=pytest.mark.slow),
    pytest.param(lambda: NoseHooverChain(dt=10.0, tdamp=100.0, steps=60), marks=pytest.mark.slow),
], ids=["langevin", "bussi", "nhc"])  # fmt: skip
def test_two_groups_together_equal_each_alone_bit_for_bit(md):
    reps = make_replicas([particle(-1.0), particle(0.8)], len(LADDER))
    together = run(reps, md())
    first = run(reps[:4], md(), ids=[0, 1, 2, 3])
    second = run(reps[4:], md(), ids=[4, 5, 6, 7])
    for name in FIELDS:
        joined = torch.cat([getattr(first.batch, name), getattr(second.batch, name)])
        assert torch.equal(getattr(together.batch, name), joined), name
    assert int(together.batch.rex_accepts.sum()) > 0


def test_kill_and_resume_mid_run_is_bit_for_bit(tmp_path):
    reps = make_replicas([particle(-1.0), particle(0.8)], len(LADDER))
    reference = run(reps)

    def crash(ctx):
        if ctx.step == 33:
            raise RuntimeError("killed")

    where = str(tmp_path / "ckpt")
    with pytest.raises(RuntimeError, match="killed"):
        run(reps, callbacks=[Checkpoint(where, every=8),
                             LambdaCallback(HookStageEnum.AFTER_STEP, crash)])  # fmt: skip
    same(reference, run(reps, callbacks=[Checkpoint(where, every=8)], resume=where))


def test_the_accelerator_path_and_emulated_cuda_graphs_give_the_cpu_results():
    """Argon crystals at a 20-80 K ladder (LJ, a neighbour list: what a capture needs):
    the torch path (a GPU's) takes the same exchange decisions as the CPU's numba one,
    its floats within 1e-9 (libraries and summation order differ); replayed graphs equal
    the eager accelerator path bit for bit."""
    reps = make_replicas(perturbed_argon(2, 2, 0.05, seed=4), 4)

    def crystals(**kw):
        md = Langevin(dt=5.0, friction=0.02, steps=40)
        sim = al.Simulator(LennardJones(AR_EPSILON, AR_SIGMA, 6.0),
                           ReplicaExchange(md, geometric_ladder(20.0, 80.0, 4), every=2),
                           precision="64", seed=3, **kw)  # fmt: skip
        return sim.run(SizeAwareSampler(reps, max_atoms=256))

    reference = crystals()
    with accelerator_path():
        eager = crystals()
        with emulated_cuda_graphs() as backends:
            graphed = crystals(cuda_graphs=True)
    assert backends[-1].captures >= 1
    same(eager, graphed)
    for name in FIELDS:
        a, b = getattr(eager.batch, name), getattr(reference.batch, name)
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=name)
        else:
            assert torch.equal(a, b), name
    assert int(reference.batch.rex_accepts.sum()) > 0


def test_bad_ladders_and_inputs_are_refused_before_the_run():
    md = Langevin(steps=10)
    with pytest.raises(ConfigError, match="increase strictly"):
        ReplicaExchange(md, [300.0, 600.0, 500.0])
    with pytest.raises(ConfigError, match="at least 2"):
        ReplicaExchange(md, [300.0])
    with pytest.raises(ConfigError, match="every"):
        ReplicaExchange(md, LADDER, every=0)
    with pytest.raises(ConfigError, match="> 0 K"):
        ReplicaExchange(md, [0.0, 300.0])
    with pytest.raises(ConfigError, match="canonical ensemble"):
        ReplicaExchange(VelocityVerlet(steps=10), LADDER)
    with pytest.raises(ConfigError, match="t_min < t_max"):
        geometric_ladder(600, 300, 4)
    sim = al.Simulator(MODEL, ReplicaExchange(md, LADDER), precision="64")
    with pytest.raises(ConfigError, match="not a replica"):
        sim.run([particle()])
    with pytest.raises(ConfigError, match=r"rungs \[0, 1\], but the ladder has 4"):
        sim.run(make_replicas(particle(), 2))
    with pytest.raises(ConfigError, match="never split"):
        SizeAwareSampler(make_replicas(particle(), 4), max_atoms=100, max_systems=3)


def test_the_ladder_acceptance_and_round_trips_are_reported():
    import io

    from rich.console import Console

    from alchemi_lit.callbacks import ProgressBar

    out = io.StringIO()
    bar = ProgressBar(every=5, console=Console(force_terminal=True, file=out, width=250))
    results = run(make_replicas([particle(-1.0), particle(0.8)], len(LADDER)), callbacks=[bar])
    b = results.batch
    rates = " ".join(f"{100 * a / n:.0f}%" for a, n in zip(b.rex_accepts.sum(0).tolist(),
                                                          b.rex_attempts.sum(0).tolist()))
    trips = int(b.rex_round_trips.sum())
    assert f"ladder 150-1200 K (4): accepted {rates}, {trips} round trips" in out.getvalue()
    table = results.to_pandas()
    assert sorted(table["temperature"]) == pytest.approx(sorted(LADDER * 2))
    assert table["replica_group"].tolist() == [0] * 4 + [1] * 4
    assert table["round_trips"].sum() == trips


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_groups_sharded_over_two_replica_ranks_equal_one_device_bit_for_bit():
    """ReplicasStrategy shards by sampler unit: a group's replicas stay on one rank."""
    reps = make_replicas([particle(-1.0), particle(0.8), particle(0.2)], len(LADDER))
    one = run(reps)
    two = run(reps, strategy="replicas", devices=2, start_method="fork", timeout=60.0)
    same(one, two)


@pytest.mark.slow
def test_a_yaml_config_runs_replica_exchange_by_short_name(tmp_path):
    """``ReplicaExchange`` wraps its stage by class_path; replicas come from a file whose
    info keeps their group and rung (extxyz)."""
    from ase.io import write

    from alchemi_lit.cli import main

    write(tmp_path / "reps.extxyz", make_replicas(perturbed_argon(2, 2, 0.05, seed=1), 3))
    (tmp_path / "cfg.yaml").write_text(
        "simulator:\n  model: {class_path: lj-argon}\n  precision: '64'\n  stages:\n"
        "    - class_path: ReplicaExchange\n      init_args:\n"
        "        stage: {class_path: Langevin, init_args: {dt: 4.0, steps: 20}}\n"
        "        temperatures: [20.0, 35.0, 60.0]\n        every: 5\n"
        f"data:\n  structures: {tmp_path / 'reps.extxyz'}\n"
    )  # fmt: skip
    assert main(["run", "--config", str(tmp_path / "cfg.yaml"), "--output.dir",
                 str(tmp_path / "out")]) == 0  # fmt: skip


def test_a_results_store_keeps_the_replica_fields(tmp_path):
    from alchemi_lit.io.results_store import read_results
    from alchemi_lit.io.store_reader import REPLICA_COLUMNS
    from alchemi_lit.sinks import ZarrSink

    assert set(REPLICA_COLUMNS) == {v for k, v in vars(exchange).items() if k.isupper()}
    reps = make_replicas([particle(-1.0), particle(0.8)], len(LADDER))
    memory = run(reps).to_pandas()
    run(reps, sinks=[ZarrSink(str(tmp_path / "rex.zarr"))])
    lazy = read_results(tmp_path / "rex.zarr")  # read back from the store
    for column in ("replica_group", "temperature", "round_trips"):
        assert memory[column].tolist() == lazy.to_pandas()[column].tolist(), column
