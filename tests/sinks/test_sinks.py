"""ZarrSink: buffering, failing flushes, stores that several runs append to, and
stores read back as the structures of a new run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import alchemi_lit as al
from alchemi_lit.callbacks import TrajectoryWriter
from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.core.state import default_system_ids
from alchemi_lit.data import SizeAwareSampler, mixed_argon, read_structures
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.report import read_store_runs
from alchemi_lit.sinks import HostMemory, SinkChain, ZarrSink, read_results

DATA = mixed_argon(16, 8, 30, seed=4)


def small_batch(ids: list[int]) -> al.Batch:
    return al.Batch.from_atoms([DATA[k] for k in ids], system_ids=ids)


def test_writes_are_buffered_until_the_threshold_or_a_read(tmp_path):
    sink = ZarrSink(tmp_path / "r.zarr", flush_every=5, flush_seconds=3600)
    sink.open({})
    sink.write(small_batch([0, 1]))
    sink.write(small_batch([2, 3]))
    assert len(read_results(tmp_path / "r.zarr")) == 0  # nothing committed yet
    assert len(sink) == 4  # but the sink counts what it holds
    sink.write(small_batch([4]))  # 5 systems: flushed
    assert read_results(tmp_path / "r.zarr").system_id.tolist() == [0, 1, 2, 3, 4]
    sink.write(small_batch([5]))
    assert sink.read_batch().system_id.tolist() == [0, 1, 2, 3, 4, 5]  # read flushes
    sink.write(small_batch([6]))
    sink.close()
    assert len(ZarrSink(tmp_path / "r.zarr")) == 7


def test_time_based_flush(tmp_path):
    sink = ZarrSink(tmp_path / "r.zarr", flush_every=1000, flush_seconds=0.0)
    sink.open({})
    sink.write(small_batch([3]))
    assert read_results(tmp_path / "r.zarr").system_id.tolist() == [3]


class DiskFillsUp(ZarrSink):
    """A ZarrSink whose disk is full from its second flush on."""

    def _append(self, host):
        self.flushes = getattr(self, "flushes", 0) + 1
        if self.flushes > 1:
            raise OSError(28, "No space left on device")
        super()._append(host)


def test_a_failing_flush_hands_every_buffered_system_down_the_chain(tmp_path):
    zarr_sink = DiskFillsUp(tmp_path / "r.zarr", flush_every=3, flush_seconds=3600)
    memory = HostMemory()
    sim = al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0),
        stages=FIRE(fmax=0.05, max_steps=40) + Langevin(dt=2.0, temperature=50.0, steps=5),
        sinks=[zarr_sink, memory],
        sync_every=2,
    )
    res = sim.run(SizeAwareSampler(DATA, max_atoms=120))
    in_store = read_results(tmp_path / "r.zarr").system_id.tolist()
    in_memory = memory.read_batch().system_id.tolist()
    assert 0 < len(in_store) < len(DATA)  # the first flush landed, later ones failed
    assert sorted(in_store + in_memory) == list(range(len(DATA)))  # each exactly once
    assert res.stats["systems"] == len(DATA)
    assert torch.equal(res.batch.system_id, torch.tensor(sorted(in_memory)))  # memory's share


@pytest.mark.parametrize("kwargs", [{"flush_every": 0}, {"flush_seconds": -1.0}])
def test_bad_flush_settings(tmp_path, kwargs):
    with pytest.raises(ConfigError, match="flush_every >= 1 and flush_seconds >= 0"):
        ZarrSink(tmp_path / "r.zarr", **kwargs)


def relax_sim(sink: ZarrSink) -> al.Simulator:
    return al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=FIRE(fmax=0.05, max_steps=40), sinks=[sink]
    )


def test_runs_appending_to_one_store_read_back_whole_or_run_by_run(tmp_path):
    store = tmp_path / "r.zarr"
    first = relax_sim(ZarrSink(store)).run(SizeAwareSampler(DATA[:5], max_atoms=120))
    second = relax_sim(ZarrSink(store, mode="a")).run(
        SizeAwareSampler(DATA[5:9], max_atoms=120, system_ids=[20, 21, 22, 23])
    )
    # each run's Results holds its own systems, not the store's earlier ones
    assert first.system_id.tolist() == [0, 1, 2, 3, 4]
    assert second.system_id.tolist() == [20, 21, 22, 23]
    sink = ZarrSink(store)
    assert [a.info["system_id"] for a in sink.read()] == [0, 1, 2, 3, 4, 20, 21, 22, 23]
    assert [a.info["system_id"] for a in sink.read(run=1)] == [20, 21, 22, 23]
    assert sink.read_batch(run=-1).system_id.tolist() == [20, 21, 22, 23]
    run0 = read_results(store, run=0)
    assert run0.system_id.tolist() == [0, 1, 2, 3, 4]
    assert torch.equal(run0.batch.positions, first.batch.positions)  # the right atoms per row
    assert torch.equal(run0.batch.forces, first.batch.forces)
    with pytest.raises(ConfigError, match=r"written by 2 run\(s\); run=2 does not exist"):
        sink.read(run=2)


def test_appending_a_run_that_reuses_stored_ids_is_refused_before_any_work(tmp_path):
    store = tmp_path / "r.zarr"
    relax_sim(ZarrSink(store)).run(SizeAwareSampler(DATA[:5], max_atoms=120))
    model = LennardJones(0.0104, 3.40, 6.0)
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    sim = al.Simulator(model=model, stages=FIRE(fmax=0.05), sinks=[ZarrSink(store, mode="a")])
    for data in (
        SizeAwareSampler(DATA[5:8], max_atoms=120, system_ids=[4, 5, 6]),
        small_batch([3, 9]),
        DATA[5:7],  # ase.Atoms get ids 0, 1, ...
    ):
        with pytest.raises(ConfigError, match=r"already holds system_id\(s\) .*mode='w'"):
            sim.run(data)
    assert calls == []  # refused before the first forward
    assert len(ZarrSink(store)) == 5 and len(read_store_runs(store)) == 1  # store untouched


def test_a_store_holding_an_id_twice_is_read_run_by_run(tmp_path):
    """Stores written before the clash check could hold an id twice: read() says how to
    read them instead of failing inside Batch.select."""
    store = tmp_path / "r.zarr"
    for mode, ids in (("w-", [0, 1]), ("a", [1, 2])):
        sink = ZarrSink(store, mode=mode, flush_every=1)
        sink.open({})
        sink.write(small_batch(ids))
        sink.close()
    with pytest.raises(ConfigError, match=r"more than once .* run=k"):
        ZarrSink(store).read()
    assert read_results(store, run=1).system_id.tolist() == [1, 2]
    assert torch.equal(read_results(store, run=1).batch.positions, small_batch([1, 2]).positions)


def test_a_results_store_is_a_dataset_whose_systems_keep_their_ids(tmp_path):
    """Relax into a store, then run MD from it: structures start where the relaxation
    left them and keep their system_ids, through a sampler or a plain list."""
    store = tmp_path / "relaxed.zarr"
    relaxed = relax_sim(ZarrSink(store)).run(
        SizeAwareSampler(DATA[:4], max_atoms=120, system_ids=[10, 11, 12, 13])
    )
    md = Langevin(dt=2.0, temperature=50.0, steps=0)  # no step: states pass through
    model = LennardJones(0.0104, 3.40, 6.0)
    for source in (SizeAwareSampler(store, max_atoms=120), read_structures(store)):
        again = al.Simulator(model=model, stages=md).run(source)
        assert again.system_id.tolist() == [10, 11, 12, 13]
        assert torch.equal(again.batch.positions, relaxed.batch.positions)
    assert [a.info["system_id"] for a in read_structures(store, index="1:3")] == [11, 12]
    assert read_structures(store, index=-1)[0].get_potential_energy() == pytest.approx(
        float(relaxed.energy[-1])
    )
    with pytest.raises(StructureError, match=r"index 9 selects no structure .*4 stored"):
        read_structures(store, index=9)


def test_a_store_that_is_not_a_results_store_is_named_as_such(tmp_path):
    import zarr

    zarr.open_group(str(tmp_path / "other.zarr"), mode="w")
    with pytest.raises(StructureError, match="a zarr store, not an alchemi_lit results store"):
        read_structures(tmp_path / "other.zarr")
    traj = tmp_path / "traj.zarr"
    sim = al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0),
        stages=FIRE(fmax=0.05, max_steps=3),
        callbacks=[TrajectoryWriter(traj, every=1)],
    )
    sim.run(small_batch([0]))
    with pytest.raises(StructureError, match=r"a trajectory store, not .*read_trajectory"):
        SizeAwareSampler(traj, max_atoms=120)


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([7, 3, 5], [7, 3, 5]),  # results read back: their ids
        ([7, 7, 5], [0, 1, 2]),  # not distinct
        ([7, "b", 5], [0, 1, 2]),  # not all integers (a user's label)
        ([7, None, 5], [0, 1, 2]),  # not all carry one
        ([True, False, 5], [0, 1, 2]),  # booleans are not ids
    ],
)
def test_default_system_ids(ids, expected):
    atoms = [DATA[k].copy() for k in range(3)]
    for a, sid in zip(atoms, ids):
        if sid is not None:
            a.info["system_id"] = sid
    assert default_system_ids(atoms) == expected
    assert sorted(al.Batch.from_atoms(atoms).system_id.tolist()) == sorted(expected)


def test_results_of_a_full_memory_sink_say_where_the_rest_went(tmp_path):
    sim = relax_sim(ZarrSink(tmp_path / "r.zarr"))
    sim.sinks.insert(0, HostMemory(capacity=2))
    res = sim.run(SizeAwareSampler(DATA[:5], max_atoms=120))
    assert len(res) == 2 and res.stats["systems"] == 5
    assert "systems=2 of 5; the other 3 went to later sinks in " in repr(res)
    assert str(tmp_path / "r.zarr") in repr(res)
    assert len(read_results(tmp_path / "r.zarr")) == 3


@pytest.mark.parametrize("mode", ["w-", "a", "w"])
def test_a_sink_used_for_a_second_run_appends_it_as_a_run(tmp_path, mode):
    """A Simulator run twice with the same ZarrSink: the second run must not write on as
    if it were the first (it did: no run entry, ids stored twice, read() failing).  It
    is appended as a run of its own whatever the mode (the sink made the store, as a
    TrajectoryWriter appends its later runs), and reusing ids is refused before work."""
    store = tmp_path / "r.zarr"
    sim = relax_sim(ZarrSink(store, mode=mode))
    sim.run(SizeAwareSampler(DATA[:3], max_atoms=120))
    res = sim.run(SizeAwareSampler(DATA[3:5], max_atoms=120, system_ids=[7, 8]))
    assert res.system_id.tolist() == [7, 8]
    assert [a.info["system_id"] for a in ZarrSink(store).read()] == [0, 1, 2, 7, 8]
    assert [r["first_row"] for r in read_store_runs(store)] == [0, 3]
    with pytest.raises(ConfigError, match=r"already holds system_id\(s\) 0, 1"):
        sim.run(SizeAwareSampler(DATA[:2], max_atoms=120))
    # another sink object on that store follows its mode again
    if mode == "w-":
        with pytest.raises(ConfigError, match="already exists; use ZarrSink"):
            relax_sim(ZarrSink(store)).run(SizeAwareSampler(DATA[5:6], max_atoms=120))


class NoForwards(LennardJones):
    """LJ that fails the test if a run computes anything."""

    def forward(self, *args, **kwargs):
        raise AssertionError("the run started although its store cannot be written")


def refused_before_step_0(sink: ZarrSink) -> str:
    """The one-line error of a run (with a HostMemory fallback) writing to ``sink``."""
    model = NoForwards(epsilon=0.0104, sigma=3.40, cutoff=6.0)
    sim = al.Simulator(model=model, stages=FIRE(fmax=0.1), sinks=[sink, HostMemory()])
    with pytest.raises(ConfigError) as caught:
        sim.run(DATA[:2])
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"ZarrSink: cannot write the results store "
                                                f"{str(sink.path)!r}")  # fmt: skip
    assert text.endswith("choose a store path in a writable folder"), text
    return text


@pytest.mark.parametrize("mode", ["w-", "a", "w"])
def test_an_unwritable_store_path_is_a_one_line_config_error(tmp_path, mode, monkeypatch):
    """They used to be a raw NotADirectoryError / FileExistsError / PermissionError with a
    traceback, HostMemory fallback or not."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a store")
    text = refused_before_step_0(ZarrSink(blocker / "r.zarr", mode=mode))
    assert f"{str(blocker)!r} is a file" in text
    text = refused_before_step_0(ZarrSink(blocker, mode=mode))
    assert "exists and is a file, not a directory" in text
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)  # (root may write there all the same: os.access then says no)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: Path(p) != locked and real(p, m))
    text = refused_before_step_0(ZarrSink(locked / "r.zarr", mode=mode))
    assert f"no write permission in {str(locked)!r}" in text
    assert blocker.read_text() == "not a store" and not any(locked.iterdir())


def test_a_store_failing_to_open_is_a_one_line_config_error(tmp_path, monkeypatch):
    """A folder os.access calls writable that refuses all the same (immutable, a
    read-only mount): the error at open is the same one line."""
    import zarr

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted", str(tmp_path / "r.zarr"))

    monkeypatch.setattr(zarr, "open_group", refuse)
    text = refused_before_step_0(ZarrSink(tmp_path / "r.zarr"))
    assert "(PermissionError: Operation not permitted)" in text


def test_a_float32_run_then_a_float64_run_keep_every_bit(tmp_path):
    """Stores hold float64 whatever the run's precision: a float32 run that creates the
    store must not make a float64 run appended to it lose precision (zarr casts what
    it appends to the array's dtype), and columns read as the input's values."""
    store = tmp_path / "r.zarr"
    low = small_batch([0, 1]).to(dtype=torch.float32)
    for mode, batch in (("w-", low), ("a", small_batch([2, 3]))):
        sink = ZarrSink(store, mode=mode, flush_every=1)
        sink.open({})
        sink.write(batch)
        sink.close()
    back = read_results(store, run=1).batch
    assert back.positions.dtype == torch.float64
    expected = torch.from_numpy(np.concatenate([DATA[k].positions for k in (2, 3)]))
    assert torch.equal(back.positions, expected)  # the input's own bits
    assert torch.equal(read_results(store, run=0).batch.positions, low.positions.double())


def test_a_flush_failing_midway_leaves_the_store_as_it_was(tmp_path):
    """The commit marker (n_systems, n_atoms) is written after every column: a write
    that fails part-way leaves the store holding exactly what it held, and the
    systems go down the chain (a marker written first would commit half-written rows)."""

    class FailsAtEnergy(ZarrSink):
        fail = False

        def _put(self, group, name, data, start):  # (after atoms/* and systems/system_id)
            if self.fail and name == "systems/energy":
                raise OSError(28, "No space left on device")
            super()._put(group, name, data, start)

    store = tmp_path / "r.zarr"
    sink = FailsAtEnergy(store, flush_every=1)
    memory = HostMemory()
    chain = SinkChain([sink, memory])
    chain.open({})
    chain.write(small_batch([0, 1]))
    sink.fail = True
    chain.write(small_batch([2, 3]))
    assert read_results(store).system_id.tolist() == [0, 1]
    assert memory.read_batch().system_id.tolist() == [2, 3]
    assert torch.equal(read_results(store).batch.positions, small_batch([0, 1]).positions)


def test_the_chain_state_brings_back_overflow_memory_and_failed_sinks():
    """A checkpoint of the sink chain holds what no sink could take (overflow), what
    went to in-memory sinks and which sinks failed: a resume that lost the overflow
    would lose finished systems (they are not computed again)."""

    class Broken(HostMemory):
        def write(self, batch):
            raise OSError(5, "Input/output error")

    chain = SinkChain([HostMemory(capacity=2), Broken()])
    chain.write(small_batch([0, 1, 2, 3]))  # two kept in memory, two overflow
    state = chain.state_dict()
    again = SinkChain([HostMemory(capacity=2), Broken()])
    again.load_state_dict(state)
    assert [b.system_id.tolist() for b in again.overflow] == [[2, 3]]
    assert [b.system_id.tolist() for b in again.in_memory] == [[0, 1]]
    assert torch.equal(again.overflow[0].positions, small_batch([2, 3]).positions)
    assert list(again.failed) == [1] and again.sinks[0].free() == 0
