"""Buffered ZarrSink: what reaches the store when, and that a failing flush loses nothing."""

from __future__ import annotations

import pytest
import torch

import alchemi_lit as al
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.errors import ConfigError
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import HostMemory, ZarrSink, read_results

DATA = mixed_argon(16, 8, 30, seed=4)


def small_batch(ids: list[int]) -> al.Batch:
    return al.Batch.from_atoms([DATA[k] for k in ids], system_ids=ids)


def test_writes_are_buffered_until_the_threshold_or_a_read(tmp_path):
    sink = ZarrSink(tmp_path / "r.zarr", flush_every=5, flush_seconds=3600)
    sink.open({})
    sink.write(small_batch([0, 1]))
    sink.write(small_batch([2, 3]))
    assert read_results(tmp_path / "r.zarr") is None  # nothing committed yet
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
    stored = read_results(tmp_path / "r.zarr")
    in_store = stored.system_id.tolist() if stored is not None else []
    in_memory = memory.read_batch().system_id.tolist()
    assert 0 < len(in_store) < len(DATA)  # the first flush landed, later ones failed
    assert sorted(in_store + in_memory) == list(range(len(DATA)))  # each exactly once
    assert res.stats["systems"] == len(DATA)
    assert torch.equal(res.batch.system_id, torch.tensor(sorted(in_memory)))  # memory's share


@pytest.mark.parametrize("kwargs", [{"flush_every": 0}, {"flush_seconds": -1.0}])
def test_bad_flush_settings(tmp_path, kwargs):
    with pytest.raises(ConfigError, match="flush_every >= 1 and flush_seconds >= 0"):
        ZarrSink(tmp_path / "r.zarr", **kwargs)
