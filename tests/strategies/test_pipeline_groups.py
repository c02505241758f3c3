"""Replica groups and chains of copies across ranks (issue #45 part 3): ``relax |
ReplicaExchange`` and ``relax | SwapMC(proposals=k)`` equal their fused plans.

A group leaves a rank only whole, in one message, as a band does
(:mod:`alchemi_lit.strategies.units`); its members that left the relaxation first wait
in the outbox taking no step.  Bit for bit against the fused plan on one process: every
random stream is keyed by the system (or group) and its steps, and neighbours exchange
only at the same stage step and total steps -- members that left the relaxation at
different steps never pair, on one device or across ranks.  Multi-rank runs are forked
gloo ranks with a hard timeout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import Batch
from alchemi_lit.data import SizeAwareSampler, make_replicas
from alchemi_lit.integrators import (
    FIRE,
    Langevin,
    ReplicaExchange,
    SemiGrandMC,
    SwapMC,
    geometric_ladder,
)
from alchemi_lit.integrators.stages import Pipeline
from alchemi_lit.models import EMT
from alchemi_lit.strategies.buffers import BufferConfig
from alchemi_lit.strategies.units import group_unit, sendable
from alchemi_lit.testing import DoubleWell

pytestmark = [pytest.mark.timeout(120)]

LADDER = geometric_ladder(150.0, 1200.0, 4)
WELL = DoubleWell(barrier=0.15, a=1.0, spring=1.0)
REX = ("positions", "velocities", "energy", "total_steps", "stage_steps", "stage_exit",
       "rex_group", "rex_rung", "rex_temperature", "rex_attempts", "rex_accepts",
       "rex_round_trips")  # fmt: skip
CHAINS = ("atomic_numbers", "positions", "velocities", "energy", "total_steps", "stage_steps",
          "mc_chain", "mc_copy", "mc_attempts", "mc_accepted")  # fmt: skip


def particle(x: float) -> Atoms:
    return Atoms("Ar", positions=[[x, 0.1, -0.1]], pbc=False)


def replicas() -> list[Atoms]:
    """Group 0: identical copies (they leave the relaxation together); group 1: one
    replica per start, so its members leave the relaxation at different steps."""
    groups = make_replicas([particle(-1.0), particle(0.5)], len(LADDER))
    for k, x in enumerate((0.3, 0.5, 1.6, 0.9)):
        groups[4 + k].positions[0, 0] = x
    return groups


def tempering() -> Any:
    return ReplicaExchange(Langevin(dt=10.0, friction=0.01, steps=24), LADDER, every=2)


def run(plan: Any, data: Any, model: Any, **kw: Any) -> Batch:
    if isinstance(plan, Pipeline):
        kw = {"devices": 2, "start_method": "fork", "timeout": 30.0, **kw}
    sim = al.Simulator(model=model, stages=plan, precision="64", seed=5, sync_every=4, **kw)
    batch = sim.run(data).batch
    assert batch.system_id.tolist() == sorted(batch.system_id.tolist())
    return batch


def assert_same(got: Batch, ref: Batch, fields: tuple[str, ...]) -> None:
    assert got.system_id.tolist() == ref.system_id.tolist(), "lost or duplicated"
    for name in fields:
        assert torch.equal(getattr(got, name), getattr(ref, name)), f"{name} differs"


@pytest.mark.multirank
def test_relax_then_replica_exchange_across_two_ranks_equals_the_fused_plan():
    """Budget for one group at a time (4 systems): the early replicas of group 1 wait
    on rank 0 for the last one, then the group crosses whole and is tempered on rank 1."""
    relax = lambda: FIRE(fmax=0.01, max_steps=40)  # noqa: E731

    def sampler() -> SizeAwareSampler:
        return SizeAwareSampler(replicas(), max_atoms=64, max_systems=4)

    fused = run(relax() + tempering(), sampler(), WELL)
    piped = run(relax() | tempering(), sampler(), WELL,
                buffer=BufferConfig(num_systems=4, num_atoms=8))  # fmt: skip
    assert_same(piped, fused, REX)
    left = fused.stage_steps[:, 0]
    assert len(set(left[:4].tolist())) == 1 and len(set(left[4:].tolist())) > 1
    assert int(fused.rex_accepts[:4].sum()) > 0  # group 0 exchanges
    # group 1's members that left FIRE at different steps never paired (neither here)
    assert int(fused.rex_attempts[4:].sum()) < int(fused.rex_attempts[:4].sum())


@pytest.mark.multirank
@pytest.mark.parametrize("kind", ["swap", "semi-grand"])
def test_relax_then_mc_chains_across_two_ranks_equals_the_fused_plan(kind: str):
    """``SwapMC(proposals=2)`` and ``SemiGrandMC(proposals=2)`` on tiny Cu-Au EMT cells:
    each chain's two copies relax on rank 0, cross in one message and run their chain on
    rank 1."""
    cells = []
    for k in range(3):
        atoms = bulk("Cu", "fcc", a=3.85, cubic=True)
        atoms.numbers[np.random.default_rng(k).permutation(4)[:2]] = 79
        atoms.rattle(0.05, seed=k)
        cells.append(atoms)

    def plan(pipe: bool) -> Any:
        relax = FIRE(fmax=0.1, max_steps=6)
        mc = (SwapMC(["Cu", "Au"], temperature=900.0, steps=10, proposals=2) if kind == "swap"
              else SemiGrandMC({"Cu": 0.0, "Au": -0.3}, temperature=900.0, steps=10,
                               proposals=2))  # fmt: skip
        return relax | mc if pipe else relax + mc

    fused = run(plan(False), cells, EMT())
    piped = run(plan(True), cells, EMT(), buffer=BufferConfig(num_systems=2,
                num_atoms=8))  # fmt: skip
    assert_same(piped, fused, CHAINS)
    assert fused.mc_chain.tolist() == [0, 0, 1, 1, 2, 2]
    assert int(fused.mc_accepted.sum()) > 0


def test_a_group_larger_than_one_transfer_message_is_refused_before_launch():
    sim = al.Simulator(model=WELL, stages=FIRE(fmax=0.01, max_steps=5) | tempering(),
                       precision="64", devices=2, start_method="fork", timeout=30.0,
                       buffer=BufferConfig(num_systems=3, num_atoms=8))  # fmt: skip
    with pytest.raises(ConfigError, match=r"replica group 0 \(structures 0-3\) needs "
                       r"num_systems=4 .* raise num_systems to at least 4"):  # fmt: skip
        sim.run(SizeAwareSampler(replicas(), max_atoms=64))


def test_group_pipelines_that_cannot_run_as_groups_are_refused():
    md = Langevin(dt=1.0, temperature=300.0, steps=3)
    fans = Pipeline({0: FIRE(fmax=0.1), 1: tempering(), 2: md}, [(0, 1), (0, 2)])
    with pytest.raises(ConfigError, match=r"rank 0 fans out to ranks \[1, 2\], of which \[1\]"):
        group_unit(fans)
    three = ReplicaExchange(md, LADDER[:3])
    with pytest.raises(ConfigError, match=r"groups of different sizes \(\[3, 4\] systems\)"):
        group_unit(tempering() | three)
    assert group_unit(FIRE(fmax=0.1) | md) is None
    assert group_unit(FIRE(fmax=0.1) | tempering()) == ("rex_group", 4)


def test_a_group_is_sent_only_whole():
    """Rows of groups 3 (complete), 5 (one of two members here) and a lone system."""
    batch = Batch.from_atoms([particle(x) for x in (0.1, 0.2, 0.3, 0.4)], dtype=torch.float64)
    batch.ensure_field("rex_group", "system", (), torch.int64, -1)
    batch.rex_group = torch.tensor([3, 5, -1, 3])
    whole, waiting = sendable(batch, ("rex_group", 2))
    assert whole == [[0, 3], [2]] and waiting == [1]
    assert sendable(batch) == ([[0], [1], [2], [3]], [])  # (no grouped stage: lone systems)
