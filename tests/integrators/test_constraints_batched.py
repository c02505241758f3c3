"""Constraints in batches: a batch mixing constraints equals each system alone (bit for
bit, the construction guarantees it), CUDA-graph replays equal eager steps, a run killed
mid-way resumes exactly, and bad input is refused before the run naming the system.

References: the same systems run alone (batch independence), the eager run (graphs),
the uninterrupted run (resume), ASE's ``get_number_of_degrees_of_freedom`` (DOF).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from ase.constraints import FixAtoms, FixBondLengths, FixCom, FixedLine, FixSymmetry, Hookean
from test_constraints import CASES, cluster, constrained, run
from test_md import lj_model

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.core.state import Batch
from alchemi_lit.integrators import FIRE, MTKNPT, Bussi, VelocityVerlet
from alchemi_lit.testing import accelerator_path, emulated_cuda_graphs
from conftest import argon_bulk


def mixed_systems() -> list:
    """Four systems, each with its own set: the mix, rigid bonds, FixCom + a spring, none."""
    bonds = cluster(seed=3)
    bonds.set_constraint(FixBondLengths([(0, 1), (2, 3), (3, 4), (2, 4)]))
    com = cluster(seed=5)
    com.set_constraint([FixCom(), Hookean(7, 12, k=2.0, rt=3.0)])
    systems = [constrained("mixed", seed=1), bonds, com, cluster(seed=7)]
    for a in systems:
        a.set_momenta(a.get_momenta())  # (ASE applies the constraints)
    return systems


def plan():
    return FIRE(fmax=1e-6, max_steps=6) + VelocityVerlet(dt=4.0, steps=8)


def frames(rec, sid):
    return rec.trajectory(sid)


@pytest.mark.parametrize("path", ["cpu", pytest.param("accelerator", marks=pytest.mark.slow)])
def test_a_batch_mixing_constraints_equals_each_system_alone(path: str) -> None:
    systems = mixed_systems()
    with accelerator_path() if path == "accelerator" else contextlib.nullcontext():
        _, together = run(systems, plan())
        for k, atoms in enumerate(systems):
            _, alone = run([atoms], plan())
            a, b = frames(together, k), frames(alone, 0)
            assert len(a) == len(b) == 14
            assert all(np.array_equal(x, y) for x, y in zip(a, b)), k


@pytest.mark.parametrize("bonds", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_graph_replays_equal_eager_steps(bonds: bool) -> None:
    """Every kind's step captured and replayed (emulated CUDA graphs) equals eager
    (rigid bonds' fixed sweeps make a long graph: the slow tier)."""
    systems = [a for k, a in enumerate(mixed_systems()) if bonds or k != 1]

    def md(graphs: bool):
        sim = al.Simulator(model=lj_model(), stages=VelocityVerlet(dt=4.0, steps=8),
                           precision="64", cuda_graphs=graphs)  # fmt: skip
        return sim.run(Batch.from_atoms(systems))

    with accelerator_path():
        eager = md(False)
        with emulated_cuda_graphs() as backends:
            graphed = md(True)
    assert backends[-1].captures >= 1
    for field in ("positions", "velocities", "forces"):
        assert torch.equal(getattr(eager.batch, field), getattr(graphed.batch, field)), field
    assert torch.equal(eager.batch.energy, graphed.batch.energy)


class Crash(Exception):
    pass


def test_a_constrained_run_killed_mid_way_resumes_exactly(tmp_path) -> None:
    systems = mixed_systems()

    def sim(extra=()):
        return al.Simulator(model=lj_model(), stages=plan(), precision="64", sync_every=2,
                            callbacks=[Checkpoint(tmp_path / "ckpt", every=4), *extra])  # fmt: skip

    reference = al.Simulator(model=lj_model(), stages=plan(), precision="64",
                             sync_every=2).run(Batch.from_atoms(systems))  # fmt: skip

    def boom(ctx):
        if ctx.step == 9:
            raise Crash("killed")

    with pytest.raises(Crash):
        sim([LambdaCallback(HookStageEnum.AFTER_STEP, boom)]).run(Batch.from_atoms(systems))
    resumed = sim().run(Batch.from_atoms(systems), resume=str(tmp_path / "ckpt"))
    for key, value in reference.batch.atom.items():
        assert torch.equal(value, resumed.batch.atom[key]), key
    assert torch.equal(reference.batch.energy, resumed.batch.energy)


def test_thermostats_count_the_removed_degrees_of_freedom() -> None:
    """Bussi's target and the reported temperature use ASE's DOF (3N - removed)."""
    systems = mixed_systems()
    batch = Batch.from_atoms(systems)
    dof = [a.get_number_of_degrees_of_freedom() for a in systems]
    assert batch.degrees_of_freedom().tolist() == dof
    t = [a.get_temperature() for a in systems]
    assert np.allclose(batch.temperature().numpy(), t, rtol=1e-12)
    res = al.Simulator(model=lj_model(), stages=Bussi(dt=2.0, temperature=60.0, taut=20.0,
                       steps=5), precision="64").run(batch)  # fmt: skip
    for a in res.to_atoms():  # the results' constraints give ASE the same count
        assert a.get_number_of_degrees_of_freedom() in dof


def _refused(atoms, *words) -> None:
    with pytest.raises(StructureError) as err:
        Batch.from_atoms([cluster(), atoms], system_ids=[0, 9])
    for w in ("system 1 (system_id 9)", *words):
        assert w in str(err.value), (w, str(err.value))


def test_bad_constraints_are_refused_naming_the_system() -> None:
    a = cluster()
    a.set_constraint([FixAtoms([2]), FixBondLengths([(2, 3)])])
    _refused(a, "atom 2 is fixed", "rigid bond")
    a = cluster()
    a.set_constraint(Hookean(0, 1, k=-1.0, rt=1.0))
    _refused(a, "k=-1.0", ">= 0")
    a = cluster()
    a.set_constraint(FixedLine([40], (0, 0, 1)))
    _refused(a, "atom index 40 out of range")
    a = argon_bulk(1)
    a.set_constraint(FixSymmetry(a))  # supported now (core/symmetrize.py): read, not refused
    assert int(al.Batch.from_atoms([a]).symmetry_count[0]) == 192  # 48 x 4 translations
    a = cluster()
    a.set_constraint([FixedLine([3], (0, 0, 1)), FixedLine([3], (1, 0, 0))])
    _refused(a, "atom 3", "two constraints")
    a = cluster()
    a.set_constraint([FixCom(), FixAtoms([1])])
    _refused(a, "FixCom together with FixAtoms")


def test_barostats_refuse_constraints_before_the_run() -> None:
    atoms = argon_bulk(2)
    atoms.set_constraint(FixedLine([0], (0, 0, 1)))
    sim = al.Simulator(model=lj_model(), stages=MTKNPT(dt=2.0, temperature=50.0, steps=3))
    with pytest.raises(ConfigError, match="FixedLine"):
        sim.run(Batch.from_atoms([atoms]))


def test_every_case_has_the_dof_ase_counts() -> None:
    for name in CASES:
        atoms = constrained(name)
        assert float(Batch.from_atoms([atoms]).degrees_of_freedom()[0]) == (
            atoms.get_number_of_degrees_of_freedom()
        ), name


@pytest.mark.parametrize("suffix", ["traj", "extxyz"])
def test_files_that_carry_constraints_bring_them(tmp_path, suffix: str) -> None:
    """ASE's .traj keeps every constraint; extxyz keeps FixAtoms and FixCartesian (its
    ``move_mask``, one FixCartesian per atom) -- both read by ``open_dataset``."""
    from ase.constraints import FixCartesian

    from alchemi_lit.data import open_dataset

    atoms = cluster(temperature=0.0)
    atoms.set_constraint([FixAtoms([0]), FixCartesian([1, 2], (False, False, True))])
    path = tmp_path / f"c.{suffix}"
    atoms.write(path)
    (read,) = open_dataset(path)
    batch = Batch.from_atoms([read])
    assert float(batch.degrees_of_freedom()[0]) == atoms.get_number_of_degrees_of_freedom()
    (back,) = batch.to_atoms(results=False)
    assert back.get_number_of_degrees_of_freedom() == atoms.get_number_of_degrees_of_freedom()
