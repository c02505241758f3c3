"""Multi-rank pipelines on CPU/gloo (forked local ranks), checked against fused runs.

A pipeline ``a | b | c`` must give every system exactly once, in exactly the state
the fused single-process run ``a + b + c`` gives it (bitwise, float64): the random
streams are keyed per system, every field travels as raw bytes, and a system's
integrator state moves with it.  Each test names the seed-system bug it guards
against where there is one (REFERENCE.md section 1).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import EXIT_MODEL_ERROR, EXIT_QUARANTINED, EXIT_RUNNING, Batch
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.integrators.stages import Pipeline
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import HostMemory, ZarrSink
from alchemi_lit.strategies.buffers import BufferConfig
from alchemi_lit.strategies.pipeline import PipelineError, PipelineWorker

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]

N_SYSTEMS = 100  # the failure tests need a run long enough for a rank to fail mid-run
N_SAME = 40  # the runs compared with a fused one: several batches on every rank
MAX_ATOMS = 400  # per-rank batch budget
BIG = 60  # largest system
SYNC_EVERY = 5
TIMEOUT = 60.0  # seconds a rank waits for a silent peer


_DATA: dict[int, list] = {}


def data(n: int = N_SYSTEMS) -> list:
    if n not in _DATA:
        _DATA[n] = mixed_argon(n, 8, BIG, seed=3)
    return _DATA[n]


def model() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0)


def relax() -> FIRE:
    return FIRE(fmax=0.05, max_steps=40)


def md() -> Langevin:
    return Langevin(dt=2.0, temperature=50.0, friction=0.02, steps=10)


def cool() -> FIRE:
    return FIRE(fmax=0.05, max_steps=20)


def sampler(n: int = N_SYSTEMS) -> SizeAwareSampler:
    return SizeAwareSampler(data(n), max_atoms=MAX_ATOMS)


def pipeline_sim(plan, devices: int = 2, **kwargs) -> al.Simulator:
    """A Simulator over ``devices`` forked gloo ranks with the tests' settings."""
    kwargs.setdefault("buffer", BufferConfig(num_systems=16, num_atoms=MAX_ATOMS))
    kwargs.setdefault("strategy", "pipeline")
    return al.Simulator(
        model=model(),
        stages=plan,
        devices=devices,
        start_method="fork",
        sync_every=SYNC_EVERY,
        timeout=TIMEOUT,
        **kwargs,
    )


def run_distributed(
    plan, devices: int, n: int = N_SYSTEMS, sampler_atoms: int = MAX_ATOMS, **kwargs
) -> al.Results:
    sim = pipeline_sim(plan, devices, **kwargs)
    return sim.run(SizeAwareSampler(data(n), max_atoms=sampler_atoms))


_FUSED: dict[tuple, Batch] = {}


def fused(names: tuple[str, ...], n: int = N_SYSTEMS, precision: str = "64") -> Batch:
    """The single-process fused run of the named stages (cached)."""
    key = (names, n, precision)
    if key not in _FUSED:
        make = {"relax": relax, "md": md, "cool": cool}
        plan = sum((make[k]() for k in names[1:]), make[names[0]]())
        plan = al.integrators.stages.as_fused(plan)
        sim = al.Simulator(model=model(), stages=plan, sync_every=SYNC_EVERY, precision=precision)
        _FUSED[key] = sim.run(sampler(n)).batch
    return _FUSED[key]


def assert_same(
    got: Batch | None,
    ref: Batch,
    columns: list[list[int]] | None = None,
    status: torch.Tensor | None = None,
    ids: list[int] | None = None,
) -> None:
    """``got`` holds every system once, each in the same final state as in ``ref``.

    ``columns[k]``: the pipeline's stage-history columns that correspond to the fused
    run's column k (fan-out/fan-in/replicas visit one of several equivalent ranks).
    ``status``: expected pipeline-wide exit codes (default: equal to ``ref``'s).
    ``ids``: the expected system ids (default ``0..n-1``).
    """
    assert got is not None, "no results came back"
    expected_ids = list(range(ref.num_systems)) if ids is None else ids
    assert got.system_id.tolist() == ref.system_id.tolist() == expected_ids, "lost or duplicated"
    for name in ("positions", "velocities", "forces", "masses", "atomic_numbers"):
        assert got.atom[name].dtype == ref.atom[name].dtype, name
        assert torch.equal(got.atom[name], ref.atom[name]), f"{name} differs from the fused run"
    for name in ("energy", "total_steps", "converged", "exit_code", "cell", "pbc", "n_atoms"):
        assert torch.equal(got.system[name], ref.system[name]), f"{name} differs from the fused run"
    steps, exits, energies = got.stage_steps, got.stage_exit, got.stage_energy
    if columns is not None:
        steps = torch.stack([steps[:, c].sum(1) for c in columns], 1)
        visited = [exits[:, c] for c in columns]
        for v in visited:  # exactly one of the equivalent ranks saw each system
            assert ((v != EXIT_RUNNING).sum(1) <= 1).all()
        energies = torch.stack(  # the energy of the rank that saw it (NaN if none did)
            [
                energies[:, c].nansum(1).where((v != EXIT_RUNNING).any(1), float("nan"))
                for c, v in zip(columns, visited)
            ],
            1,
        )
        exits = torch.stack([v.max(1).values for v in visited], 1)
    assert torch.equal(steps, ref.stage_steps), "stage_steps differ from the fused run"
    assert torch.equal(exits, ref.stage_exit), "stage_exit differ from the fused run"
    torch.testing.assert_close(  # energy at each stage exit: bitwise, NaN where not left
        energies, ref.stage_energy, rtol=0, atol=0, equal_nan=True, msg="stage_energy differ"
    )
    expected = ref.status if status is None else status
    assert torch.equal(got.status, expected), "status differs"


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder where every (forked) rank writes how its worker ended, ``rank<r>.json``."""
    folder = tmp_path / "records"
    folder.mkdir()
    original = PipelineWorker.run

    def recorded(self):
        try:
            out = original(self)
        except BaseException as exc:
            entry = {
                "type": type(exc).__name__,
                "text": str(exc),
                "failed_rank": getattr(exc, "rank", None),
                "time": time.monotonic(),
            }
            (folder / f"rank{self.rank}.json").write_text(json.dumps(entry))
            raise
        (folder / f"rank{self.rank}.json").write_text(json.dumps({"type": None}))
        return out

    monkeypatch.setattr(PipelineWorker, "run", recorded)
    return folder


def _outcomes(folder: Path, world: int) -> dict[int, dict]:
    return {
        r: json.loads((folder / f"rank{r}.json").read_text())
        for r in range(world)
        if (folder / f"rank{r}.json").exists()
    }


# ============================================================== linear pipelines
def test_two_stage_pipeline_equals_fused_run(tmp_path):
    """The results in memory and in the ZarrSink store the last rank writes."""
    path = tmp_path / "results.zarr"
    res = run_distributed(relax() | md(), devices=2, n=N_SAME, sinks=[ZarrSink(path)])
    assert_same(res.batch, fused(("relax", "md"), n=N_SAME))
    assert res.stats["systems"] == N_SAME
    assert_same(ZarrSink(path).read_batch(), fused(("relax", "md"), n=N_SAME))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.zarr"]


def test_a_batch_keeps_its_system_ids_through_a_pipeline():
    """A Batch given to a pipeline run keeps its ids (they key the random streams and
    the results), as in a fused run: ids given out of order, not 0..n-1."""
    batch = Batch.from_atoms(data(6)[::-1], system_ids=[25, 24, 23, 22, 21, 20])
    ref = al.Simulator(model=model(), stages=relax() + md(), sync_every=SYNC_EVERY).run(batch)
    got = pipeline_sim(relax() | md()).run(batch)
    assert_same(got.batch, ref.batch, ids=[20, 21, 22, 23, 24, 25])


def test_three_stage_pipeline_equals_fused_run():
    """Also: a 3-stage pipeline runs (the seed system crashed at its first iteration)."""
    res = run_distributed(relax() | md() | cool(), devices=3)
    assert_same(res.batch, fused(("relax", "md", "cool")))
    ranks = res.stats["ranks"]
    assert [r["systems_in"] for r in ranks] == [N_SYSTEMS] * 3
    assert [r["systems_out"] for r in ranks] == [N_SYSTEMS] * 3


@pytest.mark.parametrize("mode", ["sync", "async_recv", "fully_async"])
def test_comm_modes(mode):
    res = run_distributed(relax() | md(), devices=2, n=N_SAME, comm_mode=mode)
    assert_same(res.batch, fused(("relax", "md"), n=N_SAME))


def test_synchronized_lockstep():
    res = run_distributed(relax() | md(), devices=2, n=30, synchronized=True)
    assert_same(res.batch, fused(("relax", "md"), n=30))


ONE_SYSTEM = BufferConfig(num_systems=1, num_atoms=MAX_ATOMS)
ATOM_TIGHT = BufferConfig(64, BIG)


SLOW = pytest.mark.slow


# each buffer and each mode in the fast tier; the other two pairs in the slow one
@pytest.mark.parametrize(
    ("buffer", "mode"),
    [
        pytest.param(ONE_SYSTEM, "sync", id="sync-one_system"),
        pytest.param(ATOM_TIGHT, "fully_async", id="fully_async-atom_tight"),
        pytest.param(ATOM_TIGHT, "sync", id="sync-atom_tight", marks=SLOW),
        pytest.param(ONE_SYSTEM, "fully_async", id="fully_async-one_system", marks=SLOW),
    ],
)
def test_back_pressure_loses_nothing(buffer, mode):
    """Seed system: a 1-system buffer lost 21 of 24 systems, an atom-tight one 10 of 24."""
    assert max(len(a) for a in data(40)) == BIG
    res = run_distributed(relax() | md(), devices=2, n=40, buffer=buffer, comm_mode=mode)
    assert_same(res.batch, fused(("relax", "md"), n=40))


@pytest.mark.parametrize("mode", ["sync", "fully_async"])
def test_back_pressure_reaches_the_source(mode):
    """A slow last stage: the ranks before it hold at most their budget (batch, inbox
    and outbox together) and the source stops sampling, instead of piling systems up in
    a middle rank's outbox."""
    budget = 150
    plan = (
        FIRE(fmax=0.05, max_steps=5)
        | Langevin(dt=2.0, temperature=50.0, steps=5)
        | (Langevin(dt=2.0, temperature=50.0, steps=40))
    )
    sim = al.Simulator(
        model=model(),
        stages=plan,
        strategy="pipeline",
        devices=3,
        start_method="fork",
        sync_every=SYNC_EVERY,
        timeout=TIMEOUT,
        comm_mode=mode,
        buffer=BufferConfig(num_systems=4, num_atoms=BIG),
    )
    res = sim.run(SizeAwareSampler(data(30), max_atoms=budget))
    assert res.batch.system_id.tolist() == list(range(30))
    for r in res.stats["ranks"]:
        assert r["peak_atoms"] <= budget, r


def test_float32_systems_survive():
    """Seed system: float64 systems were all lost; float32 ones must survive too."""
    res = run_distributed(relax() | md(), devices=2, n=40, precision="32")
    ref = fused(("relax", "md"), n=40, precision="32")
    assert res.batch.positions.dtype == torch.float32
    assert_same(res.batch, ref)


@pytest.mark.parametrize("mode", ["sync", "async_recv", "fully_async"])
def test_in_memory_results_on_last_rank_do_not_livelock(mode):
    """Seed system: the documented final-stage in-memory sink livelocked in every mode."""
    res = run_distributed(relax() | md(), devices=2, n=30, comm_mode=mode, sinks=[HostMemory()])
    assert_same(res.batch, fused(("relax", "md"), n=30))


# ============================================================== topologies
def test_fan_out_one_to_two(tmp_path):
    """Also: the two sink ranks write their own stores, merged into the requested one."""
    path = tmp_path / "results.zarr"
    plan = Pipeline(stages={0: relax(), 1: md(), 2: md()}, edges=[(0, 1), (0, 2)])
    res = run_distributed(plan, devices=3, n=N_SAME, sinks=[ZarrSink(path)])
    for got in (res.batch, ZarrSink(path).read_batch()):
        # systems that ran on rank 2 report its exit code (2 + 1), the others rank 1's (1 + 1)
        status = torch.where(got.stage_exit[:, 2] != EXIT_RUNNING, 3, 2)
        assert_same(got, fused(("relax", "md"), n=N_SAME), columns=[[0], [1, 2]], status=status)
    ranks = res.stats["ranks"]
    assert ranks[1]["systems_in"] > 0 and ranks[2]["systems_in"] > 0, "fan-out used one branch"
    assert ranks[1]["systems_in"] + ranks[2]["systems_in"] == N_SAME
    assert ranks[1]["systems_out"] > 0 and ranks[2]["systems_out"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.zarr"]


def test_fan_in_two_to_one(tmp_path):
    """In memory and in the ZarrSink store of the one sink rank."""
    path = tmp_path / "results.zarr"
    plan = Pipeline(stages={0: relax(), 1: relax(), 2: md()}, edges=[(0, 2), (1, 2)])
    res = run_distributed(plan, devices=3, n=N_SAME, sinks=[ZarrSink(path)])
    ref = fused(("relax", "md"), n=N_SAME)
    for got in (res.batch, ZarrSink(path).read_batch()):
        assert_same(got, ref, columns=[[0, 1], [2]], status=torch.full_like(ref.status, 3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.zarr"]
    ranks = res.stats["ranks"]
    assert ranks[0]["systems_in"] > 0 and ranks[1]["systems_in"] > 0, "sampler not sharded"
    assert ranks[0]["systems_in"] + ranks[1]["systems_in"] == N_SAME


def test_fan_in_with_a_budget_below_two_large_systems():
    """Fan-in whose sink budget cannot take the largest system from each upstream at
    once: credit must still let every system through (no livelock)."""
    plan = Pipeline(stages={0: relax(), 1: relax(), 2: md()}, edges=[(0, 2), (1, 2)])
    items = data(30)
    budget = BIG + BIG // 2  # an even split of the sink's room is below BIG
    res = run_distributed(
        plan,
        devices=3,
        n=30,
        buffer=BufferConfig(8, BIG),
        sampler_atoms=budget,
    )
    assert res.batch.system_id.tolist() == list(range(30))
    assert max(len(a) for a in items) == BIG


def test_two_independent_sub_pipelines():
    plan = Pipeline(stages={0: relax(), 1: md(), 2: relax(), 3: md()}, edges=[(0, 1), (2, 3)])
    res = run_distributed(plan, devices=4, n=N_SAME)
    got = res.batch
    status = torch.where(got.stage_exit[:, 3] != EXIT_RUNNING, 4, 2)
    assert_same(got, fused(("relax", "md"), n=N_SAME), columns=[[0, 2], [1, 3]], status=status)
    ranks = res.stats["ranks"]
    assert ranks[0]["systems_in"] > 0 and ranks[2]["systems_in"] > 0
    assert ranks[0]["systems_in"] + ranks[2]["systems_in"] == N_SAME


# ============================================================== replicas
def test_replicas_of_fused_plan_equal_one_process(tmp_path):
    """Also: each replica writes its own store, merged into the requested one."""
    path = tmp_path / "results.zarr"
    res = run_distributed(
        relax() + md(), devices=2, n=N_SAME, strategy="replicas", sinks=[ZarrSink(path)]
    )
    assert_same(res.batch, fused(("relax", "md"), n=N_SAME))
    assert_same(ZarrSink(path).read_batch(), fused(("relax", "md"), n=N_SAME))
    ranks = res.stats["ranks"]
    assert all(r["systems_in"] > 0 for r in ranks)
    assert sum(r["systems_out"] for r in ranks) == N_SAME


def test_replicas_of_two_stage_pipeline():
    res = run_distributed(relax() | md(), devices=4, n=N_SAME, strategy="replicas")
    assert_same(res.batch, fused(("relax", "md"), n=N_SAME))
    ranks = res.stats["ranks"]
    assert ranks[0]["systems_in"] > 0 and ranks[2]["systems_in"] > 0


# ============================================================== quarantine
class SickLJ(LennardJones):
    """Lennard-Jones that gives system ``nan_id`` NaN forces from its 3rd step on, and
    raises on any batch holding system ``error_id`` once that one made 3 MD steps (with
    ``error_in_relax``: 3 relaxation steps)."""

    def __init__(
        self, nan_id: int = 7, error_id: int = 11, error_in_relax: bool = False, **kwargs
    ) -> None:
        super().__init__(epsilon=0.0104, sigma=3.40, cutoff=6.0, **kwargs)
        self.nan_id, self.error_id, self.error_in_relax = nan_id, error_id, error_in_relax

    def forward(self, batch, *args, **kwargs):
        md_steps = batch.total_steps - batch.stage_steps[:, 0]
        relaxed = batch.stage_exit[:, 0] != EXIT_RUNNING
        if self.error_in_relax:
            sick = (batch.system_id == self.error_id) & ~relaxed & (batch.total_steps >= 3)
        else:
            sick = (batch.system_id == self.error_id) & relaxed & (md_steps >= 3)
        if bool(sick.any()):
            raise RuntimeError(f"cannot evaluate system {self.error_id}")
        out = super().forward(batch, *args, **kwargs)
        bad = (batch.system_id == self.nan_id) & (batch.total_steps >= 3)
        out["forces"] = out["forces"].masked_fill(batch.atom_mask(bad).unsqueeze(-1), float("nan"))
        return out


def test_quarantined_systems_pass_through_once():
    """A system quarantined on rank 0 (NaN) passes the later ranks untouched and arrives
    once, as in the fused run; one the model fails on (rank 1) is quarantined there."""
    items = data(30)
    sim = al.Simulator(model=SickLJ(), stages=relax() + md(), sync_every=SYNC_EVERY)
    ref = sim.run(SizeAwareSampler(items, max_atoms=MAX_ATOMS)).batch
    assert int(ref.exit_code[7]) == EXIT_QUARANTINED
    assert int(ref.exit_code[11]) == EXIT_MODEL_ERROR
    sim = al.Simulator(
        model=SickLJ(),
        stages=relax() | md(),
        strategy="pipeline",
        devices=2,
        start_method="fork",
        sync_every=SYNC_EVERY,
        timeout=TIMEOUT,
        buffer=BufferConfig(16, MAX_ATOMS),
    )
    got = sim.run(SizeAwareSampler(items, max_atoms=MAX_ATOMS)).batch
    assert got.system_id.tolist() == list(range(30))
    assert int(got.exit_code[7]) == EXIT_QUARANTINED and int(got.nan_flags[7]) != 0
    assert int(got.exit_code[11]) == EXIT_MODEL_ERROR
    assert torch.equal(got.status, ref.status), "quarantined systems report another exit"
    healthy = [k for k in range(30) if k not in (7, 11)]
    assert_same(got.select(healthy), ref.select(healthy), ids=healthy)
    nan7 = [got.select([7]), ref.select([7])]
    assert torch.equal(nan7[0].positions, nan7[1].positions)
    assert torch.equal(nan7[0].total_steps, nan7[1].total_steps)


def test_info_travels_with_its_system():
    """``ase.Atoms.info`` of the input and the error text of a system the model failed
    on at rank 0 both reach the results on the last rank (they stayed behind before),
    and a message carries fewer systems when their info would overflow its room."""
    import numpy as np

    items = []
    for k, a in enumerate(data(30)):
        a = a.copy()
        a.info.update(label=f"sys{k}", weights=np.arange(k % 4, dtype=np.float64))
        if k % 5 == 0:
            a.info["notes"] = "x" * 700  # a few large ones: ~1 system per message fits
        items.append(a)
    sick = dict(nan_id=7, error_id=11, error_in_relax=True)
    ref = al.Simulator(model=SickLJ(**sick), stages=relax() + md(), sync_every=SYNC_EVERY)
    ref = ref.run(SizeAwareSampler(items, max_atoms=MAX_ATOMS)).batch
    assert "cannot evaluate system 11" in ref.info[11]["model_error"]
    sim = al.Simulator(
        model=SickLJ(**sick),
        stages=relax() | md(),
        strategy="pipeline",
        devices=2,
        start_method="fork",
        sync_every=SYNC_EVERY,
        timeout=TIMEOUT,
        buffer=BufferConfig(16, MAX_ATOMS, info_bytes=1500),
    )
    got = sim.run(SizeAwareSampler(items, max_atoms=MAX_ATOMS)).batch
    assert got.system_id.tolist() == list(range(30))
    assert int(got.exit_code[11]) == EXIT_MODEL_ERROR
    assert got.info[11]["model_error"] == ref.info[11]["model_error"]
    for k, a in enumerate(items):
        assert got.info[k]["label"] == a.info["label"]
        assert np.array_equal(got.info[k]["weights"], a.info["weights"])
        assert got.info[k].get("notes") == a.info.get("notes")
    healthy = [k for k in range(30) if k not in (7, 11)]
    assert_same(got.select(healthy), ref.select(healthy), ids=healthy)


def test_info_larger_than_buffer_rejected_before_launch(monkeypatch):
    import alchemi_lit.strategies.distributed as distributed

    def no_launch(*args, **kwargs):
        raise AssertionError("launched despite an invalid configuration")

    monkeypatch.setattr(distributed, "launch", no_launch)
    items = [a.copy() for a in data(10)]
    items[4].info["blob"] = "y" * 5000
    sim = al.Simulator(
        model=model(),
        stages=relax() | md(),
        devices=2,
        start_method="fork",
        buffer=BufferConfig(num_systems=8, num_atoms=MAX_ATOMS, info_bytes=4096),
    )
    with pytest.raises(ConfigError) as info:
        sim.run(SizeAwareSampler(items, max_atoms=MAX_ATOMS))
    text = str(info.value)
    assert "system 4 carries" in text and "raise info_bytes" in text


# ============================================================== failures
class FailingLJ(LennardJones):
    """Lennard-Jones that raises on rank ``fail_rank`` after ``after`` forward calls."""

    def __init__(self, fail_rank: int, after: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_rank, self.after, self.calls = fail_rank, after, 0

    def forward(self, batch, *args, **kwargs):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == self.fail_rank:
            self.calls += 1
            if self.calls > self.after:
                raise RuntimeError(f"boom: model gave up after {self.after} calls")
        return super().forward(batch, *args, **kwargs)


# every failing rank and every mode in the fast tier; rank 1 in the other modes, slow
@pytest.mark.parametrize(
    ("fail_rank", "mode"),
    [
        (1, "async_recv"), (2, "sync"), (0, "fully_async"),
        pytest.param(1, "sync", marks=SLOW), pytest.param(1, "fully_async", marks=SLOW),
    ],
)  # fmt: skip
def test_failing_rank_stops_every_rank_and_keeps_results(tmp_path, records, fail_rank, mode):
    """A model error on one rank ends every rank with a PipelineError naming that rank and
    its exception text, well within the timeout; the last rank keeps what it finished."""
    path = tmp_path / "results.zarr"
    sim = al.Simulator(
        model=FailingLJ(fail_rank, 40, epsilon=0.0104, sigma=3.40, cutoff=6.0),
        stages=relax() | md() | cool(),
        strategy="pipeline",
        devices=3,
        start_method="fork",
        sync_every=SYNC_EVERY,
        timeout=TIMEOUT,
        comm_mode=mode,
        buffer=BufferConfig(16, MAX_ATOMS),
        sinks=[ZarrSink(path)],
    )
    t0 = time.monotonic()
    with pytest.raises(
        PipelineError, match=rf"rank {fail_rank} failed: RuntimeError: boom"
    ) as info:
        sim.run(sampler())
    assert time.monotonic() - t0 < TIMEOUT / 2, "the failure was not propagated promptly"
    assert info.value.rank == fail_rank
    outcomes = _outcomes(records, 3)
    assert sorted(outcomes) == [0, 1, 2], f"some rank did not finish by itself: {outcomes}"
    for r, o in outcomes.items():
        assert o["type"] == "PipelineError", (r, o)
        assert o["failed_rank"] == fail_rank, (r, o)
        assert "boom" in o["text"], (r, o)
    stored = ZarrSink(path).read_batch()  # what the last rank finished is kept, readable
    if fail_rank == 1:
        assert stored is not None and 0 < stored.num_systems < N_SYSTEMS
    if stored is not None:
        ids = stored.system_id.tolist()
        assert len(set(ids)) == len(ids)
        # a batch of one system that the model fails on is quarantined, not a rank failure
        stored = stored.select(stored.exit_code != EXIT_MODEL_ERROR)
        ref = fused(("relax", "md", "cool")).select(stored.system_id)
        assert torch.equal(stored.positions, ref.positions)
        assert torch.equal(stored.velocities, ref.velocities)
        assert torch.equal(stored.energy, ref.energy)


def test_failure_with_several_writer_ranks_merges_what_they_finished(tmp_path):
    """Fan-out 1 -> 2 with a ZarrSink: when one MD rank fails, what both MD ranks had
    committed is merged into the store the user named (the per-rank stores go away:
    there is no checkpoint to resume from) and the error says so."""
    path = tmp_path / "results.zarr"
    plan = Pipeline(stages={0: relax(), 1: md(), 2: md()}, edges=[(0, 1), (0, 2)])
    sim = al.Simulator(
        model=FailingLJ(2, 15, epsilon=0.0104, sigma=3.40, cutoff=6.0),
        stages=plan,
        strategy="pipeline",
        devices=3,
        start_method="fork",
        sync_every=SYNC_EVERY,
        timeout=TIMEOUT,
        buffer=BufferConfig(16, MAX_ATOMS),
        sinks=[ZarrSink(path)],
    )
    with pytest.raises(PipelineError, match=r"rank 2 failed: RuntimeError: boom") as info:
        sim.run(SizeAwareSampler(data(40), max_atoms=MAX_ATOMS))
    match = re.search(
        r"the (\d+) systems finished before the failure were merged into", str(info.value)
    )
    assert match, str(info.value)
    stored = ZarrSink(path).read_batch()
    assert stored is not None and stored.num_systems == int(match.group(1)) > 0
    ids = stored.system_id.tolist()
    assert ids == sorted(set(ids))  # each once, in system_id order
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.zarr"]
    ref = fused(("relax", "md"), n=40).select(stored.system_id)
    assert torch.equal(stored.positions, ref.positions)
    assert torch.equal(stored.energy, ref.energy)


class StallingLJ(LennardJones):
    """Lennard-Jones that stalls (sleeps ``seconds``) once on rank 1, at call ``at``."""

    def __init__(self, at: int, seconds: float) -> None:
        super().__init__(epsilon=0.0104, sigma=3.40, cutoff=6.0)
        self.at, self.seconds, self.calls = at, seconds, 0

    def forward(self, batch, *args, **kwargs):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == 1:
            self.calls += 1
            if self.calls == self.at:
                time.sleep(self.seconds)
        return super().forward(batch, *args, **kwargs)


def stalled_pipeline(timeout: float, stall: float) -> al.Simulator:
    return al.Simulator(
        model=StallingLJ(at=8, seconds=stall),
        stages=relax() | md(),
        strategy="pipeline",
        devices=2,
        start_method="fork",
        sync_every=SYNC_EVERY,
        timeout=timeout,
        buffer=BufferConfig(16, MAX_ATOMS),
    )


def test_silent_rank_is_named_after_the_timeout(records):
    """A live rank that stops answering makes its neighbour fail after ``timeout``
    (not after gloo's default 30 minutes), naming the silent rank.  (A healthy step
    of these ranks takes milliseconds: 2 s of silence is a stall even on a loaded
    machine; the order in time is checked with wider margins in the slow tier.)"""
    with pytest.raises(PipelineError, match="rank 1 failed: rank 1 stopped responding"):
        stalled_pipeline(timeout=2.0, stall=4.5).run(sampler(30))
    outcomes = _outcomes(records, 2)
    assert outcomes[0]["failed_rank"] == 1
    assert outcomes[1]["failed_rank"] == 0  # rank 1 found rank 0 gone when it woke


@pytest.mark.slow
def test_the_silent_rank_is_given_up_on_while_it_is_still_silent(records):
    """Rank 0 gives up ``timeout`` after rank 1 fell silent, while rank 1 still stalls;
    rank 1 finds rank 0 gone only when it wakes: 15 s later, with seconds of margin for
    a loaded machine's scheduling."""
    with pytest.raises(PipelineError, match="rank 1 failed: rank 1 stopped responding"):
        stalled_pipeline(timeout=5.0, stall=20.0).run(sampler(30))
    outcomes = _outcomes(records, 2)
    assert outcomes[0]["failed_rank"] == 1 and outcomes[1]["failed_rank"] == 0
    assert outcomes[1]["time"] - outcomes[0]["time"] > 5.0


def test_mismatched_buffer_config_fails_at_setup_on_every_rank(monkeypatch, records):
    original = PipelineWorker.setup

    def setup(self):
        if self.rank == 1:  # as if rank 1 had been launched with another config
            self.buffer = BufferConfig(num_systems=8, num_atoms=MAX_ATOMS)
        return original(self)

    monkeypatch.setattr(PipelineWorker, "setup", setup)
    with pytest.raises(ConfigError, match="disagree at setup") as info:
        run_distributed(relax() | md(), devices=2, n=10)
    outcomes = _outcomes(records, 2)
    assert sorted(outcomes) == [0, 1]
    assert outcomes[0]["type"] == outcomes[1]["type"] == "ConfigError"
    assert outcomes[0]["text"] == outcomes[1]["text"] == str(info.value)
    assert "rank 1" in str(info.value) and "buffer" in str(info.value)


def test_mismatched_plan_fails_at_setup(monkeypatch, records):
    original = PipelineWorker.setup

    def setup(self):
        if self.rank == 1:
            self.pipeline = relax() | cool()
            self.plan = self.pipeline.stages[1]
        return original(self)

    monkeypatch.setattr(PipelineWorker, "setup", setup)
    with pytest.raises(ConfigError, match=r"disagree at setup.*plan"):
        run_distributed(relax() | md(), devices=2, n=10)
    outcomes = _outcomes(records, 2)
    assert outcomes[0]["text"] == outcomes[1]["text"]


# ============================================================== validation
def test_devices_must_match_pipeline_stages():
    with pytest.raises(ConfigError, match="devices=3"):
        al.Simulator(model=model(), stages=relax() | md(), strategy="pipeline", devices=3)
    with pytest.raises(ConfigError, match="multiple"):
        al.Simulator(model=model(), stages=relax() | md(), strategy="replicas", devices=3)


def test_system_larger_than_buffer_rejected_before_launch(monkeypatch):
    import alchemi_lit.strategies.distributed as distributed

    def no_launch(*args, **kwargs):
        raise AssertionError("launched despite an invalid configuration")

    monkeypatch.setattr(distributed, "launch", no_launch)
    items = data(20)
    largest = max(len(a) for a in items)
    big = next(k for k, a in enumerate(items) if len(a) == largest)
    sim = al.Simulator(
        model=model(),
        stages=relax() | md(),
        devices=2,
        start_method="fork",
        buffer=BufferConfig(num_systems=8, num_atoms=largest - 1),
    )
    with pytest.raises(ConfigError) as info:
        sim.run(SizeAwareSampler(items, max_atoms=MAX_ATOMS))
    text = str(info.value)
    assert f"system {big} has {largest} atoms" in text
    assert "raise num_atoms" in text and str(largest) in text


def test_forked_runs_leave_the_test_process_clean(tmp_path, monkeypatch):
    """After forked runs the launching process has no process group and does not look
    like a rank of a launcher (the next run would not spawn its ranks otherwise), and the
    hand-off folder of rank 0's results is gone."""
    import tempfile

    import torch.distributed as dist

    from alchemi_lit.strategies.launch import _under_launcher

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_distributed(relax() | md(), devices=2, n=5)
    assert not (dist.is_available() and dist.is_initialized())
    assert not _under_launcher()
    assert not list(tmp_path.glob("alchemi_lit_*")), "hand-off folder left behind"


@pytest.mark.timeout(120)
def test_edge_budget_of_buffers_is_respected_and_validated():
    """BufferConfig.num_edges bounds a message's summed neighbour pairs: systems still all
    arrive (back-pressure), and a system with more pairs than the budget is rejected."""
    from alchemi_lit.integrators import VelocityVerlet
    from alchemi_lit.models.neighbors import count_pairs

    data = mixed_argon(10, 8, 30, seed=9)
    model = LennardJones(0.0104, 3.40, 5.0)
    radius = model.cutoff + model.neighbors.skin
    most = max(count_pairs(a.positions, a.cell.array, a.pbc, radius) for a in data)

    def sim(num_edges):
        return al.Simulator(
            model=LennardJones(0.0104, 3.40, 5.0),
            stages=FIRE(fmax=0.1, max_steps=20) | VelocityVerlet(dt=1.0, steps=3),
            strategy="pipeline",
            devices=2,
            start_method="fork",
            timeout=60,
            buffer=BufferConfig(num_systems=8, num_atoms=400, num_edges=num_edges),
        )

    res = sim(most).run(SizeAwareSampler(data, max_atoms=200))
    assert sorted(res.system_id.tolist()) == list(range(10))
    with pytest.raises(ConfigError, match="num_edges"):
        sim(most - 1).run(SizeAwareSampler(data, max_atoms=200))


def test_a_pipeline_simulator_run_again_appends_to_its_store(tmp_path):
    """As on one device, a second run with the same ZarrSink (default mode 'w-') appends
    to the store the first run made -- its ranks wrote it through copies of the sink --
    and reusing ids is refused before the ranks start."""
    path = tmp_path / "results.zarr"
    sim = pipeline_sim(relax() | md(), sinks=[ZarrSink(path)])
    sim.run(SizeAwareSampler(data(4), max_atoms=MAX_ATOMS))
    res = sim.run(SizeAwareSampler(data(3), max_atoms=MAX_ATOMS, system_ids=[10, 11, 12]))
    assert res.system_id.tolist() == [10, 11, 12]
    assert ZarrSink(path).read_batch().system_id.tolist() == [0, 1, 2, 3, 10, 11, 12]
    with pytest.raises(ConfigError, match="already holds system_id"):
        sim.run(SizeAwareSampler(data(2), max_atoms=MAX_ATOMS))
