"""Nudged elastic bands across ranks (issue #27 part 4): ``relax | neb`` equals ``relax + neb``.

Rank 0 relaxes the endpoints and passes the images on unrelaxed, exactly as the fused
plan's first stage does; a band leaves a rank only whole, in one message, and enters
the next rank's batch as one unit (:mod:`alchemi_lit.strategies.units`).  Bit for bit
against the fused plan on one process: the same code runs on every band, whichever
ranks and batches it went through.  Multi-rank runs are forked gloo ranks with a hard
timeout; small EMT bands and few steps keep them quick.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from neb_cases import PoisonAt, hop

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import EXIT_MODEL_ERROR, EXIT_QUARANTINED, Batch
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import BFGS, FIRE, NEB, Langevin
from alchemi_lit.integrators.stages import Pipeline
from alchemi_lit.models import EMT
from alchemi_lit.strategies.buffers import BufferConfig
from alchemi_lit.strategies.rank_io import Outbox, RankIO
from alchemi_lit.workflows import label_bands, make_band

pytestmark = [pytest.mark.timeout(120)]

COMPARED = ("positions", "velocities", "forces", "energy", "total_steps", "stage_steps",
            "stage_exit", "exit_code", "converged", "status")  # fmt: skip


def bands(*cases: tuple[str, str, int, int]) -> list:
    return label_bands([make_band(*hop(m, a, d), n, "linear") for m, a, d, n in cases])


TWO = (("Cu", "Au", 0, 4), ("Al", "Cu", 1, 3))  # 4 x 9 and 3 x 9 atoms


def relax() -> FIRE:
    return FIRE(fmax=0.05, max_steps=10)


def neb() -> FIRE:
    return FIRE(fmax=0.1, max_steps=6, band=NEB(climb=True))


def run(plan: Any, data: list, max_atoms: int, model: Any = None, **kw: Any) -> Batch:
    if kw or isinstance(plan, Pipeline):  # forked gloo ranks
        kw = {"devices": 2, "start_method": "fork", "timeout": 30.0, **kw}
    sim = al.Simulator(model=model or EMT(), stages=plan, precision="64", seed=0, sync_every=4,
                       **kw)  # fmt: skip
    return sim.run(SizeAwareSampler(data, max_atoms=max_atoms)).batch


def assert_same(got: Batch, ref: Batch) -> None:
    assert got.system_id.tolist() == ref.system_id.tolist(), "lost or duplicated"
    for name in COMPARED:
        assert torch.equal(getattr(got, name), getattr(ref, name)), f"{name} differs"
    for sid in ref.system_id.tolist():
        assert got.info[sid].get("neb_quarantined") == ref.info[sid].get("neb_quarantined")


@pytest.mark.multirank
def test_relax_then_band_across_two_ranks_equals_the_fused_plan():
    """One band at a time fits the budget (40 atoms): the images wait on rank 0 while
    their endpoints relax, then the band crosses whole and runs on rank 1."""
    data = bands(*TWO)
    fused = run(relax() + neb(), data, 40)
    piped = run(relax() | neb(), data, 40, buffer=BufferConfig(num_systems=8, num_atoms=40))
    assert_same(piped, fused)
    ends, inner = [0, 3, 4, 6], [1, 2, 5]
    assert (fused.stage_steps[ends, 0] > 0).all() and (fused.stage_steps[inner, 0] == 0).all()
    assert (fused.stage_steps[inner, 1] > 0).all()  # the band did run, on rank 1


@pytest.mark.slow
@pytest.mark.multirank
def test_relax_band_md_over_three_ranks_with_a_failing_endpoint_equals_the_fused_plan():
    """Three bands, BFGS on the band, Langevin after it (its random streams are keyed by
    the steps taken: waiting takes none), and an endpoint of band 1 that turns NaN while
    it relaxes: band 1 is quarantined whole on either side, the others finish."""
    data = bands(("Cu", "Au", 0, 5), ("Al", "Cu", 1, 4), ("Cu", "Ag", 0, 3))

    def plan() -> list:
        return [FIRE(fmax=0.05, max_steps=12), BFGS(fmax=0.1, max_steps=8, band=NEB()),
                Langevin(dt=2.0, temperature=100.0, friction=0.02, steps=4)]  # fmt: skip

    a, b, c = plan()
    fused = run(a + b + c, data, 60, model=PoisonAt(8, 4))
    a, b, c = plan()
    piped = run(a | b | c, data, 60, model=PoisonAt(8, 4), devices=3,
                buffer=BufferConfig(num_systems=8, num_atoms=60))  # fmt: skip
    assert_same(piped, fused)
    broken = [5, 6, 7, 8]  # band 1: the endpoint 8 failed, its images went with it
    assert (fused.exit_code[broken] == EXIT_QUARANTINED).all()
    assert fused.info[6]["neb_quarantined"] == "an image of its band failed"
    assert (fused.stage_steps[[1, 2, 3, 10], 2] == 4).all()  # the others' images ran MD


@pytest.mark.multirank
def test_replicas_of_a_band_plan_equal_one_process():
    data = bands(*TWO, ("Cu", "Cu", 1, 3))
    one = run(relax() + neb(), data, 40)
    assert_same(run(relax() + neb(), data, 40, strategy="replicas"), one)


def test_band_pipelines_that_cannot_run_are_refused_before_launch():
    md = Langevin(dt=1.0, temperature=300.0, steps=3)
    with pytest.raises(ConfigError, match=r"rank 0 fans out to ranks \[1, 2\], of which \[1\]"):
        Pipeline({0: relax(), 1: neb(), 2: md}, [(0, 1), (0, 2)])
    Pipeline({0: relax(), 1: neb(), 2: neb()}, [(0, 1), (0, 2)])  # alike branches: fine
    data = bands(*TWO)
    small = BufferConfig(num_systems=8, num_atoms=30)  # band 0 has 36 atoms
    with pytest.raises(ConfigError, match=r"band path_id 0 .* raise num_atoms to at least 36"):
        run(relax() | neb(), data, 40, buffer=small)
    lone = [*data, hop("Al", "Au", 1)[0]]
    with pytest.raises(ConfigError, match=r"structure 7, which has no info\['path_id'\]"):
        run(relax() | neb(), lone, 40)


def outbox_io(downs: list[int]) -> RankIO:
    sim = SimpleNamespace(model=EMT(), device=torch.device("cpu"))
    loop = SimpleNamespace(plan=SimpleNamespace(exit=1))
    return RankIO(sim, loop, None, Outbox(), downs, BufferConfig(num_systems=8, num_atoms=40),
                  (40, 8), SimpleNamespace(systems_in=0), lambda: None)  # fmt: skip


def test_a_band_leaves_a_rank_only_whole_within_credit():
    data = bands(*TWO)
    batch = Batch.from_atoms([*data[:4], hop("Al", "Au", 1)[0]], dtype=torch.float64)
    NEB().declare(batch)  # band 0 (rows 0-3) and a lone system (row 4)
    io = outbox_io([1, 2])
    io.outbox.deliver(batch.select([1, 2, 4]))  # the images passed on, and a lone system
    sent = io.route({1: (40, 8), 2: (40, 8)})
    assert [p.system_id.tolist() for p in sent.values()] == [[4]]  # the images wait
    io.outbox.deliver(batch.select([0]))
    assert io.route({1: (40, 8), 2: (40, 8)}) == {}  # one endpoint still relaxing
    io.outbox.deliver(batch.select([3]))
    assert io.route({1: (35, 8), 2: (20, 8)}) == {}  # no rank has room for all 36 atoms
    sent = io.route({1: (20, 8), 2: (36, 8)})
    assert list(sent) == [2] and sorted(sent[2].system_id.tolist()) == [0, 1, 2, 3]
    assert io.outbox.batch is None


def test_a_band_arriving_without_an_endpoint_has_its_images_quarantined():
    """An endpoint that failed upstream: its band cannot run; the images leave with it,
    the other endpoint finishes (the fused plan quarantines the waiting images)."""
    batch = Batch.from_atoms(bands(TWO[0]), dtype=torch.float64)
    NEB().declare(batch)
    batch.exit_code[0] = EXIT_MODEL_ERROR
    batch.converged.fill_(True)
    io = outbox_io([1])
    io.accept(batch)
    through = io.outbox.batch
    assert through.system_id.tolist() == [0, 1, 2]
    assert through.exit_code.tolist() == [EXIT_MODEL_ERROR, EXIT_QUARANTINED, EXIT_QUARANTINED]
    assert not through.converged[1:].any() and through.info[1]["neb_quarantined"]
    assert [b.system_id.tolist() for b in io.inbox] == [[3]]



def test_fan_in_credit_is_not_split_below_a_band():
    """Two upstream ranks: an even split of 8 free systems (4 each) would never let a
    5-image band through (livelock); a rank holding bands gives all to one, in turn."""
    io = outbox_io([])
    banded = Batch.from_atoms(bands(TWO[1]), dtype=torch.float64).select([])
    plain = banded.clone()
    NEB().declare(banded)
    io.max_atoms, io.max_systems = 1000, 8
    assert io.credit_shares(plain, [0, 1], 0) == {0: (500, 4), 1: (500, 4)}
    assert io.credit_shares(banded, [0, 1], 0) == {0: (1000, 8), 1: (0, 0)}
    assert io.credit_shares(banded, [0, 1], 1) == {0: (0, 0), 1: (1000, 8)}


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_relax_then_band_across_ranks_resumes_mid_band_bit_for_bit(tmp_path):
    """Rank 1 crashes while a band is half relaxed; resumed from the newest round every
    rank checkpointed, the stores equal the uninterrupted run's, each image once."""
    from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
    from alchemi_lit.sinks import ZarrSink
    from alchemi_lit.strategies.pipeline import PipelineError

    data = bands(*TWO)
    plan = relax() | FIRE(fmax=0.02, max_steps=30, band=NEB(climb=True))

    def sim(folder, extra=()):
        return al.Simulator(
            model=EMT(), stages=plan, precision="64", seed=0, sync_every=4, devices=2,
            start_method="fork", timeout=30.0, buffer=BufferConfig(num_systems=8, num_atoms=40),
            sinks=[ZarrSink(folder / "res.zarr", mode="w")],
            callbacks=[Checkpoint(folder / "ckpt", every=4), *extra],
        )  # fmt: skip

    sim(tmp_path / "full").run(SizeAwareSampler(data, max_atoms=40))
    seen: dict[str, int] = {}

    def boom(ctx):
        if ctx.state.get("rank") == 1 and bool((ctx.batch.neb_image > 0).any()):
            seen["band steps"] = seen.get("band steps", 0) + 1
            if seen["band steps"] == 14:
                raise RuntimeError("crash on rank 1 mid-band")

    cut = tmp_path / "cut"
    with pytest.raises(PipelineError, match="rank 1"):
        sim(cut, [LambdaCallback(HookStageEnum.AFTER_STEP, boom)]).run(
            SizeAwareSampler(data, max_atoms=40)
        )
    assert list((cut / "ckpt" / "rank1").glob("round-*.ckpt")), "no round before the crash"
    sim(cut).run(SizeAwareSampler(data, max_atoms=40), resume=str(cut / "ckpt"))
    full, resumed = ZarrSink(tmp_path / "full" / "res.zarr").read_batch(), ZarrSink(
        cut / "res.zarr"
    ).read_batch()
    assert resumed.system_id.tolist() == full.system_id.tolist() == list(range(len(data)))
    for key in full.atom:
        assert torch.equal(resumed.atom[key], full.atom[key]), key
    for key in full.system:
        assert torch.equal(resumed.system[key].nan_to_num(7.0), full.system[key].nan_to_num(7.0))
