"""SwapMC, SemiGrandMC and Hybrid keep the integrator contract, bit for bit where the
construction guarantees it: a batch equals each system alone, a killed run resumes
exactly, a hybrid stage equals its MD and MC steps run one after another, the
accelerator's code path and CUDA-graph replays equal the eager CPU steps; bad input is
refused before the run, naming the system."""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import pytest
import torch
from ase.build import bulk
from ase.constraints import FixAtoms

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import Batch
from alchemi_lit.engine.hooks import HookStageEnum, LambdaCallback
from alchemi_lit.integrators import FIRE, Hybrid, Langevin, SemiGrandMC, SwapMC
from alchemi_lit.models import EMT, LennardJones
from alchemi_lit.sinks import ZarrSink, read_results
from alchemi_lit.testing import accelerator_path, check_integrator, emulated_cuda_graphs

FIELDS = ("atomic_numbers", "masses", "positions", "velocities", "forces", "energy",
          "total_steps", "mc_attempts", "mc_accepted", "mc_energy_sum")  # fmt: skip


def alloys(n: int = 3) -> list:
    """Small, different Cu-Au cells (8 and 16 atoms, rattled)."""
    out = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.85, cubic=True).repeat((1, 1, 1 + k % 2))
        rng = np.random.default_rng(k)
        atoms.numbers[rng.permutation(len(atoms))[: len(atoms) // 2 - k % 2]] = 79
        atoms.rattle(0.05, seed=k)
        out.append(atoms)
    return out


PLANS = {
    "swap": lambda: SwapMC(["Cu", "Au"], temperature=900.0, steps=15),
    "semi-grand": lambda: SemiGrandMC({"Cu": 0.0, "Au": -0.1}, temperature=900.0, steps=15),
    "hybrid": lambda: Hybrid(
        Langevin(dt=2.0, temperature=900.0, steps=12), SwapMC(["Cu", "Au"], 900.0), every=3
    ),
}


def run(plan, data, **kw):
    return al.Simulator(model=EMT(), stages=plan, precision="64", seed=3, **kw).run(data)


def same(a: Batch, b: Batch, what: str, rtol: float = 0.0) -> None:
    """Bit for bit (``rtol=0``), or the species and chain statistics bit for bit and the
    floats within ``rtol`` (code paths that sum forces in another order)."""
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if rtol and x.is_floating_point() and name != "masses":
            torch.testing.assert_close(x, y, rtol=rtol, atol=rtol, msg=f"{what}: {name}")
        else:
            assert torch.equal(x, y), f"{what}: {name} differ"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_keeps_the_integrator_contract(name, tmp_path):
    """The full contract (masked systems untouched, pickling, batch independence, resume,
    fused equals sequential); its fast siblings are the tests below."""
    check_integrator(PLANS[name], tmp_path, model=EMT, structures=alloys)


@pytest.mark.parametrize("name", ["swap", "hybrid"])
def test_species_and_statistics_are_the_same_alone_and_after_a_resume(name, tmp_path):
    data = alloys()
    together = run(PLANS[name](), data).batch
    for k in (0, 1):
        alone = run(PLANS[name](), Batch.from_atoms([data[k]], system_ids=[k])).batch
        same(alone, together.select([k]), f"system {k} alone")

    def stop(ctx):
        if ctx.step == 8:
            raise KeyboardInterrupt

    cut = [Checkpoint(tmp_path, every=4), LambdaCallback(HookStageEnum.AFTER_STEP, stop)]
    with contextlib.suppress(KeyboardInterrupt, al.engine.interrupt.RunInterrupted):
        run(PLANS[name](), data, callbacks=cut, sync_every=4)
    resumed = al.Simulator(model=EMT(), stages=PLANS[name](), precision="64", seed=3,
                           sync_every=4, callbacks=[Checkpoint(tmp_path)])  # fmt: skip
    same(resumed.run(data, resume=tmp_path).batch, together, "resumed")


def test_hybrid_equals_its_md_and_mc_steps_run_one_after_another():
    data = alloys(2)
    hybrid = Hybrid(Langevin(dt=2.0, temperature=900.0, steps=6), SwapMC(["Cu", "Au"], 900.0), 3)
    fused = run(hybrid, data).batch
    state = data
    for _ in range(2):
        state = run(Langevin(dt=2.0, temperature=900.0, steps=3), state).batch
        state = run(SwapMC(["Cu", "Au"], temperature=900.0, steps=1), state).batch
    for name in FIELDS[:7]:
        assert torch.equal(getattr(fused, name), getattr(state, name)), name
    assert fused.mc_attempts.tolist() == [2, 2]


def test_accepted_swaps_keep_each_atoms_kinetic_energy():
    """LAMMPS fix atom/swap ke yes: at an MC step the swapped atoms change mass and keep
    0.5 m v^2; every other atom keeps its velocity, and positions do not move."""
    seen = []

    def before(ctx):
        b = ctx.batch
        seen.append([b.velocities.clone(), b.masses.clone(), b.positions.clone()])

    def after(ctx):
        b = ctx.batch
        seen[-1] += [b.velocities.clone(), b.masses.clone(), b.positions.clone()]

    hooks = [LambdaCallback(HookStageEnum.BEFORE_PRE_UPDATE, before),
             LambdaCallback(HookStageEnum.AFTER_POST_UPDATE, after)]  # fmt: skip
    run(PLANS["hybrid"](), alloys(2), callbacks=hooks)
    swapped = 0
    for step in range(3, len(seen), 4):  # the MC steps: phase 3 of every 4
        v0, m0, r0, v1, m1, r1 = seen[step]
        assert torch.equal(r0, r1)
        changed = m0 != m1
        swapped += int(changed.sum())
        assert torch.equal(v0[~changed], v1[~changed])
        ke0 = 0.5 * m0[changed] * (v0[changed] ** 2).sum(-1)
        ke1 = 0.5 * m1[changed] * (v1[changed] ** 2).sum(-1)
        torch.testing.assert_close(ke1, ke0, rtol=1e-14, atol=0.0)
    assert swapped >= 2 and swapped % 2 == 0


class UnlikeLJ(LennardJones):
    """Lennard-Jones with unlike pairs 30 % deeper: a species-dependent energy whose
    forward a CUDA graph can capture (EMT's cannot be replayed yet)."""

    def energy_and_edge_gradient(self, batch, edges):
        e_pair, grad = self.pair_terms(edges.vec)
        z = batch.atomic_numbers
        w = 1.0 + 0.3 * (z.index_select(0, edges.i) != z.index_select(0, edges.j)).to(e_pair.dtype)
        return edges.system_sum(e_pair * w, batch.num_systems), grad * w.unsqueeze(-1)


@pytest.mark.parametrize(
    "name", ["swap", *(pytest.param(n, marks=pytest.mark.slow) for n in ("semi-grand", "hybrid"))]
)
def test_accelerator_path_and_replayed_graphs_equal_the_cpu_steps(name):
    data = alloys()
    cpu = run(PLANS[name](), data).batch
    with accelerator_path():
        same(run(PLANS[name](), data).batch, cpu, "accelerator path", rtol=1e-10)
        lj = dict(model=UnlikeLJ(epsilon=0.05, sigma=2.42, cutoff=5.0))
        sim = lambda graphs: al.Simulator(  # noqa: E731
            stages=PLANS[name](), precision="64", seed=3, cuda_graphs=graphs, **lj
        )
        eager = sim(False).run(data).batch
        with emulated_cuda_graphs() as backends:
            graphed = sim(True).run(data).batch
    assert backends[-1].captures >= 1
    assert (eager.mc_accepted > 0).any()  # both branches replayed: some accepted, some not
    assert name == "hybrid" or (eager.mc_accepted < eager.mc_attempts).any()
    same(graphed, eager, "graph replays")


def test_results_table_has_the_chain_statistics(tmp_path):
    """In memory and read back from the results store alike."""
    store = tmp_path / "mc.zarr"
    results = run(PLANS["swap"](), alloys(2), sinks=[ZarrSink(store, mode="w")])
    table = results.to_pandas()
    pd.testing.assert_frame_equal(read_results(store).to_pandas(), table, check_dtype=False)
    for column in ("mc_attempts", "mc_acceptance", "mc_energy_mean", "mc_accepted[Cu-Au]"):
        assert column in table, column
    b = results.batch
    np.testing.assert_array_equal(table["mc_attempts"], b.mc_attempts.numpy())
    np.testing.assert_allclose(table["mc_energy_mean"], (b.mc_energy_sum / 15).numpy())


def test_bad_input_is_refused_before_the_run_naming_the_system():
    data = alloys(2)
    data.append(bulk("Cu", "fcc", a=3.6, cubic=True))
    with pytest.raises(ConfigError, match=r"system 2 has free atoms of fewer than two"):
        run(PLANS["swap"](), data)
    pinned = alloys(1)[0]
    pinned.set_constraint(FixAtoms(mask=pinned.numbers == 79))
    with pytest.raises(ConfigError, match=r"system 0 has free atoms"):
        run(PLANS["swap"](), [pinned])
    with pytest.raises(ConfigError, match="temperature must be > 0 K"):
        SwapMC(["Cu", "Au"], temperature=0.0)
    with pytest.raises(ConfigError, match="temperature must be > 0 K"):
        SemiGrandMC({"Cu": 0.0, "Au": 0.1}, temperature=[300.0, 0.0])
    with pytest.raises(ConfigError, match="not an element"):
        SwapMC(["Cu", "Xx"])
    with pytest.raises(ConfigError, match="at least two distinct"):
        SwapMC(["Cu", "Cu"])
    with pytest.raises(ConfigError, match=r"system 1 has no free atom of \['Ag', 'Pd'\]"):
        run(SemiGrandMC({"Ag": 0.0, "Pd": 0.1}), [bulk("Ag", cubic=True), data[0]])
    with pytest.raises(ConfigError, match="every"):
        Hybrid(Langevin(steps=4), SwapMC(["Cu", "Au"]), every=0)
    with pytest.raises(ConfigError, match="temperature"):
        run(SwapMC(["Cu", "Au"], temperature=[900.0]), alloys(2))
    inner = Hybrid(Langevin(temperature=[900.0], steps=4), SwapMC(["Cu", "Au"]), every=2)
    with pytest.raises(ConfigError, match="Langevin: temperature has 1 value"):
        run(inner, alloys(2))


@pytest.mark.slow
def test_a_pipeline_rank_runs_the_chain_as_the_fused_plan_does():
    """``FIRE | SwapMC`` on two forked ranks equals ``FIRE + SwapMC`` in one process:
    a system carries its chain's state and statistics to the rank that runs it."""
    data = alloys()

    def plan(join: str):
        relax, mc = FIRE(fmax=0.1, max_steps=6), PLANS["swap"]()
        return relax + mc if join == "+" else relax | mc

    kw = dict(precision="64", seed=3, sync_every=2)
    fused = al.Simulator(EMT(), plan("+"), **kw).run(data).batch
    piped = al.Simulator(EMT(), plan("|"), devices=2, strategy="pipeline",
                         start_method="fork", timeout=120, **kw).run(data).batch  # fmt: skip
    same(piped, fused, "pipeline")
